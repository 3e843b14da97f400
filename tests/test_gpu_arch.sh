#!/usr/bin/env bash
# Every GPU binary carries machine code (SASS) for sm_80 (A100) and sm_90 (H100/H200)
# and PTX that newer GPUs compile at load time: an sm_90-only build fails on an A100
# with "no kernel image is available". Read with cuobjdump from the binaries that make
# test built; no GPU needed. The Makefile sets DDP_EXPECT_ARCH for its default; when
# NVARCH was chosen (make NVARCH="-arch=sm_86") the binaries must hold what it asks for.
cd "$(dirname "$0")/.." || exit 1
expect=${DDP_EXPECT_ARCH-sm_80 sm_90 ptx:sm_90}
if ! command -v nvcc >/dev/null; then echo "SKIP gpu_arch: nvcc not found, so no GPU binaries are built"; exit 0; fi
if [ "${DDP_GPU_BUILDS-}" = 0 ]; then echo "SKIP gpu_arch: make HAVE_NVCC= builds no GPU binaries"; exit 0; fi
# the architectures nvcc flags ask for, as a reader takes them: every -arch=sm_XY (SASS +
# PTX) and -gencode ...,code=sm_XY / compute_XY named
asks_for() {
  echo "$1" | sed -e 's/-arch[= ]sm_\([0-9a-z]*\)/,code=sm_\1,compute_\1/g' | grep -o ',code=[^ ]*' |
    grep -o '\(sm\|compute\)_[0-9][0-9a-z]*' | sed -e 's/^compute_/ptx:sm_/' | sort -u | tr '\n' ' '
}
if [ -z "$expect" ]; then
  expect=$(asks_for "$DDP_NVARCH")
  if [ -z "$expect" ]; then echo "SKIP gpu_arch: cannot tell what NVARCH='$DDP_NVARCH' builds"; exit 0; fi
fi
cuobjdump=$(command -v cuobjdump || ls "${CUDA_HOME:-/usr/local/cuda}"/bin/cuobjdump \
  "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)"/nvidia/cu*/bin/cuobjdump 2>/dev/null | head -1)
if [ -z "$cuobjdump" ]; then
  echo "SKIP gpu_arch: cuobjdump not found (CUDA toolkit's, or pip install nvidia-cuda-cuobjdump)"; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# missing <binary> [wanted]: prints what of wanted (default $expect) the binary lacks
missing() {
  local elf ptx want out=""
  elf=$("$cuobjdump" --list-elf "$1" 2>&1) || { echo "cuobjdump failed: $(echo "$elf" | head -c 200)"; return; }
  ptx=$("$cuobjdump" --list-ptx "$1" 2>&1)
  for want in ${2-$expect}; do
    case $want in
      ptx:*) grep -q "\.${want#ptx:}\.ptx\$" <<<"$ptx" || out="$out PTX for ${want#ptx:};" ;;
      *) grep -q "\.$want\.cubin\$" <<<"$elf" || out="$out SASS for $want;" ;;
    esac
  done
  echo "$out"
}

bins=$(ls examples/*.c examples/*.cu tests/test_*.cu 2>/dev/null | sed -e '/ddprun\.c$/d' -e 's/\.c$/_gpu/' -e 's/\.cu$//')
for b in $bins; do
  name=gpu_arch.${b#*/}
  if [ ! -x "$b" ]; then echo "FAIL $name: $b is not built (make gpu-build)"; fail=1; continue; fi
  m=$(missing "$b")
  if [ -z "$m" ]; then echo "PASS $name"; else echo "FAIL $name: lacks$m has: $("$cuobjdump" --list-elf --list-ptx "$b" 2>&1 | sed 's/.*\.\(sm_[0-9a-z]*\.[a-z]*\)$/\1/' | sort -u | tr '\n' ' ')"; fail=1; fi
done

# ddp_kernels.cuh's own usage line builds what it names, for a program that includes
# the header copied beside it
line=$(grep -m 1 '^ *nvcc ' ddp_kernels.cuh | sed -e 's/^ *//' -e 's/ *(.*$//') # without a note in brackets
cp ddp_kernels.cuh "$tmp/"
cat >"$tmp/prog.cu" <<'EOF'
#include "ddp_kernels.cuh"
int main(void)
{
    ddp_kernels_ctx k;
    float *p = 0;
    if (ddp_kernels_init(&k) != cudaSuccess) return 1; /* never past here without a GPU */
    (void)ddp_layernorm_forward_gpu(&k, p, p, p, p, p, p, 1, 1, 1, (cudaStream_t)0);
    ddp_kernels_destroy(&k);
    return 0;
}
EOF
want=$(asks_for "$line")
if (cd "$tmp" && $line -o prog) >"$tmp/log" 2>&1; then
  m=$(missing "$tmp/prog" "$want")
  if [ -n "$want" ] && [ -z "$m" ]; then echo "PASS gpu_arch.kernels_usage_line: $line"
  else echo "FAIL gpu_arch.kernels_usage_line: '$line' asks for ${want}but its binary lacks$m"; fail=1; fi
else
  echo "FAIL gpu_arch.kernels_usage_line: '$line' does not build: $(head -c 300 "$tmp/log" | tr '\n' ' ')"; fail=1
fi

# the check itself can fail: an sm_90-only binary is caught
printf '__global__ void k(int *p) { *p = 1; }\nint main(void) { return 0; }\n' > "$tmp/one.cu"
if nvcc -arch=sm_90 "$tmp/one.cu" -o "$tmp/sm90only" >"$tmp/log" 2>&1; then
  m=$(missing "$tmp/sm90only")
  case $m in *"SASS for sm_80"*) echo "PASS gpu_arch.sm90_only_build_is_caught" ;;
    *) echo "FAIL gpu_arch.sm90_only_build_is_caught: the check found nothing missing in an -arch=sm_90 build ($m)"; fail=1 ;; esac
else
  echo "FAIL gpu_arch.sm90_only_build_is_caught: nvcc failed: $(head -c 300 "$tmp/log" | tr '\n' ' ')"; fail=1
fi
exit $fail
