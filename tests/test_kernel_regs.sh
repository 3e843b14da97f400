#!/usr/bin/env bash
# Every kernel of ddp_kernels.cuh, for fp32 and bf16 and every attention head-size
# instantiation, compiled for sm_80 and sm_90 with -Xptxas -v: no kernel may spill
# registers to local memory or keep a stack frame over 256 bytes (attention backward
# once held 2.8 KB per thread there). Needs nvcc only, no GPU.
cd "$(dirname "$0")/.." || exit 1
if ! command -v nvcc >/dev/null; then
  echo "SKIP kernel_regs: nvcc not found"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# calls every launcher once per activation type, so that nvcc instantiates every kernel
cat > "$tmp/all.cu" <<'EOF'
#include "ddp_kernels.cuh"
template <typename F> static void all(ddp_kernels_ctx *k, cudaStream_t s)
{
    F *a = 0;
    float *f = 0;
    int *i = 0;
    ddp_embedding_forward_gpu(k, a, i, a, a, 1, 1, 1, s);
    ddp_embedding_backward_gpu(k, f, f, a, i, 1, 1, 1, s);
    ddp_layernorm_forward_gpu(k, a, f, f, a, a, a, 1, 1, 1, s);
    ddp_layernorm_backward_gpu(k, a, f, f, a, a, a, f, f, 1, 1, 1, s);
    ddp_matmul_forward_gpu(k, a, a, a, a, 1, 1, 1, 1, s);
    ddp_matmul_backward_gpu(k, a, f, f, a, a, a, 1, 1, 1, 1, s);
    ddp_attention_forward_gpu(k, a, f, a, 1, 1, 1, 1, s);
    ddp_attention_backward_gpu(k, a, a, a, a, f, 1, 1, 1, 1, s);
    ddp_gelu_forward_gpu(k, a, a, 1, s);
    ddp_gelu_backward_gpu(k, a, a, a, 1, s);
    ddp_residual_forward_gpu(k, a, a, a, 1, s);
    ddp_residual_backward_gpu(k, a, a, a, 1, s);
    ddp_crossentropy_forward_backward_gpu(k, f, f, a, a, i, 1, 1, 1, -1, 1.0f, s);
    ddp_adamw_update_gpu(k, a, f, f, f, 1, 0.1f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, f, s);
    ddp_global_norm_gpu(k, f, f, 1, s);
    ddp_clip_by_norm_gpu(k, f, 1, 1.0f, f, s);
}
int main()
{
    ddp_kernels_ctx k;
    if (ddp_kernels_init(&k) != cudaSuccess) return 1;
    all<float>(&k, 0);
    all<__nv_bfloat16>(&k, 0);
    ddp_kernels_destroy(&k);
    return 0;
}
EOF
fail=0
for arch in 80 90; do
  name="kernel_regs.sm_$arch"
  if ! nvcc -cubin -arch=sm_$arch -std=c++17 -Werror all-warnings -Xptxas -v -I. "$tmp/all.cu" \
       -o "$tmp/all_$arch.cubin" >"$tmp/log_$arch" 2>&1; then
    echo "FAIL $name: nvcc: $(grep -m3 -E 'error|warning' "$tmp/log_$arch" | tr '\n' ' ' | head -c 400)"
    fail=1
    continue
  fi
  # ptxas prints "Compiling entry function '<mangled>' for 'sm_NN'" and, a line later,
  # "<S> bytes stack frame, <W> bytes spill stores, <R> bytes spill loads"
  report=$(awk '
    /Compiling entry function/ { split($0, q, "'\''"); fn = q[2]; n++ }
    /bytes stack frame/ {
      stack = $1; stores = $5; loads = $9
      if (stores > 0 || loads > 0 || stack > 256) printf "%s: %s B stack, %s B spill stores, %s B spill loads; ", fn, stack, stores, loads
    }
    /Compiling entry function .*attention/ { att++ }
    END { printf "\n%d %d\n", n, att }' "$tmp/log_$arch")
  bad=$(printf '%s\n' "$report" | sed -n 1p)
  read -r kernels att <<<"$(printf '%s\n' "$report" | sed -n 2p)"
  if [ "${att:-0}" -lt 20 ]; then # 3 head sizes x 3 kernels + the dot kernel, x 2 types
    echo "FAIL $name: expected the attention kernels in ptxas's report, found ${att:-0} (of ${kernels:-0} kernels)"
    fail=1
  elif [ -n "$bad" ]; then
    echo "FAIL $name: $(printf '%s' "$bad" | c++filt | head -c 1500)"
    fail=1
  else
    echo "PASS $name ($kernels kernels, none spills)"
  fi
done
exit $fail
