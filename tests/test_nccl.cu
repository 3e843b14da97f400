/* The NCCL backend on one GPU. One GPU allows a world of one only (NCCL refuses two
   ranks on one device), and there every reduction is the identity: the data a rank
   sends is the result. So these checks are built to catch what a world of one can
   catch, and say plainly what it cannot:
   - shown: each collective x dtype x op writes its result into a separate, poisoned
     output buffer (a broken path leaves poison), with the right element size and
     count (a poisoned guard after the end stays untouched: byte counts passed as
     element counts overrun it), non-integer values, AVG included, 1 and 1000003
     elements; the collective is ordered after the caller's stream (a slow kernel
     writes the input just before the call: NCCL must see its values, not the old
     ones) and the caller's stream after the collective (blocking call, and
     ddp_wait(stream) after an async one: a kernel on the stream reads the result);
     gradient sync with buckets that split the buffer covers every element, moves
     nothing out of place and writes nothing outside it; host memory (&x, a stack
     variable) works as on the CPU backend; the watchdog's time starts when a
     collective can start (behind a 2.5 s kernel, a 1 s timeout does not fire).
   - not shown: arithmetic across ranks (sums, averages over several ranks; which
     NCCL dtype or op was asked for, as long as its element size is right), the data
     a broadcast moves. Those are exercised on the CPU backend by test_collectives and
     test_gradsync, and here the first time a job runs on two GPUs.
   Without a usable GPU every check is skipped with the cause (FAIL under
   DDP_REQUIRE_GPU=1, as make check-gpu runs it). */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <cuda_runtime.h>

enum { GUARD = 64 }; /* poisoned elements after every output buffer */
static const char *const dtype_names[] = {"f32", "f64", "bf16", "f16", "i32", "i64"}; /* ddp_dtype order */
static const char *const op_names[] = {"sum", "avg", "min", "max"};                    /* ddp_op order */
static const char *const checks[] = {"all_reduce", "all_reduce_async", "broadcast", "all_gather", "reduce_scatter",
                                     "stream_order", "stream_order_async", "grad_sync", "grad_sync_bf16",
                                     "metrics", "deadline_from_start", "host_memory"};

/* Non-integer, non-repeating values (exact in bf16 and f16; truncated for integers). */
static double value(size_t i, int salt) { return (double)((long)((i * 7919 + salt * 131) % 2003) - 1001) / 8.0 + 0.375; }

/* Spins for `ns` nanoseconds of GPU time, then writes out[i] = base + i / 4: the slow
   producer that a collective issued right after it must wait for. */
__global__ void slow_fill(float *out, size_t n, float base, long long ns)
{
    unsigned long long t0, t;
    size_t i;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while ((long long)(t - t0) < ns);
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = base + (float)(i % 4096) / 4;
}

/* Counts elements of in that are not base + i / 4: the consumer on the caller's stream. */
__global__ void count_wrong(const float *in, size_t n, float base, unsigned long long *wrong)
{
    size_t i;
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (in[i] != base + (float)(i % 4096) / 4) atomicAdd(wrong, 1ULL);
}

/* One collective out of place into a poisoned buffer followed by a poisoned guard,
   on the legacy default stream (read back with a plain cudaMemcpy, which the call
   must be ordered before). In a world of one the result equals the input. */
static int out_of_place(ddp_ctx *ctx, int which, ddp_dtype t, ddp_op op, size_t n, char *why)
{
    size_t es = ddp_dtype_size(t), bytes = n * es, total = (n + GUARD) * es, i;
    unsigned char *in = (unsigned char *)malloc(bytes), *out = (unsigned char *)malloc(total);
    void *a = NULL, *b = NULL;
    ddp_result r = DDP_OK;
    ddp_work w;
    cudaError_t e;
    int ok = 1;
    for (i = 0; i < n; i++) test_put(in, t, i, value(i, (int)op));
    cudaMalloc(&a, bytes);
    cudaMalloc(&b, total);
    cudaMemcpy(a, in, bytes, cudaMemcpyHostToDevice);
    cudaMemset(b, 0xff, total); /* NaN for floats, -1 for integers */
    switch (which) {
    case 0: r = ddp_all_reduce(ctx, a, b, n, t, op, NULL); break;
    case 1:
        r = ddp_all_reduce_async(ctx, a, b, n, t, op, NULL, &w);
        if (r == DDP_OK) r = ddp_wait(ctx, &w, NULL);
        break;
    case 3: r = ddp_all_gather(ctx, a, b, n, t, NULL); break;
    default: r = ddp_reduce_scatter(ctx, a, b, n, t, op, NULL); break;
    }
    e = cudaMemcpy(out, b, total, cudaMemcpyDeviceToHost);
    if (r != DDP_OK || e != cudaSuccess) {
        snprintf(why, 400, "%s %s n=%zu: %.300s", dtype_names[t], which == 3 ? "" : op_names[op], n,
                 r != DDP_OK ? ddp_error(ctx) : cudaGetErrorString(e));
        ok = 0;
    }
    for (i = 0; i < n && ok; i++)
        if (!(test_get(out, t, i) == test_get(in, t, i))) { /* poison (NaN) compares unequal */
            snprintf(why, 400, "%s %s n=%zu: [%zu] = %g, want %g", dtype_names[t], op_names[op], n, i,
                     test_get(out, t, i), test_get(in, t, i));
            ok = 0;
        }
    for (i = bytes; i < total && ok; i++)
        if (out[i] != 0xff) {
            snprintf(why, 400, "%s n=%zu: wrote past the end of the output (byte %zu of the guard)", dtype_names[t], n,
                     i - bytes);
            ok = 0;
        }
    cudaFree(a);
    cudaFree(b);
    free(in);
    free(out);
    return ok;
}

/* The broadcast is in place, so in a world of one it moves nothing: what is left to
   check is that it runs, leaves the data as it was and keeps stream order. */
static int broadcast(ddp_ctx *ctx, ddp_dtype t, size_t n, char *why)
{
    size_t es = ddp_dtype_size(t), i;
    unsigned char *in = (unsigned char *)malloc(n * es), *out = (unsigned char *)malloc(n * es);
    void *a = NULL;
    ddp_result r;
    int ok = 1;
    for (i = 0; i < n; i++) test_put(in, t, i, value(i, 7));
    cudaMalloc(&a, n * es);
    cudaMemcpy(a, in, n * es, cudaMemcpyHostToDevice);
    r = ddp_broadcast(ctx, a, n, t, 0, NULL);
    cudaMemcpy(out, a, n * es, cudaMemcpyDeviceToHost);
    if (r != DDP_OK) { snprintf(why, 400, "%s n=%zu: %.300s", dtype_names[t], n, ddp_error(ctx)); ok = 0; }
    if (ok && memcmp(in, out, n * es) != 0) { snprintf(why, 400, "%s n=%zu: data changed", dtype_names[t], n); ok = 0; }
    cudaFree(a);
    free(in);
    free(out);
    return ok;
}

/* The caller's stream (non-blocking, so nothing orders it implicitly) writes the
   input with a kernel that first spins for 50 ms, then the all-reduce is issued at
   once: NCCL must read the new values, not the old ones written before. After the
   call (blocking) or ddp_wait(stream) (async), a kernel on the caller's stream counts
   wrong values in the output; after ddp_wait the host may also read it directly. */
static int stream_order(ddp_ctx *ctx, int async, char *why)
{
    const size_t n = (size_t)1 << 22;
    float *a = NULL, *b = NULL;
    unsigned long long *wrong = NULL, nwrong = ~0ULL, host_wrong = 0;
    cudaStream_t s = NULL, other = NULL;
    ddp_result r;
    ddp_work w;
    cudaError_t e;
    float *back = (float *)malloc(n * sizeof *back);
    size_t i;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
    cudaMalloc((void **)&a, n * sizeof *a);
    cudaMalloc((void **)&b, n * sizeof *b);
    cudaMalloc((void **)&wrong, sizeof *wrong);
    slow_fill<<<256, 256, 0, s>>>(a, n, -3.25f, 0);         /* the old values */
    cudaMemsetAsync(b, 0xff, n * sizeof *b, s);
    cudaMemsetAsync(wrong, 0, sizeof *wrong, s);
    cudaStreamSynchronize(s);
    slow_fill<<<256, 256, 0, s>>>(a, n, 1.5f, 50000000LL); /* the new ones, 50 ms later */
    if (async) {
        r = ddp_all_reduce_async(ctx, a, b, n, DDP_F32, DDP_AVG, s, &w);
        if (r == DDP_OK) r = ddp_wait(ctx, &w, s);
    } else {
        r = ddp_all_reduce(ctx, a, b, n, DDP_F32, DDP_AVG, s);
    }
    if (async && r == DDP_OK) { /* ddp_wait returned: the result is there for the host */
        cudaMemcpyAsync(back, b, n * sizeof *b, cudaMemcpyDeviceToHost, other);
        cudaStreamSynchronize(other);
        for (i = 0; i < n; i++) host_wrong += back[i] != 1.5f + (float)(i % 4096) / 4;
    }
    count_wrong<<<256, 256, 0, s>>>(b, n, 1.5f, wrong);
    cudaMemcpyAsync(&nwrong, wrong, sizeof nwrong, cudaMemcpyDeviceToHost, s);
    e = cudaStreamSynchronize(s);
    if (r != DDP_OK) snprintf(why, 400, "%.300s", ddp_error(ctx));
    else if (e != cudaSuccess) snprintf(why, 400, "%s", cudaGetErrorString(e));
    else if (nwrong) snprintf(why, 400, "%llu of %zu results on the caller's stream are wrong: the collective did "
                              "not wait for the stream's kernel, or the stream did not wait for the collective", nwrong, n);
    else if (host_wrong) snprintf(why, 400, "%llu of %zu results not there for the host after ddp_wait", host_wrong, n);
    cudaFree(a);
    cudaFree(b);
    cudaFree(wrong);
    cudaStreamDestroy(s);
    cudaStreamDestroy(other);
    free(back);
    return r == DDP_OK && e == cudaSuccess && nwrong == 0 && host_wrong == 0;
}

/* Gradient sync on device memory, buckets of about 10000 elements over a buffer of
   100003 (11 buckets, the last partial), regions of 9001 marked last first so they straddle
   bucket boundaries; the parameters are broadcast by init. A world of one averages
   into the same values: everything must come back as it was, and the guards after
   both buffers stay poisoned. */
static int grad_sync(ddp_ctx *ctx, ddp_dtype t, char *why)
{
    enum { N = 100003, REGION = 9001 };
    size_t es = ddp_dtype_size(t), i;
    unsigned char *host = (unsigned char *)malloc((N + GUARD) * es), *back = (unsigned char *)malloc((N + GUARD) * es);
    float *params = (float *)malloc(N * sizeof *params), *pback = (float *)malloc((N + GUARD) * sizeof *pback);
    void *g = NULL, *p = NULL;
    ddp_grad gs;
    ddp_grad_desc gd;
    ddp_result r;
    long i0;
    int ok;
    memset(host, 0xff, (N + GUARD) * es);
    for (i = 0; i < N; i++) {
        test_put(host, t, i, value(i, 3));
        params[i] = (float)value(i, 5);
    }
    cudaMalloc(&g, (N + GUARD) * es);
    cudaMalloc(&p, (N + GUARD) * sizeof *params);
    cudaMemcpy(g, host, (N + GUARD) * es, cudaMemcpyHostToDevice);
    cudaMemset(p, 0xff, (N + GUARD) * sizeof *params);
    cudaMemcpy(p, params, N * sizeof *params, cudaMemcpyHostToDevice);
    memset(&gd, 0, sizeof gd);
    gd.grads = g;
    gd.count = N;
    gd.dtype = t;
    gd.params = p;
    gd.bucket_bytes = 10000 * es;
    r = ddp_grad_init(&gs, ctx, &gd);
    ok = r == DDP_OK && gs.num_buckets > 1 && gs.bucket_count > 0 &&
         gs.num_buckets == (N + gs.bucket_count - 1) / gs.bucket_count;
    for (i0 = N; ok && i0 > 0; i0 -= REGION)
        ok = (r = ddp_grad_ready(&gs, i0 > REGION ? (size_t)(i0 - REGION) : 0, i0 > REGION ? (size_t)REGION : (size_t)i0)) == DDP_OK;
    ok = ok && (r = ddp_grad_finish(&gs)) == DDP_OK;
    cudaMemcpy(back, g, (N + GUARD) * es, cudaMemcpyDeviceToHost);
    cudaMemcpy(pback, p, (N + GUARD) * sizeof *pback, cudaMemcpyDeviceToHost);
    if (r != DDP_OK) snprintf(why, 400, "%s: %.300s", dtype_names[t], ddp_error(ctx));
    else if (!ok) snprintf(why, 400, "%s: %zu buckets of %zu elements for %d, want several covering it exactly",
                           dtype_names[t], gs.num_buckets, gs.bucket_count, (int)N);
    for (i = 0; i < N && ok; i++)
        if (!(test_get(back, t, i) == test_get(host, t, i)) || !(pback[i] == params[i])) {
            snprintf(why, 400, "%s: grad[%zu] = %g (want %g), param = %g (want %g)", dtype_names[t], i,
                     test_get(back, t, i), test_get(host, t, i), pback[i], params[i]);
            ok = 0;
        }
    if (ok && (memcmp(back + N * es, host + N * es, GUARD * es) != 0 || pback[N] == pback[N])) { /* poison is NaN */
        snprintf(why, 400, "%s: wrote past the end of the gradients or parameters", dtype_names[t]);
        ok = 0;
    }
    ddp_grad_destroy(&gs);
    cudaFree(g);
    cudaFree(p);
    free(host);
    free(back);
    free(params);
    free(pback);
    return ok;
}

/* The watchdog's time for a collective starts when the collective can start, not when
   it is queued: behind 2.5 s of the caller's kernel, an all-reduce under a 1 s timeout
   must succeed (a second context, with that timeout, on the same GPU). The host
   all-reduce after it waits for both. */
static int deadline_from_start(char *why)
{
    const size_t n = 1024;
    ddp_ctx ctx;
    ddp_desc d;
    float *a = NULL, one = 1.0f;
    cudaStream_t s = NULL;
    ddp_result r;
    double t0;
    memset(&d, 0, sizeof d);
    d.backend = DDP_BACKEND_NCCL;
    d.timeout_ms = 1000;
    if ((r = ddp_init(&ctx, &d)) != DDP_OK) {
        snprintf(why, 400, "init with a 1 s timeout: %.300s", ddp_error(&ctx));
        return 0;
    }
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc((void **)&a, n * sizeof *a);
    t0 = test_now_s();
    slow_fill<<<1, 256, 0, s>>>(a, n, 1.5f, 2500000000LL);
    r = ddp_all_reduce(&ctx, a, a, n, DDP_F32, DDP_SUM, s);
    if (r == DDP_OK) r = ddp_all_reduce(&ctx, &one, &one, 1, DDP_F32, DDP_SUM, s);
    if (r != DDP_OK) snprintf(why, 400, "after %.2f s: %.300s", test_now_s() - t0, ddp_error(&ctx));
    else if (test_now_s() - t0 < 2.4) snprintf(why, 400, "the host collective returned after %.2f s, before the "
                                                         "2.5 s kernel ahead of it ended", test_now_s() - t0);
    cudaFree(a);
    cudaStreamDestroy(s);
    ddp_destroy(&ctx);
    return r == DDP_OK && why[0] == 0;
}

/* Host memory, as the README's first example passes it: a stack variable, out of
   place and in place, and small host arrays through the other collectives. On the
   NCCL backend ddp.h stages host buffers through device memory; the result must be
   there when the call returns, as on the CPU backend. */
static int host_memory(ddp_ctx *ctx, char *why)
{
    float x = 2.75f, y = -1.0f;
    double v[5] = {0.5, -1.25, 3.125, 1e-3, -7.0}, avg[5];
    int32_t k = 41, gathered[3] = {-1, -1, -1};
    int64_t big[2] = {((int64_t)1 << 40) + 3, -5}, scat[2] = {0, 0};
    ddp_result r;
    int i, ok = 1;
    for (i = 0; i < 5; i++) avg[i] = -99;
    if ((r = ddp_all_reduce(ctx, &x, &y, 1, DDP_F32, DDP_SUM, NULL)) != DDP_OK || y != 2.75f) {
        snprintf(why, 400, "all_reduce(&x, &y): %.300s, y = %g", r != DDP_OK ? ddp_error(ctx) : "", y);
        return 0;
    }
    if ((r = ddp_all_reduce(ctx, &x, &x, 1, DDP_F32, DDP_MAX, NULL)) != DDP_OK || x != 2.75f) {
        snprintf(why, 400, "all_reduce(&x, &x): %.300s, x = %g", r != DDP_OK ? ddp_error(ctx) : "", x);
        return 0;
    }
    r = ddp_all_reduce(ctx, v, avg, 5, DDP_F64, DDP_AVG, NULL);
    for (i = 0; i < 5; i++) ok &= avg[i] == v[i];
    if (r != DDP_OK || !ok) {
        snprintf(why, 400, "all_reduce of a host double[5], AVG: %.300s, [0] = %g", r != DDP_OK ? ddp_error(ctx) : "", avg[0]);
        return 0;
    }
    if ((r = ddp_broadcast(ctx, &k, 1, DDP_I32, 0, NULL)) != DDP_OK || k != 41) {
        snprintf(why, 400, "broadcast(&k): %.300s, k = %d", r != DDP_OK ? ddp_error(ctx) : "", (int)k);
        return 0;
    }
    if ((r = ddp_all_gather(ctx, &k, gathered, 1, DDP_I32, NULL)) != DDP_OK || gathered[0] != 41 || gathered[1] != -1) {
        snprintf(why, 400, "all_gather(&k): %.300s, got %d, guard %d", r != DDP_OK ? ddp_error(ctx) : "", (int)gathered[0],
                 (int)gathered[1]);
        return 0;
    }
    if ((r = ddp_reduce_scatter(ctx, big, scat, 2, DDP_I64, DDP_SUM, NULL)) != DDP_OK || scat[0] != big[0] ||
        scat[1] != big[1]) {
        snprintf(why, 400, "reduce_scatter of a host int64[2]: %.300s, got %lld %lld", r != DDP_OK ? ddp_error(ctx) : "",
                 (long long)scat[0], (long long)scat[1]);
        return 0;
    }
    return 1;
}

int main(void)
{
    ddp_ctx ctx;
    ddp_desc d;
    char why[400] = "", name[96];
    int c, t, o, ok;
    static const size_t sizes[] = {1, 1000003};
    if (!test_gpu_ready("nccl.gpu")) {
        for (c = 0; c < TEST_COUNT(checks); c++) {
            snprintf(name, sizeof name, "nccl.%s", checks[c]);
            test_skip(name, "no usable GPU (nccl.gpu above says why)");
        }
        TEST_EXIT();
    }
    memset(&d, 0, sizeof d);
    d.backend = DDP_BACKEND_NCCL;
    d.timeout_ms = 60000;
    if (ddp_init(&ctx, &d) != DDP_OK) {
        CHECK("nccl.init", 0, "%s", ddp_error(&ctx));
        TEST_EXIT();
    }
    for (c = 0; c < 5; c++) {
        int s;
        ok = 1;
        for (t = 0; t < DDP_DTYPE_COUNT && ok; t++)
            for (s = 0; s < 2 && ok; s++)
                if (c == 2) ok = broadcast(&ctx, (ddp_dtype)t, sizes[s], why);
                else if (c == 3) ok = out_of_place(&ctx, c, (ddp_dtype)t, DDP_SUM, sizes[s], why);
                else
                    for (o = 0; o < DDP_OP_COUNT && ok; o++)
                        ok = out_of_place(&ctx, c, (ddp_dtype)t, (ddp_op)o, sizes[s], why);
        snprintf(name, sizeof name, "nccl.%s", checks[c]);
        CHECK(name, ok, "%s", why);
    }
    CHECK("nccl.stream_order", stream_order(&ctx, 0, why), "%s", why);
    CHECK("nccl.stream_order_async", stream_order(&ctx, 1, why), "%s", why);
    CHECK("nccl.grad_sync", grad_sync(&ctx, DDP_F32, why), "%s", why);
    CHECK("nccl.grad_sync_bf16", grad_sync(&ctx, DDP_BF16, why), "%s", why);
    {
        ddp_metric m[2];
        memset(m, 0, sizeof m);
        ddp_metric_add(&m[0], 2.0, 1);
        ddp_metric_add(&m[0], 4.0, 1);
        ddp_metric_add(&m[1], 1.0, 3);
        CHECK("nccl.metrics", ddp_metric_reduce(&ctx, m, 2) == DDP_OK && ddp_metric_mean(&m[0]) == 3.0 &&
              m[1].count == 3 && m[0].max == 4.0, "%s", ddp_error(&ctx));
    }
    why[0] = 0;
    CHECK("nccl.deadline_from_start", deadline_from_start(why), "%s", why);
    CHECK("nccl.host_memory", host_memory(&ctx, why), "%s", why); /* last: a failure may break the group */
    ddp_destroy(&ctx);
    TEST_EXIT();
}
