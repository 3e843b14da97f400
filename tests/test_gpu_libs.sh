#!/usr/bin/env bash
# Which shared libraries each GPU binary needs (readelf -d): NCCL only where ddp.h's
# implementation, with its NCCL backend, is compiled in; cuBLAS and cuBLASLt only
# where ddp_kernels.cuh's matmuls are; the probe neither (it opens them itself, to
# name a missing one). A binary that needs a library it never calls cannot even start
# where that library is missing (on a lent GPU machine NCCL may live only inside
# PyTorch's wheel). Then: the link line asks for --as-needed, for toolchains that do
# not default to it; and check-gpu finds a library the loader cannot in a wheel's
# nvidia/*/lib on Python's path, and the binary then starts.
cd "$(dirname "$0")/.." || exit 1
if ! command -v nvcc >/dev/null; then echo "SKIP gpu_libs: nvcc not found, so no GPU binaries are built"; exit 0; fi
if [ "${DDP_GPU_BUILDS-}" = 0 ]; then echo "SKIP gpu_libs: make HAVE_NVCC= builds no GPU binaries"; exit 0; fi
if ! command -v readelf >/dev/null; then echo "SKIP gpu_libs: readelf not found (binutils)"; exit 0; fi
. tests/lib.sh
major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
for src in examples/*.c examples/*.cu examples/lessons/[0-9]*/*.c tests/test_*.cu; do
  # (exercises are built one at a time by make lesson-N, on the CPU)
  case $src in examples/ddprun.c | */exercise.c) continue ;; *.c) b=${src%.c}_gpu ;; *.cu) b=${src%.cu} ;; esac
  name="gpu_libs.${b}"
  if [ ! -x "$b" ]; then report "$name" 1 "$b is not built (make gpu-build)"; continue; fi
  needed=$(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  want=""
  grep -q '^#define DDP_IMPLEMENTATION' "$src" && want="libnccl.so.2"
  grep -q '^#include "ddp_kernels.cuh"' "$src" && want="$want libcublasLt.so.$major libcublas.so.$major"
  want=${want# }
  bad=""
  for lib in libnccl.so.2 "libcublasLt.so.$major" "libcublas.so.$major"; do
    case " $want " in *" $lib "*) in_want=1 ;; *) in_want=0 ;; esac
    case " $needed " in *" $lib "*) in_needed=1 ;; *) in_needed=0 ;; esac
    [ $in_want = $in_needed ] || bad="$bad $lib ($([ $in_want = 1 ] && echo 'used, not linked' || echo 'linked, never called'))"
  done
  report "$name needs ${want:-none of NCCL, cuBLAS}" "$([ -z "$bad" ]; echo $?)" "wrong:$bad; NEEDED: $needed"
done

line=$(unset MAKEFLAGS MFLAGS MAKELEVEL; make -n -B examples/hello_allreduce_gpu 2>&1)
grep -q -- '--as-needed -lnccl' <<<"$line"
report "gpu_libs.link_line_as_needed" $? "make -n: $(head -c 300 <<<"$line")"

# a program linked against a library that only a wheel directory holds
mkdir -p "$tmp/build" "$tmp/site/nvidia/fake/lib"
printf 'int ddp_fake(void) { return 7; }\n' >"$tmp/fake.c"
printf 'int ddp_fake(void);\nint main(void) { return ddp_fake() == 7 ? 0 : 1; }\n' >"$tmp/prog.c"
if cc -shared -fPIC -Wl,-soname,libddpfake.so.1 "$tmp/fake.c" -o "$tmp/build/libddpfake.so.1" &&
   ln -s libddpfake.so.1 "$tmp/build/libddpfake.so" &&
   cc "$tmp/prog.c" -o "$tmp/prog" -L"$tmp/build" -lddpfake; then
  mv "$tmp/build/libddpfake.so.1" "$tmp/site/nvidia/fake/lib/"
  out=$(PYTHONPATH=$tmp/site CHECK_GPU_LOG=$tmp/log tests/check_gpu.sh --libraries "$tmp/prog" 2>&1)
  path=$(sed -n 's/^LD_LIBRARY_PATH=//p' <<<"$out")
  [[ ":$path:" == *":$tmp/site/nvidia/fake/lib:"* ]] && LD_LIBRARY_PATH=$path "$tmp/prog"
  report "gpu_libs.check_gpu_finds_a_wheels_library" $? "$(tr '\n' ' ' <<<"$out" | head -c 400)"
  out=$(PYTHONPATH=$tmp/nowhere CHECK_GPU_LOG=$tmp/log tests/check_gpu.sh --libraries "$tmp/prog" 2>&1)
  [ $? -ne 0 ] && grep -q "FAIL .*not found: libddpfake.so.1" <<<"$out"
  report "gpu_libs.check_gpu_names_a_missing_library" $? "$(tr '\n' ' ' <<<"$out" | head -c 400)"
else
  report "gpu_libs.check_gpu_finds_a_wheels_library" 1 "could not build the test library with cc"
fi
exit $fail
