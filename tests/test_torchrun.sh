#!/usr/bin/env bash
# A compiled ddp.h program under PyTorch's launchers, with the command lines the
# README gives: torchrun --no_python, and the legacy torch.distributed.launch with
# --use_env --no_python (without --no_python they run the binary as a Python script);
# two torchrun --nnodes=2 on one machine, and on two simulated hosts with the GPU build
# on the CUDA emulator.
# Runs where `import torch` works, and skips with the reason elsewhere.
cd "$(dirname "$0")/.." || exit 1
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then py=$p; break; fi
done
if [ -z "$py" ]; then echo "SKIP torchrun: no python3 here imports torch (Debian: apt-get install python3-torch)"; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
hello=examples/hello_allreduce
torchrun=$(command -v torchrun)
if [ -z "$torchrun" ] || ! head -1 "$torchrun" | grep -q python || ! "$(head -1 "$torchrun" | sed 's/^#! *//; s/ .*//')" -c 'import torch' 2>/dev/null; then
  torchrun="$py -m torch.distributed.run" # what torchrun is
fi
# torch 1.x (Debian's python3-torch is 1.13): on Python >= 3.11 it cannot parse its
# own default --redirects/--tee of 0 (IntFlag iteration changed), so they are named;
# its agent checks its workers every 5 s (0.1 s in torch 2), so that is shortened.
extra=""
if "$py" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) >= 2)'; then
  extra="--redirects 1 --tee 1 --log_dir $tmp/logs --monitor_interval 0.2"
fi
version=$("$py" -c 'import torch; print(torch.__version__)')
# a free port P with P+1 free too: torchrun's agent takes P, ddp.h's store P+1
port() { "$py" -c '
import socket
while True:
    a, b = socket.socket(), socket.socket()
    a.bind(("127.0.0.1", 0))
    try:
        b.bind(("127.0.0.1", a.getsockname()[1] + 1))
        break
    except (OSError, OverflowError):
        a.close(); b.close()
print(a.getsockname()[1])'; }

# check name expected-world command...
check() {
  local name=$1 n=$2 out rc want; shift 2
  out=$(timeout 120 "$@" 2>&1); rc=$?
  want="sum $((n * (n + 1) / 2)), expected $((n * (n + 1) / 2)), world $n, backend cpu"
  if [ $rc -eq 0 ] && grep -q "$want" <<<"$out" && [ "$(grep -c 'my sum is' <<<"$out")" -eq "$n" ]; then
    echo "PASS torchrun.$name"
  else
    echo "FAIL torchrun.$name: '$*' (torch $version) status $rc, want $n ranks and '$want': $(grep -v '^\*\|OMP_NUM\|^WARNING' <<<"$out" | tail -5 | tr '\n' ' ' | head -c 400)"
    fail=1
  fi
}
# shellcheck disable=SC2086 # $torchrun and $extra are word lists
check no_python_nproc3 3 $torchrun $extra --no_python --nproc_per_node=3 --master_port="$(port)" $hello
# shellcheck disable=SC2086
check legacy_launch_use_env_no_python 3 "$py" -m torch.distributed.launch $extra --use_env --no_python \
  --nproc_per_node=3 --master_port="$(port)" $hello
# two torchrun --nnodes=2 on one machine (how a 2-node launch is rehearsed): one job of
# 4 ranks on one host, which the CPU backend runs as such
p=$(port)
node() { echo "$torchrun $extra --no_python --nnodes=2 --node_rank=$1 --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=$p $hello"; }
check two_nodes_on_one_host 4 bash -c "$(node 1) & other=\$!; $(node 0); rc=\$?; wait \$other || rc=1; exit \$rc"

# the README's GPU line, torchrun --nnodes=2 on each of two hosts (simulated: network
# namespaces, tests/hosts.sh), with train_gpt's GPU build on the CUDA emulator (its NCCL
# meets in /dev/shm): the bytes of 1 host x 4 GPUs
emu=$PWD/build/emu/examples/train_gpt_gpu
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
  echo "SKIP torchrun.two_hosts_gpu_emulated: needs root, ip and unshare for network namespaces"
elif [ ! -x "$emu" ]; then
  echo "SKIP torchrun.two_hosts_gpu_emulated: $emu is not built (make emu)"
else
  . tests/hosts.sh
  trap 'hosts_down; rm -rf "$tmp"' EXIT
  if hosts_up ddpt$$ 10.233.$(( $$ % 200 + 20 )) && unshare --uts true 2>/dev/null; then
    args="--steps 6 --batch-size 2 --val-every 0 --sample-len 0 --layers 2 --dim 64 --ctx 32 --dtype fp32 --data $PWD/examples/train_gpt.txt"
    timeout 120 "$emu" --nproc 4 $args --save "$tmp/one.safetensors" >"$tmp/one.txt" 2>&1
    on() { # host node_rank: torchrun there, its agent's store on h1
      timeout 180 ip netns exec "$([ "$1" = h1 ] && echo "$h1" || echo "$h2")" unshare --uts sh -c "hostname $1; cd $tmp;
        exec $torchrun $extra --no_python --nnodes=2 --node_rank=$2 --nproc_per_node=2 --master_addr=$net.1 \
        --master_port=29400 $emu $args --save $tmp/two.safetensors"
    }
    on h2 1 >"$tmp/h2.txt" 2>&1 &
    other=$!
    on h1 0 >"$tmp/h1.txt" 2>&1; rc=$?
    wait $other || rc=1
    if [ $rc -eq 0 ] && [ -s "$tmp/one.safetensors" ] && cmp -s "$tmp/one.safetensors" "$tmp/two.safetensors" &&
      grep -q "ranks: 4 (nccl backend)" "$tmp/h1.txt"; then echo "PASS torchrun.two_hosts_gpu_emulated"
    else
      echo "FAIL torchrun.two_hosts_gpu_emulated: status $rc: $(grep -h -v '^step\|^\*\|OMP_NUM\|^WARNING' "$tmp/one.txt" "$tmp/h1.txt" "$tmp/h2.txt" | tail -6 | tr '\n' ' ' | head -c 500)"
      fail=1
    fi
  else
    echo "SKIP torchrun.two_hosts_gpu_emulated: cannot create network or UTS namespaces here"
  fi
fi
exit $fail
