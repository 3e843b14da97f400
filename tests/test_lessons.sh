#!/usr/bin/env bash
# Every lesson under examples/lessons/: its pages exist in English and Chinese, its
# program and its solution run with 3 ranks (a world that divides nothing evenly) and
# exit 0, the solution says "correct", and the exercise, as handed out, fails with a
# "hint:" line. The Makefile builds them all (with cc, and with nvcc where present).
# They run in a temporary directory, where lesson 5 writes its checkpoint.
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
exit $fail
