#!/usr/bin/env bash
# tests/emu/test_mutants_ddp.sh - planted bugs in ddp.h's NCCL backend and in
# train_gpt's GPU path (the same method as test_mutants.sh, which plants them in
# ddp_kernels.cuh): a stream ordering removed either way, a count in bytes, a host
# wait per gradient bucket, NCCL's one-rank average, a communicator used after its
# abort, the watchdog thread without its cudaSetDevice, a pinned upload buffer written
# again before its copy ran.
cd "$(dirname "$0")/../.." || exit 1
. tests/emu/common.sh
mutants_need build/emu/libemu.a build/emu/tests/test_nccl build/emu/examples/train_gpt_gpu examples/train_gpt

mutant nccl_after_stream_unordered ddp.h '
        (r = ddp__cuda(ctx, cudaStreamWaitEvent(b->stream, b->ready, 0), "cudaStreamWaitEvent")) != DDP_OK ||' '' \
  tests/test_nccl '' '^FAIL nccl\.stream_order'
mutant stream_after_nccl_unordered ddp.h 'ddp__cuda(ctx, cudaStreamWaitEvent(user, f->done, 0), "cudaStreamWaitEvent")' \
  'ddp__cuda(ctx, cudaSuccess, "cudaStreamWaitEvent")' tests/test_nccl '' '^FAIL nccl\.stream_order:'
mutant nccl_count_in_bytes ddp.h 'nr = ncclAllReduce(send, recv, c->count, t,' 'nr = ncclAllReduce(send, recv, c->count * es, t,' \
  tests/test_nccl '' '^emu: ncclAllReduce #1 \(4 x float32\) on rank 0: sendbuff: 16 bytes .*past its end'
# a world of one averaging through NCCL's own average (NCCL before 2.29.7, as the
# emulator models it, leaves the last elements of an out-of-place f64 average unwritten)
mutant one_rank_average_by_nccl ddp.h 'c->op == DDP_AVG && ctx->world_size == 1 ? ncclSum : ops[c->op]' 'ops[c->op]' \
  tests/test_nccl '' '^FAIL nccl\.all_reduce: .*f64 avg n=1000003, rank 0: \[1000000\] = -?nan'
# a gradient bucket's all-reduce waited for on the host, as ddp_wait does: the backward
# would stall at every bucket
mutant bucket_waits_on_host ddp.h 'r = host ? ddp__nccl_wait_event(ctx, ev, "all_reduce", work->seq) : ddp__nccl_alive(ctx, "all_reduce", work->seq);' \
  'r = ddp__nccl_wait_event(ctx, ev, "all_reduce", work->seq);' tests/test_nccl '' '^FAIL nccl\.grad_sync_no_host_wait: .*the host waited'

# the communicator kept after the watchdog aborted it: ddp.h calls NCCL on it again
# (the emulator reports any use after ncclCommAbort, a second abort included)
mutant comm_used_after_abort ddp.h '    b->failed = code;
    b->comm = NULL;' '    b->failed = code;' tests/test_nccl 2 '^emu: nccl[A-Za-z]+ on a communicator after ncclCommAbort'

# the watchdog's CUDA calls on GPU 0 (the current device of a thread that never set
# one): on a GPU, a context on GPU 0 from every rank
MUTANT_ENV="DDP_EMU_STRICT_DEVICES=1" mutant watchdog_without_device ddp.h 'const cudaError_t e = cudaSetDevice(b->device);' \
  'const cudaError_t e = cudaSuccess;' tests/test_nccl 2 '^emu: process [0-9]+ touched device 0 by .*which never called cudaSetDevice'

# The pinned upload buffer of the tokens reused for the targets: the host writes it
# again before the tokens' copy has read it, so the model trains on the targets as
# tokens: its losses are not the CPU's (the unmutated build's are, within fp32 rounding).
tiny="--layers 1 --heads 2 --dim 32 --ctx 16 --batch-size 4 --data data.txt --steps 3 --val-every 0 --sample-len 0 --seed 3"
losses() { awk '/^step / { print $5 }' "$1" | tr '\n' ' '; }
name=pinned_buffer_rewritten
if build $name examples/train_gpt.c '        memcpy(d->h_targets, g->a.targets, BT * sizeof(int));
        CUDA(cudaMemcpyAsync(a->targets, d->h_targets,' '        memcpy(d->h_tokens, g->a.targets, BT * sizeof(int));
        CUDA(cudaMemcpyAsync(a->targets, d->h_tokens,' examples/train_gpt_gpu examples/train_gpt.c; then
  (cd "$tmp" && head -c 30000 "$root/ddp.h" >data.txt &&
    "$root/examples/train_gpt" $tiny --stop-after 1 --save init.st >init.txt 2>&1 &&
    "$root/examples/train_gpt" $tiny --resume init.st >cpu.txt 2>&1 &&
    timeout 200 "$root/build/emu/examples/train_gpt_gpu" $tiny --dtype fp32 --resume init.st >good.txt 2>&1 &&
    timeout 200 "$tmp/$name/examples/train_gpt_gpu" $tiny --dtype fp32 --resume init.st >bad.txt 2>&1)
  verdict=$(awk -v c="$(losses "$tmp/cpu.txt")" -v g="$(losses "$tmp/good.txt")" -v b="$(losses "$tmp/bad.txt")" 'BEGIN {
    n = split(c, x, " "); if (n != 2 || split(g, y, " ") != 2 || split(b, z, " ") != 2) { print "runs"; exit }
    for (i = 1; i <= n; i++) { d = y[i] - x[i]; if (d < 0) d = -d; if (d > 1e-4 * x[i]) { print "good"; exit } }
    for (i = 1; i <= n; i++) { d = z[i] - x[i]; if (d < 0) d = -d; if (d > 1e-3 * x[i]) { print "caught"; exit } }
    print "same" }')
  case $verdict in
  caught) echo "PASS emu.mutant.$name: losses $(losses "$tmp/bad.txt")against the CPU's $(losses "$tmp/cpu.txt")" ;;
  *) echo "FAIL emu.mutant.$name: $verdict: CPU $(losses "$tmp/cpu.txt")| unmutated $(losses "$tmp/good.txt")| mutant $(losses "$tmp/bad.txt")$(tail -n 2 "$tmp/bad.txt" | tr '\n' ' ')"; fail=1 ;;
  esac
else
  echo "FAIL emu.mutant.$name: cannot build the mutant: $(tail -n 3 "$tmp/$name/log" | tr '\n' ' ' | head -c 400)"
  fail=1
fi
exit $fail
