#!/usr/bin/env bash
# tests/test_train_gpt_gpu.sh - examples/train_gpt_gpu (the GPU path) against the CPU
# build examples/train_gpt, from the same weights and data: the CPU build trains step 1
# and saves it; both builds resume from that file for steps 2-6 and save.
#
# Tolerances for --dtype fp32 (fp32 on both sides, no TF32): the GPU sums in other
# orders (whole-batch matmuls, block reductions), so each op differs by a few ulp, ~1e-6
# relative, and a few steps compound that to ~1e-5. Checked:
#   - every step's training loss and the validation loss: relative difference <= 1e-4;
#   - AdamW's first moment (opt.m.*, linear in the gradients): max relative difference
#     per tensor <= 1e-3.
# --dtype bf16 (the GPU's default: bf16 activations, fp32 masters), alone and with
# --allreduce bf16: bf16 keeps 8 bits, ~4e-3 relative per rounding, so the losses are
# checked within 2e-2 relative of the CPU's, and the checkpoint must hold fp32 masters
# that --compare reads.
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
cpu=${DDP_CPU_TWIN:-$PWD/examples/train_gpt}
gpu=$PWD/examples/train_gpt_gpu
name="train_gpt_gpu matches the CPU build"
skip() { # why
  if [ "${DDP_REQUIRE_GPU:-0}" = 1 ]; then echo "FAIL $name: $1 (DDP_REQUIRE_GPU=1)"; exit 1; fi
  echo "SKIP $name: $1"; exit 0
}
[ -x "$cpu" ] || { echo "FAIL $name: $cpu is not built (make ${cpu#$PWD/})"; exit 1; }
[ -x "$gpu" ] || skip "$gpu is not built (needs nvcc: make examples/train_gpt_gpu)"
info=$("$gpu" --device-info 2>&1) || skip "${info:-train_gpt_gpu --device-info failed}"
echo "# $info"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
head -c 60000 "$OLDPWD/ddp.h" >data.txt
tiny="--layers 2 --heads 2 --dim 64 --ctx 32 --batch-size 8 --data data.txt --steps 6 --val-every 6 --sample-len 0 --seed 3"
fail=0
report() { # name ok why
  if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1: $3"; fail=1; fi
}
timeout 120 "$cpu" $tiny --stop-after 1 --save init.st >init.txt 2>&1
report "train_gpt (CPU) trains step 1" $? "$(tail -n 2 init.txt | tr '\n' ' ')"
timeout 120 "$cpu" $tiny --resume init.st --save cpu.st >cpu.txt 2>&1
report "train_gpt (CPU) resumes for steps 2-6" $? "$(tail -n 2 cpu.txt | tr '\n' ' ')"
timeout 120 "$gpu" $tiny --dtype fp32 --resume init.st --save gpu.st >gpu.txt 2>&1
report "train_gpt_gpu --dtype fp32 resumes for steps 2-6" $? "$(tail -n 2 gpu.txt | tr '\n' ' ')"
grep -q 'nccl backend' gpu.txt
report "train_gpt_gpu trains on the GPU (nccl backend)" $? "$(grep -m1 -e '^ranks' -e '^note' gpu.txt)"

losses() { awk '/^step / { print $2, $5 } / val / { print "val", $NF }' "$1"; }
[ "$(losses cpu.txt | wc -l)" -eq 6 ] && [ "$(losses gpu.txt | wc -l)" -eq 6 ] &&
  paste -d' ' <(losses cpu.txt) <(losses gpu.txt) |
  awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-4 * $2) bad = 1 } END { exit bad }'
report "train_gpt_gpu: losses within 1e-4 relative of the CPU's" $? \
  "$(paste -d' ' <(losses cpu.txt) <(losses gpu.txt) | tr '\n' ';')"
out=$("$cpu" --compare cpu.st gpu.st opt.m. 2>&1)
awk -v l="$out" 'BEGIN { split(l, x, " "); exit !(x[1] == "max_rel_diff" && x[2] ~ /^[0-9.e+-]+$/ && x[2] + 0 <= 1e-3) }'
report "train_gpt_gpu: AdamW first moments within 1e-3 of the CPU's" $? "$out"

for run in "bf16:" "bf16_allreduce:--allreduce bf16"; do
  tag=${run%%:*}
  timeout 120 "$gpu" $tiny ${run#*:} --resume init.st --save "$tag.st" >"$tag.txt" 2>&1
  report "train_gpt_gpu $tag resumes for steps 2-6" $? "$(tail -n 2 "$tag.txt" | tr '\n' ' ')"
  grep -q "^device: bf16 activations" "$tag.txt"
  report "train_gpt_gpu $tag says it trains in bf16" $? "$(grep -m1 '^device' "$tag.txt")"
  [ "$(losses "$tag.txt" | wc -l)" -eq 6 ] &&
    paste -d' ' <(losses cpu.txt) <(losses "$tag.txt") |
    awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 2e-2 * $2) bad = 1 } END { exit bad }'
  report "train_gpt_gpu $tag: losses within 2e-2 relative of the CPU's" $? \
    "$(paste -d' ' <(losses cpu.txt) <(losses "$tag.txt") | tr '\n' ';')"
  "$cpu" --compare cpu.st "$tag.st" >/dev/null 2>&1
  report "train_gpt_gpu $tag: the checkpoint holds finite fp32 tensors of the CPU's shapes" $? \
    "$("$cpu" --compare cpu.st "$tag.st" 2>&1)"
done
exit $fail
