#!/usr/bin/env bash
# ddp.h programs under a real Slurm (slurmctld, slurmd and munged from Debian's packages)
# on two hosts simulated on this machine: two network namespaces joined by a veth pair
# (addresses only inside them), each host with its own name (UTS namespace), /etc/hosts
# and /tmp (mount namespace) and a /dev/shm apart from the machine's that the two share
# (the CUDA emulator's NCCL meets there), a slurmd on each and the controller on h1.
# Checks, on one host: srun (hello; train_gpt equal to --nproc 4 byte for byte, also as
# --nproc 4 inside a step of one task; two steps of one allocation at once never merge),
# a program started alone by the batch script or salloc's shell says to use srun, mpirun
# and mpiexec inside an allocation. Across both hosts: the CPU build and an MPI build
# started without PMIx say how to run them; the MPI build under srun --mpi=pmix chooses
# the MPI backend by itself and trains the bits of one host (ranks also dealt cyclically,
# 2 + 1), as under mpirun across the allocation and from the README's batch script, and
# torchrun-style workers of its tasks say that MPI cannot group them; a
# rank killed on h2 ends the step; the GPU build of train_gpt on the CUDA emulator (make
# emu), 2 hosts x 2 GPUs, trains the bytes of 1 x 4 (the store, the NCCL id and the GPU
# of each rank across hosts). Needs root, ip, unshare, nsenter, Slurm and munge; the MPI
# checks need mpicc. Skips with the reason otherwise.
cd "$(dirname "$0")/.." || exit 1
root=$PWD
skip() { echo "SKIP slurm: $1"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
for t in ip unshare nsenter slurmctld slurmd srun salloc sinfo munged; do
  command -v $t >/dev/null || skip "$t not found (Debian: slurmctld slurmd slurm-client munge)"
done
. tests/hosts.sh
# not under /tmp: each host mounts its own /tmp
tmp=$(mktemp -d -p /var/tmp) || exit 1
cleanup() {
  hosts_down
  [ -f "$tmp/munge/pid" ] && kill "$(cat "$tmp/munge/pid")" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
hosts_up ddps$$ 10.232.$(( $$ % 200 + 20 )) || skip "cannot create network namespaces here"
unshare --uts --mount true 2>/dev/null || skip "cannot create UTS and mount namespaces here"
printf '127.0.0.1 localhost\n%s h1\n%s h2\n' "$net.1" "$net.2" >"$tmp/hosts"
# host NAME COMMAND: a shell on that host (its network, name, hosts file, /tmp and /dev/shm)
host() {
  local ns; ns=$([ "$1" = h1 ] && echo "$h1" || echo "$h2")
  nsenter --net=/run/netns/"$ns" unshare --uts --mount sh -c "set -e; mount --bind $tmp/hosts /etc/hosts
    mount -t tmpfs none /tmp; mount --bind $tmp/shm /dev/shm; hostname $1; cd $tmp; $2"
}

# munge with a key of this test's own, its socket in $tmp (both hosts reach it)
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/shm" && chmod 700 "$tmp/munge"
head -c 128 /dev/urandom >"$tmp/munge/key" && chmod 600 "$tmp/munge/key"
munged --force --key-file="$tmp/munge/key" --socket="$tmp/munge/sock" --pid-file="$tmp/munge/pid" \
  --log-file="$tmp/munge/log" --seed-file="$tmp/munge/seed" 2>"$tmp/munged.err" || skip "munged does not start: $(head -c 200 "$tmp/munged.err")"
cat >"$tmp/slurm.conf" <<EOF
ClusterName=$tag
SlurmctldHost=h1($net.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.%n.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
NodeName=h1 NodeAddr=$net.1 CPUs=8 State=UNKNOWN
NodeName=h2 NodeAddr=$net.2 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
export SLURM_CONF=$tmp/slurm.conf
host h1 "slurmctld -D >$tmp/ctld.out 2>&1 & slurmd -D >$tmp/d1.out 2>&1 &"
host h2 "slurmd -D >$tmp/d2.out 2>&1 &"
up=0
for _ in $(seq 150); do # until both nodes report idle (30 s at most)
  [ "$(host h1 "sinfo -h -o '%D %T'" 2>/dev/null)" = "2 idle" ] && { up=1; break; }
  sleep 0.2
done
[ $up = 1 ] || skip "Slurm did not come up: $(tail -c 300 "$tmp/ctld.out" "$tmp/d1.out" "$tmp/d2.out" | tr '\n' ' ')"

fail=0
say() { if [ "$2" = 1 ]; then echo "PASS slurm.$1"; else echo "FAIL slurm.$1: $3"; fail=1; fi; }
cc_build() { cc -std=c99 -O2 -fopenmp -I"$root" "$root/$1" -o "$tmp/$2" -lm 2>"$tmp/build.log" ||
  { echo "FAIL slurm.build_$2: $(head -c 300 "$tmp/build.log")"; exit 1; }; }
cc_build examples/hello_allreduce.c hello
cc_build examples/train_gpt.c gpt
cp "$root/examples/train_gpt.txt" "$tmp/" # train_gpt's default data, found in the working directory
# srun on h1 (the login node here), under a time limit
on_h1() { local limit=$1; shift; timeout -k 2 "$limit" bash -c "$(declare -f host); h1=$h1 h2=$h2 tmp=$tmp; host h1 \"$*\""; }
export OMP_NUM_THREADS=1 DDP_TIMEOUT=30
gpt_args="--steps 12 --batch-size 2 --val-every 6 --sample-len 0 --layers 2 --dim 64 --ctx 32"
(cd "$tmp" && ./gpt --nproc 4 $gpt_args --save "$tmp/nproc4.safetensors" >"$tmp/nproc4.txt" 2>&1) ||
  { echo "FAIL slurm.reference_run: $(tail -3 "$tmp/nproc4.txt")"; exit 1; }

on_h1 60 "srun -N 1 -n 4 ./hello" >"$tmp/out" 2>&1
ok=0; grep -q "sum 10, expected 10, world 4, backend cpu" "$tmp/out" && ok=1
say one_host_hello $ok "$(tail -c 300 "$tmp/out" | tr '\n' ' ')"

on_h1 120 "srun -N 1 -n 4 ./gpt $gpt_args --save one.safetensors" >"$tmp/out" 2>&1
ok=0; cmp -s "$tmp/nproc4.safetensors" "$tmp/one.safetensors" && ok=1
say one_host_train_gpt_equals_nproc_4 $ok "$(grep -v '^step' "$tmp/out" | tail -c 300 | tr '\n' ' ')"

# a step of one task (srun --pty bash, srun -n 1) is a place to launch from
on_h1 120 "srun -N 1 -n 1 ./gpt --nproc 4 $gpt_args --save step1.safetensors" >"$tmp/out" 2>&1
ok=0; cmp -s "$tmp/nproc4.safetensors" "$tmp/step1.safetensors" && ok=1
say nproc_inside_a_step_of_one_task $ok "$(grep -v '^step' "$tmp/out" | tail -c 300 | tr '\n' ' ')"

# two steps of one allocation on one host at once: the same program, flags and node, a
# job id each (job.step), so each trains alone
on_h1 120 "salloc -N 1 -n 8 -w h1 sh -c 'srun -n 4 --exact ./gpt $gpt_args --save a.safetensors >a.txt 2>&1 &
  srun -n 4 --exact ./gpt $gpt_args --save b.safetensors >b.txt 2>&1; wait'" >"$tmp/out" 2>&1
ok=0; cmp -s "$tmp/nproc4.safetensors" "$tmp/a.safetensors" && cmp -s "$tmp/nproc4.safetensors" "$tmp/b.safetensors" && ok=1
say two_steps_at_once_never_merge $ok "$(grep -h -v '^step' "$tmp/a.txt" "$tmp/b.txt" "$tmp/out" 2>&1 | tail -c 400 | tr '\n' ' ')"

# the batch script and salloc's shell run once, though Slurm's count says 4: a program
# started there alone says to use srun, at once, instead of waiting for 3 more ranks
on_h1 60 "salloc -N 1 -n 4 ./hello" >"$tmp/out" 2>&1; rc=$?
ok=0; [ $rc -ne 0 ] && grep -q "salloc's shell (SLURM_NTASKS=4, no SLURM_STEP_ID), which run once: start the ranks with srun" "$tmp/out" && ok=1
say salloc_shell_says_srun $ok "exit $rc: $(tail -c 300 "$tmp/out" | tr '\n' ' ')"
on_h1 60 "sbatch --wait -N 1 -n 4 -o batch.out --wrap ./hello" >"$tmp/out" 2>&1; rc=$?
ok=0; [ $rc -ne 0 ] && grep -q "batch script or salloc's shell (SLURM_NTASKS=4, no SLURM_STEP_ID)" "$tmp/batch.out" && ok=1
say batch_script_says_srun $ok "exit $rc: $(cat "$tmp/out" "$tmp/batch.out" 2>&1 | tail -c 300 | tr '\n' ' ')"

# mpirun and mpiexec inside an allocation: their ranks still see Slurm's variables
if command -v mpirun >/dev/null; then
  on_h1 60 "salloc -N 1 -n 4 mpirun --allow-run-as-root --oversubscribe -np 4 ./hello" >"$tmp/out" 2>&1
  ok=0; grep -q "sum 10, expected 10, world 4, backend cpu" "$tmp/out" && ok=1
  say mpirun_inside_an_allocation $ok "$(tail -c 300 "$tmp/out" | tr '\n' ' ')"
fi
if command -v mpiexec.hydra >/dev/null; then
  on_h1 60 "salloc -N 1 -n 4 mpiexec.hydra -n 4 ./hello" >"$tmp/out" 2>&1
  ok=0; grep -q "sum 10, expected 10, world 4, backend cpu" "$tmp/out" && ok=1
  say hydra_inside_an_allocation $ok "$(tail -c 300 "$tmp/out" | tr '\n' ' ')"
fi

# across the hosts without the MPI backend: every rank says how, at once
t0=$SECONDS
on_h1 60 "srun -N 2 --ntasks-per-node=2 ./hello" >"$tmp/out" 2>&1; rc=$?
ok=0; [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $((SECONDS - t0)) -le 20 ] &&
  [ "$(grep -c 'the CPU backend runs on one host, but this job spans 2 hosts: build it with mpicc -DDDP_MPI' "$tmp/out")" = 4 ] && ok=1
say cpu_build_across_hosts_says_how $ok "exit $rc after $((SECONDS - t0)) s: $(tail -c 300 "$tmp/out" | tr '\n' ' ')"

# GPUs across hosts, emulated: srun puts rank 0's store on the step's first host, NCCL's
# id travels through it, each rank drives the GPU of its local rank
emu=$root/build/emu/examples/train_gpt_gpu
if [ -x "$emu" ]; then
  on_h1 180 "srun -N 1 -n 4 $emu $gpt_args --dtype fp32 --save emu1.safetensors" >"$tmp/out1" 2>&1
  on_h1 180 "DDP_DEBUG=1 srun -N 2 --ntasks-per-node=2 $emu $gpt_args --dtype fp32 --save emu2.safetensors" >"$tmp/out" 2>&1
  ok=0; [ -s "$tmp/emu1.safetensors" ] && cmp -s "$tmp/emu1.safetensors" "$tmp/emu2.safetensors" &&
    grep -q "ranks: 4 (nccl backend)" "$tmp/out" && grep -q "local rank 1/2, node 1/2, device 1" "$tmp/out" && ok=1
  say gpu_emulated_two_hosts_equals_one $ok "$(grep -h -v '^step' "$tmp/out1" "$tmp/out" | grep -v '^\[' | tail -c 400 | tr '\n' ' ')"
else
  echo "SKIP slurm.gpu_emulated_two_hosts_equals_one: $emu is not built (make emu)"
fi

if command -v mpicc >/dev/null && host h1 "srun --mpi=list" 2>&1 | grep -q pmix; then
  mpi_build() { mpicc -std=c99 -O2 -fopenmp -DDDP_MPI -I"$root" "$root/$1" -o "$tmp/$2" -lm 2>"$tmp/build.log" ||
    { echo "FAIL slurm.build_$2: $(head -c 300 "$tmp/build.log")"; exit 1; }; }
  mpi_build examples/hello_allreduce.c hello_mpi
  mpi_build examples/train_gpt.c gpt_mpi

  on_h1 60 "srun -N 2 --ntasks-per-node=2 ./hello_mpi" >"$tmp/out" 2>&1; rc=$?
  ok=0; [ $rc -ne 0 ] && [ "$(grep -c 'start it with an MPI launcher (mpirun, srun --mpi=pmix)' "$tmp/out")" = 4 ] && ok=1
  say mpi_build_without_pmix_says_how $ok "exit $rc: $(tail -c 300 "$tmp/out" | tr '\n' ' ')"

  on_h1 60 "DDP_DEBUG=1 srun -N 2 --ntasks-per-node=2 --mpi=pmix ./hello_mpi" >"$tmp/out" 2>&1
  ok=0; grep -q "sum 10, expected 10, world 4, backend mpi" "$tmp/out" && grep -q "node 1/2" "$tmp/out" && ok=1
  say mpi_across_hosts_chooses_mpi $ok "$(grep -v '^\[' "$tmp/out" | tail -c 400 | tr '\n' ' ')"

  on_h1 60 "srun -N 2 -n 3 -m cyclic --mpi=pmix ./hello_mpi" >"$tmp/out" 2>&1
  ok=0; grep -q "sum 6, expected 6, world 3, backend mpi" "$tmp/out" && ok=1
  say mpi_cyclic_two_and_one $ok "$(tail -c 300 "$tmp/out" | tr '\n' ' ')"

  # torchrun-style workers (2 a host, torchrun's names) of the tasks srun --mpi=pmix
  # started inherit PMIx's variables: MPI cannot group them, and every rank says so
  cat >"$tmp/workers.sh" <<'EOF'
#!/bin/sh
export WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_RANK=$SLURM_NODEID MASTER_ADDR=h1 MASTER_PORT=29411
RANK=$((GROUP_RANK * 2)) LOCAL_RANK=0 "$@" & a=$!
RANK=$((GROUP_RANK * 2 + 1)) LOCAL_RANK=1 "$@"; b=$?
wait $a; exit $(($? | b))
EOF
  on_h1 60 "srun -N 2 --ntasks-per-node=1 --mpi=pmix sh workers.sh ./hello_mpi" >"$tmp/out" 2>&1; rc=$?
  ok=0; [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
    [ "$(grep -c 'spans 2 hosts: MPI cannot group the workers of a launcher (torchrun, --nproc)' "$tmp/out")" = 4 ] && ok=1
  say torchrun_workers_inside_srun_say_how $ok "exit $rc: $(tail -c 300 "$tmp/out" | tr '\n' ' ')"

  on_h1 120 "srun -N 2 --ntasks-per-node=2 --mpi=pmix ./gpt_mpi $gpt_args --save two.safetensors" >"$tmp/out" 2>&1
  ok=0; cmp -s "$tmp/nproc4.safetensors" "$tmp/two.safetensors" && grep -q "ranks: 4 (mpi backend)" "$tmp/out" && ok=1
  say mpi_train_gpt_two_hosts_equals_one $ok "$(grep -v '^step' "$tmp/out" | tail -c 300 | tr '\n' ' ')"

  # mpirun across both hosts of an allocation: it starts its daemons with srun, so every
  # rank of a host sees that step's SLURM_PROCID; Open MPI's variables decide
  on_h1 120 "salloc -N 2 -n 4 mpirun --allow-run-as-root -np 4 --map-by slot ./gpt_mpi $gpt_args --save mpirun.safetensors" >"$tmp/out" 2>&1
  ok=0; cmp -s "$tmp/nproc4.safetensors" "$tmp/mpirun.safetensors" && grep -q "ranks: 4 (mpi backend)" "$tmp/out" && ok=1
  say mpirun_across_an_allocation_equals_one_host $ok "$(grep -v '^step' "$tmp/out" | tail -c 300 | tr '\n' ' ')"

  # a batch script as the README writes it, with train_gpt
  printf '#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\nsrun --mpi=pmix ./gpt_mpi %s --save batch.safetensors\n' \
    "$gpt_args" >"$tmp/job.sh"
  on_h1 120 "sbatch --wait -o batch2.out job.sh" >"$tmp/out" 2>&1
  ok=0; cmp -s "$tmp/nproc4.safetensors" "$tmp/batch.safetensors" && ok=1
  say batch_script_srun_equals_one_host $ok "$(cat "$tmp/out" "$tmp/batch2.out" 2>&1 | grep -v '^step' | tail -c 300 | tr '\n' ' ')"

  # a rank on h2 killed in the middle: the step ends within seconds
  on_h1 60 "srun -N 2 --ntasks-per-node=2 --mpi=pmix ./gpt_mpi $gpt_args --steps 100000" >"$tmp/out" 2>&1 &
  job=$!
  victim=
  for _ in $(seq 300); do # until training runs, then a rank of h2's
    grep -q '^step' "$tmp/out" &&
      victim=$(ip netns pids "$h2" | xargs -r ps -o pid=,comm= -p 2>/dev/null | awk '$2=="gpt_mpi"{print $1; exit}')
    [ -n "$victim" ] && break
    sleep 0.1
  done
  t0=$SECONDS
  [ -n "$victim" ] && kill -9 "$victim"
  wait $job; rc=$?
  ok=0; [ -n "$victim" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $((SECONDS - t0)) -le 20 ] && ok=1
  say killed_rank_on_h2_ends_the_step $ok "victim '$victim', exit $rc after $((SECONDS - t0)) s: $(grep -v '^step' "$tmp/out" | tail -c 300 | tr '\n' ' ')"
else
  echo "SKIP slurm.mpi: no mpicc, or this Slurm has no PMIx plugin (srun --mpi=list)"
fi
exit $fail
