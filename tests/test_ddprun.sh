#!/usr/bin/env bash
# examples/ddprun takes the process count the ways users type it: -n N, --nproc N,
# and torchrun's habit --nproc_per_node N / --nproc_per_node=N; a bad count or no
# program is refused with status 2 before anything starts.
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
exit $fail
