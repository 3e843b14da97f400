#!/usr/bin/env bash
# tests/check_gpu.sh (make check-gpu) - every check that needs a real GPU, in one command
# that fits a lent GPU machine's 10-minute command with room to spare, ending in one
# table. Build beforehand on any machine with nvcc (make gpu-build) and carry the
# repository with its built examples/ and tests/ over: binaries run as they are; only
# missing ones are built, from the Makefile and both headers (nvcc there: minutes of the
# budget).
#
# Every step runs under its own timeout, and all of them within one budget
# (CHECK_GPU_BUDGET seconds, default 510): a step that would start with too little
# left is reported as not run, so the table always prints. Each step's time on an
# H200 (the first real run, 2026-12-04, 153 s in all) and its timeout:
#   libraries and probe                                            1 s   (30)
#   kernels vs CPU twins: small shapes, ~150 launches              2 s  (120)
#   NCCL, a world of one: ~300 collectives up to 8 MB              5 s  (120)
#   train_gpt_gpu vs the CPU twin: a tiny model, 4 runs            4 s  (120)
#   hello_allreduce_gpu; bench_allreduce_gpu, 4 KB-64 MB x 20    1+1 s (30, 60)
#   bench_kernels: ~30 kernels at GPT-2 124M B=8, 17 runs each     1 s  (90)
#   train_gpt_gpu, the default model, 30 steps                     2 s  (60)
#   GPT-2 124M B=8, 6 steps, bf16 and fp32 (6.1 TFLOP a step)    6+7 s  (90 each)
#   GPT-2 124M B=64, 3 steps, bf16: 3.3e9 logits (past 2^31), 56
#     TFLOP a step, ~28 GB of activations                          7 s (120)
#   GPT-2 124M at the unpadded vocabulary 50257, B=8, 3 steps,
#     bf16 (not yet run on a GPU; the emulator trains vocab 251-300)  ? s  (60)
#   compute-sanitizer memcheck, synccheck on the kernel tests    2+2 s  (90 each)
#   compute-sanitizer racecheck on the kernel tests               84 s (180)
#   the lessons' GPU builds, a world of one, program and solution 14 x 1-5 s (20 each)
# DDP_REQUIRE_GPU=1 turns every "no GPU" skip into a failure.
# Every step's output also goes to CHECK_GPU_LOG.
cd "$(dirname "$0")/.." || exit 1
shopt -s nullglob
budget=${CHECK_GPU_BUDGET:-510}
log=${CHECK_GPU_LOG:-/tmp/ddp-check-gpu.log}
deadline=$(( $(date +%s) + budget ))
out=$(mktemp)
rows=()
failed=""
trap 'rm -f "$out"' EXIT
export DDP_REQUIRE_GPU=1 DDP_CPU_TWIN=$PWD/tests/train_gpt_twin
: >"$log"

row() { rows+=("| $1 | $2 | $3 | ${4//|//} |"); } # step, result, seconds, detail

# step TIMEOUT CMD...: runs CMD under the smaller of TIMEOUT and what the budget has left
# (less a reserve for the table), its output to the terminal, the log and $out; sets rc
# (124: timed out; 255: not run) and secs
step() {
  local limit=$1 t0 left
  shift
  left=$(( deadline - $(date +%s) - 10 ))
  if [ "$left" -lt 5 ]; then
    rc=255 secs=0
    : >"$out"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "+ $* (timeout ${limit} s)" | tee -a "$log"
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" 2>&1 | tee "$out" | tee -a "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 137 ] && rc=124
  secs=$(( $(date +%s) - t0 ))
}

# verdict NAME DETAIL: a row from rc (and a failure for the end)
verdict() {
  local result
  case $rc in
    0) result=PASS ;;
    124) result="TIMEOUT after $secs s" ;;
    255) result="not run: the ${budget} s budget is spent" ;;
    *) result="FAIL (status $rc)" ;;
  esac
  [ "$rc" -ne 0 ] && failed="$failed, $1"
  row "$1" "$result" "$secs" "$2"
}

# ---- the binaries, the libraries they load, and the probe ----
bins="tests/train_gpt_twin"
for src in examples/*.c examples/*.cu examples/lessons/[0-9]*/*.c tests/test_*.cu; do
  case $src in # an exercise is the student's to finish: make lesson-N builds it
  examples/ddprun.c | */exercise.c) continue ;;
  *.c) bins="$bins ${src%.c}_gpu" ;;
  *.cu) bins="$bins ${src%.cu}" ;;
  esac
done
# build missing NAMES... (the probe first: without a GPU nothing else is worth building)
build() {
  local missing="" b
  for b in "$@"; do [ -x "$b" ] || missing="$missing $b"; done
  [ -z "$missing" ] && return
  echo "check-gpu: not built here:$missing; building them (make gpu-build beforehand, and carry examples/ and tests/, saves this)"
  step 300 make -j"$(nproc)" --no-print-directory $missing
  verdict "build$missing" "$(tail -n 1 "$out" | head -c 120)"
}

# PyTorch's wheels bring NCCL and cuBLAS (site-packages/nvidia/*/lib) where the system
# may have none: where the loader finds a library nowhere, a directory that has it
# joins LD_LIBRARY_PATH.
lib_dirs() {
  echo "${CUDA_HOME:-/usr/local/cuda}/lib64"
  python3 -c 'import glob, sys
print("\n".join(sorted({d for r in sys.path if r for d in glob.glob(r + "/nvidia/*/lib")})))' 2>/dev/null
}
not_found() { ldd "$@" 2>/dev/null | awk '/=> not found/ { print $1 }' | sort -u | tr '\n' ' ' | sed 's/ $//'; }
libraries() {
  local existing="" need still added="" b d lib libc
  for b in $bins; do [ -x "$b" ] && existing="$existing $b"; done
  # built on a newer system than this one: the loader refuses every binary (no library helps)
  libc=$(ldd $existing 2>&1 | sed -n "s/.*version \`\(GLIBC_[0-9.]*\)' not found.*/\1/p" | sort -uV | tail -n 1)
  if [ -n "$libc" ]; then
    failed="$failed, libraries"
    row libraries FAIL 0 "this system's C library is older than the binaries' $libc: build them on a system no newer than this one"
    return
  fi
  need=$(not_found $existing)
  [ -z "$need" ] && return
  for d in $(lib_dirs); do
    for lib in $need; do
      [ -e "$d/$lib" ] && [[ ":$added:" != *":$d:"* ]] && added="$added:$d"
    done
  done
  [ -n "$added" ] && export LD_LIBRARY_PATH="${added#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "check-gpu: the loader finds no $need; added to LD_LIBRARY_PATH: ${added#:}" | tee -a "$log"
  still=$(not_found $existing)
  if [ -n "$still" ]; then
    failed="$failed, libraries"
    row libraries FAIL 0 "not found: $still; looked in LD_LIBRARY_PATH, the loader's cache, $(lib_dirs | tr '\n' ' ')"
  else
    row libraries PASS 0 "$need from ${added#:}"
  fi
}
summary() {
  printf '\ncheck-gpu summary (every output: %s)\n| step | result | s | detail |\n|---|---|---|---|\n' "$log"
  printf '%s\n' "${rows[@]}"
}

if [ "${1-}" = --libraries ]; then # BIN...: this step alone (tests/test_gpu_libs.sh)
  shift
  bins="$*"
  libraries
  printf '%s\n' "${rows[@]}" "LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}"
  [ -z "$failed" ]
  exit
fi
build tests/test_gpu_probe
libraries
step 30 tests/test_gpu_probe
verdict "probe" "$(grep -m1 '^device 0:' "$out" || grep -m1 '^FAIL' "$out" | head -c 160)"
if [ "$rc" -ne 0 ]; then
  echo "check-gpu: FAILED: no usable GPU (the probe says why above)"
  summary
  exit 1
fi
build $bins
libraries

# ---- the GPU tests: kernels against their CPU twins, NCCL, train_gpt_gpu against the CPU ----
for t in tests/test_*.cu tests/test_*_gpu.sh; do
  t=${t%.cu}
  case $t in tests/test_gpu_probe | tests/test_check_gpu.sh) continue ;; esac # the probe ran; this script's own test needs no GPU
  step 120 tests/run.sh "$t"
  verdict "$t" "$(tail -n 1 "$out")"
done

# ---- runs: collectives, benchmarks, GPT-2 124M at B=8, and at B=64 past 2^31 logits ----
gpt2="--layers 12 --heads 12 --dim 768 --ctx 1024 --vocab 50304 --val-every 0 --sample-len 0"
run() { # name timeout detail-pattern cmd...
  local name=$1 limit=$2 pattern=$3
  shift 3
  step "$limit" "$@"
  verdict "$name" "$(grep -m1 -E "$pattern" "$out" | head -c 160)"
}
run hello_allreduce_gpu 30 '^sum' ./examples/hello_allreduce_gpu
run bench_allreduce_gpu 60 '67108864' ./examples/bench_allreduce_gpu --iters 20
run bench_kernels 90 '^ceilings' ./examples/bench_kernels
run "train_gpt_gpu, default model" 60 'after step 1' ./examples/train_gpt_gpu --steps 30 --val-every 10 --sample-len 64
run "GPT-2 124M B=8 bf16" 90 'after step 1' ./examples/train_gpt_gpu $gpt2 --batch-size 8 --steps 6 --dtype bf16
run "GPT-2 124M B=8 fp32" 90 'after step 1' ./examples/train_gpt_gpu $gpt2 --batch-size 8 --steps 6 --dtype fp32
# 64 x 1024 x 50304 = 3.3e9 logits: every index into them must be 64-bit; a NaN or
# infinite loss ends train_gpt with a non-zero status
run "GPT-2 124M B=64 bf16 (2^31+ logits)" 120 'step +3/3' ./examples/train_gpt_gpu $gpt2 --batch-size 64 --steps 3
# GPT-2's own vocabulary, not padded to 50304: rows of 50257 bf16 logits are only 2-byte
# aligned, where cuBLASLt may have no algorithm (the product then goes through
# cublasGemmEx) and every vectorized kernel must take its unaligned path
run "GPT-2 124M vocab 50257 (unpadded) B=8 bf16" 60 'step +3/3' ./examples/train_gpt_gpu ${gpt2/50304/50257} \
  --batch-size 8 --steps 3

# ---- compute-sanitizer on the kernel tests (the CUDA toolkit's: pip's
# nvidia-cuda-sanitizer-api holds the library, not the tool) ----
sanitizer=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}"/bin/compute-sanitizer \
  /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck synccheck racecheck; do
  name="compute-sanitizer $tool"
  if [ -z "$sanitizer" ]; then
    row "$name" SKIP 0 "compute-sanitizer not found (PATH, the CUDA toolkit's bin/)"
    continue
  fi
  step "$([ $tool = racecheck ] && echo 180 || echo 90)" "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 20 \
    tests/test_kernels_gpu
  # memcheck and synccheck end with "ERROR SUMMARY: N errors", racecheck with
  # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"
  errors=$(sed -n -e 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' -e 's/.*RACECHECK SUMMARY: .*(\([0-9]*\) error.*/\1/p' "$out" |
    tail -n 1)
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 255 ]; then
    verdict "$name" "${errors:-?} errors"
  elif [ -z "$errors" ]; then # the tool could not run here (gVisor: "Device not supported")
    row "$name" SKIP "$secs" "the tool did not run: $(grep -m1 -i 'error\|not supported' "$out" | head -c 140)"
  else
    rc=1
    verdict "$name" "$errors errors, or the test failed under the tool (the output above)"
  fi
done

# ---- the lessons' GPU builds, a world of one: each program and its solution ----
lessons=$(mktemp -d)
trap 'rm -rf "$out" "$lessons"' EXIT
for src in examples/lessons/[0-9]*/*.c; do
  case $src in */exercise.c) continue ;; esac
  b=${src%.c}_gpu
  step 20 env -C "$lessons" "$PWD/$b"
  verdict "${b#examples/}" "$(tail -n 1 "$out" | head -c 100)"
done

summary
awk '/% of (gemm|copy)$/ { printf "| bench_kernels %s | | | %s %s %s |\n", $1, $(NF - 2), $(NF - 1), $NF }' "$log"
if [ -n "$failed" ]; then echo "check-gpu: FAILED: ${failed#, }"; exit 1; fi
echo "check-gpu: every step passed"
