/* The NCCL backend on a real GPU (world of one per GPU here; every call goes
   through NCCL all the same): every collective x dtype, async all-reduce, gradient
   sync on device memory, metrics. Without a GPU every check is reported skipped. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {"f32", "f64", "bf16", "f16", "i32", "i64"};
static const char *const checks[] = {"all_reduce", "all_reduce_async", "broadcast", "all_gather",
                                     "reduce_scatter", "grad_sync", "metrics"};


/* In a world of one every collective returns its input: check that, through NCCL. */
static int roundtrip(ddp_ctx *ctx, ddp_dtype t, int which, size_t n, char *why)
{
    size_t es = ddp_dtype_size(t), i;
    char *host = (char *)malloc(n * es), *back = (char *)malloc(n * es);
    void *a = NULL, *b = NULL;
    ddp_result r = DDP_OK;
    ddp_work w;
    int ok = 1;
    cudaMalloc(&a, n * es);
    cudaMalloc(&b, n * es);
    for (i = 0; i < n; i++) test_put(host, t, i, (double)((int)(i % 11) - 5));
    cudaMemcpy(a, host, n * es, cudaMemcpyHostToDevice);
    cudaMemset(b, 0xff, n * es); /* poison */
    switch (which) {
    case 0: r = ddp_all_reduce(ctx, a, b, n, t, DDP_SUM, NULL); break;
    case 1:
        r = ddp_all_reduce_async(ctx, a, b, n, t, DDP_MAX, NULL, &w);
        if (r == DDP_OK) r = ddp_wait(ctx, &w, NULL);
        break;
    case 2: /* in place */
        cudaFree(b);
        b = a;
        r = ddp_broadcast(ctx, a, n, t, 0, NULL);
        break;
    case 3: r = ddp_all_gather(ctx, a, b, n, t, NULL); break;
    default: r = ddp_reduce_scatter(ctx, a, b, n, t, DDP_AVG, NULL); break;
    }
    cudaDeviceSynchronize();
    cudaMemcpy(back, b, n * es, cudaMemcpyDeviceToHost);
    if (r != DDP_OK) { snprintf(why, 400, "%s: %s", names[t], ddp_error(ctx)); ok = 0; }
    for (i = 0; i < n && ok; i++)
        if (test_get(back, t, i) != test_get(host, t, i)) {
            snprintf(why, 400, "%s n=%zu [%zu] = %g, want %g", names[t], n, i, test_get(back, t, i), test_get(host, t, i));
            ok = 0;
        }
    if (which != 2) cudaFree(b);
    cudaFree(a);
    free(host);
    free(back);
    return ok;
}

int main(void)
{
    ddp_ctx ctx;
    ddp_desc d;
    char why[400] = "", name[96];
    int n = 0, c, t;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        for (c = 0; c < 7; c++) {
            snprintf(name, sizeof name, "nccl.%s", checks[c]);
            test_skip(name, "no CUDA device");
        }
        return 0;
    }
    memset(&d, 0, sizeof d);
    d.backend = DDP_BACKEND_NCCL;
    d.timeout_ms = 60000;
    if (ddp_init(&ctx, &d) != DDP_OK) {
        CHECK("nccl.init", 0, "%s", ddp_error(&ctx));
        TEST_EXIT();
    }
    for (c = 0; c < 5; c++) {
        int ok = 1;
        for (t = 0; t < 6 && ok; t++)
            ok = roundtrip(&ctx, (ddp_dtype)t, c, 1, why) && roundtrip(&ctx, (ddp_dtype)t, c, 1000003, why);
        snprintf(name, sizeof name, "nccl.%s", checks[c]);
        CHECK(name, ok, "%s", why);
    }
    { /* gradient sync on device memory: average of one rank = the gradient itself */
        enum { N = 100003 };
        float *g = NULL, *p = NULL, host[N], back[N];
        ddp_grad gs;
        ddp_grad_desc gd;
        int i, ok;
        for (i = 0; i < N; i++) host[i] = (float)(i % 13) * 0.5f;
        cudaMalloc((void **)&g, sizeof host);
        cudaMalloc((void **)&p, sizeof host);
        cudaMemcpy(g, host, sizeof host, cudaMemcpyHostToDevice);
        cudaMemcpy(p, host, sizeof host, cudaMemcpyHostToDevice);
        memset(&gd, 0, sizeof gd);
        gd.grads = g;
        gd.count = N;
        gd.params = p;
        gd.bucket_bytes = 40000;
        ok = ddp_grad_init(&gs, &ctx, &gd) == DDP_OK;
        for (i = N; ok && i > 0; i -= 9001) ok = ddp_grad_ready(&gs, i > 9001 ? i - 9001 : 0, i > 9001 ? 9001 : i) == DDP_OK;
        ok = ok && ddp_grad_finish(&gs) == DDP_OK;
        cudaMemcpy(back, g, sizeof back, cudaMemcpyDeviceToHost);
        for (i = 0; i < N && ok; i++) ok = back[i] == host[i];
        CHECK("nccl.grad_sync", ok, "%s", ddp_error(&ctx));
        ddp_grad_destroy(&gs);
        cudaFree(g);
        cudaFree(p);
    }
    {
        ddp_metric m[2];
        memset(m, 0, sizeof m);
        ddp_metric_add(&m[0], 2.0, 1);
        ddp_metric_add(&m[0], 4.0, 1);
        ddp_metric_add(&m[1], 1.0, 3);
        CHECK("nccl.metrics", ddp_metric_reduce(&ctx, m, 2) == DDP_OK && ddp_metric_mean(&m[0]) == 3.0 &&
              m[1].count == 3 && m[0].max == 4.0, "%s", ddp_error(&ctx));
    }
    ddp_destroy(&ctx);
    TEST_EXIT();
}
