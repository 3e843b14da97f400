#!/usr/bin/env bash
# examples/ddprun takes the process count the ways users type it: -n N, --nproc N,
# and torchrun's habit --nproc_per_node N / --nproc_per_node=N; a bad count or no
# program is refused with status 2 before anything starts (--help is no error, and --
# ends the options); --max-restarts N starts the job again after a failure, up to N
# times.
cd "$(dirname "$0")/.." || exit 1
fail=0
hello=examples/hello_allreduce
for form in "-n 3" "--nproc 3" "--nproc=3" "--nproc_per_node 3" "--nproc_per_node=3" "--nproc-per-node=5"; do
  n=${form##*[ =]}
  name="ddprun.$(echo "$form" | sed -e 's/^-*//' -e 's/=/_eq_/' | tr ' -' '_')"
  out=$(timeout -k 5 60 examples/ddprun $form $hello 2>&1); rc=$?
  want="sum $((n * (n + 1) / 2)), expected $((n * (n + 1) / 2)), world $n,"
  if [ $rc -eq 0 ] && grep -q "^$want" <<<"$out" && [ "$(grep -c 'my sum is' <<<"$out")" -eq "$n" ]; then
    echo "PASS $name"
  else
    echo "FAIL $name: 'ddprun $form $hello' status $rc, want $n ranks and '$want': $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1
  fi
done
for bad in "--nproc_per_node=0 $hello" "--nproc_per_node=x $hello" "--nproc_per_node $hello" "-n 2" "--nproc_per_node=2" "-x 2 $hello"; do
  name="ddprun.refuses.$(echo "$bad" | sed -e "s|$hello|prog|" -e 's/^-*//' -e 's/=/_eq_/' | tr ' -' '_')"
  out=$(timeout -k 5 60 examples/ddprun $bad 2>&1); rc=$?
  if [ $rc -eq 2 ] && ! grep -q 'my sum' <<<"$out" && grep -Eq 'usage|process count' <<<"$out"; then echo "PASS $name"
  else echo "FAIL $name: 'ddprun $bad' status $rc, want 2 with a usage line and no rank started: $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1; fi
done
out=$(timeout -k 5 60 examples/ddprun --help 2>/dev/null); rc=$?
if [ $rc -eq 0 ] && grep -q '^usage: ddprun -n N' <<<"$out"; then echo "PASS ddprun.help_is_not_an_error"
else echo "FAIL ddprun.help_is_not_an_error: 'ddprun --help' status $rc, want 0 and the usage on stdout: $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1; fi
out=$(timeout -k 5 60 examples/ddprun -n 2 -- $hello 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q '^sum 3, expected 3, world 2,' <<<"$out"; then echo "PASS ddprun.double_dash_ends_the_options"
else echo "FAIL ddprun.double_dash_ends_the_options: 'ddprun -n 2 -- prog' status $rc: $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1; fi
for twice in "-n 2 -n 3" "--nproc 2 --nproc_per_node=3" "-n 2 --max-restarts 1 --max_restarts=2"; do
  name="ddprun.refuses_twice.$(echo "$twice" | sed -e 's/^-*//' -e 's/=/_eq_/g' | tr ' -' '_')"
  out=$(timeout -k 5 60 examples/ddprun $twice $hello 2>&1); rc=$?
  if [ $rc -eq 2 ] && ! grep -q 'my sum' <<<"$out" && grep -q 'given twice' <<<"$out"; then echo "PASS $name"
  else echo "FAIL $name: 'ddprun $twice' status $rc, want 2 naming the flag given twice (the last one won): $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1; fi
done
for last in "-n" "-n 2 --max-restarts"; do # a known option as the last argument: its value is missing
  out=$(timeout -k 5 60 examples/ddprun $last 2>&1); rc=$?
  if [ $rc -eq 2 ] && [ "$out" = "ddprun: ${last##* } needs a value (usage: ddprun -n N [--max-restarts M] [--] program [args...])" ]; then
    echo "PASS ddprun.names_a_missing_value: $last"
  else echo "FAIL ddprun.names_a_missing_value: $last: 'ddprun $last' status $rc: $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1; fi
done
# OMP_NUM_THREADS: each rank gets cores / ranks (at least 1) unless the variable holds a
# thread count; empty counts as unset, malformed is ignored with a warning; the note
# about it comes once per job, and not where OpenMP would take 1 thread anyway.
cores=$(nproc)
share=$((cores / 3 > 1 ? cores / 3 : 1))
omp() { # name want_value want_notes want_warnings [taskset args] -- env value or "unset"
  local name=$1 want=$2 notes=$3 warns=$4 value=$5; shift 5
  local out
  if [ "$value" = unset ]; then out=$(env -u OMP_NUM_THREADS "$@" examples/ddprun -n 3 sh -c 'echo "omp=[$OMP_NUM_THREADS]"' 2>&1)
  else out=$(OMP_NUM_THREADS="$value" "$@" examples/ddprun -n 3 sh -c 'echo "omp=[$OMP_NUM_THREADS]"' 2>&1); fi
  if [ "$(grep -c "^omp=\[$want\]$" <<<"$out")" -eq 3 ] && [ "$(grep -c '^ddp: .*OMP_NUM_THREADS=[0-9]' <<<"$out")" -eq "$notes" ] &&
     [ "$(grep -c "ignoring OMP_NUM_THREADS" <<<"$out")" -eq "$warns" ]; then echo "PASS ddprun.$name"
  else echo "FAIL ddprun.$name: OMP_NUM_THREADS='$value' $*: want [$want] in 3 ranks, $notes note(s), $warns warning(s): $(tr '\n' ' ' <<<"$out" | head -c 400)"; fail=1; fi
}
omp omp_unset_gets_share "$share" $((cores > 1)) 0 unset
omp omp_empty_is_unset "$share" $((cores > 1)) 0 ""
omp omp_malformed_is_ignored "$share" $((cores > 1)) 1 abc
omp omp_zero_is_ignored "$share" $((cores > 1)) 1 0
omp omp_count_is_kept 3 0 0 3
if command -v taskset >/dev/null; then
  omp omp_one_core_no_note 1 0 0 unset taskset -c 0
else
  echo "SKIP ddprun.omp_one_core_no_note: no taskset (util-linux)"
fi
# a count no OpenMP can start (libgomp crashed at 99999): refused once, before any rank
out=$(OMP_NUM_THREADS=99999 examples/ddprun -n 3 sh -c 'echo started' 2>&1); rc=$?
c=$(getconf _NPROCESSORS_ONLN); most=$((64 * c > 256 ? 64 * c : 256))
if [ $rc -eq 2 ] && [ "$out" = "ddp: OMP_NUM_THREADS=99999 is more threads than this machine takes ($most: 64 for each of its $c cores, at least 256; OpenMP crashes past some tens of thousands)" ]; then
  echo "PASS ddprun.omp_absurd_count_refused"
else echo "FAIL ddprun.omp_absurd_count_refused: status $rc, want 2 and one line: $(tr '\n' ' ' <<<"$out" | head -c 300)"; fail=1; fi
out=$(env -u OMP_NUM_THREADS examples/ddprun -n 1 true 2>&1)
[ -z "$out" ]
if [ $? -eq 0 ]; then echo "PASS ddprun.omp_one_rank_no_note"; else echo "FAIL ddprun.omp_one_rank_no_note: $out"; fail=1; fi
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
  out=$(timeout -k 5 60 examples/ddprun -n 3 $form "$tmp/flaky" 2>&1); rc=$?
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
out=$(timeout -k 5 60 examples/ddprun -n 3 --max-restarts 1 "$tmp/flaky" 2>&1); rc=$?
[ $rc -eq 137 ] && grep -q 'no restart left (attempt 2 of 2)' <<<"$out"
if [ $? -eq 0 ]; then echo "PASS ddprun.max_restarts_used_up_ends_with_the_status"
else echo "FAIL ddprun.max_restarts_used_up_ends_with_the_status: status $rc (want 137): $(head -c 300 <<<"$out" | tr '\n' ' ')"; fail=1; fi
out=$(timeout -k 5 60 examples/ddprun -n 3 --max-restarts x "$tmp/flaky" 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q 'restart count' <<<"$out"; then echo "PASS ddprun.refuses.max_restarts_x"
else echo "FAIL ddprun.refuses.max_restarts_x: status $rc, want 2 and a line about the count: $out"; fail=1; fi
# the note comes once per job, not once per restart attempt
rm -f "$tmp/seen"
out=$(env -u OMP_NUM_THREADS timeout -k 5 60 examples/ddprun -n 3 --max-restarts 2 "$tmp/flaky" 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(grep -c '^ddp: .*OMP_NUM_THREADS=[0-9]' <<<"$out")" -eq $((cores > 1)) ]
if [ $? -eq 0 ]; then echo "PASS ddprun.omp_note_once_per_job"
else echo "FAIL ddprun.omp_note_once_per_job: status $rc, want 0 and $((cores > 1)) note(s) over 3 attempts: $(head -c 400 <<<"$out" | tr '\n' ' ')"; fail=1; fi

# Signals to the launcher. A user's stop (SIGTERM, SIGINT, SIGHUP) before any failure ends
# the job with 128 + the signal and a line saying so, even when the ranks catch it and
# exit 0; a signal the launcher was started ignoring (nohup) stays ignored; a second stop
# ends the 30 s grace at once; a launcher started with SIGCHLD ignored still sees its
# ranks end (it waited forever).
cat >"$tmp/waiter" <<'EOF2'
#!/bin/sh
# a rank: says it started, waits for the file "go"; HUP is noted, IGNORE ignored, EXIT0 exits 0
d=$(dirname "$0")
trap 'echo "hup $RANK" >>"$d/got"' HUP
[ -n "$IGNORE" ] && trap '' "$IGNORE"
[ -n "$EXIT0" ] && trap 'exit 0' "$EXIT0"
echo started >"$d/started.$RANK"
while [ ! -e "$d/go" ]; do sleep 0.05; done
echo "finished $RANK"
EOF2
chmod +x "$tmp/waiter"
launch() { # command...: in the background (pid), once both ranks have started
  rm -f "$tmp"/started.* "$tmp/go" "$tmp/got"
  "$@" >"$tmp/sig.txt" 2>&1 &
  pid=$!
  for _ in $(seq 400); do [ -e "$tmp/started.0" ] && [ -e "$tmp/started.1" ] && return; sleep 0.05; done
}
pending() { # signal number: 1 while it is pending for the launcher
  local mask
  mask=$(sed -n 's/^ShdPnd:[[:space:]]*//p' "/proc/$pid/status" 2>/dev/null)
  [ -n "$mask" ] && [ $(( (0x$mask >> ($1 - 1)) & 1 )) -eq 1 ]
}
sigcheck() { # name ok why
  if [ "$2" -eq 0 ]; then echo "PASS ddprun.$1"; else echo "FAIL ddprun.$1: $3"; fail=1; fi
}
launch timeout -k 5 60 sh -c "trap '' HUP; exec examples/ddprun -n 2 $tmp/waiter"
kill -HUP "$(pgrep -P $pid)" 2>/dev/null
# the job goes on: the old launcher SIGKILLed the ranks (which ignore it too) 3 s later
for _ in $(seq 80); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
touch "$tmp/go"
wait $pid
rc=$?
[ $rc -eq 0 ] && [ ! -e "$tmp/got" ] && [ "$(grep -c '^finished' "$tmp/sig.txt")" -eq 2 ]
sigcheck signal_ignored_at_start_stays_ignored $? "status $rc (want 0), $(cat "$tmp/got" 2>/dev/null | tr '\n' ' ')$(tr '\n' ' ' <"$tmp/sig.txt")"
launch env EXIT0=TERM timeout -k 5 60 examples/ddprun -n 2 "$tmp/waiter"
kill -TERM "$(pgrep -P $pid)"
wait $pid
rc=$?
[ $rc -eq 143 ] && grep -q '^ddp: stopped by signal 15 (Terminated) sent to the launcher$' "$tmp/sig.txt"
sigcheck stopped_job_is_not_a_success $? "status $rc (want 143): $(tr '\n' ' ' <"$tmp/sig.txt")"
launch env --default-signal=INT IGNORE=INT timeout -k 5 60 examples/ddprun -n 2 "$tmp/waiter"
start=$(date +%s)
ddprun_pid=$(pgrep -P $pid)
kill -INT "$ddprun_pid"
pid=$ddprun_pid
for _ in $(seq 100); do pending 2 || break; sleep 0.02; done # taken, before it comes again
kill -INT "$ddprun_pid"
wait
took=$(($(date +%s) - start))
grep -q '^ddp: stopped by signal 2 (Interrupt) sent to the launcher$' "$tmp/sig.txt" && [ $took -lt 20 ]
sigcheck second_stop_signal_ends_the_grace $? "after $took s (the grace is 30 s): $(tr '\n' ' ' <"$tmp/sig.txt")"
# What the ranks started goes with a failed or stopped attempt: a wrapper script's program
# (the wrapper, the launcher's child, dies of SIGTERM; its program went on as an orphan),
# and before a restart whatever a rank left running (it ran beside the next attempt).
printf '#!/bin/sh\n"$(dirname "$0")/waiter"\n' >"$tmp/wrap"
cat >"$tmp/lingerer" <<'EOF2'
#!/bin/sh
d=$(dirname "$0")
while [ ! -e "$d/attempt1" ]; do sleep 0.05; done
echo "a process of attempt $TORCHELASTIC_RESTART_COUNT ran in attempt 1" >>"$d/overlap"
EOF2
cat >"$tmp/leaver" <<'EOF2'
#!/bin/sh
d=$(dirname "$0")
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  [ "$RANK" = 1 ] && { "$d/lingerer" & kill -9 $$; }
  while :; do sleep 0.05; done
fi
touch "$d/attempt1"
EOF2
chmod +x "$tmp/wrap" "$tmp/lingerer" "$tmp/leaver"
launch timeout -k 5 60 examples/ddprun -n 2 "$tmp/wrap"
kill -TERM "$(pgrep -P $pid)"
wait $pid
rc=$?
left=$(pgrep -f "$tmp/waiter" | wc -l)
touch "$tmp/go"
[ $rc -eq 143 ] && [ "$left" -eq 0 ]
sigcheck wrapped_programs_end_with_the_job $? "status $rc (want 143), $left wrapped ranks still running"
# A launcher killed by SIGKILL (kill -9, the out-of-memory killer) cleans up nothing: its
# ranks end with it (PR_SET_PDEATHSIG), and what they started must too (each went on as an
# orphan). The ranks and their children are the only writers of the FIFO: end of file
# comes once every one of them is gone.
mkfifo "$tmp/out9"
examples/ddprun -n 2 sh -c 'sleep 1000 & echo "up $!"; wait' >"$tmp/out9" 2>/dev/null &
pid=$!
exec 3<"$tmp/out9"
read -r -t 30 _ a <&3
read -r -t 30 _ b <&3
{ kill -9 $pid; wait $pid; } 2>/dev/null # (bash's "Killed" line too)
read -r -t 20 _ <&3 # 1: end of file; past 128: still open after 20 s
rc=$?
exec 3<&-
left=$(ps -o pid=,stat=,args= -p "${a:-0},${b:-0}" | grep -v ' Z' | tr '\n' ' ')
kill "${a:-0}" "${b:-0}" 2>/dev/null # none left behind by a failure
[ $rc -eq 1 ] && [ -n "$b" ]
sigcheck sigkill_to_the_launcher_ends_what_the_ranks_started $? "read status $rc (want 1, end of file); the ranks' children $a $b, still running: $left"
# The watchdog killed by someone (kill -9 to the launcher's children) costs the job
# nothing: it ends with status 0 (the launcher's goodbye to a dead watchdog was SIGPIPE,
# status 141). Each rank says it is up, then waits on a FIFO of its own.
mkfifo "$tmp/out10" "$tmp/go0" "$tmp/go1"
examples/ddprun -n 2 sh -c 'echo up; read -r _ <"$0/go$RANK"' "$tmp" >"$tmp/out10" 2>"$tmp/err10" &
pid=$!
exec 3<"$tmp/out10"
read -r -t 30 _ <&3
read -r -t 30 _ <&3
dog=$(pgrep -P $pid -x ddp-watchdog)
[ -n "$dog" ] && kill -9 $dog
timeout 20 sh -c 'echo >"$0/go0"; echo >"$0/go1"' "$tmp"
wait $pid
rc=$?
exec 3<&-
[ $rc -eq 0 ] && [ -n "$dog" ]
sigcheck a_killed_watchdog_costs_the_job_nothing $? "status $rc (want 0); watchdog '${dog}'; $(tr '\n' ' ' <"$tmp/err10")"
rm -f "$tmp/attempt1" "$tmp/overlap"
out=$(timeout -k 5 60 examples/ddprun -n 2 --max-restarts 1 "$tmp/leaver" 2>&1)
rc=$?
for _ in $(seq 60); do # until attempt 0's lingerer has written, or is gone
  if [ -e "$tmp/overlap" ] || ! pgrep -f "$tmp/lingerer" >/dev/null; then break; fi
  sleep 0.05
done
pkill -f "$tmp/lingerer"
[ $rc -eq 0 ] && [ ! -e "$tmp/overlap" ] && grep -q 'restarting the job: attempt 2 of 2' <<<"$out"
sigcheck restart_after_every_process_of_the_attempt_before $? "status $rc: $(cat "$tmp/overlap" 2>/dev/null) $(tr '\n' ' ' <<<"$out")"
# A program that cannot run is one line and the shell's status, never restarted (a line per
# rank and attempt, thousands a second); a ddp_launch program started under another name
# (exec -a) starts copies of itself.
for case in "$tmp/no-such-program|127|no such file" "no-such-program-in-path|127|not found in PATH" \
            "$tmp|126|not an executable file"; do
  IFS='|' read -r prog want say <<<"$case"
  out=$(timeout -k 5 30 examples/ddprun -n 3 --max-restarts 1000 "$prog" 2>&1)
  rc=$?
  [ $rc -eq "$want" ] && [ "$(grep -c "^ddp: cannot run '$prog': $say" <<<"$out")" -eq 1 ] && ! grep -q restart <<<"$out"
  ok=$?
  sigcheck "cannot_run_${prog##*/}" $ok "status $rc (want $want): $(head -c 300 <<<"$out" | tr '\n' ' ')"
done
printf '#!/bin/sh\necho "here $RANK"\n' >"$tmp/in_dot" && chmod +x "$tmp/in_dot"
out=$(d=$PWD && cd "$tmp" && PATH="$PATH:" timeout -k 5 30 "$d/examples/ddprun" -n 2 in_dot 2>&1)
rc=$?
[ $rc -eq 0 ] && [ "$(grep -c '^here [01]$' <<<"$out")" -eq 2 ]
sigcheck runs_a_program_found_through_an_empty_path_entry $? "status $rc: $(head -c 300 <<<"$out" | tr '\n' ' ')"
out=$(h=$PWD/$hello && cd "$tmp" && timeout -k 5 30 bash -c "exec -a hello_under_another_name $h --nproc 2" 2>&1)
rc=$?
[ $rc -eq 0 ] && grep -q '^sum 3, expected 3, world 2' <<<"$out"
sigcheck launch_under_another_name $? "status $rc: $(head -c 300 <<<"$out" | tr '\n' ' ')"
# --nproc where a launcher's variables are set: one line naming them (a shell's leftover RANK
# and WORLD_SIZE were blamed on a torchrun that was not there), no rank started
for vars in "RANK=0 WORLD_SIZE=2" "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=3"; do
  out=$(env $vars timeout -k 5 30 $hello --nproc 2 2>&1); rc=$?
  read -r v1 v2 <<<"$vars"
  [ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "^ddp: --nproc inside a job started by .* ($v1 and $v2 are set; left in the shell? unset them): drop one of the two launchers$" <<<"$out"
  sigcheck "nproc_inside_a_job_names_its_variables.${v1%%=*}" $? "status $rc (want 2 and one line): $(head -c 300 <<<"$out" | tr '\n' ' ')"
done
# hello_allreduce's --help is its usage (it ran as a world of 1), and a flag it does not
# know one line and status 2, before any rank starts
out=$(timeout -k 5 30 $hello --help 2>/dev/null); rc=$?
[ $rc -eq 0 ] && grep -q '^usage: hello_allreduce ' <<<"$out" && ! grep -q 'sum' <<<"$out"
sigcheck hello_help_is_the_usage $? "status $rc (want 0 and the usage): $(head -c 300 <<<"$out" | tr '\n' ' ')"
for bad in "--bogus" "--nprocs 3" "-x" "extra" "--nproc 2 --bogus=1"; do
  out=$(timeout -k 5 30 $hello $bad 2>&1); rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "^hello_allreduce: unknown argument '" <<<"$out"
  ok=$? # (before the name's $(...) sets $?)
  sigcheck "hello_refuses.$(sed -e 's/^-*//' -e 's/[ =-]/_/g' <<<"$bad")" $ok "status $rc (want 2 and one line): $(head -c 300 <<<"$out" | tr '\n' ' ')"
done
# a near miss of --nproc (mp.spawn's nprocs, mpirun's -np, a typo) in a program that ignores flags it does not know:
# said, not a silent run of one process; under a launcher, not said by every rank
ignorer=$tmp/ignores_flags
printf '%s\n' '#define DDP_IMPLEMENTATION' '#include "ddp.h"' '#include <stdio.h>' 'int main(int argc, char **argv) {' \
  '  ddp_ctx ctx; ddp_desc desc = {0}; float x; int status = ddp_launch(&argc, argv);' \
  '  if (status != DDP_WORKER) return status;' 'if (ddp_init(&ctx, &desc) != DDP_OK) return 1;' \
  '  x = (float)(ctx.rank + 1); ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);' \
  '  ddp_print(&ctx, "sum %g, world %d\n", x, ctx.world_size); return ddp_destroy(&ctx) != DDP_OK; }' >"$ignorer.c"
cc -std=c99 -O0 -I. "$ignorer.c" -o "$ignorer" -lpthread -lm || { echo "FAIL ddprun.near_miss: cannot build $ignorer.c"; fail=1; }
for form in "--nprocs 3" "--nprocs=3" "--nproc_per_nodes 3" "-np 3" "-nproc 3" "--NPROC=3" "--nroc 3"; do
  out=$(timeout -k 5 30 "$ignorer" $form 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -q "^ddp: warning: ${form%%[ =]*} is not ddp_launch's flag (--nproc N starts N ranks): running as one process$" <<<"$out" &&
    grep -q '^sum 1, world 1' <<<"$out"
  ok=$?
  sigcheck "near_miss_said.$(sed -e 's/^-*//' -e 's/=.*/_eq/' -e 's/ .*//' <<<"$form")" $ok "status $rc: $(head -c 300 <<<"$out" | tr '\n' ' ')"
done
out=$(timeout -k 5 30 examples/ddprun -n 2 "$ignorer" --nprocs 3 2>&1); rc=$?
[ $rc -eq 0 ] && ! grep -q 'warning' <<<"$out" && grep -q '^sum 3, world 2' <<<"$out"
sigcheck near_miss_not_said_under_a_launcher $? "status $rc: $(head -c 300 <<<"$out" | tr '\n' ' ')"
# rank 0's store out of file descriptors while ranks are still to join: every rank stops
# at once naming the limit (the store spun at 100% CPU until DDP_TIMEOUT, which then blamed
# the ranks left in its backlog)
start=$(date +%s)
out=$(ulimit -n 40 && DDP_TIMEOUT=60 OMP_NUM_THREADS=1 timeout -k 5 50 $hello --nproc 60 2>&1)
rc=$?
took=$(($(date +%s) - start))
# (rank 0's line: its own failure, or the store's refusal of its hello, or its own socket)
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 30 ] && grep -q '^ddp: error: rank 0/60: .*ulimit -n is 40' <<<"$out"
sigcheck store_out_of_descriptors $? "status $rc after $took s: $(grep 'rank 0/60' <<<"$out" | head -c 300)"
# a few descriptors short where the ranks compare hosts: the rank that could not read the
# boot id seemed another host ("this job spans 2 hosts: build it with mpicc", 4 of 10 runs
# at ulimit -n 12 on one machine). Where the boot id is read depends on how many descriptors
# the environment leaves open (a CI runner passed ulimit -n 12), so every limit from 10 to 24
# is run three times: each run either works or stops naming the descriptors, never another host
# (the limit is set inside timeout, so that timeout itself is not what runs short)
bad=0 said= worked=0 short=0
for n in $(seq 10 24); do
  for i in 1 2 3; do
    out=$(DDP_TIMEOUT=20 OMP_NUM_THREADS=1 timeout -k 5 30 sh -c "ulimit -n $n && exec $hello --nproc 2" 2>&1); rc=$?
    if [ $rc -eq 0 ] && grep -q '^sum 3, expected 3, world 2' <<<"$out"; then worked=$((worked + 1))
    elif [ $rc -ne 0 ] && [ $rc -ne 124 ] && ! grep -q 'spans' <<<"$out" && grep -Eq 'file descriptors|Too many open files' <<<"$out"
    then short=$((short + 1))
    else bad=$((bad + 1)) said="ulimit -n $n: status $rc: $(grep -m1 error <<<"$out" | head -c 200)"; fi
  done
done
[ $bad -eq 0 ] && [ $worked -gt 0 ] && [ $short -gt 0 ]
sigcheck few_descriptors_not_taken_for_another_host $? "$bad of 45 runs wrong ($worked worked, $short stopped naming the descriptors): $said"
out=$(timeout -k 5 30 bash -c "trap '' CHLD; exec examples/ddprun -n 2 true" 2>&1)
rc=$?
sigcheck sigchld_ignored_at_start $rc "status $rc (124: the launcher never saw its ranks end): $out"
# the whole job stopped (Ctrl-Z, SIGSTOP to its process group) for longer than DDP_TIMEOUT
# and continued: it goes on (the time stopped counted, and a rank waiting in a collective
# timed out at once on SIGCONT, blaming the other, 2 of 6 runs of train_gpt). Stopped while
# the ranks all-reduce 64 bytes back to back, so that a rank is nearly always waiting.
bad=0 said=
for i in 1 2 3 4; do
  rm -f "$tmp/stop.out"
  DDP_TIMEOUT=1 OMP_NUM_THREADS=1 setsid examples/bench_allreduce --nproc 2 --iters 300000 --min-bytes 64 \
    --max-bytes 64 >"$tmp/stop.out" 2>&1 &
  job=$!
  for t in $(seq 100); do grep -q '^#' "$tmp/stop.out" 2>/dev/null && break; sleep 0.05; done # its loop has begun
  kill -STOP -- -$job
  sleep 2 # stopped past the timeout (the scenario, not a wait for something)
  kill -CONT -- -$job
  timeout -k 5 60 tail --pid=$job -f /dev/null
  wait $job; rc=$?
  if [ $rc -ne 0 ] || ! grep -q ' ok$' "$tmp/stop.out"; then
    bad=$((bad + 1)) said="status $rc: $(grep -m1 error "$tmp/stop.out" | head -c 200)"
  fi
done
[ $bad -eq 0 ]
sigcheck job_stopped_and_continued_goes_on $? "$bad of 4 runs: $said"
# a network namespace whose loopback is down (unshare -n): said at once, not retried for DDP_TIMEOUT
if unshare -n true 2>/dev/null; then
  start=$(date +%s)
  out=$(env -u DDP_TIMEOUT timeout -k 5 60 unshare -n $hello --nproc 2 2>&1); rc=$?
  took=$(($(date +%s) - start))
  [ $rc -eq 1 ] && [ $took -lt 10 ] && grep -q "loopback interface is down" <<<"$out"
  sigcheck loopback_down $? "status $rc after $took s: $(head -c 300 <<<"$out" | tr '\n' ' ')"
else
  echo "SKIP ddprun.loopback_down: no network namespaces here (unshare -n needs root)"
fi
exit $fail
