#!/usr/bin/env bash
# The MPI backend on one host: tests/test_mpi.c built with mpicc -DDDP_MPI and run
# under Open MPI's mpirun for 1-5 ranks (every collective x dtype x op, bit for bit),
# for 3 ranks again with the all-reduce chain in small chunks (many rounds), with
# the exchange (DDP_MPI_ALLREDUCE=exchange: the form for ranks dealt round-robin over
# hosts) and with DDP_CHECK=1 (a check through a store MPI has not: it failed every
# call), the chain's shared memory (512 KiB per slot unless DDP_SHM_CHUNK says), then
# ranks that disagree, a rank that leaves, a rank past the timeout (the
# others name it), a rank stuck before ddp_init (the others' ddp_init ends past the timeout), a rank stuck for good (the others' ddp_destroy returns, under MPICH too), torchrun-style workers of a process mpirun started (the CPU backend,
# not MPI), and a rank killed mid-run (the job must end within seconds). Skips
# where mpicc/mpirun are missing (.ci/run installs Debian's Open MPI).
cd "$(dirname "$0")/.." || exit 1
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "SKIP mpi: mpicc/mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! mpicc -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -DDDP_MPI -I. tests/test_mpi.c -o "$tmp/test_mpi" -lm 2>"$tmp/log"; then
  echo "FAIL mpi.build: $(head -c 400 "$tmp/log" | tr '\n' ' ')"; exit 1
fi
# root in CI; oversubscribe: 2 cores, up to 5 ranks
run() { timeout "$1" mpirun --allow-run-as-root --oversubscribe --bind-to none -x DDP_BACKEND=mpi -x DDP_TIMEOUT "${@:2}"; }
fail=0
for n in 1 2 3 5; do
  DDP_TIMEOUT=60 run 300 -np $n "$tmp/test_mpi" >"$tmp/out" 2>&1
  rc=$?
  grep -E '^(PASS|FAIL|SKIP) ' "$tmp/out"
  if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$tmp/out"; then
    echo "FAIL mpi.w$n.run: mpirun exited $rc: $(grep -v '^PASS' "$tmp/out" | head -c 400 | tr '\n' ' ')"; fail=1
  fi
done
for form in "small_chunks DDP_SHM_CHUNK=4096" "exchange DDP_MPI_ALLREDUCE=exchange" "ddp_check DDP_CHECK=1"; do
  set -- $form
  DDP_TIMEOUT=60 run 300 -np 3 -x "$2" "$tmp/test_mpi" >"$tmp/out" 2>&1
  rc=$?
  grep -E '^(PASS|FAIL|SKIP) ' "$tmp/out" | sed "s/ mpi\./ mpi.$1./"
  if [ $rc -ne 0 ] && ! grep -q '^FAIL ' "$tmp/out"; then
    echo "FAIL mpi.$1.run: mpirun exited $rc: $(grep -v '^PASS' "$tmp/out" | head -c 400 | tr '\n' ' ')"; fail=1
  fi
done
check() { # name want-rc seconds-at-most mode np grep...
  local name=$1 want=$2 limit=$3 mode=$4 np=$5; shift 5
  local t0=$SECONDS
  DDP_TIMEOUT=1 run 60 -np "$np" "$tmp/test_mpi" "$mode" >"$tmp/out" 2>&1
  local rc=$? dt=$((SECONDS - t0)) ok=1 pat
  for pat in "$@"; do grep -q -- "$pat" "$tmp/out" || ok=0; done
  local rc_ok=0
  if [ "$want" = 0 ]; then [ $rc -eq 0 ] && rc_ok=1; else [ $rc -ne 0 ] && rc_ok=1; fi
  if [ $rc_ok = 1 ] && [ $ok = 1 ] && [ $dt -le "$limit" ]; then
    echo "PASS mpi.$name"
  else
    echo "FAIL mpi.$name: exit $rc after ${dt} s: $(grep 'ddp' "$tmp/out" | head -c 500 | tr '\n' ' ')"; fail=1
  fi
}
# (the ranks return 0 after the error, but leave MPI unfinalized: mpirun ends the failed job
# non-zero rather than wait for ranks that may never come, and the first rank's exit may end
# the others before they say it: any rank's line will do)
check mismatch_named nonzero 10 mismatch 3 "rank [02] passes 10 x f32 sum, rank 1 passes 100 x f32 sum\|rank 1 passes 100 x f32 sum, rank 0 passes 10 x f32 sum"
# DDP_SHM_CHUNK set to its documented default on one rank only: the chain's chunk differs
# (the chain has its own default where it is unset), so the ranks disagree by name; they
# gave a wrong sum with DDP_OK, or crashed
DDP_TIMEOUT=5 run 60 -np 2 "$tmp/test_mpi" mismatch : -x DDP_BACKEND=mpi -x DDP_TIMEOUT -x DDP_SHM_CHUNK=1048576 \
  -np 1 "$tmp/test_mpi" mismatch >"$tmp/out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -Eq "rank [01] has mpi_chunk=524288, rank 2 has mpi_chunk=1048576|rank 2 has mpi_chunk=1048576, rank [01] has mpi_chunk=524288" "$tmp/out"; then
  echo "PASS mpi.chunk_on_one_rank_named"
else echo "FAIL mpi.chunk_on_one_rank_named: exit $rc: $(grep 'ddp' "$tmp/out" | head -c 400 | tr '\n' ' ')"; fail=1; fi
check destroy_named nonzero 10 leave 3 "rank 1 left the job (ddp_destroy) while rank [02] waits in all_reduce #1\|rank 1 called ddp_destroy while rank [02] is in all_reduce #1"
check timeout_names_late_rank nonzero 10 late 3 "timed out after 1.0 s in MPI waiting for rank 1 (no answer: busy outside ddp.h"
# a rank stuck for good: the others time out, and their ddp_destroy returns (MPI_Win_free and
# MPI_Finalize waited for the stuck rank: forever), so their exits end the job (the first exit
# may end the other before it says so)
check destroy_returns_past_a_stuck_rank nonzero 15 stuck 3 "rank [02]: .*, then ddp_destroy returned after [0-9.]* s"
# a rank stuck before its ddp_init: the others waited in MPI_Init for good; past the timeout
# they say so and end, and so does the job
check init_bounded_past_a_rank_stuck_before_it nonzero 15 stuck_before_init 3 "the MPI group did not form within 1.0 s"
# ddp_init again after ddp_destroy (which finalized MPI): a one-line refusal on every rank
# (MPI aborted the job, naming MPI_Query_thread after MPI_FINALIZE)
check init_after_finalize_refused 0 15 reinit 2 "again: backend unavailable or failed: MPI was finalized (by an earlier ddp_destroy"
# the chain's shared memory: 512 KiB per slot by default ((3 ranks + 4) slots), DDP_SHM_CHUNK's size when set
for want in "3670016 default" "28672 set DDP_SHM_CHUNK=4096"; do
  set -- $want
  DDP_TIMEOUT=60 run 60 -np 3 -x DDP_DEBUG=1 ${3:+-x "$3"} "$tmp/test_mpi" mismatch >"$tmp/out" 2>&1
  n=$(grep -c "MPI all-reduce: a chain of 1 host, $1 bytes of shared memory" "$tmp/out")
  if [ "$n" = 3 ]; then echo "PASS mpi.chain_memory_$2"; else
    echo "FAIL mpi.chain_memory_$2: $n of 3 ranks say $1 bytes: $(grep 'MPI all-reduce' "$tmp/out" | head -1)"; fail=1; fi
done
# torchrun-style workers of a launcher that mpirun started (each with torchrun's names,
# two "nodes" rehearsed on one host) inherit mpirun's variables: they meet through the
# store on the CPU backend instead of calling MPI_Init, which aborted one and left the
# other waiting forever
cat >"$tmp/workers.sh" <<'EOF'
#!/bin/sh
export WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$1; shift
RANK=0 GROUP_RANK=0 "$@" & a=$!
RANK=1 GROUP_RANK=1 "$@"; b=$?
wait $a; exit $(($? | b))
EOF
mpicc -std=c99 -O2 -DDDP_MPI -I. examples/hello_allreduce.c -o "$tmp/hello" -lm
DDP_TIMEOUT=20 timeout 60 mpirun --allow-run-as-root -np 1 -x DDP_TIMEOUT sh "$tmp/workers.sh" $((29600 + $$ % 300)) \
  "$tmp/hello" >"$tmp/out" 2>&1; rc=$?
if [ $rc = 0 ] && grep -q "sum 3, expected 3, world 2, backend cpu" "$tmp/out"; then echo "PASS mpi.torchrun_workers_inside_mpirun"
else echo "FAIL mpi.torchrun_workers_inside_mpirun: exit $rc: $(grep -v '^\s*$' "$tmp/out" | head -c 400 | tr '\n' ' ')"; fail=1; fi

# DDP_BACKEND=mpi for ranks no MPI launcher started (ddp_launch's, torchrun's): one line
# from each, before an MPI_Init that aborts (or makes each a world of one)
DDP_BACKEND=mpi DDP_TIMEOUT=20 timeout 60 "$tmp/hello" --nproc 2 >"$tmp/out" 2>&1; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c 'the MPI backend was asked for (DDP_BACKEND), but no MPI launcher started these ranks' "$tmp/out")" = 2 ] &&
   ! grep -qi 'MPI says\|unfinalized\|MPI_Init' "$tmp/out"; then echo "PASS mpi.backend_mpi_without_an_mpi_launcher_says_how"
else echo "FAIL mpi.backend_mpi_without_an_mpi_launcher_says_how: exit $rc: $(head -c 400 "$tmp/out" | tr '\n' ' ')"; fail=1; fi

# launchers nested, or torchrun's names exported into mpirun: the tasks of one mpirun share
# a RANK. Each is said as such within seconds (before: "two launches share this port?", and
# for ddp's launcher around mpirun, torchrun's variables blamed)
nest() { # name command... (the plain CPU build: these never reach MPI)
  local name=$1 t0=$SECONDS; shift
  DDP_TIMEOUT=20 timeout 60 "$@" >"$tmp/out" 2>&1; rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $((SECONDS - t0)) -le 20 ] && grep -q "$want" "$tmp/out"; then echo "PASS mpi.$name"
  else echo "FAIL mpi.$name: exit $rc after $((SECONDS - t0)) s: $(grep 'ddp:' "$tmp/out" | head -c 400 | tr '\n' ' ')"; fail=1; fi
}
mpi1="mpirun --allow-run-as-root --oversubscribe --bind-to none"
want="torchrun's RANK meets Open MPI's OMPI_COMM_WORLD_SIZE=2, whose tasks share a RANK set outside"
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29900 + $$ % 90)) nest rank_exported_into_mpirun_said \
  $mpi1 -np 2 -x RANK -x WORLD_SIZE -x MASTER_ADDR -x MASTER_PORT -x DDP_TIMEOUT examples/hello_allreduce
if command -v torchrun >/dev/null && python3 -c 'import torch' 2>/dev/null; then
  nest torchrun_around_mpirun_said torchrun --nproc_per_node 2 --master_port $((29990 + $$ % 90)) --no_python \
    $mpi1 -np 2 -x DDP_TIMEOUT examples/hello_allreduce
else echo "SKIP mpi.torchrun_around_mpirun_said: torchrun (PyTorch) not found"; fi
want="ddp's launcher started Open MPI, whose 2 tasks share one RANK=[01]: start the ranks with one launcher"
MASTER_PORT=$((30080 + $$ % 90)) nest ddp_launcher_around_mpirun_said examples/ddprun -n 2 $mpi1 -np 2 examples/hello_allreduce

# a rank killed in the middle of a run: mpirun ends the job and names it
t0=$SECONDS
DDP_TIMEOUT=60 run 60 -np 3 "$tmp/test_mpi" >"$tmp/out" 2>&1 &
job=$!
# (a rank's command line starts with the program: mpirun's and timeout's hold it further on)
for _ in $(seq 100); do victim=$(pgrep -f "^$tmp/test_mpi" | sed -n 2p); [ -n "$victim" ] && break; sleep 0.1; done
[ -n "$victim" ] && kill -9 "$victim"
wait $job
rc=$?
if [ -n "$victim" ] && [ $rc -ne 0 ] && [ $((SECONDS - t0)) -le 15 ] && grep -qi "signal 9\|killed" "$tmp/out"; then
  echo "PASS mpi.killed_rank_ends_job"
else
  echo "FAIL mpi.killed_rank_ends_job: victim '$victim', mpirun exit $rc after $((SECONDS - t0)) s: $(tail -c 300 "$tmp/out" | tr '\n' ' ')"; fail=1
fi
# Under MPICH's Hydra, ranks ask for the launch's id over PMI_FD; a program that uses
# MPI besides ddp.h (built with mpicc, MPI_Init before ddp_init or after it) still runs
# to its end: ddp.h leaves the PMI connection to MPI (Hydra stops a job whose process
# closes it unfinalized, and MPI cannot finalize one closed under it).
if command -v mpiexec.hydra >/dev/null && command -v mpicc.mpich >/dev/null; then
  cat >"$tmp/both.c" <<'EOF'
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <mpi.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
    int before = argc > 1 && strcmp(argv[1], "before") == 0, one = 1, sum = 0;
    ddp_ctx ctx;
    float x;
    if (before) MPI_Init(&argc, &argv);
    if (ddp_init(&ctx, NULL) != DDP_OK) return 1;
    if (!before) MPI_Init(&argc, &argv);
    x = (float)(ctx.rank + 1);
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 2;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("ddp %g mpi %d\n", x, sum);
    if (before) { ddp_destroy(&ctx); MPI_Finalize(); } else { MPI_Finalize(); ddp_destroy(&ctx); }
    return 0;
}
EOF
  if ! mpicc.mpich -std=c99 -Wall -Wextra -Wpedantic -Werror -I. "$tmp/both.c" -o "$tmp/both" 2>"$tmp/log"; then
    echo "FAIL mpi.mpich_beside_mpi.build: $(head -c 400 "$tmp/log" | tr '\n' ' ')"; fail=1
  else
    for order in before after; do
      out=$(DDP_TIMEOUT=30 timeout 60 mpiexec.hydra -n 3 "$tmp/both" $order 2>&1); rc=$?
      if [ $rc -eq 0 ] && [ "$(grep -c '^ddp 6 mpi 3$' <<<"$out")" -eq 3 ]; then echo "PASS mpi.mpich_beside_mpi.init_$order"
      else echo "FAIL mpi.mpich_beside_mpi.init_$order: exit $rc: $(head -c 400 <<<"$out" | tr '\n' ' ')"; fail=1; fi
    done
  fi
  # a rank stuck for good under Hydra (or stuck after its ddp_destroy): the MPI backend's
  # ddp_destroy returns (MPICH spun in MPI_Win_free, at 100% of a core, until it came) and
  # the failed ranks' exits end the job (they finalized MPI, or Hydra's PMI on the CPU
  # backend, and Hydra kept waiting for the stuck one)
  if mpicc.mpich -std=c99 -O2 -DDDP_MPI -I. tests/test_mpi.c -o "$tmp/test_mpich" -lm 2>"$tmp/log"; then
    for backend in mpi cpu; do
      for mode in stuck leave_stuck; do
        t0=$SECONDS
        out=$(timeout 60 mpiexec.hydra -n 3 -genv DDP_TIMEOUT 1 -genv DDP_BACKEND $backend "$tmp/test_mpich" $mode 2>&1); rc=$?
        if [ $rc -ne 0 ] && [ $((SECONDS - t0)) -le 15 ] && grep -q "rank [02]: .*, then ddp_destroy returned" <<<"$out"; then
          echo "PASS mpi.mpich_${backend}_${mode}_rank_ends_the_job"
        else echo "FAIL mpi.mpich_${backend}_${mode}_rank_ends_the_job: exit $rc after $((SECONDS - t0)) s: $(grep ddp <<<"$out" | head -c 400 | tr '\n' ' ')"; fail=1; fi
      done
    done
  else
    echo "FAIL mpi.mpich_build: $(head -c 400 "$tmp/log" | tr '\n' ' ')"; fail=1
  fi
else
  echo "SKIP mpi.mpich_beside_mpi: mpiexec.hydra or mpicc.mpich not found (apt-get install mpich)"
fi
exit $fail
