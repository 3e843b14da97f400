#!/usr/bin/env bash
# examples/ddprun takes the process count the ways users type it: -n N, --nproc N,
# and torchrun's habit --nproc_per_node N / --nproc_per_node=N; a bad count or no
# program is refused with status 2 before anything starts; --max-restarts N starts the
# job again after a failure, up to N times.
cd "$(dirname "$0")/.." || exit 1
fail=0
hello=examples/hello_allreduce
for form in "-n 3" "--nproc 3" "--nproc=3" "--nproc_per_node 3" "--nproc_per_node=3" "--nproc-per-node=5"; do
  n=${form##*[ =]}
  name="ddprun.$(echo "$form" | sed -e 's/^-*//' -e 's/=/_eq_/' | tr ' -' '_')"
  out=$(timeout 60 examples/ddprun $form $hello 2>&1); rc=$?
  want="sum $((n * (n + 1) / 2)), expected $((n * (n + 1) / 2)), world $n,"
  if [ $rc -eq 0 ] && grep -q "^$want" <<<"$out" && [ "$(grep -c 'my sum is' <<<"$out")" -eq "$n" ]; then
    echo "PASS $name"
  else
    echo "FAIL $name: 'ddprun $form $hello' status $rc, want $n ranks and '$want': $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1
  fi
done
for bad in "--nproc_per_node=0 $hello" "--nproc_per_node=x $hello" "--nproc_per_node $hello" "-n 2" "--nproc_per_node=2" "-x 2 $hello"; do
  name="ddprun.refuses.$(echo "$bad" | sed -e "s|$hello|prog|" -e 's/^-*//' -e 's/=/_eq_/' | tr ' -' '_')"
  out=$(timeout 60 examples/ddprun $bad 2>&1); rc=$?
  if [ $rc -eq 2 ] && ! grep -q 'my sum' <<<"$out" && grep -Eq 'usage|process count' <<<"$out"; then echo "PASS $name"
  else echo "FAIL $name: 'ddprun $bad' status $rc, want 2 with a usage line and no rank started: $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1; fi
done
# --max-restarts: a program whose rank 1 is killed on the first two attempts finishes on
# the third, each attempt with its number in TORCHELASTIC_RESTART_COUNT (as torchrun sets it)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/flaky" <<'EOF2'
#!/bin/sh
echo "attempt $TORCHELASTIC_RESTART_COUNT rank $RANK" >>"$(dirname "$0")/seen"
if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" -lt 2 ]; then kill -9 $$; fi
EOF2
chmod +x "$tmp/flaky"
for form in "--max-restarts 2" "--max_restarts=2"; do
  rm -f "$tmp/seen"
  out=$(timeout 60 examples/ddprun -n 3 $form "$tmp/flaky" 2>&1); rc=$?
  name="ddprun.$(echo "$form" | sed -e 's/^-*//' -e 's/=/_eq_/' | tr ' -' '_')"
  # (the other ranks of a failed attempt may be stopped before they write their line)
  if [ $rc -eq 0 ] && grep -qx 'attempt 0 rank 1' "$tmp/seen" && grep -qx 'attempt 1 rank 1' "$tmp/seen" &&
     [ "$(grep -c '^attempt 2 ' "$tmp/seen")" -eq 3 ] && ! grep -q '^attempt [3-9]' "$tmp/seen" &&
     [ "$(grep -c 'restarting the job' <<<"$out")" -eq 2 ]; then
    echo "PASS $name"
  else
    echo "FAIL $name: status $rc, want 0 after 3 attempts of 3 ranks; seen: $(tr '\n' ' ' <"$tmp/seen"); $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1
  fi
done
out=$(timeout 60 examples/ddprun -n 3 --max-restarts 1 "$tmp/flaky" 2>&1); rc=$?
[ $rc -eq 137 ] && grep -q 'no restart left (attempt 2 of 2)' <<<"$out"
if [ $? -eq 0 ]; then echo "PASS ddprun.max_restarts_used_up_ends_with_the_status"
else echo "FAIL ddprun.max_restarts_used_up_ends_with_the_status: status $rc (want 137): $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1; fi
out=$(timeout 60 examples/ddprun -n 3 --max-restarts x "$tmp/flaky" 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q 'restart count' <<<"$out"; then echo "PASS ddprun.refuses.max_restarts_x"
else echo "FAIL ddprun.refuses.max_restarts_x: status $rc, want 2 and a line about the count: $out"; fail=1; fi
exit $fail
