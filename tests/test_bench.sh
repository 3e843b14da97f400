#!/usr/bin/env bash
# tests/test_bench.sh - the CPU benchmarks run and print what the README's tables take:
#   train_gpt --bench-matmul (ours and, where python3 imports torch, PyTorch's, or why
#   not), and examples/bench_train_gpt.py (the train_gpt forms, one short round, the CPU
#   named; an unknown form is an error; a failed PyTorch run is tried once more, aloud),
#   and examples/bench_allreduce (its rows checked, its flags). Their numbers are not
#   checked: they measure.
# The Makefile builds the example.
cd "$(dirname "$0")/.." || exit 1
bin=$PWD/examples/train_gpt
. tests/lib.sh
need_built bench "$bin"
cd "$tmp" || exit 1
out=$("$bin" --bench-matmul --dim 32 --ctx 16 --batch-size 4 2>&1)
grep -q '^| mlp proj 32 x 128 | [0-9.]* / [0-9.]* / [0-9.]* |' <<<"$out" &&
  grep -q '^matmul: [0-9.]* GFLOP/s (ddp_kernels.cuh, ' <<<"$out" &&
  grep -q '^matmul: \([0-9.]* GFLOP/s (PyTorch .* sgemm, .*% of it)\|PyTorch not measured (.*)\)$' <<<"$out" &&
  grep -q '^attention: [0-9.]*[1-9][0-9.]* GFLOP/s forward, [0-9.]*[1-9][0-9.]* backward (ddp_kernels.cuh, .* 4 heads of 8, ctx 16; ' <<<"$out"
report "train_gpt --bench-matmul prints GFLOP/s per weight, ours and PyTorch's, and attention's" $? "$out"
out=$(PATH=/nonexistent "$bin" --bench-matmul --dim 32 --ctx 16 --batch-size 4 2>&1)
grep -q '^matmul: PyTorch not measured (.*python3.*)$' <<<"$out"
report "train_gpt --bench-matmul without python3 says why PyTorch is missing" $? "$out"
# a flag of a training run with --bench-matmul (or --device-info, or before --compare) would
# be dropped unsaid: refused, named; and shapes past the free memory are refused, not
# allocated for the out-of-memory killer
said=""
for args in "--bench-matmul --steps 5|--bench-matmul trains nothing, so it takes no --steps (only the model's shape" \
            "--bench-matmul --data x.txt --save y.st|--bench-matmul trains nothing, so it takes no --data (only" \
            "--device-info --nproc 2|--device-info trains nothing, so it takes no --nproc" \
            "--steps 5 --compare a.st b.st|--compare A B [PREFIX] takes no other flags: --steps before it" \
            "--bench-matmul --batch-size 65536 --ctx 8192 --vocab 65536|--bench-matmul at these shapes needs "; do
  out=$("$bin" ${args%%|*} 2>&1); rc=$?
  case $out in "train_gpt: ${args#*|}"*) [ $rc -ne 0 ] && [ "$(wc -l <<<"$out")" -eq 1 ] ;; *) false ;; esac ||
    said+="${args%%|*}: exit $rc '$out'; "
done
[ -z "$said" ]
report "train_gpt --bench-matmul, --device-info, --compare: a run's flags with them are refused, named" $? "$said"
timeout 300 python3 "$OLDPWD/examples/bench_train_gpt.py" --forms ddp2,ddp1 --rounds 1 --steps 3 --warmup 1 >bench.txt 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q '^| train_gpt --nproc 2 --batch-size 8 | [0-9]* ([0-9]*-[0-9]*) | [0-9]*% |$' bench.txt &&
  grep -q '^| train_gpt --nproc 1 --batch-size 16 | ' bench.txt && grep -q 'matmul ceiling [0-9.]* GFLOP/s' bench.txt &&
  grep -q '^cpu: .*; \(avx\|sve\|asimd\|no AVX2\).*[0-9]* cores$' bench.txt && grep -q '^on .*cores:$' bench.txt
report "bench_train_gpt.py: a table of the forms, with the matmul ceiling" $? "exit $rc: $(tail -n 6 bench.txt | tr '\n' '|')"
# round by round, each train_gpt form against the best PyTorch form of that same round
out=$(python3 -B -c 'import sys; sys.path.insert(0, sys.argv[1]); import bench_train_gpt as b
r = {"ddp2": [100, 120, 90], "torch": [80, 100, 100], "torch_ddp": [90, 60, 50]}
print("\n".join(b.round_by_round(r, ["ddp2", "torch", "torch_ddp"])))
print(b.round_by_round({"ddp2": [1.0]}, ["ddp2"]))' "$OLDPWD/examples" 2>&1); rc=$?
[ "$rc" -eq 0 ] && [ "$out" = "ddp2 against the best PyTorch form of each round: 1.11x, 1.20x, 0.90x (median 1.11x)
[]" ]
report "bench_train_gpt.py: round by round against the best PyTorch form of the round" $? "exit $rc: $out"
# a PyTorch form that fails (a stand-in torch package: it imports, it cannot train) gets one
# more try, said aloud, and a second failure ends the benchmark with the reason
mkdir -p faketorch/torch && echo '__version__ = "0.0-standin"' >faketorch/torch/__init__.py
out=$(PYTHONPATH=$PWD/faketorch timeout 300 python3 "$OLDPWD/examples/bench_train_gpt.py" --forms torch --rounds 1 \
  --steps 3 --warmup 1 2>&1); rc=$?
[ "$rc" -eq 1 ] && grep -q '^round 1 torch *failed (.*); once more$' <<<"$out" &&
  grep -q '^bench_train_gpt.py: torch failed twice: exit 1: ' <<<"$out" && grep -q "No module named 'torch.nn'" <<<"$out"
report "bench_train_gpt.py: a failed PyTorch run gets one more try, then stops the benchmark" $? "exit $rc: $out"
# bench_allreduce: a table of checked rows from --min-bytes to --max-bytes; a flag it does
# not know, or a size that no row could hold, is one line and exit 2 before any rank starts
ar=$OLDPWD/examples/bench_allreduce
out=$(OMP_NUM_THREADS=1 timeout 60 "$ar" --nproc 3 --iters=2 --min-bytes 8 --max-bytes 32 2>&1); rc=$?
[ "$rc" -eq 0 ] && [ "$(grep -c '^ *[0-9][0-9]* *[0-9][0-9]* .* ok$' <<<"$out")" -eq 3 ] &&
  grep -q '^ *32 *8 ' <<<"$out" && grep -q '# all_reduce sum f32, 3 ranks, backend cpu, 2 iterations per size' <<<"$out"
report "bench_allreduce --nproc 3: rows of 8, 16, 32 bytes, each checked" $? "exit $rc: $out"
for args in "--bogus" "--iters 4294967296" "--iters 0" "--min-bytes 6" "--max-bytes" "--min-bytes 8192 --max-bytes 4096"; do
  # shellcheck disable=SC2086 # args is a word list
  out=$(timeout 20 "$ar" --nproc 2 $args 2>&1); rc=$?
  [ "$rc" -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q '^bench_allreduce: ' <<<"$out"
  report "bench_allreduce $args: one line, exit 2" $? "exit $rc: $out"
done
out=$("$ar" --help 2>&1); rc=$?
[ "$rc" -eq 0 ] && grep -q '^usage: bench_allreduce' <<<"$out"
report "bench_allreduce --help: the usage, exit 0 (it ran the whole benchmark)" $? "exit $rc: $(head -c 200 <<<"$out")"

out=$(python3 "$OLDPWD/examples/bench_train_gpt.py" --forms nosuch 2>&1); rc=$?
[ "$rc" -eq 2 ] && case $out in *"unknown form 'nosuch'"*) true ;; *) false ;; esac
report "bench_train_gpt.py: an unknown form is an error" $? "exit $rc: $out"

exit $fail
