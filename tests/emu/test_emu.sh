#!/usr/bin/env bash
# tests/emu/test_emu.sh - the CUDA emulator's own checks (tests/emu/selftest.cu): each
# case is a small program with one bug a GPU would not report, and must end in the
# emulator's one-line report (naming the kernel, block and thread where there are
# some) and an abort; or one behaviour of CUDA that the emulator must have, and must
# print "ok". Run by make check-emu (and make test).
cd "$(dirname "$0")/../.." || exit 1
bin=build/emu/tests/emu/selftest
if [ ! -x "$bin" ]; then echo "FAIL emu.selftest: $bin is not built (make emu)"; exit 1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
# reports CASE REPORT [VAR=value ...]: an abort with "emu: ...REPORT..." on stderr
reports() {
  local c=$1 want=$2 out rc
  shift 2
  out=$(env "$@" timeout 60 "$bin" "$c" 2>&1); rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "^emu: .*$want" <<<"$out"; then echo "PASS emu.reports.$c"
  else echo "FAIL emu.reports.$c: exit $rc, want an abort with an 'emu: ...$want' line; got: $(tail -n 3 <<<"$out" | tr '\n' ' ' | head -c 500)"; fail=1; fi
}
# behaves CASE [VAR=value ...]: status 0 and "ok"
behaves() {
  local c=$1 out rc
  shift
  out=$(env "$@" timeout 60 "$bin" "$c" 2>&1); rc=$?
  if [ $rc -eq 0 ] && grep -q '^ok$' <<<"$out"; then echo "PASS emu.behaves.$c"
  else echo "FAIL emu.behaves.$c: exit $rc: $(tail -n 3 <<<"$out" | tr '\n' ' ' | head -c 500)"; fail=1; fi
}

reports divergent_barrier 'block (0,0,0) of (1,1,1): divergent __syncthreads: thread ([0-9]*,0,0) waits at .*selftest.cu:[0-9]*, thread'
reports barrier_after_exit 'waits at __syncthreads at .*, but thread (3,0,0) has exited'
reports shuffle_partner_exited 'thread (5,0,0) exited while thread (.*) waits for it in a warp shuffle'
reports shuffle_under_branch 'exited while thread (.*) waits for it in a warp shuffle'
reports shuffle_masks_differ 'divergent warp shuffles: .*mask 0x0000ffff.*mask 0xffffffff'
reports shuffle_meets_barrier 'shuffles at .* but thread (.*) waits at __syncthreads'
behaves shuffle_ok
reports host_pointer_arg 'launch of set_value at .*: pointer argument 1 of 1 is 0x[0-9a-f]*, host memory'
reports write_past_end 'kernel write_at (.*) wrote past the end of device memory: byte 400 of allocation #1 of 400 bytes'
reports write_far_past_end 'kernel write_at (launched at .*), block (0,0,0), thread (0,0,0): invalid access to .*past the end of device memory'
reports use_after_free 'pointer argument 1 of 1 is 0x[0-9a-f]*, freed device memory'
reports memcpy_past_end 'cudaMemcpy: the source: 404 bytes .* the range ends 4 bytes past its end'
reports memcpy_direction 'cudaMemcpyHostToDevice): the pointers say cudaMemcpyDeviceToHost'
behaves launch_limits
reports vector_misaligned_cpp 'a 16-byte vector access to .* not 16-byte aligned'
reports vector_misaligned_c 'a 16-byte vector access to .* not 16-byte aligned'
reports past_launch_bounds 'blocks of 64 threads, but the kernel at .* is declared __launch_bounds__(32)'
behaves within_launch_bounds
reports too_much_shared '65536 bytes of static shared memory: more than the 48 KB a kernel may declare'
behaves warps_run_ahead
behaves shared_poisoned
behaves blocks_shuffled
behaves streams_unordered
behaves streams_ordered
behaves wait_event_snapshot
behaves legacy_stream
behaves pageable_and_pinned
behaves second_device DDP_EMU_TOUCH_LOG="$tmp/touch"
grep -q ' devices 0 1; device 0 first by cudaEventQuery on thread [0-9]*, which never called cudaSetDevice' "$tmp/touch" 2>/dev/null
if [ $? -eq 0 ]; then echo "PASS emu.touch_log_names_the_thread_without_a_device"
else echo "FAIL emu.touch_log_names_the_thread_without_a_device: $(cat "$tmp/touch" 2>&1)"; fail=1; fi
reports second_device 'touched device 0 by cudaEventQuery on thread .*, which never called cudaSetDevice, but it already uses device 1' DDP_EMU_STRICT_DEVICES=1
behaves lt_declines
reports lt_misaligned 'cublasLtMatmul: A at .* is 2-byte aligned, but the algorithm was chosen for 16-byte alignment'
behaves cub_temp_too_small
reports nccl_use_after_abort 'ncclCommGetAsyncError on a communicator after ncclCommAbort'
reports nccl_two_threads 'ncclCommGetAsyncError on thread .* while thread .* is inside ncclCommGetAsyncError on the same communicator' DDP_EMU_NCCL_DELAY_US=200000
behaves nccl_in_progress DDP_EMU_NCCL_INPROGRESS=3
behaves nccl_injected_error DDP_EMU_NCCL_ERROR=0:2:3
behaves nccl_mismatch
out=$(timeout 60 "$bin" nccl_mismatch 2>&1)
if grep -q 'emu: collective #1 of the communicator: rank . calls ncclAllReduce . x float32 sum root 0, rank . calls ncclAllReduce . x float32' <<<"$out"; then
  echo "PASS emu.reports.nccl_mismatch_names_both_ranks"
else echo "FAIL emu.reports.nccl_mismatch_names_both_ranks: $(head -c 400 <<<"$out")"; fail=1; fi
behaves fork_after_cuda
behaves math_faithful
# make exports DDP_EMU_FMA (0 for a build with EMU_FMA=); run by hand, the CPU decides
if [ "${DDP_EMU_FMA:-$(grep -qw fma /proc/cpuinfo 2>/dev/null && echo 1)}" = 1 ]; then behaves multiply_add_fused
else echo "SKIP emu.behaves.multiply_add_fused: built without fused multiply-adds (EMU_FMA=, or a CPU without FMA)"; fi
exit $fail
