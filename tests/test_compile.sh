#!/usr/bin/env bash
# ddp.h compiles clean in every way a user may include it: C99, C++11, nvcc, gcc with
# NCCL, DDP_STATIC in two files, API in one file and implementation in another, the
# header before and after the implementation define; both headers under clang too.
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
CUDA=${CUDA_HOME:-/usr/local/cuda}
check() { # name command...
  local name=$1; shift
  if "$@" >"$tmp/log" 2>&1; then echo "PASS compile.$name"; else echo "FAIL compile.$name: $(head -c 400 "$tmp/log" | tr '\n' ' ')"; fail=1; fi
}
impl='#define DDP_IMPLEMENTATION
#include "ddp.h"'
main='int main(void) { ddp_ctx c; if (ddp_init(&c, 0) != DDP_OK) return 1; ddp_destroy(&c); return 0; }'
printf '%s\n%s\n' "$impl" "$main" > "$tmp/one.c"
cp "$tmp/one.c" "$tmp/one.cpp"
cp "$tmp/one.c" "$tmp/one.cu"
check c99 cc -std=c99 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/one.c" -o "$tmp/c99" -lpthread
check c99_runs "$tmp/c99"
check cxx11 c++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/one.cpp" -o "$tmp/cxx" -lpthread
check cxx11_runs "$tmp/cxx"
# the examples' safetensors.h alone, first in a C99 file (realpath was hidden by POSIX alone)
printf '#include "safetensors.h"\nint main(void) { return 0; }\n' > "$tmp/st.c"
check safetensors_h_alone_c99 cc -std=c99 -Wall -Wextra -Wpedantic -Werror -Iexamples "$tmp/st.c" -o "$tmp/st"
# C++ zero-initialises the descriptors with {} (the C idiom {0} trips -Wmissing-field-initializers)
printf '%s\nint main(void) { ddp_desc d = {}; ddp_grad_desc g = {}; ddp_sampler_desc s = {}; (void)g; (void)s; ddp_ctx c; if (ddp_init(&c, &d) != DDP_OK) return 1; ddp_destroy(&c); return 0; }\n' "$impl" > "$tmp/desc.cpp"
check cxx11_desc_braces c++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/desc.cpp" -o "$tmp/desc" -lpthread
if command -v nvcc >/dev/null; then
  check nvcc nvcc -arch=sm_90 -std=c++17 -Werror all-warnings -Xcompiler -Wall,-Wextra -I. "$tmp/one.cu" -o "$tmp/nv" -lnccl
  check gcc_with_nccl cc -std=c99 -Wall -Wextra -Wpedantic -Werror -DDDP_NCCL -I. -isystem "$CUDA/include" "$tmp/one.c" \
        -o "$tmp/gn" -L"$CUDA/lib64" -L"$CUDA/lib" -lcudart -lnccl -lpthread
else
  echo "SKIP compile.nvcc: nvcc not found"
fi
# DDP_STATIC: two files each with a private copy link together
printf '#define DDP_STATIC\n%s\nint other(void) { return ddp_is_main(0) ; }\n' "$impl" | sed 's/ddp_is_main(0)/(int)ddp_dtype_size(DDP_F32)/' > "$tmp/s1.c"
printf '#define DDP_STATIC\n%s\nint other(void);\nint main(void) { return other() == 4 && ddp_dtype_size(DDP_F64) == 8 ? 0 : 1; }\n' "$impl" > "$tmp/s2.c"
check static_two_files cc -std=c99 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/s1.c" "$tmp/s2.c" -o "$tmp/st" -lpthread
check static_runs "$tmp/st"
# API in one file, implementation in another
printf '#include "ddp.h"\nint other(void) { return (int)ddp_dtype_size(DDP_BF16); }\n' > "$tmp/a1.c"
printf '%s\nint other(void);\nint main(void) { return other() == 2 ? 0 : 1; }\n' "$impl" > "$tmp/a2.c"
check api_and_impl_files cc -std=c99 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/a1.c" "$tmp/a2.c" -o "$tmp/ai" -lpthread
# the header before and after the implementation define
printf '#include "ddp.h"\n#include <stdio.h>\n%s\n%s\n' "$impl" "$main" > "$tmp/twice.c"
check included_twice_gnu99 cc -std=gnu99 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/twice.c" -o "$tmp/tw" -lpthread
check included_twice_c99_gnu_source cc -std=c99 -D_GNU_SOURCE -Wall -Wextra -Wpedantic -Werror -I. "$tmp/twice.c" -o "$tmp/tw2" -lpthread
# strict C99 with another header first cannot work: the error must say why
if cc -std=c99 -Werror -I. "$tmp/twice.c" -o "$tmp/tw3" >"$tmp/log" 2>&1; then
  echo "FAIL compile.strict_c99_explains: compiled, but POSIX declarations should be missing"; fail=1
elif grep -q "before any other header" "$tmp/log"; then echo "PASS compile.strict_c99_explains"
else echo "FAIL compile.strict_c99_explains: $(head -c 300 "$tmp/log")"; fail=1; fi
# another system (simulated by undefining __linux__): the first error says what is needed
if cc -std=c99 -U__linux__ -I. -c "$tmp/one.c" -o "$tmp/nl.o" >"$tmp/log" 2>&1; then
  echo "FAIL compile.non_linux_explains: compiled without __linux__"; fail=1
elif grep -m1 'error' "$tmp/log" | grep -q "Linux only"; then echo "PASS compile.non_linux_explains"
else echo "FAIL compile.non_linux_explains: $(head -c 300 "$tmp/log")"; fail=1; fi
# the kernels header: its CPU half is plain C and C++
printf '#include "ddp_kernels.cuh"\nint main(void) { return 0; }\n' > "$tmp/k.c"
cp "$tmp/k.c" "$tmp/k.cpp"
check kernels_c99 cc -std=c99 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/k.c" -o "$tmp/k" -lm
check kernels_cxx11 c++ -std=c++11 -Wall -Wextra -Werror -I. "$tmp/k.cpp" -o "$tmp/kx" -lm
# ddp_kernels.cuh's own usage line for the CPU half, on a program beside a copy of the header
line=$(grep -m 1 '^ *cc ' ddp_kernels.cuh | sed -e 's/^ *//' -e 's/ *(.*$//')
cp ddp_kernels.cuh "$tmp/"
printf '#include "ddp_kernels.cuh"\nint main(void) { float x[4] = {1, 2, 3, 4}, o[4], m, r; ddp_layernorm_forward_cpu(o, &m, &r, x, x, x, 1, 1, 4); return m == 2.5f ? 0 : 1; }\n' > "$tmp/prog.c"
check kernels_usage_line_cpu sh -c "cd '$tmp' && $line -o prog && ./prog"
# clang (macOS's compiler and many a Linux project's): both headers warning-free as C99 and
# C++11, the kernels' matmul in each x86 instruction set's intrinsics
if command -v clang >/dev/null && command -v clang++ >/dev/null; then
  check clang_c99 clang -std=c99 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/one.c" -o "$tmp/cl" -lpthread
  check clang_c99_runs "$tmp/cl"
  check clang_cxx11 clang++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/one.cpp" -o "$tmp/clx" -lpthread
  check clang_kernels_cxx11 clang++ -std=c++11 -Wall -Wextra -Werror -I. "$tmp/k.cpp" -o "$tmp/clk" -lm
  if [ "$(uname -m)" = x86_64 ]; then
    for arch in x86-64-v2 x86-64-v3 x86-64-v4; do
      check "clang_kernels_c99_$arch" clang -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -march=$arch -fopenmp -I. \
        -c tests/test_kernels.c -o "$tmp/clk_$arch.o"
    done
  fi
else
  echo "SKIP compile.clang: clang not found"
fi
exit $fail
