#!/usr/bin/env bash
# tests/test_train_gpt_gpu.sh [GPU_BINARY] - examples/train_gpt_gpu (the GPU path) against
# the CPU build examples/train_gpt, from the same weights and data: the CPU build trains
# step 1 and saves it; both builds resume from that file for steps 2-6 and save. The GPU
# binary is the argument, else $DDP_GPU_BIN, else examples/train_gpt_gpu (make check-emu
# passes the emulated build/emu/examples/train_gpt_gpu).
#
# Tolerances for --dtype fp32 (fp32 on both sides, no TF32): the GPU sums in other
# orders (whole-batch matmuls, block reductions), so each op differs by a few ulp, ~1e-6
# relative, and a few steps compound that to ~1e-5. Checked:
#   - every step's training loss and the validation loss: relative difference <= 1e-4;
#   - AdamW's first moment (opt.m.*, linear in the gradients): max relative difference
#     per tensor <= 1e-3.
# The same with 2 and 4 ranks (batch 4 and 2 per rank: the same global batch) where the
# machine has that many GPUs: the sum over ranks is another order, within fp32 rounding.
# --dtype bf16 (the GPU's default: bf16 activations, fp32 masters), alone and with
# --allreduce bf16: bf16 keeps 8 bits, ~4e-3 relative per rounding, yet the errors do
# not compound over these steps: under the CUDA emulator (tests/emu, which rounds to bf16
# as the GPU does, but without its fused multiply-adds and with glibc's math functions)
# the losses stay within 8e-5 relative of the CPU's and AdamW's moments within 3e-3
# (first) and 5e-3 (second). Checked with margins of about 5x and 3x, against a GPU's
# other summation orders and roundings: losses <= 4e-4, opt.m.* <= 1e-2, opt.v.* <= 1.5e-2.
# The fp32 runs end with a 60-byte sample: the same text (the device's forward, the one
# row of logits that comes back to the host, the same random draws).
# Not the parameters element by element: AdamW's step is about lr * sign(gradient) for
# tiny gradients, and some gradients are zero up to rounding (the key bias's: softmax
# ignores a constant added to every score), so rounding picks the sign and parameters
# differ by whole steps without anything being wrong.
#
# Without a usable GPU it prints SKIP with the cause that train_gpt_gpu --device-info
# names; with DDP_REQUIRE_GPU=1 (make check-gpu) that is a FAIL. The CPU build is
# DDP_CPU_TWIN when set (make check-gpu: tests/train_gpt_twin, built to run on any
# x86-64), else examples/train_gpt.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
cpu=${DDP_CPU_TWIN:-$PWD/examples/train_gpt}
gpu=${1:-${DDP_GPU_BIN:-examples/train_gpt_gpu}}
case $gpu in /*) ;; *) gpu=$PWD/$gpu ;; esac
name="train_gpt_gpu matches the CPU build"
skip() { # why
  if [ "${DDP_REQUIRE_GPU:-0}" = 1 ]; then echo "FAIL $name: $1 (DDP_REQUIRE_GPU=1)"; exit 1; fi
  echo "SKIP $name: $1"; exit 0
}
[ -x "$cpu" ] || { echo "FAIL $name: $cpu is not built (make ${cpu#$PWD/})"; exit 1; }
[ -x "$gpu" ] || skip "$gpu is not built (needs nvcc: make examples/train_gpt_gpu)"
info=$("$gpu" --device-info 2>&1) || skip "${info:-train_gpt_gpu --device-info failed}"
echo "# $info"
ngpu=$(sed -n 's/^train_gpt: \([0-9]*\) GPU(s).*/\1/p' <<<"$info")

cd "$tmp" || exit 1
head -c 60000 "$OLDPWD/examples/train_gpt.c" >data.txt # text from examples/, which check-gpu carries
tiny="--layers 2 --heads 2 --dim 64 --ctx 32 --batch-size 8 --data data.txt --steps 6 --val-every 6 --sample-len 0 --seed 3"
timeout 120 "$cpu" $tiny --stop-after 1 --save init.st >init.txt 2>&1
report "train_gpt (CPU) trains step 1" $? "$(tail -n 2 init.txt | tr '\n' ' ')"
timeout 120 "$cpu" $tiny --resume init.st --save cpu.st --sample-len 60 >cpu.txt 2>&1
report "train_gpt (CPU) resumes for steps 2-6" $? "$(tail -n 2 cpu.txt | tr '\n' ' ')"
timeout 120 "$gpu" $tiny --dtype fp32 --resume init.st --save gpu.st --sample-len 60 >gpu.txt 2>&1
report "train_gpt_gpu --dtype fp32 resumes for steps 2-6" $? "$(tail -n 2 gpu.txt | tr '\n' ' ')"
grep -q 'nccl backend' gpu.txt
report "train_gpt_gpu trains on the GPU (nccl backend)" $? "$(grep -m1 -e '^ranks' -e '^note' gpu.txt)"

losses() { awk '/^step / { print $2, $5 } / val / { print "val", $NF }' "$1"; }
close_losses() { # name run tolerance: every step's loss and the validation loss of run.txt near cpu.txt's
  [ "$(losses cpu.txt | wc -l)" -eq 6 ] && [ "$(losses "$2.txt" | wc -l)" -eq 6 ] &&
    paste -d' ' <(losses cpu.txt) <(losses "$2.txt") |
    awk -v tol="$3" '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > tol * $2) bad = 1 } END { exit bad }'
  report "$1: losses within $3 relative of the CPU's" $? "$(paste -d' ' <(losses cpu.txt) <(losses "$2.txt") | tr '\n' ';')"
}
norms() { awk '/^step / { for (i = 1; i < NF; i++) if ($i == "norm") print $2, $(i + 1) }' "$1"; }
close_norms() { # name run: every step's printed gradient norm (3 decimals) near the CPU's; a norm read from
  # the device before the step's kernels ended (a copy on another stream) is the last step's, or 0
  [ "$(norms cpu.txt | wc -l)" -eq 5 ] && [ "$(norms "$2.txt" | wc -l)" -eq 5 ] &&
    paste -d' ' <(norms cpu.txt) <(norms "$2.txt") |
    awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 0.002 + 1e-3 * $2) bad = 1 } END { exit bad }'
  report "$1: gradient norms near the CPU's" $? "$(paste -d' ' <(norms cpu.txt) <(norms "$2.txt") | tr '\n' ';')"
}
close_tensors() { # name run prefix tolerance: --compare's largest relative difference of the tensors named prefix...
  local out
  out=$("$cpu" --compare cpu.st "$2.st" "$3" 2>&1)
  awk -v l="$out" -v tol="$4" 'BEGIN { split(l, x, " "); exit !(x[1] == "max_rel_diff" && x[2] ~ /^[0-9.e+-]+$/ && x[2] + 0 <= tol) }'
  report "$1: $3* within $4 of the CPU's" $? "$out"
}
close_losses "train_gpt_gpu" gpu 1e-4
close_norms "train_gpt_gpu" gpu
# a head over 128, which the CPU trains: one line before any step, naming the way out
timeout 60 "$gpu" --steps 1 --layers 1 --dim 160 --heads 1 --ctx 16 --batch-size 2 --data data.txt >head.txt 2>&1
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l <head.txt)" -eq 1 ] && grep -q "head size of 160: .*at most 128.*DDP_BACKEND=cpu" head.txt
report "train_gpt_gpu: a head size over 128 is one line" $? "exit $rc: $(head -c 300 head.txt | tr '\n' ' ')"

sample() { sed -n '/^sample (/,$p' "$1"; }
[ -n "$(sample cpu.txt)" ] && [ "$(sample cpu.txt)" = "$(sample gpu.txt)" ]
report "train_gpt_gpu: the sample is the CPU's" $? "CPU: $(sample cpu.txt | tr -c '[:print:]' .); GPU: $(sample gpu.txt | tr -c '[:print:]' .)"
close_tensors "train_gpt_gpu" gpu opt.m. 1e-3

for n in 2 4; do
  if [ "${ngpu:-0}" -lt $n ]; then echo "SKIP train_gpt_gpu with $n ranks: ${ngpu:-no} GPU(s) here"; continue; fi
  timeout 180 "$gpu" --nproc $n $tiny --batch-size $((8 / n)) --dtype fp32 --resume init.st --save "gpu$n.st" >"gpu$n.txt" 2>&1
  report "train_gpt_gpu --dtype fp32 resumes for steps 2-6 on $n ranks" $? "$(tail -n 2 "gpu$n.txt" | tr '\n' ' ')"
  close_losses "train_gpt_gpu on $n ranks" "gpu$n" 1e-4
  close_norms "train_gpt_gpu on $n ranks" "gpu$n"
  close_tensors "train_gpt_gpu on $n ranks" "gpu$n" opt.m. 1e-3
done
# ranks started by hand agree on the precision they train in: --dtype bf16 beside the
# GPU's default (bf16) trains (it was refused: "(default)" against "bf16"); --dtype fp32
# beside it is named on both ranks
if [ "${ngpu:-0}" -ge 2 ]; then
  for want in "bf16:0" "fp32:1"; do
    port=$(free_port)
    hand() { MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=$1 LOCAL_RANK=$1 DDP_TIMEOUT=60 \
      timeout 120 "$gpu" $tiny --batch-size 4 --resume init.st --stop-after 3 "${@:2}" >"hand$1.txt" 2>&1; }
    hand 0 --dtype "${want%%:*}" &
    hand 1; rc1=$?
    wait $!; rc0=$?
    if [ "${want#*:}" = 0 ]; then [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ]
    else [ $rc0 -eq 1 ] && [ $rc1 -eq 1 ] && grep -q "ranks disagree on precision .*: rank [01] has bf16, all-reduce fp32, rank [01] has fp32, all-reduce fp32" hand0.txt hand1.txt
    fi
    report "train_gpt_gpu: ranks by hand, --dtype ${want%%:*} beside the default: $([ "${want#*:}" = 0 ] && echo trains || echo named)" $? \
      "exit $rc0 and $rc1: $(grep -h -m1 -e 'train_gpt:' -e 'ddp:' hand0.txt hand1.txt | head -c 300 | tr '\n' '|')"
  done
fi

for run in "bf16:" "bf16_allreduce:--allreduce bf16"; do
  tag=${run%%:*}
  timeout 120 "$gpu" $tiny ${run#*:} --resume init.st --save "$tag.st" >"$tag.txt" 2>&1
  report "train_gpt_gpu $tag resumes for steps 2-6" $? "$(tail -n 2 "$tag.txt" | tr '\n' ' ')"
  grep -q "^device: bf16 activations" "$tag.txt"
  report "train_gpt_gpu $tag says it trains in bf16" $? "$(grep -m1 '^device' "$tag.txt")"
  close_losses "train_gpt_gpu $tag" "$tag" 4e-4
  close_tensors "train_gpt_gpu $tag" "$tag" opt.m. 1e-2
  close_tensors "train_gpt_gpu $tag" "$tag" opt.v. 1.5e-2
done

# the precision is the run's: --resume auto refuses a bf16 run's file to an fp32 run, and
# goes on with it in bf16
timeout 120 "$gpu" $tiny --resume init.st --stop-after 3 --save half.st >half.txt 2>&1 &&
  timeout 120 "$gpu" $tiny --dtype fp32 --resume auto --save half.st >half_fp32.txt 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "^train_gpt: half.st belongs to another run: its precision .* is bf16, all-reduce fp32, this run's is fp32, all-reduce fp32" half_fp32.txt &&
  timeout 120 "$gpu" $tiny --resume auto --save half.st >half_bf16.txt 2>&1 && grep -q "^resumed from half.st after step 3" half_bf16.txt
report "train_gpt_gpu --resume auto: another precision is another run" $? \
  "exit $rc: $(tail -n 2 half_fp32.txt | tr '\n' '|'); $(grep -m1 -e '^resumed' -e 'train_gpt:' half_bf16.txt)"
exit $fail
