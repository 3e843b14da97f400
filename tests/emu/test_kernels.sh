#!/usr/bin/env bash
# tests/emu/test_kernels.sh - ddp_kernels.cuh on the CUDA emulator: the GPU probe,
# tests/test_kernels_gpu.cu (every kernel against its CPU twin, fp32 and bf16, three
# shapes), and GPT-2's training shape in sampled-block mode (tests/emu/gpt2_corners.cu).
cd "$(dirname "$0")/../.." || exit 1
. tests/emu/common.sh
fail=0
emulated build/emu/tests/test_gpu_probe
emulated build/emu/tests/test_kernels_gpu
emulated DDP_EMU_SAMPLE=1 DDP_EMU_FILL_LIMIT=16777216 build/emu/tests/emu/gpt2_corners
exit $fail
