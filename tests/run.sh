#!/usr/bin/env bash
# Runs each test program given as an argument and counts its PASS/FAIL/SKIP lines.
# The failures are listed again at the end (a log's tail names them); the last line is
# "N passed, N failed, N skipped".
pass=0; fail=0; skip=0; failed=""
for t in "$@"; do
  echo "== $t"
  out=$(mktemp)
  start=$(date +%s)
  timeout 240 "$t" >"$out" 2>&1
  rc=$?
  cat "$out"
  p=$(grep -c '^PASS ' "$out"); f=$(grep -c '^FAIL ' "$out"); s=$(grep -c '^SKIP ' "$out")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL $t: exited with status $rc without reporting a failure" | tee -a "$out"
    f=1
  fi
  echo "-- $t: $p passed, $f failed, $s skipped ($(( $(date +%s) - start )) s)"
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
  [ "$f" -gt 0 ] && failed+="$t: $(grep '^FAIL ' "$out" | head -5 | tr '\n' ';')"$'\n'
  rm -f "$out"
done
[ -n "$failed" ] && printf 'failed in:\n%s' "$failed"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
