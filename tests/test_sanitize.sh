#!/usr/bin/env bash
# tests/test_sanitize.sh - the examples and a few C tests built with AddressSanitizer and
# UndefinedBehaviorSanitizer (gcc's -fsanitize=address,undefined, leaks included) and run
# as users run them: several ranks through --nproc (the launcher is a process of its own),
# a checkpoint saved, resumed and compared, a log and a trace. Each run must exit 0 and
# print no sanitizer report: a leak on a path that succeeds turns the exit status to 1
# under LeakSanitizer, an out-of-bounds read or a signed overflow is a report. Then the
# multi-rank C tests under ThreadSanitizer: no data race.
cd "$(dirname "$0")/.." || exit 1
root=$PWD
. tests/lib.sh
cc=${CC:-cc}
if ! echo 'int main(void) { return 0; }' | "$cc" -x c -fsanitize=address,undefined - -o "$tmp/probe" 2>/dev/null ||
  ! "$tmp/probe"; then
  echo "SKIP sanitize: $cc cannot build or run with -fsanitize=address,undefined here"
  exit 0
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export OMP_NUM_THREADS=1
flags="-std=c99 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
built=""
for src in examples/train_gpt.c examples/train_classifier.c examples/bench_allreduce.c examples/hello_allreduce.c \
           tests/test_gradsync.c tests/test_sampler.c tests/test_mismatch.c; do
  name=$(basename "$src" .c)
  # two builds at a time: train_gpt alone takes about half a minute
  ( $cc $flags -fopenmp -I. -Itests "$src" -o "$tmp/$name" -lpthread -lm >"$tmp/$name.build" 2>&1 ||
      echo "$name" >>"$tmp/failed" ) &
  [ $(( $(jobs -r | wc -l) )) -ge 2 ] && wait -n
  built="$built $name"
done
wait
for name in $built; do
  grep -qx "$name" "$tmp/failed" 2>/dev/null
  [ $? -ne 0 ]
  report "sanitize.build_$name" $? "$(head -c 400 "$tmp/$name.build")"
done

clean_run() { # name dir program args...: exit 0 and no sanitizer report, output in $tmp/name.txt
  local name=$1 dir=$2 rc; shift 2
  (cd "$dir" && timeout 300 "$@" >"$tmp/$name.txt" 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] && ! grep -q 'Sanitizer\|runtime error:' "$tmp/$name.txt"
  report "sanitize.$name" $? "exit $rc: $(grep -m 3 -A 3 'Sanitizer\|runtime error:' "$tmp/$name.txt" | tr '\n' '|' |
    head -c 600)$(tail -n 2 "$tmp/$name.txt" | tr '\n' '|' | head -c 200)"
}
mkdir -p "$tmp/run"
cp examples/train_gpt.txt "$tmp/run/"
tiny="--layers 2 --heads 2 --dim 32 --ctx 16 --batch-size 2 --val-every 2 --sample-len 8"
clean_run hello_allreduce_3_ranks "$tmp/run" "$tmp/hello_allreduce" --nproc 3
clean_run bench_allreduce_3_ranks "$tmp/run" "$tmp/bench_allreduce" --nproc 3 --iters 2 --max-bytes 262144
clean_run train_classifier_3_ranks "$tmp/run" "$tmp/train_classifier" --nproc 3 --epochs 2 --save-every 1 --out c.st
clean_run train_classifier_resume_auto "$tmp/run" "$tmp/train_classifier" --nproc 3 --epochs 2 --resume auto \
  --out c.st
clean_run train_gpt_2_ranks "$tmp/run" "$tmp/train_gpt" --nproc 2 $tiny --steps 4 --stop-after 2 --save g.st \
  --log g.jsonl --trace g.json
clean_run train_gpt_resume "$tmp/run" "$tmp/train_gpt" --nproc 2 $tiny --steps 4 --resume g.st --save g.st --log g.jsonl
clean_run train_gpt_nothing_left "$tmp/run" "$tmp/train_gpt" --nproc 2 $tiny --steps 4 --resume auto --save g.st
clean_run train_gpt_2_steps "$tmp/run" "$tmp/train_gpt" --nproc 2 $tiny --steps 2 --save g2.st
clean_run train_gpt_compare "$tmp/run" "$tmp/train_gpt" --compare g.st g.st
clean_run train_gpt_compare_different "$tmp/run" "$tmp/train_gpt" --compare g.st g2.st  # names the worst tensor
for name in test_gradsync test_sampler test_mismatch; do
  clean_run "$name" "$root" "$tmp/$name"
done
# ThreadSanitizer (-fsanitize=thread) on the tests whose ranks run ddp.h's threads together:
# the store's server, the async worker, gradient buckets, ddp_destroy beside the server (it
# wrote the listener's pause while the server read it unlocked)
if echo 'int main(void) { return 0; }' | "$cc" -x c -fsanitize=thread - -o "$tmp/tprobe" 2>/dev/null && "$tmp/tprobe"; then
  for name in test_collectives test_gradsync test_mismatch test_trace; do
    $cc -std=c99 -O1 -g -fsanitize=thread -I. -Itests "tests/$name.c" -o "$tmp/tsan_$name" -lpthread -lm \
      >"$tmp/tsan_$name.build" 2>&1
    report "sanitize.thread_build_$name" $? "$(head -c 400 "$tmp/tsan_$name.build")"
    [ -x "$tmp/tsan_$name" ] && clean_run "thread_$name" "$root" "$tmp/tsan_$name"
  done
  # ddp.h's NCCL backend on the CUDA emulator (make emu's rewritten sources): its watchdog
  # thread and the emulator's engine thread beside the caller's (the emulator's NCCL once
  # published a communicator to its engine before the caller's last write to it)
  if [ -f build/emu/src/tests/test_nccl.cu ] && command -v "${EMU_CXX:-g++}" >/dev/null; then
    emu_flags="-std=c++17 -O1 -g -fno-strict-aliasing -pthread -D__CUDACC__ -w -fsanitize=thread -Itests/emu"
    for m in emu emu_blas emu_nccl; do
      "${EMU_CXX:-g++}" $emu_flags -c "tests/emu/$m.cpp" -o "$tmp/tsan_$m.o" >>"$tmp/tsan_emu.build" 2>&1
    done
    "${EMU_CXX:-g++}" $emu_flags -Ibuild/emu/src -x c++ build/emu/src/tests/test_nccl.cu -x none "$tmp"/tsan_emu*.o \
      -o "$tmp/tsan_emu_nccl" -lrt >>"$tmp/tsan_emu.build" 2>&1
    report "sanitize.thread_build_emu_nccl" $? "$(head -c 400 "$tmp/tsan_emu.build")"
    for w in 1 2; do
      [ -x "$tmp/tsan_emu_nccl" ] && clean_run "thread_emu_nccl_w$w" "$root" env DDP_EMU_NCCL_CHUNK=65536 \
        "$tmp/tsan_emu_nccl" $w
    done
  else
    echo "SKIP sanitize.thread_emu_nccl: make emu has not written build/emu/src (or no ${EMU_CXX:-g++})"
  fi
else
  echo "SKIP sanitize.thread: $cc cannot build or run with -fsanitize=thread here"
fi
exit $fail
