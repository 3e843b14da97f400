#!/usr/bin/env bash
# Every lesson under examples/lessons/: its pages in English and Chinese, its Makefile
# (make in the folder works from the root), its programs run with 3 ranks (a world
# that divides nothing evenly) and exit 0, its solution passes examples/lessons/check.sh
# (1 to 7 ranks). The exercise is checked *as handed out*: the committed one, from git,
# compiled in a temporary directory, so that a student's exercise, solved or half done,
# changes nothing here. It must fail the same check with a first hint, in English, in
# Chinese under LANG=zh_CN.UTF-8, and give the second hint with HINT=2. The Chinese pages
# may not break a line between two Chinese characters (Markdown shows it as a space),
# quote Chinese text with ASCII quotes, or write 规约 for 归约. Lesson 5's checkpoint
# --resume refuses bad files with rank 0's reason; lesson 7's restart, its last rank
# killed, is restarted and ends with the bits of a run that never stopped. Then the pictures' sources:
# gradsync --trace writes a Chrome trace that python's json loads, with a process per
# rank and buckets on the collectives row, and the committed scripts draw it and the job
# diagram (where matplotlib is installed). Programs run in a temporary directory, where
# lessons 5 and 7 write their checkpoints.
cd "$(dirname "$0")/.." || exit 1
root=$PWD
. tests/lib.sh
export OMP_NUM_THREADS=1 # the lessons use no OpenMP: keeps the launcher's note out of the outputs
unset LC_ALL LC_MESSAGES HINT
export LANG=C # English messages, whatever the caller's locale (the Chinese ones are asked for below)
# The exercises as handed out are HEAD's, when this is a git checkout of its own.
handed_out=""
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$root" ] && git rev-parse -q --verify HEAD >/dev/null; then
  handed_out=HEAD
fi
py=$(command -v python3)
clang=$(command -v clang)

# make emu (and so make test) builds the exercises as handed out, not the student's: in a
# clone of HEAD with this tree's Makefile, a half-done exercise changes nothing there.
if [ -n "$handed_out" ]; then
  clone=$tmp/clone
  copy=build/emu/src/examples/lessons/01_launch/exercise.c
  git clone -q "$root" "$clone" && cp Makefile "$clone/" && cp tests/emu/rewrite.pl "$clone/tests/emu/" &&
    printf '\nint half_done( {\n' >>"$clone/examples/lessons/01_launch/exercise.c" &&
    make -C "$clone" "$copy" >"$tmp/out" 2>&1 &&
    git show HEAD:examples/lessons/01_launch/exercise.c | perl tests/emu/rewrite.pl | cmp -s - "$clone/$copy"
  report "lessons.emu_builds_the_exercise_as_handed_out" $? \
    "$(tail -n 3 "$tmp/out" | tr '\n' ' ' | head -c 300) $(grep -c half_done "$clone/$copy" 2>&1) half_done in the copy"
  rm -rf "$clone"
else
  echo "SKIP lessons.emu_builds_the_exercise_as_handed_out: not a git checkout"
fi

# make in a lesson's folder works where the repository's path has a space in it
spaced="$tmp/with space"
mkdir -p "$spaced/examples" "$spaced/tests" && cp Makefile ddp.h ddp_kernels.cuh "$spaced/" &&
  cp tests/README.md "$spaced/tests/" && cp -r examples/lessons "$spaced/examples/" &&
  make -n -C "$spaced/examples/lessons/01_launch" >"$tmp/make" 2>&1 &&
  grep -q '^examples/lessons/check.sh examples/lessons/01_launch/exercise$' "$tmp/make"
report "lessons.make_in_a_folder_whose_path_has_a_space" $? "$(tail -n 3 "$tmp/make" | tr '\n' ' ')"
rm -rf "$spaced"

for dir in examples/lessons/[0-9]*/; do
  dir=${dir%/}
  lesson=$(basename "$dir")
  n=${lesson%%_*}
  n=${n#0}
  name=lessons.$lesson
  [ -s "$dir/README.md" ] && [ -s "$dir/README.zh.md" ] && [ -s "$dir/exercise.c" ] && [ -s "$dir/solution.c" ] &&
    [ -s "$dir/Makefile" ]
  report "$name: README.md, README.zh.md, exercise.c, solution.c, Makefile" $? "one is missing"
  make -n -C "$dir" >"$tmp/make" 2>&1 && grep -q "check.sh $dir/exercise" "$tmp/make"
  report "$name/make in the folder checks the exercise from the root" $? "$(tail -n 3 "$tmp/make" | tr '\n' ' ')"

  for src in "$dir"/*.c; do
    bin=${src%.c}
    base=$(basename "$bin")
    [ "$base" = exercise ] && continue
    if [ ! -x "$bin" ]; then report "$name/$base" 1 "$bin is not built (make lessons)"; continue; fi
    if [ "$base" = solution ]; then
      (cd "$tmp" && "$root/examples/lessons/check.sh" "$root/$bin" >"$tmp/out" 2>&1)
      rc=$?
      [ $rc -eq 0 ] && grep -q "^lesson $n: correct with 1, 2, 3, 4, 5 and 7 ranks" "$tmp/out"
      report "$name/solution is correct with 1 to 7 ranks" $? "exit $rc: $(tail -n 4 "$tmp/out" | tr '\n' ' ' | head -c 400)"
      continue
    fi
    args="--nproc 3"
    [ "$base" = speedup ] && args="$args --epochs 1" # the measurement itself takes a while
    # shellcheck disable=SC2086 # $args is a word list
    (cd "$tmp" && timeout 120 "$root/$bin" $args >"$tmp/out" 2>&1)
    rc=$?
    report "$name/$base runs with 3 ranks" $rc "exit $rc: $(tail -n 3 "$tmp/out" | tr '\n' ' ' | head -c 400)"
  done

  if [ -z "$handed_out" ]; then
    echo "SKIP $name/exercise as handed out: not a git checkout, so the exercise as handed out cannot be told from yours"
    continue
  fi
  src=$tmp/src/$lesson
  mkdir -p "$src"
  for f in $(git ls-tree --name-only "$handed_out" examples/lessons/ | grep '\.h$'); do
    git show "$handed_out:$f" >"$tmp/src/$(basename "$f")"
  done
  if ! git show "$handed_out:$dir/exercise.c" >"$src/exercise.c" 2>"$tmp/out"; then
    report "$name/exercise as handed out" 1 "not in git: $(head -c 300 "$tmp/out")"
    continue
  fi
  if ! grep -q TODO "$src/exercise.c"; then
    echo "SKIP $name/exercise as handed out: the committed exercise.c has no TODO left (a solved one was committed)"
    continue
  fi
  # -O0: three times quicker to build than make's -O2, and it behaves the same
  ${CC:-cc} -std=c99 -Wall -Wextra -Wpedantic -Werror -O0 -I"$root" "$src/exercise.c" -o "$src/exercise" -lpthread -lm \
    >"$tmp/out" 2>&1
  report "$name/exercise as handed out compiles" $? "$(head -c 400 "$tmp/out")"
  # clang warns about what gcc lets pass (an unused static inline function)
  if [ -n "$clang" ]; then
    "$clang" -std=c99 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$root" "$src/exercise.c" >"$tmp/out" 2>&1
    report "$name/exercise as handed out compiles with clang" $? "$(head -c 400 "$tmp/out")"
  fi
  [ -x "$src/exercise" ] || continue
  # check.sh names the lesson after the exercise's folder
  (cd "$tmp" && "$root/examples/lessons/check.sh" "$src/exercise" >"$tmp/en" 2>&1)
  rc=$?
  [ $rc -eq 1 ] && grep -q '^wrong: ' "$tmp/en" && grep -q '^hint 1: ' "$tmp/en" && ! grep -q '^hint 2: ' "$tmp/en" &&
    grep -q "make lesson-$n HINT=2" "$tmp/en" && grep -q "^lesson $n: not yet" "$tmp/en"
  report "$name/exercise as handed out is wrong, with a first hint" $? "exit $rc: $(tr '\n' ' ' <"$tmp/en" | head -c 500)"
  (cd "$tmp" && LANG=zh_CN.UTF-8 HINT=2 "$root/examples/lessons/check.sh" "$src/exercise" >"$tmp/zh" 2>&1)
  rc=$?
  [ $rc -eq 1 ] && grep -q '^错误：' "$tmp/zh" && grep -q '^提示 1：' "$tmp/zh" && grep -q '^提示 2：' "$tmp/zh" &&
    grep -q "^第 $n 课：还没做对" "$tmp/zh"
  report "$name/exercise as handed out, in Chinese and with HINT=2" $? "exit $rc: $(tr '\n' ' ' <"$tmp/zh" | head -c 500)"
  # run by hand, with one rank, where the work of many cannot go wrong: a "correct" there says so
  (cd "$tmp" && timeout 60 "$src/exercise" >"$tmp/one" 2>&1)
  ! grep -q '^correct: ' "$tmp/one" || grep -q "^(one rank only: .*make lesson-$n checks 1 to 7 ranks)$" "$tmp/one"
  report "$name/exercise as handed out, run alone: a \"correct\" says that one rank shows little" $? \
    "$(tr '\n' ' ' <"$tmp/one" | head -c 300)"
done
# The checker against wrong answers a student could write, each made from a solution
# with sed: it says "not yet" and what was wrong, never "correct". Exit status 0 alone is
# no verdict (a return before main's check), a run may not leave processes behind (they
# are stopped), lesson 1's pieces must be even and by rank, not local rank, lesson 2's answer right on every rank,
# lesson 4's layers handed over as backward finishes them (the overlap), not at the end,
# and lesson 5's weights known only from rank 0's file.
# A right answer written another way (lesson 2's counts in float) is "correct".
variant() { # lesson-folder what sed-edit: $tmp/wrong/<lesson>/exercise built from the solution, or a FAIL
  local dir=examples/lessons/$1 w=$tmp/wrong/$1
  mkdir -p "$w"
  sed "$3" "$dir/solution.c" >"$w/exercise.c"
  if cmp -s "$dir/solution.c" "$w/exercise.c"; then report "lessons.checker: $2" 1 "the edit changed nothing"; return 1; fi
  if ! ${CC:-cc} -std=c99 -D_DEFAULT_SOURCE -Wall -Wextra -Werror -O0 -I"$root" -I"$root/$dir" "$w/exercise.c" \
      -o "$w/exercise" -lpthread -lm >"$tmp/out" 2>&1; then
    report "lessons.checker: $2" 1 "does not build: $(head -c 300 "$tmp/out")"
    return 1
  fi
}
wrong_answer() { # lesson-folder what sed-edit expected-line(grep -E)
  local w=$tmp/wrong/$1 rc left
  variant "$1" "$2" "$3" || return
  (cd "$tmp" && "$root/examples/lessons/check.sh" "$w/exercise" >"$tmp/out" 2>&1)
  rc=$?
  left=$(ps -eo args | grep -c "^$w/exercise")
  [ $rc -eq 1 ] && grep -q "^lesson ${1:1:1}: not yet" "$tmp/out" && grep -Eq "$4" "$tmp/out" && [ "$left" -eq 0 ]
  report "lessons.checker: $2: not yet" $? "exit $rc, $left processes left: $(tr '\n' ' ' <"$tmp/out" | head -c 500)"
}
right_answer() { # lesson-folder what sed-edit: a right answer written another way is correct
  local w=$tmp/wrong/$1 rc
  variant "$1" "$2" "$3" || return
  (cd "$tmp" && "$root/examples/lessons/check.sh" "$w/exercise" >"$tmp/out" 2>&1)
  rc=$?
  [ $rc -eq 0 ] && grep -q "^lesson ${1:1:1}: correct" "$tmp/out"
  report "lessons.checker: $2: correct" $? "exit $rc: $(tr '\n' ' ' <"$tmp/out" | head -c 500)"
}
wrong_answer 01_launch "every rank returns 0 before the verdict" \
  's|^\( *\)for (ok = inside|\1ddp_destroy(\&ctx);\n\1return 0;\n&|' 'printed no verdict'
wrong_answer 01_launch "the right pieces, and a child of rank 1 left running" \
  's|^\( *\)\*end = (ctx->rank + 1) \* N / ctx->world_size;|&\n\1if (ctx->rank == 1 \&\& fork() == 0) { sleep(1000); _exit(0); }|; s|^#include <stdio.h>|&\n#include <unistd.h>|' \
  'left processes running'
wrong_answer 01_launch "the last rank takes the rest (4 ranks: 2, 2, 2, 4)" \
  's|ctx->rank \* N / ctx->world_size;|ctx->rank * (N / ctx->world_size);|; s|(ctx->rank + 1) \* N / ctx->world_size;|ctx->rank + 1 == ctx->world_size ? N : (ctx->rank + 1) * (N / ctx->world_size);|' \
  '^  uneven: a piece of 4 items beside one of 2'
wrong_answer 01_launch "pieces by local rank (right on one host)" \
  's|ctx->rank \* N|ctx->local_rank * N|; s|(ctx->rank + 1) \* N|(ctx->local_rank + 1) * N|' \
  '^lesson 1: not yet: the run above, 4 ranks on two simulated hosts, went wrong'
wrong_answer 02_allreduce "the right accuracy on rank 0 only" \
  's|return 100 \* n\[0\] / n\[1\];|return ctx->rank == 0 ? 100 * n[0] / n[1] : 100 * correct / seen;|' \
  '^  rank 1: .*gave 80.0000 %, wrong$'
right_answer 02_allreduce "the counts reduced in float" \
  's|double n\[2\];|float n[2];|; s|n, n, 2, DDP_F64|n, n, 2, DDP_F32|'
wrong_answer 04_gradsync "every layer handed over after backward (no overlap)" \
  's|return ddp_grad_ready(sync, (size_t)layer \* P, P);|(void)sync, (void)layer; return DDP_OK;|; s|{ return ddp_grad_finish(sync); }|{ return ddp_grad_all_reduce(sync); }|' \
  "^wrong: the weights are right, but layer 0's gradient was never marked"
wrong_answer 04_gradsync "backward_done() divides the summed gradient by the world size again" \
  's|{ return ddp_grad_finish(sync); }|{ ddp_result r = ddp_grad_finish(sync); size_t j; for (j = 0; j < D; j++) ((float *)sync->grads)[j] /= (float)sync->ctx->world_size; return r; }|' \
  '^hint 1: the gradient was summed over the ranks \(they agree\), then its size changed'
wrong_answer 04_gradsync "two layers to a bucket" \
  's|return P \* sizeof(float);|return 2 * P * sizeof(float);|' \
  '^hint 1: bucket_bytes\(\) returns 512 bytes, room for 2 layers of 256 bytes in a bucket'
wrong_answer 04_gradsync "each layer marks another layer's elements" \
  's|ddp_grad_ready(sync, (size_t)layer \* P, P)|ddp_grad_ready(sync, (size_t)(LAYERS - 1 - layer) * P, P)|' \
  "^wrong: the weights are right, but layer 0's gradient was marked ready in layer 3's layer_done"
wrong_answer 04_gradsync "odd ranks mark the layers in forward order (the verdict is the job's)" \
  's|{ return ddp_grad_ready(sync, (size_t)layer \* P, P); }|{ static int k; int l = getenv("RANK") \&\& atoi(getenv("RANK")) % 2 ? k % LAYERS : LAYERS - 1 - k % LAYERS; k++; (void)layer; return ddp_grad_ready(sync, (size_t)l * P, P); }|' \
  "^wrong: the weights are right, but layer 0's gradient was marked ready in layer 3's layer_done"
wrong_answer 05_metrics "every rank computes the saved weights instead of reading them" \
  's|return ddp_broadcast(ctx, w, P, DDP_F32, 0, NULL);|{ int j; for (j = 0; j < P; j++) w[j] = 0.25f * (float)j - 0.5f; } return DDP_OK;|' \
  "^wrong: these ranks' weights differ from the checkpoint's: rank 0 by"
wrong_answer 07_restart "the momentum read back on rank 0 only" \
  's|^ *if (ddp_broadcast(ctx, r->v, 2, DDP_F32, 0, NULL) != DDP_OK) return DDP_ERR_SYSTEM;||' \
  "^wrong: rank 0 holds the saved run after load_checkpoint\\(\\), these ranks do not: rank 1 by"
wrong_answer 07_restart "the step saved but not read back (the run starts over from the checkpoint's weights)" \
  's|\(fread(r->v, sizeof(float), 2, f) == 2\) \&\&$|\1;|; s|^ *fread(\&r->step, sizeof r->step, 1, f) == 1;||' \
  "^wrong: after load_checkpoint\\(\\) these ranks' runs differ from the saved one \\(rank 0 holds step 0, saved 11;"

# Lesson 5's page: its restart demo, run as printed (the checkpoints in $tmp), kills a rank
# of the job mid-run, which comes back and ends with the bits of the run that never
# stopped; the Chinese page shows the same commands.
demo() { sed -n '/^    make examples\/train_gpt$/,/^    cmp /{s/^    //; s/ *#.*//; p}' "$1"; }
demo examples/lessons/05_metrics/README.md | sed 's|^L=.*|L="$tmp"|' >"$tmp/demo.sh"
(export tmp; timeout 300 bash "$tmp/demo.sh" >"$tmp/demo.out" 2>&1)
rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <"$tmp/demo.sh")" -eq 10 ] &&
  grep -q '^ddp: rank [01] (pid [0-9]*) was killed by signal 9 .*restarting the job: attempt 2 of 4$' "$tmp/demo.out" &&
  grep -q "^resumed from $tmp/b.safetensors after step [1-5]0$" "$tmp/demo.out" && grep -q '^byte-identical$' "$tmp/demo.out"
report "lessons.05_metrics/README.md: the restart demo, as printed, kills a rank and ends byte-identical" $? \
  "exit $rc: $(tr '\n' ' ' <"$tmp/demo.out" | tail -c 600)"
cmp -s <(demo examples/lessons/05_metrics/README.md) <(demo examples/lessons/05_metrics/README.zh.md)
report "lessons.05_metrics/README.zh.md: the restart demo's commands are the English page's" $? \
  "$(diff <(demo examples/lessons/05_metrics/README.md) <(demo examples/lessons/05_metrics/README.zh.md) | head -c 300)"
rm -f "$tmp"/[ab].safetensors

# Lesson 7's restart: the last rank killed after 13 steps under --max-restarts 2; the job
# starts again, resumes from rank 0's checkpoint after step 10 and prints, step for step,
# the bits of the run that never stopped. Then a run with other settings refuses the file.
r7=$root/examples/lessons/07_restart/restart
rm -f "$tmp/restart.ckpt"
(cd "$tmp" && timeout 120 "$r7" --nproc 3 >"$tmp/whole" 2>&1)
rc=$?
rm -f "$tmp/restart.ckpt"
(cd "$tmp" && timeout 120 "$r7" --nproc 3 --max-restarts 2 --crash-at 13 >"$tmp/crashed" 2>&1)
rc=$((rc * 256 + $?))
grep '^step' "$tmp/whole" | tail -n 6 >"$tmp/whole.end"
grep '^step' "$tmp/crashed" | tail -n 6 >"$tmp/crashed.end"
[ $rc -eq 0 ] && grep -q '^ddp: rank 2 (pid [0-9]*) was killed by signal 9 .*restarting the job: attempt 2 of 3$' "$tmp/crashed" &&
  grep -q '^attempt 2: resumed from restart.ckpt at step 10$' "$tmp/crashed" && [ "$(wc -l <"$tmp/whole.end")" -eq 6 ] &&
  cmp -s "$tmp/whole.end" "$tmp/crashed.end" && grep -q '^done: 40 steps, w 3.0' "$tmp/whole" &&
  [ "$(grep '^done:' "$tmp/whole")" = "$(grep '^done:' "$tmp/crashed")" ]
report "lessons.07_restart/restart: a rank killed after 13 steps, restarted, ends with the bits of a run that never stopped" \
  $? "exit $rc: $(tr '\n' ' ' <"$tmp/crashed" | head -c 600)"
(cd "$tmp" && timeout 60 "$r7" --nproc 2 >"$tmp/out" 2>&1)
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] &&
  grep -q '^restart.ckpt: belongs to another run (40 steps, 3 ranks; this one: 40 steps, 2 ranks)' "$tmp/out"
report "lessons.07_restart/restart refuses another run's checkpoint in one line" $? "exit $rc: $(tr '\n' ' ' <"$tmp/out" | head -c 300)"
rm -f "$tmp/restart.ckpt"

# Lesson 5's checkpoint: resuming refuses what no run of it writes, with rank 0's
# one-line reason, which reaches the output before the launcher stops the job (8
# ranks, every time).
ckpt=$root/examples/lessons/05_metrics/checkpoint
resume_from() { # bytes (printf escapes) ranks: runs --resume in $tmp, output in $tmp/out
  printf "$1" >"$tmp/checkpoint.bin"
  (cd "$tmp" && timeout 60 "$ckpt" --nproc "$2" --resume >"$tmp/out" 2>&1)
}
for case in "a negative epoch|\373\377\377\377\000\000\200\077\000\000\200\077|says -5 epochs were done," \
            "epoch 2^31-1|\377\377\377\177\000\000\200\077\000\000\200\077|says 2147483647 epochs were done," \
            "a NaN weight|\001\000\000\000\000\000\300\177\000\000\200\077|w nan" \
            "a truncated file|\001\000\000\000\000\000|shorter than"; do
  IFS='|' read -r what bytes want <<<"$case"
  resume_from "$bytes" 3
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "^checkpoint.bin: .*$want" "$tmp/out"
  report "lessons.05_metrics/checkpoint --resume refuses $what" $? "exit $rc: $(grep -v OMP_NUM "$tmp/out" | tr '\n' ' ' | head -c 300)"
done
said=0
for _ in 1 2 3 4 5; do
  resume_from '\001\000\000\000\000\000' 8
  grep -q '^checkpoint.bin: shorter than' "$tmp/out" && said=$((said + 1))
done
[ $said -eq 5 ]
report "lessons.05_metrics/checkpoint with 8 ranks: rank 0's reason is in the output every time" $? "in $said of 5 runs"

# The programs refuse a bad argument in one line (not one a rank) with status 2, before
# anything runs: a mistyped --resume does not train from scratch over checkpoint.bin.
printf 'kept' >"$tmp/checkpoint.bin"
for case in "05_metrics/checkpoint --epochs abc" "05_metrics/checkpoint --epochs 0" "05_metrics/checkpoint --resum" \
            "05_metrics/checkpoint --epochs" "04_gradsync/gradsync --trce t.json" "06_speedup/speedup --epochs 0" \
            "07_restart/restart --crash-at -1" "07_restart/restart --save-every 0"; do
  # shellcheck disable=SC2086 # $case is a word list
  (cd "$tmp" && timeout 60 "$root/examples/lessons/"$case --nproc 3 >"$tmp/out" 2>&1)
  rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/out")" -eq 1 ] && [ "$(cat "$tmp/checkpoint.bin")" = kept ]
  report "lessons.bad_argument: $case --nproc 3: one line, status 2" $? "exit $rc: $(tr '\n' ' ' <"$tmp/out" | head -c 300)"
done
rm -f "$tmp/checkpoint.bin"

if [ -z "$py" ]; then echo "SKIP lessons.chinese_pages and the pictures: no python3"; exit $fail; fi
# Chinese pages: a line break between two Chinese characters (or full-width punctuation)
# shows as a space; ASCII quotes around Chinese; 规约 (the standard term is 归约).
"$py" - $(find . -name '*.zh.md' -not -path './.git/*' | sort) <<'PY'
import re, sys
cjk = "\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef"
bad = []
for path in sys.argv[1:]:
    lines, code = open(path, encoding="utf-8").read().split("\n"), False
    for i, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            code = not code
        if code or line.startswith("    "):
            continue
        text = re.sub(r"`[^`]*`", "", line)
        nxt = lines[i].lstrip() if i < len(lines) else ""
        if re.search("[%s]$" % cjk, line) and re.match("[%s]" % cjk, nxt):
            bad.append("%s:%d: a line break between Chinese characters" % (path, i))
        if re.search('"[%s]|[%s]"' % (cjk, cjk), text):
            bad.append("%s:%d: ASCII quotes around Chinese text" % (path, i))
        if "规约" in text:
            bad.append("%s:%d: 规约 (write 归约)" % (path, i))
n = len(sys.argv) - 1
if bad or n == 0:
    print("FAIL lessons.chinese_pages: %s" % ("; ".join(bad[:8]) or "no .zh.md found"))
    sys.exit(1)
print("PASS lessons.chinese_pages: %d pages, no line break between Chinese characters, no ASCII quotes, 归约" % n)
PY
[ $? -eq 0 ] || fail=1

(cd "$tmp" && "$root/examples/lessons/04_gradsync/gradsync" --nproc 2 --trace trace.json >/dev/null 2>&1 &&
  "$root/examples/lessons/01_launch/ranks" --nproc 3 >ranks.txt 2>&1)
"$py" - "$tmp/trace.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["args"]["name"] for e in ev if e["name"] == "process_name"}
spans = [e for e in ev if e["ph"] == "X"]
ok = names == {"rank 0", "rank 1"} and all(e["dur"] >= 0 and {"pid", "tid", "ts"} <= set(e) for e in spans)
buckets = {e["pid"] for e in spans if e["tid"] == 1 and e["name"].startswith("bucket ")}
backward = {e["pid"] for e in spans if e["tid"] == 0 and e["name"].startswith("backward layer ")}
if ok and buckets == backward == {0, 1}:
    print("PASS lessons.gradsync_trace: Chrome trace JSON, 2 ranks, backward spans and buckets on each")
else:
    sys.exit("FAIL lessons.gradsync_trace: processes %s, ranks with buckets %s, with backward %s" % (names, buckets, backward))
PY
[ $? -eq 0 ] || fail=1
# without matplotlib the scripts say so in one line, with how to install it
for script in examples/lessons/04_gradsync/draw_trace.py examples/lessons/01_launch/draw_job.py; do
  out=$("$py" -c 'import runpy, sys; sys.modules["matplotlib"] = None; sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")' "$script" "$tmp/trace.json" "$tmp/none.png" 2>&1)
  rc=$?
  [ $rc -eq 1 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q 'matplotlib.*pip install matplotlib' <<<"$out"
  ok=$? # (before the name's $(...), which would set $? to its own status)
  report "lessons.$(basename "$script" .py)_without_matplotlib: one line on how to install it" $ok "exit $rc: $out"
done
if ! "$py" -c 'import matplotlib' 2>/dev/null; then
  echo "SKIP lessons.draw_scripts: python3 cannot import matplotlib"
else
  "$py" examples/lessons/04_gradsync/draw_trace.py "$tmp/trace.json" "$tmp/trace.png" >"$tmp/draw.txt" 2>&1 &&
    "$py" examples/lessons/01_launch/draw_job.py "$tmp/ranks.txt" "$tmp/job.png" >>"$tmp/draw.txt" 2>&1 &&
    [ -s "$tmp/trace.png" ] && [ -s "$tmp/job.png" ]
  report "lessons.draw_scripts: draw_trace.py and draw_job.py draw from real runs" $? "$(tail -n 3 "$tmp/draw.txt" | tr '\n' ' ')"
  # a wrong file, step or place to write: one line and status 1, not a traceback
  for case in "04_gradsync/draw_trace.py|$tmp/none.json $tmp/x.png|none.json: No such file or directory$" \
              "04_gradsync/draw_trace.py|$tmp/ranks.txt $tmp/x.png|ranks.txt is not a trace that ddp.h wrote" \
              "04_gradsync/draw_trace.py|$tmp/trace.json $tmp/x.png 999|STEP is a number from 0 to [0-9]*" \
              "04_gradsync/draw_trace.py|$tmp/trace.json $tmp/none/x.png|cannot write .*: No such file or directory$" \
              "01_launch/draw_job.py|$tmp/trace.json $tmp/x.png|trace.json is not what ranks --nproc N printed" \
              "01_launch/draw_job.py|$tmp/ranks.txt $tmp/none/x.png|cannot write .*: No such file or directory$" \
              "01_launch/draw_job.py||^usage: python3 draw_job.py " \
              "04_gradsync/draw_trace.py|$tmp/fifo $tmp/x.png|fifo is not a regular file$" \
              "01_launch/draw_job.py|$tmp/fifo $tmp/x.png|fifo is not a regular file$"; do
    IFS='|' read -r script args want <<<"$case"
    [ -p "$tmp/fifo" ] || mkfifo "$tmp/fifo" # (read until a writer came: for good)
    # shellcheck disable=SC2086 # $args is a word list
    out=$(timeout 20 "$py" "examples/lessons/$script" $args 2>&1)
    rc=$?
    [ $rc -eq 1 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "$want" <<<"$out"
    report "lessons.draw_scripts: $(basename "$script") ${args//$tmp\//} says what is wrong in one line" $? "exit $rc: $(head -c 300 <<<"$out")"
  done
fi
exit $fail
