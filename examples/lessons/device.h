/* device.h - where a lesson keeps the arrays that collectives touch: on this rank's own
   GPU when the lesson is built with nvcc and ddp_init chose NCCL (ctx->device >= 0),
   in ordinary memory otherwise. Lesson 1 writes these CUDA calls out in full; the
   later lessons call these four helpers. A failed CUDA call ends the lesson. */
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
#endif
