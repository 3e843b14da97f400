/* bench_allreduce: all-reduce bandwidth, in the format of nccl-tests.
       ./examples/bench_allreduce --nproc 4                 CPU processes
       ./examples/bench_allreduce_gpu --nproc 8             GPUs through NCCL
   For each size: the time of one all-reduce (mean over --iters, slowest rank), the
   algorithm bandwidth (bytes / time) and the bus bandwidth (algbw * 2(n-1)/n, what
   each link carries in a ring: comparable across world sizes), and a check of the
   result. Options: --iters N (20), --min-bytes B (4096), --max-bytes B (64 MiB). */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long arg_long(int argc, char **argv, const char *name, long def)
{
    int i;
    for (i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) {
            char *end;
            long v = strtol(argv[i + 1], &end, 10);
            if (*end || v <= 0) {
                fprintf(stderr, "bench_allreduce: %s needs a positive integer, not '%s'\n", name, argv[i + 1]);
                exit(2);
            }
            return v;
        }
    return def;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    float *send, *recv, *host;
    size_t bytes, maxb, i;
    int iters, it, gpu = 0;
    (void)gpu; /* used by the GPU build only */
    int status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    status = 0;
    iters = (int)arg_long(argc, argv, "--iters", 20);
    bytes = (size_t)arg_long(argc, argv, "--min-bytes", 4096);
    maxb = (size_t)arg_long(argc, argv, "--max-bytes", 64L << 20);
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;
    host = (float *)malloc(maxb);
#ifdef __CUDACC__
    gpu = ctx.backend == DDP_BACKEND_NCCL;
    if (gpu) {
        cudaMalloc((void **)&send, maxb);
        cudaMalloc((void **)&recv, maxb);
    } else
#endif
    {
        send = (float *)malloc(maxb);
        recv = (float *)malloc(maxb);
    }
    if (!host || !send || !recv) {
        fprintf(stderr, "bench_allreduce: out of memory for %zu bytes\n", maxb);
        return 1;
    }
    ddp_print(&ctx, "# all_reduce sum f32, %d ranks, backend %s, %d iterations per size\n", ctx.world_size,
              ddp_backend_name(ctx.backend), iters);
    ddp_print(&ctx, "# %10s %12s %10s %12s %12s %6s\n", "size(B)", "count", "time(us)", "algbw(GB/s)",
              "busbw(GB/s)", "check");
    for (; bytes <= maxb; bytes *= 2) {
        size_t count = bytes / sizeof(float);
        double t0, dt, worst;
        int bad = 0;
        /* check: rank r contributes r + 1 + (i mod 7); small integers add exactly */
        for (i = 0; i < count; i++) host[i] = (float)(ctx.rank + 1 + (int)(i % 7));
#ifdef __CUDACC__
        if (gpu) cudaMemcpy(send, host, bytes, cudaMemcpyHostToDevice);
        else
#endif
            memcpy(send, host, bytes);
        if (ddp_all_reduce(&ctx, send, recv, count, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
#ifdef __CUDACC__
        if (gpu) cudaMemcpy(host, recv, bytes, cudaMemcpyDeviceToHost);
        else
#endif
            memcpy(host, recv, bytes);
        for (i = 0; i < count; i++) {
            double want = ctx.world_size * (ctx.world_size + 1) / 2.0 + ctx.world_size * (double)(i % 7);
            bad |= host[i] != want;
        }
        if (ddp_all_reduce(&ctx, &bad, &bad, 1, DDP_I32, DDP_MAX, NULL) != DDP_OK) return 1;
        /* timed: warm up, line up, run */
        for (it = 0; it < 2; it++) ddp_all_reduce(&ctx, send, recv, count, DDP_F32, DDP_SUM, NULL);
        ddp_barrier(&ctx);
        t0 = now_s();
        for (it = 0; it < iters; it++)
            if (ddp_all_reduce(&ctx, send, recv, count, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
#ifdef __CUDACC__
        if (gpu) cudaDeviceSynchronize();
#endif
        dt = (now_s() - t0) / iters;
        if (ddp_all_reduce(&ctx, &dt, &worst, 1, DDP_F64, DDP_MAX, NULL) != DDP_OK) return 1;
        ddp_print(&ctx, "  %10zu %12zu %10.1f %12.2f %12.2f %6s\n", bytes, count, worst * 1e6, bytes / worst / 1e9,
                  bytes / worst / 1e9 * 2.0 * (ctx.world_size - 1) / ctx.world_size, bad ? "FAIL" : "ok");
        status |= bad;
    }
    ddp_destroy(&ctx);
    return status;
}
