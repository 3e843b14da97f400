#!/usr/bin/env bash
# Runs each test program given as an argument and counts its PASS/FAIL/SKIP lines.
# The last line is "N passed, N failed, N skipped".
pass=0; fail=0; skip=0
for t in "$@"; do
  echo "== $t"
  out=$(mktemp)
  start=$(date +%s)
  timeout 240 "$t" >"$out" 2>&1
  rc=$?
  cat "$out"
  p=$(grep -c '^PASS ' "$out"); f=$(grep -c '^FAIL ' "$out"); s=$(grep -c '^SKIP ' "$out")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL $t: exited with status $rc without reporting a failure"
    f=1
  fi
  echo "-- $t: $p passed, $f failed, $s skipped ($(( $(date +%s) - start )) s)"
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
  rm -f "$out"
done
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
