/* device.h - where a lesson keeps the arrays that collectives touch: on this rank's own
   GPU when the lesson is built with nvcc and ddp_init chose NCCL (ctx->device >= 0),
   in ordinary memory otherwise. Lesson 1 writes these CUDA calls out in full; the
   later lessons call these four helpers. A failed CUDA call ends the lesson. Then how
   the programs read their flags. */
#ifndef LESSON_DEVICE_H
#define LESSON_DEVICE_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __CUDACC__
#include <cuda_runtime.h>
static inline void dev_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}
#endif

static inline void *dev_alloc(const ddp_ctx *ctx, size_t bytes)
{
    void *p = NULL;
#ifdef __CUDACC__
    if (ctx->device >= 0) {
        dev_check(cudaMalloc(&p, bytes), "cudaMalloc");
        return p;
    }
#endif
    (void)ctx;
    if (!(p = calloc(1, bytes))) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static inline void dev_upload(const ddp_ctx *ctx, void *dev, const void *host, size_t bytes)
{
#ifdef __CUDACC__
    if (ctx->device >= 0) {
        dev_check(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
        return;
    }
#endif
    (void)ctx;
    if (dev != host) memcpy(dev, host, bytes);
}

static inline void dev_download(const ddp_ctx *ctx, void *host, const void *dev, size_t bytes)
{
#ifdef __CUDACC__
    if (ctx->device >= 0) {
        dev_check(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU");
        return;
    }
#endif
    (void)ctx;
    if (dev != host) memcpy(host, dev, bytes);
}

static inline void dev_free(const ddp_ctx *ctx, void *dev)
{
#ifdef __CUDACC__
    if (ctx->device >= 0) {
        cudaFree(dev);
        return;
    }
#endif
    (void)ctx;
    free(dev);
}

/* The programs read their flags before ddp_launch, so that a bad one is refused in one
   line, not once a rank. lesson_int_flag: argv[*i]'s value, a whole number from lo to
   hi, into *v (*i steps past it); lesson_launch_flag: argv[*i] is a flag of ddp_launch
   or ddp_init, left to them (*i steps past its value). Each says why and returns 0 when
   not. */
static inline int lesson_int_flag(int argc, char **argv, int *i, int lo, int hi, int *v)
{
    const char *s = *i + 1 < argc ? argv[*i + 1] : "";
    char *end;
    long x = strtol(s, &end, 10);
    if (end == s || *end || x < lo || x > hi) {
        fprintf(stderr, "%s: %s needs a whole number from %d to %d, not '%s'\n", argv[0], argv[*i], lo, hi, s);
        return 0;
    }
    *v = (int)x;
    *i += 1;
    return 1;
}

static inline int lesson_launch_flag(int argc, char **argv, int *i)
{
    static const char *const names[] = {"--nproc", "--nproc_per_node", "--nproc-per-node", "--max-restarts",
                                        "--max_restarts", "--local_rank", "--local-rank"};
    size_t k, n;
    for (k = 0; k < sizeof names / sizeof names[0]; k++) {
        n = strlen(names[k]);
        if (strncmp(argv[*i], names[k], n) == 0 && (argv[*i][n] == 0 || argv[*i][n] == '=')) {
            *i += argv[*i][n] == 0 && *i + 1 < argc;
            return 1;
        }
    }
    fprintf(stderr, "%s: unknown argument '%s' (or a flag without its value)\n", argv[0], argv[*i]);
    return 0;
}
#endif
