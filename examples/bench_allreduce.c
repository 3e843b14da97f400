/* bench_allreduce: all-reduce bandwidth, in the format of nccl-tests.
       ./examples/bench_allreduce --nproc 4                 CPU processes
       ./examples/bench_allreduce_gpu --nproc 8             GPUs through NCCL
   For each size: the time of one all-reduce (mean over --iters, slowest rank), the
   algorithm bandwidth (bytes / time) and the bus bandwidth (algbw * 2(n-1)/n, what
   each link carries in a ring: comparable across world sizes), and a check of the
   result. Options: --iters N (20), --min-bytes B (4096), --max-bytes B (64 MiB); the
   sizes double from min to max, each a multiple of 4 bytes. */
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

/* --iters N, --min-bytes B, --max-bytes B (also as --flag=value); the launcher's own
   flags (--nproc, --max-restarts, --local_rank) are ddp_launch's and ddp_init's. A bad
   one ends the program with one line, before any rank starts. */
static const char *const flags[] = {"--iters", "--min-bytes", "--max-bytes"};
static const long long limits[][2] = {{1, 1000000}, {4, 1LL << 34}, {4, 1LL << 34}};
static const char *const launcher[] = {"--nproc", "--nproc_per_node", "--nproc-per-node", "--max-restarts",
                                       "--max_restarts", "--local_rank", "--local-rank", NULL};

static void parse_args(int argc, char **argv, long long value[3])
{
    int i, k;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '='), *v = eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
        const size_t n = eq ? (size_t)(eq - a) : strlen(a);
        char *end;
        long long x;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: bench_allreduce [--nproc N] [--iters N (20)] [--min-bytes B (4096)] [--max-bytes B (64 "
                   "MiB)]\n");
            exit(0);
        }
        for (k = 0; launcher[k] && !(strlen(launcher[k]) == n && strncmp(a, launcher[k], n) == 0); k++) {}
        if (launcher[k]) {
            i += !eq;
            continue;
        }
        for (k = 0; k < 3 && !(strlen(flags[k]) == n && strncmp(a, flags[k], n) == 0); k++) {}
        if (k == 3) {
            fprintf(stderr, "bench_allreduce: unknown argument '%s' (--help lists the flags)\n", a);
            exit(2);
        }
        x = v ? strtoll(v, &end, 10) : 0;
        if (!v || end == v || *end || x < limits[k][0] || x > limits[k][1] || (k > 0 && x % 4)) {
            fprintf(stderr, "bench_allreduce: %s needs %s from %lld to %lld, not '%s'\n", flags[k],
                    k ? "a multiple of 4 bytes" : "an integer", limits[k][0], limits[k][1], v ? v : "nothing");
            exit(2);
        }
        value[k] = x;
        i += !eq;
    }
    if (value[1] > value[2]) {
        fprintf(stderr, "bench_allreduce: --min-bytes %lld is past --max-bytes %lld\n", value[1], value[2]);
        exit(2);
    }
}

#ifdef __CUDACC__
/* A CUDA call's error, said: 1 if it worked. */
static int cuda_ok(cudaError_t e, const char *what, size_t bytes)
{
    if (e != cudaSuccess) fprintf(stderr, "bench_allreduce: %s (%zu bytes): %s\n", what, bytes, cudaGetErrorString(e));
    return e == cudaSuccess;
}
#endif

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    float *send = NULL, *recv = NULL, *host;
    size_t bytes, maxb, i;
    long long value[3] = {20, 4096, 64LL << 20}; /* --iters, --min-bytes, --max-bytes */
    int iters, it, status, gpu = 0;
    (void)gpu; /* used by the GPU build only */
    parse_args(argc, argv, value);
    status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    status = 0;
    iters = (int)value[0];
    bytes = (size_t)value[1];
    maxb = (size_t)value[2];
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;
    host = (float *)malloc(maxb);
#ifdef __CUDACC__
    gpu = ctx.backend == DDP_BACKEND_NCCL;
    if (gpu) {
        if (!cuda_ok(cudaMalloc((void **)&send, maxb), "cudaMalloc", maxb) ||
            !cuda_ok(cudaMalloc((void **)&recv, maxb), "cudaMalloc", maxb))
            return 1;
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
        if (gpu) {
            if (!cuda_ok(cudaMemcpy(send, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the GPU", bytes)) return 1;
        } else
#endif
            memcpy(send, host, bytes);
        if (ddp_all_reduce(&ctx, send, recv, count, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
#ifdef __CUDACC__
        if (gpu) {
            if (!cuda_ok(cudaMemcpy(host, recv, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU", bytes))
                return 1;
        } else
#endif
            memcpy(host, recv, bytes);
        for (i = 0; i < count; i++) {
            double want = ctx.world_size * (ctx.world_size + 1) / 2.0 + ctx.world_size * (double)(i % 7);
            bad |= host[i] != want;
        }
        if (ddp_all_reduce(&ctx, &bad, &bad, 1, DDP_I32, DDP_MAX, NULL) != DDP_OK) return 1;
        /* timed: warm up, line up, run */
        for (it = 0; it < 2; it++) ddp_all_reduce(&ctx, send, recv, count, DDP_F32, DDP_SUM, NULL);
#ifdef __CUDACC__
        /* NCCL's calls return once queued; ddp_barrier meets on the host */
        if (gpu && !cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", bytes)) return 1;
#endif
        ddp_barrier(&ctx);
        t0 = now_s();
        for (it = 0; it < iters; it++)
            if (ddp_all_reduce(&ctx, send, recv, count, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
#ifdef __CUDACC__
        if (gpu && !cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", bytes)) return 1;
#endif
        dt = (now_s() - t0) / iters;
        if (ddp_all_reduce(&ctx, &dt, &worst, 1, DDP_F64, DDP_MAX, NULL) != DDP_OK) return 1;
        ddp_print(&ctx, "  %10zu %12zu %10.1f %12.2f %12.2f %6s\n", bytes, count, worst * 1e6, bytes / worst / 1e9,
                  bytes / worst / 1e9 * 2.0 * (ctx.world_size - 1) / ctx.world_size, bad ? "FAIL" : "ok");
        status |= bad;
    }
#ifdef __CUDACC__
    if (gpu) {
        cudaFree(send);
        cudaFree(recv);
    } else
#endif
    {
        free(send);
        free(recv);
    }
    free(host);
    if (ddp_destroy(&ctx) != DDP_OK) status = 1;
    return status;
}
