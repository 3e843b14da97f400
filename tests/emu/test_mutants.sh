#!/usr/bin/env bash
# tests/emu/test_mutants.sh - planted bugs in ddp_kernels.cuh: proof that the CUDA
# emulator fails the GPU tests when the GPU code is wrong. Each mutant is one edit to a
# copy of a source (an exact text that must occur once, replaced: a mutant that no
# longer applies is a failure too, so the list keeps up with the sources), built
# against the emulator (-O0: quick to build) with the smallest program that exercises
# it, and run: it must fail the way its bug class fails on the emulator (a wrong result
# the test names, or the emulator's report), while the unmutated build (make emu's)
# passes the same run. The planted bugs in ddp.h and train_gpt: test_mutants_ddp.sh.
cd "$(dirname "$0")/../.." || exit 1
. tests/emu/common.sh
mutants_need build/emu/libemu.a build/emu/tests/test_kernels_gpu build/emu/tests/emu/gpt2_corners

K=ddp_kernels.cuh
mutant syncthreads_removed $K '    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();' '    if (lane == 0) warp_vals[warp] = v;' \
  tests/test_kernels_gpu crossentropy '^FAIL kernels_gpu\.crossentropy'
mutant shuffle_under_branch $K 'for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));' \
  'for (int o = 16; o > 0; o >>= 1) if (threadIdx.x % 32 < 16) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));' \
  tests/test_kernels_gpu layernorm.forward '^emu: kernel ddp__layernorm_forward_kernel.* shuffle'
mutant tail_guard_removed $K '    if (i < N) out[i] = ddp__to<F>(ddp__f(out[i]) + ddp__f(bias[i % OC]));' \
  '    out[i] = ddp__to<F>(ddp__f(out[i]) + ddp__f(bias[i % OC]));' \
  tests/test_kernels_gpu matmul.forward.bf16 '^emu: kernel ddp__add_bias_kernel.*(past the end|invalid access)'
mutant host_array_to_kernel $K '<<<1, 1024, 0, stream>>>((int *)n_valid, targets' '<<<1, 1024, 0, stream>>>((int *)&n_valid, targets' \
  tests/test_kernels_gpu crossentropy '^emu: launch of ddp__count_valid_kernel .*pointer argument 1 of 2 .*host memory'
mutant accumulate_overwritten $K '            gv[k] += (dv[k] * wv[k] - dn_mean' '            gv[k] = (dv[k] * wv[k] - dn_mean' \
  tests/test_kernels_gpu layernorm.backward '^FAIL kernels_gpu\.layernorm\.backward'
# attention by products: a softmax that lets each query see later keys, and dq
# written over dinp instead of added to it
mutant products_unmasked $K 'p[j] = ddp__to<F>(j <= t ? expf(__fmul_rn(s[j], scale) - m) * inv : 0.0f);' \
  'p[j] = ddp__to<F>(expf(__fmul_rn(s[j], scale) - m) * inv);' \
  tests/test_kernels_gpu attention.forward.fp32 '^FAIL kernels_gpu\.attention\.forward\.fp32\.odd'
mutant products_dq_overwritten $K '(dinp, (const float *)dq, C3, h0, g, T, NH, hs, 1);' \
  '(dinp, (const float *)dq, C3, h0, g, T, NH, hs, 0);' \
  tests/test_kernels_gpu attention.backward.fp32 '^FAIL kernels_gpu\.attention\.backward\.fp32\.odd'
# rows read 16 bytes at a time where their length is no multiple of the pack: bf16 rows
# of 12 start 24 bytes apart (a GPU faults; a CPU reads them as well as aligned ones)
mutant vector_rows_misaligned $K '    const bool vec = C % ddp__pack<F>::n == 0 && ddp__aligned16(out) && ddp__aligned16(inp) &&' \
  '    const bool vec = ddp__aligned16(out) && ddp__aligned16(inp) &&' \
  tests/test_kernels_gpu layernorm.forward.bf16.odd '^emu: kernel ddp__layernorm_forward_kernel.*16-byte vector access .*not 16-byte aligned'
# a launch bound below the launch's block: a GPU refuses the launch (the macro is empty
# under the emulator: rewrite.pl checks each block against it)
mutant launch_bounds_halved $K 'static __global__ void __launch_bounds__(DDP__ATT_BR * HS / DDP__ATT_DPT)
ddp__attention_forward_kernel' 'static __global__ void __launch_bounds__(DDP__ATT_BR * HS / DDP__ATT_DPT / 2)
ddp__attention_forward_kernel' \
  tests/test_kernels_gpu attention.forward '^emu: kernel ddp__attention_forward_kernel.*__launch_bounds__'

# a row index in 32 bits: at GPT-2's training shape the last row of logits starts past 2^31
MUTANT_ENV="DDP_EMU_SAMPLE=1 DDP_EMU_FILL_LIMIT=16777216" mutant int_index_overflow $K '    const long row = blockIdx.x;' \
  '    const int row = blockIdx.x;' tests/emu/gpt2_corners '' '^emu: kernel ddp__crossentropy_kernel .*block \(65535,0,0\)'
exit $fail
