#!/usr/bin/env bash
# tests/test_kernels.c built for each CPU path of ddp_kernels.cuh's matmul, with the
# flags users build with (-O3, multiply-adds fused where gcc sees them, as in its default
# gnu modes; the Makefile's -std=c99 alone turns that off): -march=native (what this machine
# runs), x86-64-v3 (AVX2 + FMA: the 6-row register tile in intrinsics) and x86-64-v4 (AVX-512: the
# 12 x 32 tile in intrinsics). Each must build clean with -Werror; each the CPU can run must pass
# every check (bit for bit across threads, batch splits and tile edges, as make test's build
# at -O2 for any x86-64 does). A path the CPU cannot run is built only, and says so;
# the AVX-512 tile also runs everywhere over tests/emu/avx512.h, its intrinsics in plain C
# (avx512-standin, at -O2: -O3 takes gcc four times as long over the plain-C intrinsics and
# checks the same logic), so that its logic is checked on CPUs without AVX-512 too.
# A build for any x86-64 (no -march: generic) takes the AVX2 tile at run time where the CPU
# has AVX2 and FMA (a 16-wide AVX-512 one where the CPU has AVX-512; generic-avx2 keeps the
# AVX2 tile there), and must pass the same checks; so must the plain C tile it falls back
# to (nodispatch: -DDDP_KERNELS_NO_DISPATCH). The matmuls' bits (test_kernels --digest)
# are the same in every build whose multiply-adds are fused, whatever its tile (native,
# x86-64-v3 and v4, the standin, generic and generic-avx2 on a CPU with FMA), and the plain C tile's a*b + c
# gives others (the digest can tell).
# And train_gpt built as a user's project builds it (gcc's defaults, -O3 -march=native;
# -O3 alone; and clang's, whose C contracts multiply-adds within a statement) keeps the
# world-size invariance: 1 x 8 and 2 x 4 sequences, the same weights; test_kernels.c under
# clang too. The thirteen builds run in two lanes (the machines we test on have 2 cores),
# then the programs.
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
case $(uname -m) in x86_64) ;; *) echo "SKIP kernels_isa: the x86-64 levels only (this is $(uname -m))"; exit 0 ;; esac
flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
has() { for f in "$@"; do case $flags in *" $f "*) ;; *) echo "$f"; return 1 ;; esac; done; }
standin="-DDDP__AVX512_STANDIN -include tests/emu/avx512.h"
# build NAME SOURCE FLAGS...: $tmp/NAME, or $tmp/NAME.log with the compiler's complaint
# (CC=clang for clang's builds)
build() {
  local n=$1 src=$2; shift 2
  ${CC:-cc} -fno-math-errno -fopenmp -I. "$@" "$src" -o "$tmp/$n" -lm 2>"$tmp/$n.log" || rm -f "$tmp/$n"
}
# clang with its OpenMP (libomp), else its checks skip
clang=$(printf '#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n' |
  clang -fopenmp -x c - -o "$tmp/omp" >/dev/null 2>&1 && "$tmp/omp" && echo clang)
kflags="-std=c99 -Wall -Wextra -Wpedantic -Werror"
gflags="-std=c99 -D_GNU_SOURCE -O2 -march=x86-64-v3"
( build k_avx512-standin tests/test_kernels.c $kflags -O2 -march=x86-64-v2 $standin
  build g_standin examples/train_gpt.c $gflags $standin
  build g_user examples/train_gpt.c -O3 -march=native
  build g_generic examples/train_gpt.c -O3
  [ -n "$clang" ] && CC=clang build k_clang tests/test_kernels.c $kflags -O3 -march=native ) &
for arch in native x86-64-v3 x86-64-v4; do build "k_$arch" tests/test_kernels.c $kflags -O3 -ffp-contract=fast -march=$arch; done
build k_generic tests/test_kernels.c $kflags -O3
build k_nodispatch tests/test_kernels.c $kflags -O3 -DDDP_KERNELS_NO_DISPATCH
build k_generic-avx2 tests/test_kernels.c $kflags -O3 -DDDP__NO_AVX512_DISPATCH
build g_avx2 examples/train_gpt.c $gflags
[ -n "$clang" ] && CC=clang build g_clang examples/train_gpt.c -O3 -march=native
wait
for arch in native x86-64-v3 x86-64-v4 avx512-standin generic generic-avx2 nodispatch ${clang:+clang}; do
  case $arch in
    x86-64-v3) need="avx2 fma bmi2" ;;
    x86-64-v4) need="avx512f avx512bw avx512cd avx512dq avx512vl" ;;
    *) need="" ;;
  esac
  if [ ! -x "$tmp/k_$arch" ]; then
    echo "FAIL kernels_isa.$arch.builds: $(head -c 400 "$tmp/k_$arch.log" | tr '\n' ' ')"; fail=1; continue
  fi
  echo "PASS kernels_isa.$arch.builds"
  if missing=$(has $need); then
    "$tmp/k_$arch" >"$tmp/out" 2>&1; rc=$?
    n=$(grep -c '^PASS ' "$tmp/out"); bad=$(grep '^FAIL ' "$tmp/out" | head -3 | tr '\n' ' ')
    if [ $rc -eq 0 ] && [ "$n" -gt 40 ] && [ -z "$bad" ]; then echo "PASS kernels_isa.$arch.runs ($n checks)"
    else echo "FAIL kernels_isa.$arch.runs: exit $rc, $n passed: $bad"; fail=1; fi
    "$tmp/k_$arch" --digest >"$tmp/digest_$arch" 2>&1
  else
    echo "SKIP kernels_isa.$arch.runs: this CPU lacks $missing (built only)"
  fi
done
# the matmuls' bits: one digest for every fused build that ran (generic where the CPU has FMA)
digest() { [ -s "$tmp/digest_$1" ] && cut -d' ' -f3 "$tmp/digest_$1"; }
fused="native x86-64-v3 x86-64-v4 avx512-standin ${clang:+clang}"
if missing=$(has avx2 fma); then fused+=" generic generic-avx2"; else echo "SKIP kernels_isa.generic_same_bits: this CPU lacks $missing"; fi
ref=$(digest x86-64-v3 || digest native) odd="" ran=""
for arch in $fused; do
  [ -s "$tmp/digest_$arch" ] || continue
  ran+="${ran:+, }$arch"
  [ "$(digest $arch)" = "$ref" ] || odd+=" $arch: $(cat "$tmp/digest_$arch")"
done
if [ -z "$ref" ]; then echo "FAIL kernels_isa.fused_same_bits: no digest from native or x86-64-v3"; fail=1
elif [ -n "$odd" ]; then echo "FAIL kernels_isa.fused_same_bits: $ref (x86-64-v3), but$odd"; fail=1
else echo "PASS kernels_isa.fused_same_bits ($ran: $ref)"; fi
if [ -n "$ref" ] && [ "$(digest nodispatch)" = "$ref" ]; then
  echo "FAIL kernels_isa.digest_sees_fusion: the plain C tile's a*b + c gave the fused builds' digest"; fail=1
elif [ -n "$(digest nodispatch)" ]; then echo "PASS kernels_isa.digest_sees_fusion"; fi
# the tiles agree to the bit: three steps of train_gpt on 2 ranks, its AVX2 tile against the
# AVX-512 one over the standin (both x86-64-v3, so every other loop is the same code), write
# the same checkpoint byte for byte
if missing=$(has avx2 fma); then
  ok=1
  for t in avx2 standin; do
    { [ -x "$tmp/g_$t" ] || { cat "$tmp/g_$t.log" >"$tmp/log"; false; }; } &&
      "$tmp/g_$t" --steps 3 --nproc 2 --val-every 0 --sample-len 0 --save "$tmp/$t.safetensors" >"$tmp/log" 2>&1 ||
      { echo "FAIL kernels_isa.tiles_same_bits: $t: $(tail -c 300 "$tmp/log" | tr '\n' ' ')"; ok=0; fail=1; }
  done
  if [ $ok = 1 ]; then
    if cmp -s "$tmp/avx2.safetensors" "$tmp/standin.safetensors"; then echo "PASS kernels_isa.tiles_same_bits"
    else echo "FAIL kernels_isa.tiles_same_bits: the AVX-512 tile's checkpoint differs from the AVX2 tile's"; fail=1; fi
  fi
else
  echo "SKIP kernels_isa.tiles_same_bits: this CPU lacks $missing"
fi
# the invariance under a user's flags (the Makefile's build is checked by test_train_gpt.sh)
world_size() { # NAME BUILD: 1 x 8 and 2 x 4 sequences train the same weights
  local name=$1 g=$tmp/$2 w d
  [ -x "$g" ] || { echo "FAIL kernels_isa.$name: does not build: $(head -c 300 "$g.log" | tr '\n' ' ')"; fail=1; return; }
  for w in 1 2; do
    "$g" --nproc $w --batch-size $((8 / w)) --ctx 32 --steps 4 --val-every 0 --sample-len 0 \
      --save "$tmp/$2_$w.safetensors" >"$tmp/log" 2>&1 ||
      { echo "FAIL kernels_isa.$name: --nproc $w: $(tail -c 300 "$tmp/log" | tr '\n' ' ')"; fail=1; return; }
  done
  d=$("$g" --compare "$tmp/$2_1.safetensors" "$tmp/$2_2.safetensors" 2>&1)
  if [ "$(cut -d' ' -f1-2 <<<"$d")" = "max_rel_diff 0.000e+00" ]; then echo "PASS kernels_isa.$name (1 x 8 and 2 x 4 the same)"
  else echo "FAIL kernels_isa.$name: 1 x 8 and 2 x 4 differ: $d"; fail=1; fi
}
world_size user_flags_world_size g_user
world_size generic_world_size g_generic
if [ -n "$clang" ]; then world_size clang_world_size g_clang
else echo "SKIP kernels_isa.clang: no clang with OpenMP (Debian: clang libomp-dev)"; fi
exit $fail
