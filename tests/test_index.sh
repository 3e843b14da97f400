#!/usr/bin/env bash
# tests/README.md's index: one row for every test file under tests/ and tests/emu/ (a
# new test without a row is reported by name), no row for a file that is not there,
# and a tier that make can use: CUDA and emulator tests are "full" (they need nvcc or
# the emulator's build), C tests and scripts either (make test-fast runs the fast ones).
cd "$(dirname "$0")" || exit 1
fail=0
rows=$(sed -n 's/^| `\(\(emu\/\)\{0,1\}test_[A-Za-z0-9_]*\.[a-z]*\)` | \([a-z]*\) |.*/\1 \3/p' README.md)
for f in test_*.c test_*.cu test_*.sh emu/test_*.sh; do
  [ -e "$f" ] || continue
  n=$(awk -v f="$f" '$1 == f' <<<"$rows" | wc -l)
  if [ "$n" -ne 1 ]; then
    echo "FAIL index.row_$f: tests/README.md has $n rows for it (add one: | \`$f\` | fast or full | seconds | what it checks |)"
    fail=1
  fi
done
while read -r f tier; do
  [ -n "$f" ] || continue
  case "$f:$tier" in
    emu/*.sh:full | *.c:fast | *.c:full | *.cu:full | [!e]*.sh:fast | *.sh:full) ;;
    *) echo "FAIL index.tier_$f: tier '$tier' (CUDA and emulator tests are full, C tests and scripts fast or full)"; fail=1 ;;
  esac
  [ -e "$f" ] || { echo "FAIL index.exists_$f: tests/README.md has a row for it, but there is no tests/$f"; fail=1; }
done <<<"$rows"
[ "$fail" -eq 0 ] && echo "PASS index.every_test_has_one_row ($(wc -l <<<"$rows") rows)"
exit $fail
