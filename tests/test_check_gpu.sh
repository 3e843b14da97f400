#!/usr/bin/env bash
# make check-gpu's own logic, without a GPU: tests/check_gpu.sh runs in a scratch tree
# whose "GPU binaries" are small scripts. One of them hangs: its step must end at its
# timeout within the budget, the steps that no longer fit are reported as not run, and
# the table still prints, all within the budget. Then a stand-in compute-sanitizer:
# no errors passes, errors fail (in the summary lines the real tools print), a tool that
# cannot run here is a skip with its reason, and a lesson's exercise (the student's to
# finish, which does not build as it stands) is neither built nor run.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
tree=$tmp/tree
mkdir -p "$tree/tests" "$tree/examples/lessons/01_x" "$tmp/bin"
cp tests/check_gpu.sh tests/run.sh "$tree/tests/"
fake() { # path body: an executable script
  printf '#!/bin/sh\n%s\n' "$2" >"$tree/$1"
  chmod +x "$tree/$1"
}
for src in examples/hello_allreduce.c examples/bench_allreduce.c examples/train_gpt.c examples/bench_kernels.cu \
           examples/lessons/01_x/solution.c examples/lessons/01_x/exercise.c tests/test_gpu_probe.cu \
           tests/test_kernels_gpu.cu; do
  : >"$tree/$src"
done
fake tests/test_gpu_probe 'echo "device 0: a stand-in GPU"; echo "PASS gpu.probe"'
fake tests/test_kernels_gpu 'echo "PASS kernels.stand_in"'
fake tests/train_gpt_twin 'exit 0'
fake examples/hello_allreduce_gpu 'echo "sum 1"; [ -n "$HANG" ] && exec sleep 1000; exit 0'
fake examples/bench_allreduce_gpu 'echo 67108864 ok'
fake examples/bench_kernels 'echo "ceilings: stand-in"'
fake examples/train_gpt_gpu 'echo "after step 1: 1 tokens/s"; echo "step     3/3 | loss 1"'
fake examples/lessons/01_x/solution_gpu 'echo correct'

start=$(date +%s)
out=$(cd "$tree" && HANG=1 PATH="$tmp/bin:$PATH" CHECK_GPU_BUDGET=20 CHECK_GPU_LOG=$tmp/log timeout 120 tests/check_gpu.sh 2>&1)
rc=$? secs=$(( $(date +%s) - start ))
table=$(sed -n '/^check-gpu summary/,$p' <<<"$out")
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -le 25 ] && grep -q '^| probe | PASS' <<<"$table" &&
  grep -q '^| hello_allreduce_gpu | TIMEOUT after' <<<"$table" &&
  grep -q '^| GPT-2 124M B=64 bf16 (2^31+ logits) | not run' <<<"$table" && grep -q '^check-gpu: FAILED: .*hello_allreduce_gpu' <<<"$table"
report "check_gpu.a_hang_costs_its_step_and_the_table_prints" $? "status $rc after $secs s (budget 20 s): $(tail -n 25 <<<"$out" | tr '\n' ' ' | head -c 900)"

cat >"$tmp/bin/compute-sanitizer" <<'SH'
#!/bin/sh
case $2 in
memcheck) "$6"; echo "========= ERROR SUMMARY: 0 errors" ;;
racecheck) echo "========= Race reported"; echo "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)"; exit 99 ;;
*) echo "========= Error: Device not supported"; exit 1 ;;
esac
SH
chmod +x "$tmp/bin/compute-sanitizer"
out=$(cd "$tree" && PATH="$tmp/bin:$PATH" CHECK_GPU_LOG=$tmp/log timeout 120 tests/check_gpu.sh 2>&1)
rc=$?
table=$(sed -n '/^check-gpu summary/,$p' <<<"$out")
[ $rc -eq 1 ] && grep -q '^| compute-sanitizer memcheck | PASS | [0-9]* | 0 errors' <<<"$table" &&
  grep -q '^| compute-sanitizer racecheck | FAIL (status 1) | [0-9]* | 2 errors' <<<"$table" &&
  grep -q '^| compute-sanitizer synccheck | SKIP | [0-9]* | the tool did not run: .*Device not supported' <<<"$table" &&
  grep -q '^| lessons/01_x/solution_gpu | PASS' <<<"$table" && grep -q '^check-gpu: FAILED: compute-sanitizer racecheck$' <<<"$table"
report "check_gpu.sanitizer_results" $? "status $rc: $(tr '\n' ' ' <<<"$table" | head -c 900)"
exit $fail
