#!/usr/bin/env bash
# Every lesson under examples/lessons/: its pages exist in English and Chinese, its
# program and its solution run with 3 ranks (a world that divides nothing evenly) and
# exit 0, the solution says "correct", and the exercise, as handed out, fails with a
# "hint:" line. The Makefile builds them all (with cc, and with nvcc where present).
# They run in a temporary directory, where lesson 5 writes its checkpoint. Then the
# pictures' sources: gradsync --trace writes a Chrome trace that python's json loads,
# with a process per rank and buckets on the collectives row, and the committed
# scripts draw it and the job diagram (where matplotlib is installed).
cd "$(dirname "$0")/.." || exit 1
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
report() { # name ok why
  if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1: $3"; fail=1; fi
}
for dir in examples/lessons/[0-9]*/; do
  name=lessons.$(basename "$dir")
  [ -s "$dir/README.md" ] && [ -s "$dir/README.zh.md" ] && [ -s "$dir/exercise.c" ] && [ -s "$dir/solution.c" ]
  report "$name: README.md, README.zh.md, exercise.c, solution.c" $? "one is missing"
  for src in "$dir"*.c; do
    bin=${src%.c}
    base=$(basename "$bin")
    if [ ! -x "$bin" ]; then report "$name/$base" 1 "$bin is not built (make $bin)"; continue; fi
    (cd "$tmp" && timeout 120 "$root/$bin" --nproc 3 >"$tmp/out" 2>&1)
    rc=$?
    why="exit $rc: $(grep -v OMP_NUM_THREADS "$tmp/out" | tail -n 3 | tr '\n' ' ' | head -c 400)"
    case $base in
    exercise)
      [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q '^hint: ' "$tmp/out"
      report "$name/exercise fails with a hint, as handed out" $? "$why" ;;
    solution)
      [ $rc -eq 0 ] && grep -q '^correct' "$tmp/out"
      report "$name/solution runs and is correct" $? "$why" ;;
    *)
      [ $rc -eq 0 ]
      report "$name/$base runs with 3 ranks" $? "$why" ;;
    esac
  done
done
# Lesson 5's checkpoint: resuming refuses what no run of it writes, with rank 0's
# one-line reason, which reaches the output before the launcher stops the job (8
# ranks, every time).
ckpt=$root/examples/lessons/05_metrics/checkpoint
resume_from() { # bytes (printf escapes) ranks: runs --resume in $tmp, output in $tmp/out
  printf "$1" >"$tmp/checkpoint.bin"
  (cd "$tmp" && timeout 60 "$ckpt" --nproc "$2" --resume >"$tmp/out" 2>&1)
}
for case in "a negative epoch|\373\377\377\377\000\000\200\077\000\000\200\077|epoch -5," \
            "epoch 2^31-1|\377\377\377\177\000\000\200\077\000\000\200\077|epoch 2147483647," \
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
py=$(command -v python3)
if [ -z "$py" ]; then echo "SKIP lessons.pictures: no python3"; exit $fail; fi
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
if ! "$py" -c 'import matplotlib' 2>/dev/null; then
  echo "SKIP lessons.draw_scripts: python3 cannot import matplotlib"
else
  "$py" examples/lessons/04_gradsync/draw_trace.py "$tmp/trace.json" "$tmp/trace.png" >"$tmp/draw.txt" 2>&1 &&
    "$py" examples/lessons/01_launch/draw_job.py "$tmp/ranks.txt" "$tmp/job.png" >>"$tmp/draw.txt" 2>&1 &&
    [ -s "$tmp/trace.png" ] && [ -s "$tmp/job.png" ]
  report "lessons.draw_scripts: draw_trace.py and draw_job.py draw from real runs" $? "$(tail -n 3 "$tmp/draw.txt" | tr '\n' ' ')"
fi
exit $fail
