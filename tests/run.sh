#!/usr/bin/env bash
# Runs each test program given as an argument and counts its PASS/FAIL/SKIP lines.
# The failures are listed again at the end (a log's tail names them); the last line is
# "N passed, N failed, N skipped". TEST_JOBS=N runs up to N test files at once (make
# test-fast: most of its time is waiting on timeouts and child processes, not the CPU);
# each file's output still comes whole, in the order given. make test runs one at a time.
pass=0; fail=0; skip=0; failed=""
jobs=${TEST_JOBS:-1}
case $jobs in '' | *[!0-9]* | 0) echo "TEST_JOBS='$jobs' is not a number of test files to run at once" >&2; exit 2 ;; esac
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

run_one() { # test out: its output in out, then "status seconds" in out.rc
  local start=$(date +%s)
  timeout 240 "$1" >"$2" 2>&1
  echo "$? $(( $(date +%s) - start ))" >"$2.rc"
}

report() { # test out (its "== test" line already printed)
  local t=$1 out=$2 rc secs p f s
  read -r rc secs <"$out.rc"
  cat "$out"
  p=$(grep -c '^PASS ' "$out"); f=$(grep -c '^FAIL ' "$out"); s=$(grep -c '^SKIP ' "$out")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL $t: exited with status $rc without reporting a failure" | tee -a "$out"
    f=1
  fi
  echo "-- $t: $p passed, $f failed, $s skipped ($secs s)"
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
  [ "$f" -gt 0 ] && failed+="$t: $(grep '^FAIL ' "$out" | head -5 | tr '\n' ';')"$'\n'
}

if [ "$jobs" -eq 1 ]; then
  for t in "$@"; do
    echo "== $t"
    run_one "$t" "$dir/out"
    report "$t" "$dir/out"
  done
else # a pool of background runs; each reported, in order, once it and those before it ended
  pids=()
  i=0
  for t in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_one "$t" "$dir/$i" &
    pids[i]=$!
    i=$((i + 1))
  done
  i=0
  for t in "$@"; do
    wait "${pids[i]}" 2>/dev/null # (or already reaped by wait -n: its status is in the .rc file)
    echo "== $t"
    report "$t" "$dir/$i"
    i=$((i + 1))
  done
fi
[ -n "$failed" ] && printf 'failed in:\n%s' "$failed"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
