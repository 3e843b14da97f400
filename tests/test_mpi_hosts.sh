#!/usr/bin/env bash
# CPU training across two hosts with the MPI backend, the hosts simulated on this
# machine: two network namespaces joined by a veth pair (addresses only inside them),
# each rank in a UTS namespace with its host's name, Open MPI's mpirun in host h1
# reaching h2 through a launch agent that enters h2's namespaces. Checks: hello (the
# backend and the all-reduce chain are chosen by themselves), every collective x dtype
# across hosts through the chain (in big chunks and in small ones) and through the
# exchange (ranks dealt round-robin over the hosts), train_classifier and train_gpt on
# 2 hosts x 2 ranks against 1 host x 4 ranks (bit for bit), the same for train_gpt's GPU
# build on the CUDA emulator (and its error without MASTER_ADDR); torchrun-style workers
# of processes that mpirun started say that MPI cannot group them; under MPICH's mpiexec
# (Hydra) the MPI build's train_gpt, the GPU build on the emulator learning rank 0's host
# from Hydra's PMI, the CPU build's error; a rank on h2 killed mid-run, h2 unreachable at
# launch and cut off mid-run. Needs root, ip, unshare and Open MPI (MPICH for Hydra's
# checks); skips with the reason otherwise.
#   tests/test_mpi_hosts.sh bench    instead of the checks: examples/bench_allreduce on 2
#                                    hosts x 2 ranks, the exchange and the chain alternating,
#                                    3 rounds, one table of bus bandwidth (median, min-max)
cd "$(dirname "$0")/.." || exit 1
root=$PWD
skip() { echo "SKIP mpi_hosts: $1"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
for t in ip unshare mpicc mpirun; do command -v $t >/dev/null || skip "$t not found"; done
. tests/hosts.sh
tmp=$(mktemp -d)
cleanup() {
  hosts_down
  rm -rf "$tmp"
}
trap cleanup EXIT
hosts_up ddp$$ 10.231.$(( $$ % 200 + 20 )) || skip "cannot create network namespaces here"
unshare --uts true 2>/dev/null || skip "cannot create UTS namespaces here"
# mpirun's and mpiexec's remote shell: host (after options: mpiexec's ssh gives -x), then
# a command line for a shell
cat > "$tmp/agent" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case "\$host" in
  $net.1) ns=$h1; name=h1 ;;
  $net.2) ns=$h2; name=h2 ;;
  *) echo "agent: no route to host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$name; cd $tmp; \$*"
EOF
chmod +x "$tmp/agent"
build() { mpicc -std=c99 -O2 -fopenmp -DDDP_MPI -I"$root" "$root/$1" -o "$tmp/$2" -lm 2>"$tmp/build.log" ||
  { echo "FAIL mpi_hosts.build_$2: $(head -c 300 "$tmp/build.log")"; exit 1; }; }
build examples/hello_allreduce.c hello
build tests/test_mpi.c test_mpi
# mpirun on h1 (its own host name), 2 ranks on each host unless told otherwise
across() { # timeout hosts args...
  local limit=$1 hosts=$2; shift 2
  timeout -k 2 "$limit" ip netns exec "$h1" unshare --uts sh -c "hostname h1; cd $tmp; exec mpirun --allow-run-as-root \
    --oversubscribe --bind-to none --mca plm_rsh_agent $tmp/agent --mca oob_tcp_if_include $net.0/24 \
    --mca btl_tcp_if_include $net.0/24 --host $hosts -x OMP_NUM_THREADS=1 -x DDP_TIMEOUT $*"
}
two="$net.1:2,$net.2:2"
fail=0
t0=$SECONDS
say() { if [ "$2" = 1 ]; then echo "PASS mpi_hosts.$1"; else echo "FAIL mpi_hosts.$1: $3"; fail=1; fi; }

if [ "$1" = bench ]; then # median (min-max) of each form's bus bandwidth per size, as a table
  build examples/bench_allreduce.c bench
  for round in 1 2 3; do
    for form in exchange chain; do
      DDP_TIMEOUT=120 across 600 "$two" -np 4 -x DDP_BACKEND=mpi -x DDP_MPI_ALLREDUCE=$form "$tmp/bench" \
        --iters 10 --min-bytes 65536 >"$tmp/out" 2>&1 || { echo "bench: $form failed: $(tail -3 "$tmp/out")"; exit 1; }
      # busbw from the time, in more digits than the program prints: 2 (n - 1) / n x algbw, n = 4
      awk -v f=$form '/^ +[0-9]+ / && $6 == "ok" { print f, $1, 1.5 * $1 / $3 / 1e3 }' "$tmp/out" >>"$tmp/rates"
      echo "round $round $form: $(awk '/^ +[0-9]+ / { printf "%s ", $5 }' "$tmp/out")"
    done
  done
  echo; echo "busbw GB/s, 2 hosts x 2 ranks, f32 sum, median of 3 (min-max); bench_allreduce --iters 10"
  echo "| size | exchange | chain | chain / exchange |"; echo "|---:|---:|---:|---:|"
  sort -k2,2n -k3,3g "$tmp/rates" | awk '
    function cell(f, s) { n = count[f, s]; return sprintf("%.3f (%.3f-%.3f)", v[f, s, int((n + 1) / 2)], v[f, s, 1], v[f, s, n]) }
    { v[$1, $2, ++count[$1, $2]] = $3; if (!seen[$2]++) sizes[++ns] = $2 }
    END { for (i = 1; i <= ns; i++) { s = sizes[i]; e = v["exchange", s, int((count["exchange", s] + 1) / 2)]
            c = v["chain", s, int((count["chain", s] + 1) / 2)]
            size = s >= 1048576 ? (s / 1048576) " MB" : (s / 1024) " KB"
            printf "| %s | %s | %s | %.2fx |\n", size, cell("exchange", s), cell("chain", s), (e > 0 ? c / e : 0) } }'
  exit 0
fi
build examples/train_classifier.c clf
build examples/train_gpt.c gpt
cp "$root/examples/train_gpt.txt" "$tmp/" # train_gpt's default data, found in the working directory

DDP_TIMEOUT=30 across 60 "$two" -np 4 -x DDP_DEBUG=1 "$tmp/hello" >"$tmp/out" 2>&1
ok=0; grep -q "sum 10, expected 10, world 4, backend mpi" "$tmp/out" && grep -q "node 1/2" "$tmp/out" &&
  [ "$(grep -c 'MPI all-reduce: a chain of 2 hosts' "$tmp/out")" = 4 ] && ok=1
say hello_two_hosts_chooses_mpi_and_the_chain $ok "$(grep -v '^\[' "$tmp/out" | head -c 400 | tr '\n' ' ')"

collectives() { # name mpirun-args...: every collective x dtype across the hosts, all passing
  local name=$1; shift
  DDP_TIMEOUT=60 across 300 "$two" -np 4 -x DDP_BACKEND=mpi -x DDP_DEBUG=1 "$@" "$tmp/test_mpi" >"$tmp/out" 2>&1
  local rc=$? n bad
  n=$(grep -c '^PASS ' "$tmp/out"); bad=$(grep -c '^FAIL ' "$tmp/out")
  say "$name" "$([ $rc = 0 ] && [ "$n" -gt 100 ] && [ "$bad" = 0 ] && echo 1)" \
    "exit $rc, $n passed, $bad failed: $(grep '^FAIL' "$tmp/out" | head -3 | tr '\n' ' ')"
}
collectives collectives_two_hosts_chain
collectives collectives_two_hosts_chain_small_chunks -x DDP_SHM_CHUNK=4096
ok=0; grep -q "MPI all-reduce: a chain of 2 hosts, 24576 bytes" "$tmp/out" && ok=1
say chain_takes_the_chunk_size $ok "$(grep 'MPI all-reduce' "$tmp/out" | head -1)"
collectives collectives_two_hosts_round_robin_exchange --map-by node
ok=0; grep -q "MPI all-reduce: an exchange among all ranks (the ranks of a host are not consecutive)" "$tmp/out" && ok=1
say round_robin_ranks_take_the_exchange $ok "$(grep 'MPI all-reduce' "$tmp/out" | head -1)"

(cd "$tmp" && ./clf --nproc 4 --epochs 3 --out "$tmp/one.bin" >"$tmp/one.txt" 2>&1)
DDP_TIMEOUT=60 across 120 "$two" -np 4 "$tmp/clf" --epochs 3 --out "$tmp/two.bin" >"$tmp/two.txt" 2>&1
ok=0; cmp -s "$tmp/one.bin" "$tmp/two.bin" && diff -q <(grep ^epoch "$tmp/one.txt") <(grep ^epoch "$tmp/two.txt") >/dev/null && ok=1
say train_classifier_matches_one_host $ok "checkpoints or epoch lines differ: $(grep ^epoch "$tmp/one.txt" | tail -1) vs $(grep ^epoch "$tmp/two.txt" | tail -1)"

gpt_args="--steps 12 --batch-size 2 --val-every 6 --sample-len 0"
(cd "$tmp" && ./gpt --nproc 4 $gpt_args --save "$tmp/g1.safetensors" >"$tmp/g1.txt" 2>&1)
DDP_TIMEOUT=60 across 300 "$two" -np 4 "$tmp/gpt" $gpt_args --save "$tmp/g2.safetensors" >"$tmp/g2.txt" 2>&1
ok=0; cmp -s "$tmp/g1.safetensors" "$tmp/g2.safetensors" && ok=1
say train_gpt_matches_one_host $ok "$("$tmp/gpt" --compare "$tmp/g1.safetensors" "$tmp/g2.safetensors" 2>&1 | tail -1)"

# GPUs across hosts, emulated (train_gpt's GPU build on the CUDA emulator, whose NCCL
# meets in /dev/shm): mpirun gives no address for rank 0's store, so without MASTER_ADDR
# every rank says how to give it; with it, 2 hosts x 2 GPUs train the bytes of 1 x 4
emu=$root/build/emu/examples/train_gpt_gpu
emu_args="--steps 6 --batch-size 2 --val-every 0 --sample-len 0 --layers 2 --dim 64 --ctx 32 --dtype fp32"
if [ -x "$emu" ]; then
  (cd "$tmp" && "$emu" --nproc 4 $emu_args --save "$tmp/e1.safetensors" >"$tmp/e1.txt" 2>&1)
  DDP_TIMEOUT=30 across 120 "$two" -np 4 "$emu" $emu_args >"$tmp/out" 2>&1; rc=$?
  ok=0; [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "MASTER_ADDR is not set: .*(mpirun -x MASTER_ADDR=HOST)" "$tmp/out" && ok=1
  say gpu_across_hosts_without_master_addr_says_how $ok "exit $rc: $(tail -c 300 "$tmp/out" | tr '\n' ' ')"
  DDP_TIMEOUT=30 across 180 "$two" -np 4 -x MASTER_ADDR=$net.1 "$emu" $emu_args --save "$tmp/e2.safetensors" >"$tmp/out" 2>&1
  ok=0; [ -s "$tmp/e1.safetensors" ] && cmp -s "$tmp/e1.safetensors" "$tmp/e2.safetensors" && grep -q "(nccl backend)" "$tmp/out" && ok=1
  say gpu_emulated_two_hosts_equals_one $ok "$(grep -h -v '^step' "$tmp/e1.txt" "$tmp/out" | tail -c 400 | tr '\n' ' ')"
else
  echo "SKIP mpi_hosts.gpu_emulated_two_hosts_equals_one: $emu is not built (make emu)"
fi

# torchrun-style workers (2 a host, torchrun's names) of processes mpirun started on both
# hosts inherit mpirun's variables: MPI cannot group them, and every rank says so in one
# line (MPI_Init in each worker aborted one and left the others waiting past the timeout)
cat >"$tmp/workers.sh" <<EOF
#!/bin/sh
export WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_RANK=\$OMPI_COMM_WORLD_RANK MASTER_ADDR=$net.1 MASTER_PORT=29411
RANK=\$((GROUP_RANK * 2)) LOCAL_RANK=0 "\$@" & a=\$!
RANK=\$((GROUP_RANK * 2 + 1)) LOCAL_RANK=1 "\$@"; b=\$?
wait \$a; exit \$((\$? | b))
EOF
DDP_TIMEOUT=20 across 60 "$net.1:1,$net.2:1" -np 2 sh "$tmp/workers.sh" "$tmp/hello" >"$tmp/out" 2>&1; rc=$?
ok=0; [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
  [ "$(grep -c 'spans 2 hosts: MPI cannot group the workers of a launcher (torchrun, --nproc) that an MPI launcher started' "$tmp/out")" = 4 ] && ok=1
say torchrun_workers_inside_mpirun_say_how $ok "exit $rc: $(grep -v '^\s*$' "$tmp/out" | tail -c 400 | tr '\n' ' ')"

# MPICH's mpiexec (Hydra) on h1, 2 ranks on each host: the MPI build chooses the MPI
# backend and trains the bytes of one host; the GPU build on the emulator learns rank 0's
# host from Hydra's PMI (no MASTER_ADDR) and trains the bytes of 1 x 4; the CPU build says
# which build spans hosts
hydra() { # timeout args...
  local limit=$1; shift
  timeout -k 2 "$limit" ip netns exec "$h1" unshare --uts sh -c "hostname h1; cd $tmp; exec mpiexec.hydra \
    -launcher ssh -launcher-exec $tmp/agent -localhost $net.1 -hosts $net.1:2,$net.2:2 -genv OMP_NUM_THREADS 1 $*"
}
# a build without -DDDP_MPI across hosts: every rank says what to build (it asked for a
# MASTER_ADDR first, which would only have led to this)
(cd "$tmp" && cc -std=c99 -O2 -I"$root" "$root/examples/hello_allreduce.c" -o hello_cpu -lm)
DDP_TIMEOUT=30 across 60 "$two" -np 4 "$tmp/hello_cpu" >"$tmp/out" 2>&1; rc=$?
ok=0; [ $rc -ne 0 ] && [ $rc -ne 124 ] && ! grep -q MASTER_ADDR "$tmp/out" &&
  [ "$(grep -c 'the CPU backend runs on one host, but this job spans hosts (2 of its 4 ranks on this one): build it with mpicc -DDDP_MPI' "$tmp/out")" = 4 ] && ok=1
say cpu_build_across_hosts_says_how $ok "exit $rc: $(tail -c 300 "$tmp/out" | tr '\n' ' ')"

if command -v mpiexec.hydra >/dev/null && command -v mpicc.mpich >/dev/null; then
  mpicc.mpich -std=c99 -O2 -fopenmp -DDDP_MPI -I"$root" "$root/examples/train_gpt.c" -o "$tmp/gpt_mpich" -lm \
    2>"$tmp/build.log" || echo "FAIL mpi_hosts.build_gpt_mpich: $(head -c 300 "$tmp/build.log")"
  DDP_TIMEOUT=60 hydra 300 -n 4 "$tmp/gpt_mpich" $gpt_args --save "$tmp/g3.safetensors" >"$tmp/out" 2>&1
  ok=0; cmp -s "$tmp/g1.safetensors" "$tmp/g3.safetensors" && grep -q "ranks: 4 (mpi backend)" "$tmp/out" && ok=1
  say hydra_train_gpt_matches_one_host $ok "$(grep -v '^step' "$tmp/out" | tail -c 300 | tr '\n' ' ')"
  if [ -x "$emu" ]; then
    DDP_TIMEOUT=30 hydra 180 -n 4 "$emu" $emu_args --save "$tmp/e3.safetensors" >"$tmp/out" 2>&1
    ok=0; [ -s "$tmp/e1.safetensors" ] && cmp -s "$tmp/e1.safetensors" "$tmp/e3.safetensors" && ok=1
    say hydra_gpu_emulated_learns_rank0s_host $ok "$(grep -v '^step' "$tmp/out" | tail -c 400 | tr '\n' ' ')"
  fi
  DDP_TIMEOUT=30 hydra 60 -n 4 "$tmp/hello_cpu" >"$tmp/out" 2>&1
  ok=0; [ "$(grep -c 'ddp: error: rank ./4: the CPU backend runs on one host, but this job spans 2 hosts: build it with mpicc -DDDP_MPI' "$tmp/out")" = 4 ] && ok=1
  say hydra_cpu_build_across_hosts_says_how $ok "$(tail -c 300 "$tmp/out" | tr '\n' ' ')"
else
  echo "SKIP mpi_hosts.hydra: mpiexec.hydra or mpicc.mpich not found (apt-get install mpich)"
fi

# a rank on h2 killed in the middle: the job ends within seconds, naming it
t0=$SECONDS
DDP_TIMEOUT=60 across 60 "$two" -np 4 -x DDP_BACKEND=mpi "$tmp/test_mpi" >"$tmp/out" 2>&1 &
job=$!
victim=
for _ in $(seq 200); do victim=$(ip netns pids "$h2" | xargs -r ps -o pid=,comm= -p 2>/dev/null | awk '$2=="test_mpi"{print $1; exit}'); [ -n "$victim" ] && break; sleep 0.05; done
[ -n "$victim" ] && kill -9 "$victim"
wait $job; rc=$?
# named by mpirun's "exited on signal 9", or by its exit status 137 (128 + SIGKILL) when a
# survivor's error reached mpirun first and it printed only "returned a non-zero exit code"
ok=0; [ -n "$victim" ] && [ $rc -ne 0 ] && [ $((SECONDS - t0)) -le 20 ] &&
  { grep -qi "signal 9\|killed" "$tmp/out" || [ $rc = 137 ]; } && ok=1
say killed_rank_on_second_host_ends_job $ok "victim '$victim', exit $rc after $((SECONDS - t0)) s: $(tail -c 300 "$tmp/out" | tr '\n' ' ')"

# h2 unreachable when the job starts: a clear error at once
ip -n "$h2" link set "$tag-b" down
t0=$SECONDS
DDP_TIMEOUT=10 across 60 "$two" -np 4 "$tmp/hello" >"$tmp/out" 2>&1; rc=$?
ok=0; [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $((SECONDS - t0)) -le 15 ] && grep -qi "connection back to mpirun\|unable\|route" "$tmp/out" && ok=1
say unreachable_host_fails_fast $ok "exit $rc after $((SECONDS - t0)) s: $(head -c 300 "$tmp/out" | tr '\n' ' ')"
ip -n "$h2" link set "$tag-b" up

# h2 cut off in the middle of a run: each rank on h1 times out (DDP_TIMEOUT) with a clear
# error instead of hanging (mpirun itself may then wait for h2's daemon: the timeout ends it).
# Asking a rank on h2 where it is must not wait for a TCP connect to it (MPI_Send did:
# minutes, and the rank never said why). The ranks are in ddp.h's all-reduces when the link
# goes down (test_mpi's own checks meet in a blocking MPI_Allreduce, which would hang)
t0=$SECONDS
DDP_TIMEOUT=3 across 20 "$two" -np 4 -x DDP_BACKEND=mpi "$tmp/test_mpi" cut >"$tmp/out" 2>&1 &
job=$!
for _ in $(seq 200); do [ "$(grep -c 'all-reducing' "$tmp/out")" = 4 ] && break; sleep 0.05; done
ip -n "$h2" link set "$tag-b" down
wait $job; rc=$?
ok=0; [ $rc -ne 0 ] && grep -q "rank 0/4: .* timed out after 3.0 s in MPI" "$tmp/out" &&
  grep -q "rank 1/4: .* timed out after 3.0 s in MPI" "$tmp/out" && ok=1
say cut_off_host_times_out $ok "exit $rc after $((SECONDS - t0)) s: $(grep 'ddp: error' "$tmp/out" | head -2 | tr '\n' ' ')"
exit $fail
