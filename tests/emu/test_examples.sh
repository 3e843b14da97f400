#!/usr/bin/env bash
# tests/emu/test_examples.sh - the GPU builds of the examples and lessons on the CUDA
# emulator (NCCL between processes, each with its own emulated GPUs): hello_allreduce
# sums over 3 ranks, also when NCCL answers "in progress" to init and collectives at
# first (ddp.h must wait those out); bench_allreduce checks its sums; train_classifier on 4 ranks
# writes the very checkpoint its CPU build writes (the gradients are summed in rank
# order on both); bench_kernels runs at GPT-2 shapes in sampled-block mode (its numbers
# mean nothing there); every lesson's programs and solution run with 3 ranks on NCCL,
# and its exercise as handed out (HEAD's, from git) is built (tests/test_lessons.sh
# checks what the exercises say); outside a git checkout of its own, none is.
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
report() { # name ok why
  if [ "$2" -eq 0 ]; then echo "PASS emu.$1"; else echo "FAIL emu.$1: $3"; fail=1; fi
}
run() { # output-file program args...: in $tmp, within 200 s; the status
  local out=$1
  shift
  (cd "$tmp" && timeout 200 "$@" >"$out" 2>&1)
}
why() { echo "exit $1: $(grep -v OMP_NUM_THREADS "$tmp/$2" | tail -n 3 | tr '\n' ' ' | head -c 400)"; }

E=$root/build/emu/examples
run hello.txt "$E/hello_allreduce_gpu" --nproc 3
rc=$?
[ $rc -eq 0 ] && grep -q '^sum 6, expected 6, world 3, backend nccl$' "$tmp/hello.txt"
report "hello_allreduce_gpu sums over 3 ranks on NCCL" $? "$(why $rc hello.txt)"

# NCCL's non-blocking answers: init and every collective say "in progress" for 5 polls
DDP_EMU_NCCL_INPROGRESS=5 run hello5.txt "$E/hello_allreduce_gpu" --nproc 3
rc=$?
[ $rc -eq 0 ] && grep -q '^sum 6, expected 6, world 3, backend nccl$' "$tmp/hello5.txt"
report "hello_allreduce_gpu waits out NCCL's in-progress answers (DDP_EMU_NCCL_INPROGRESS=5)" $? "$(why $rc hello5.txt)"

run bench.txt "$E/bench_allreduce_gpu" --nproc 2 --iters 2 --max-bytes 1048576
rc=$?
[ $rc -eq 0 ] && grep -q 'backend nccl' "$tmp/bench.txt" && [ "$(grep -c ' ok$' "$tmp/bench.txt")" -eq 9 ] &&
  ! grep -q FAIL "$tmp/bench.txt"
report "bench_allreduce_gpu checks 9 sizes on 2 ranks" $? "$(why $rc bench.txt)"

args="--nproc 4 --batch-size 8 --epochs 3 --seed 1"
run clf_gpu.txt "$E/train_classifier_gpu" $args --out gpu.bin
rc=$?
run clf_cpu.txt "$root/examples/train_classifier" $args --out cpu.bin
[ $rc -eq 0 ] && [ -s "$tmp/gpu.bin" ] && cmp -s "$tmp/gpu.bin" "$tmp/cpu.bin" &&
  [ "$(grep '^epoch 2 ' "$tmp/clf_gpu.txt")" = "$(grep '^epoch 2 ' "$tmp/clf_cpu.txt")" ]
report "train_classifier_gpu on 4 ranks writes the CPU build's checkpoint" $? "$(why $rc clf_gpu.txt) | CPU: $(why 0 clf_cpu.txt)"

DDP_EMU_SAMPLE=1 DDP_EMU_FILL_LIMIT=0 run kernels.txt "$E/bench_kernels"
rc=$?
[ $rc -eq 0 ] && [ "$(grep -c '% of \(copy\|gemm\)$' "$tmp/kernels.txt")" -eq 24 ]
report "bench_kernels runs every layer at GPT-2 shapes (sampled blocks)" $? "$(why $rc kernels.txt)"

for dir in examples/lessons/[0-9]*/; do
  lesson=$(basename "$dir")
  for src in "$dir"*.c; do
    base=$(basename "$src" .c)
    bin=$root/build/emu/${src%.c}_gpu
    if [ "$base" = exercise ] && [ -n "$(git rev-parse --show-cdup 2>/dev/null || echo no)" ]; then
      echo "SKIP emu.lessons.$lesson.exercise_gpu: not a git checkout, so the exercise as handed out is not known"
      continue
    fi
    if [ ! -x "$bin" ]; then report "lessons.$lesson.${base}_gpu" 1 "$bin is not built (make emu)"; continue; fi
    [ "$base" = exercise ] && continue # built; as handed out it fails on purpose
    DDP_DEBUG=1 run lesson.txt "$bin" --nproc 3 # DDP_DEBUG: each rank says which backend it took
    rc=$?
    [ $rc -eq 0 ] && [ "$(grep -c ': backend nccl' "$tmp/lesson.txt")" -ge 3 ]
    report "lessons.$lesson.${base}_gpu runs with 3 ranks on NCCL" $? "$(why $rc lesson.txt)"
  done
done
exit $fail
