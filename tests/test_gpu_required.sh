#!/usr/bin/env bash
# A machine without a usable GPU: every GPU test says why. Normally its checks are
# SKIPped with the real cause (the CUDA error, the driver and runtime versions); under
# DDP_REQUIRE_GPU=1, which make check-gpu sets, it must FAIL with that cause and exit
# non-zero, so a GPU check can never pass without touching a GPU.
cd "$(dirname "$0")/.." || exit 1
if ! command -v nvcc >/dev/null; then echo "SKIP gpu_required: nvcc not found, so no GPU tests are built"; exit 0; fi
if [ "${DDP_GPU_BUILDS-}" = 0 ]; then echo "SKIP gpu_required: make HAVE_NVCC= builds no GPU binaries"; exit 0; fi
if [ -x tests/test_gpu_probe ] && env -u DDP_REQUIRE_GPU tests/test_gpu_probe 2>&1 | grep -q '^PASS gpu.probe'; then
  echo "SKIP gpu_required: a GPU is usable here; this checks the machines without one"; exit 0
fi
fail=0
cause='(cuda[A-Z][A-Za-z]*|no CUDA device visible|unusable).*runtime [0-9]+\.[0-9]+'
for src in tests/test_*.cu; do
  b=${src%.cu}; name=gpu_required.${b#tests/}
  if [ ! -x "$b" ]; then echo "FAIL $name: $b is not built (make gpu-build)"; fail=1; continue; fi
  out=$(env -u DDP_REQUIRE_GPU timeout 60 "$b" 2>&1); rc=$?
  if [ $rc -eq 0 ] && grep -Eq "^SKIP .*$cause" <<<"$out" && ! grep -q '^FAIL ' <<<"$out"; then
    echo "PASS $name.skips_naming_the_cause"
  else
    echo "FAIL $name.skips_naming_the_cause: status $rc, want 0, no FAIL and a SKIP line naming the CUDA error and versions; got: $(grep -E '^(FAIL|SKIP) ' <<<"$out" | head -3 <<<"$out" | sed 's/^/| /' | tr '\n' ' ' | head -c 400)"
    fail=1
  fi
  out=$(DDP_REQUIRE_GPU=1 timeout 60 "$b" 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -Eq "^FAIL .*$cause" <<<"$out"; then
    echo "PASS $name.fails_when_required"
  else
    echo "FAIL $name.fails_when_required: status $rc under DDP_REQUIRE_GPU=1, want non-zero with a FAIL line naming the cause; got: $(grep -E '^(FAIL|SKIP) ' <<<"$out" | head -3 <<<"$out" | sed 's/^/| /' | tr '\n' ' ' | head -c 400)"
    fail=1
  fi
done
# make check-gpu as a whole: fails at its probe, with the cause, building nothing
# (every GPU binary exists: make test built them)
out=$(unset MAKEFLAGS MFLAGS MAKELEVEL; timeout 120 make check-gpu 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -Eq "^FAIL gpu.probe: .*$cause" <<<"$out" && grep -q "no usable GPU" <<<"$out" && ! grep -q nvcc <<<"$out"; then
  echo "PASS gpu_required.make_check_gpu_fails_naming_the_cause"
else
  echo "FAIL gpu_required.make_check_gpu_fails_naming_the_cause: status $rc, want non-zero, the probe's cause and no rebuild; got: $(grep -v '^PASS\|^SKIP' <<<"$out" | sed 's/^FAIL/| FAIL/' | head -5 | tr '\n' ' ' | head -c 400)"
  fail=1
fi
exit $fail
