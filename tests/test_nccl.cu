/* The NCCL backend: tests/test_nccl [W] runs a world of W ranks (default 1), one
   process and one GPU each (rank r on GPU r), forked here with torchrun's variables.
   make check-gpu runs the world of one on its one GPU; make check-emu runs W = 1..4
   on the CUDA emulator (tests/emu), where each process has GPUs of its own.
   - every world: each collective x dtype x op writes its result into a separate,
     poisoned output buffer (a broken path leaves poison), with the right element size
     and count (a poisoned guard after the end stays untouched: byte counts passed as
     element counts overrun it), non-integer values, AVG included, 1 and 1000003
     elements (100003 for W > 1); the collective is ordered after the caller's stream (a slow kernel
     writes the input just before the call: NCCL must see its values, not the old
     ones) and the caller's stream after the collective (blocking call, and
     ddp_wait(stream) after an async one: a kernel on the stream reads the result);
     gradient sync with buckets that split the buffer covers every element and writes
     nothing outside it, the parameters are rank 0's after ddp_grad_init; metrics;
     more collectives in flight than ddp.h's ring follows, behind a slow kernel;
     gradient buckets on the backward's stream never make the host wait for it;
     host memory (&x, a stack variable) works as on the CPU backend; collectives from
     a thread that never selected a GPU work (ddp.h selects the rank's: on GPU 0
     rank 1's stream and events fail; so only a world of 2 or more, on the emulator
     until a machine lends 2 GPUs, can catch its absence).
   - W = 1 also: the watchdog's time starts when a collective can start (behind a
     2.5 s kernel, a 1 s timeout does not fire).
   - W > 1 also: the arithmetic across ranks (each rank sends its own values: sums,
     minima, maxima exact, averages within the type's rounding, bf16 and f16 too), the
     data a broadcast from the last rank moves, the all_gather and reduce_scatter
     layouts, buckets across ranks; and the failures: DDP_CHECK=1 names ranks that
     pass other counts; a rank that never arrives at a collective (the emulator's
     DDP_EMU_NCCL_HANG) gives every rank a one-line timeout within DDP_TIMEOUT on host
     memory (ddp.h waits), and on device memory the watchdog aborts NCCL within it (a
     stream that waits for the collective goes on); a rank that dies makes the others
     fail, not hang, and under ddp.h's launcher a rank that exits 0 mid-job is the
     one named (NCCL's remote error is another rank's failure); ranks that all see one GPU (CUDA_VISIBLE_DEVICES=0) are refused
     by ddp_init. A world of
     one cannot show the arithmetic (the data a rank sends is the result), nor a
     broadcast's data.
   Without enough usable GPUs every check is skipped with the cause (FAIL under
   DDP_REQUIRE_GPU=1, as make check-gpu runs it). */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <cuda_runtime.h>
#include <math.h>

enum { GUARD = 64 }; /* poisoned elements after every output buffer */
static const char *const dtype_names[] = {"f32", "f64", "bf16", "f16", "i32", "i64"}; /* ddp_dtype order */
static const char *const op_names[] = {"sum", "avg", "min", "max"};                    /* ddp_op order */
static const char *const checks[] = {"all_reduce", "all_reduce_async", "broadcast", "all_gather", "reduce_scatter",
                                     "stream_order", "stream_order_async", "grad_sync", "grad_sync_bf16",
                                     "metrics", "ring_full", "grad_sync_no_host_wait", "other_thread", "host_memory"};
static const char *const failures[] = {"check_mismatch", "hang_times_out", "watchdog_aborts", "dead_peer", "shared_gpu"};

/* Rank r's element i: a quarter step in [-8, 7.75] from a hash of i, so neighbours
   differ and no short period repeats; exact in every float type, and a sum over up to
   8 ranks is exact even in bf16; truncated for integers. */
static double value(size_t i, int salt, int rank)
{
    const uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(salt * 131 + rank * 977) * 40503u;
    return (double)((int)(h >> 26) - 32) / 4.0;
}

/* value as the dtype stores it */
static double stored(ddp_dtype t, size_t i, int salt, int rank)
{
    const double v = value(i, salt, rank);
    return t == DDP_I32 || t == DDP_I64 ? trunc(v) : v;
}

/* What the reduction over ranks 0..W-1 of stored(t, i, salt, r) must be, and how
   far a result may be from it: sums, minima and maxima of these values are exact in
   every type; an average of integers truncates toward zero, of floats it may be off
   by a few roundings (NCCL multiplies each value by 1/W before summing). */
static double expect(ddp_dtype t, ddp_op op, int W, size_t i, int salt, double *tol)
{
    static const double eps[] = {0x1p-24, 0x1p-53, 0x1p-8, 0x1p-11, 0, 0};
    double acc = 0;
    int r;
    *tol = 0;
    for (r = 0; r < W; r++) {
        double v = stored(t, i, salt, r);
        acc = r == 0 ? v : op == DDP_MIN ? fmin(acc, v) : op == DDP_MAX ? fmax(acc, v) : acc + v;
    }
    if (op != DDP_AVG) return acc;
    if (t == DDP_I32 || t == DDP_I64) return (double)((int64_t)acc / W);
    *tol = 8.0 * W * eps[t];
    return acc / W;
}

static int close_to(double got, double want, double tol) { return fabs(got - want) <= tol * fmax(1.0, fabs(want)); }

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

/* Counts elements of in that are not scale * (base + i / 4): the consumer on the caller's stream. */
__global__ void count_wrong(const float *in, size_t n, float base, float scale, unsigned long long *wrong)
{
    size_t i;
    for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (in[i] != scale * (base + (float)(i % 4096) / 4)) atomicAdd(wrong, 1ULL);
}

/* One collective out of place into a poisoned buffer followed by a poisoned guard,
   on the legacy default stream (read back with a plain cudaMemcpy, which the call
   must be ordered before). which: 0 all_reduce, 1 async, 3 all_gather, 4 reduce_scatter. */
static int out_of_place(ddp_ctx *ctx, int which, ddp_dtype t, ddp_op op, size_t n, char *why)
{
    const int W = ctx->world_size, me = ctx->rank;
    const size_t es = ddp_dtype_size(t), in_n = which == 4 ? n * W : n, out_n = which == 3 ? n * W : n;
    const size_t bytes = in_n * es, total = (out_n + GUARD) * es;
    size_t i;
    unsigned char *in = (unsigned char *)malloc(bytes), *out = (unsigned char *)malloc(total);
    void *a = NULL, *b = NULL;
    ddp_result r = DDP_OK;
    ddp_work w;
    cudaError_t e;
    int ok = 1;
    for (i = 0; i < in_n; i++) test_put(in, t, i, value(i, (int)op, me));
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
    for (i = 0; i < out_n && ok; i++) {
        double want, tol;
        if (which == 3) /* block r is rank r's input */
            want = stored(t, i % n, (int)op, (int)(i / n)), tol = 0;
        else /* rank me gets the reduction of its own block */
            want = expect(t, op, W, (which == 4 ? (size_t)me * n : 0) + i, (int)op, &tol);
        if (!close_to(test_get(out, t, i), want, tol)) { /* poison (NaN) is never close */
            snprintf(why, 400, "%s %s n=%zu, rank %d: [%zu] = %g, want %g", dtype_names[t], which == 3 ? "" : op_names[op],
                     n, me, i, test_get(out, t, i), want);
            ok = 0;
        }
    }
    for (i = out_n * es; i < total && ok; i++)
        if (out[i] != 0xff) {
            snprintf(why, 400, "%s n=%zu: wrote past the end of the output (byte %zu of the guard)", dtype_names[t], n,
                     i - out_n * es);
            ok = 0;
        }
    cudaFree(a);
    cudaFree(b);
    free(in);
    free(out);
    return ok;
}

/* The last rank broadcasts its values in place; the others start from something
   else (in a world of one nothing moves: the data must stay as it was). */
static int broadcast(ddp_ctx *ctx, ddp_dtype t, size_t n, char *why)
{
    const int W = ctx->world_size, root = W - 1;
    size_t es = ddp_dtype_size(t), i;
    unsigned char *in = (unsigned char *)malloc(n * es), *out = (unsigned char *)malloc(n * es);
    void *a = NULL;
    ddp_result r;
    int ok = 1;
    for (i = 0; i < n; i++) test_put(in, t, i, ctx->rank == root ? value(i, 7, root) : 99);
    cudaMalloc(&a, n * es);
    cudaMemcpy(a, in, n * es, cudaMemcpyHostToDevice);
    r = ddp_broadcast(ctx, a, n, t, root, NULL);
    cudaMemcpy(out, a, n * es, cudaMemcpyDeviceToHost);
    if (r != DDP_OK) { snprintf(why, 400, "%s n=%zu: %.300s", dtype_names[t], n, ddp_error(ctx)); ok = 0; }
    for (i = 0; i < n && ok; i++)
        if (test_get(out, t, i) != stored(t, i, 7, root)) {
            snprintf(why, 400, "%s n=%zu, rank %d: [%zu] = %g, want rank %d's %g", dtype_names[t], n, ctx->rank, i,
                     test_get(out, t, i), root, stored(t, i, 7, root));
            ok = 0;
        }
    cudaFree(a);
    free(in);
    free(out);
    return ok;
}

/* The caller's stream (non-blocking, so nothing orders it implicitly) writes the
   input with a kernel that first spins for 50 ms, then the all-reduce (a sum) is
   issued at once: NCCL must read the new values, not the old ones written before.
   After the call (blocking) or ddp_wait(stream) (async), a kernel on the caller's
   stream counts wrong values in the output; after ddp_wait the host may also read it
   directly. Every rank sends the same values: the sum is W times each. */
static int stream_order(ddp_ctx *ctx, int async, char *why)
{
    const size_t n = (size_t)1 << 22;
    const float W = (float)ctx->world_size;
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
        r = ddp_all_reduce_async(ctx, a, b, n, DDP_F32, DDP_SUM, s, &w);
        if (r == DDP_OK) r = ddp_wait(ctx, &w, s);
    } else {
        r = ddp_all_reduce(ctx, a, b, n, DDP_F32, DDP_SUM, s);
    }
    if (async && r == DDP_OK) { /* ddp_wait returned: the result is there for the host */
        cudaMemcpyAsync(back, b, n * sizeof *b, cudaMemcpyDeviceToHost, other);
        cudaStreamSynchronize(other);
        for (i = 0; i < n; i++) host_wrong += back[i] != W * (1.5f + (float)(i % 4096) / 4);
    }
    count_wrong<<<256, 256, 0, s>>>(b, n, 1.5f, W, wrong);
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
   100003 (11 buckets, the last partial), regions of 9001 marked last first so they
   straddle bucket boundaries. Each rank has its own gradients (the result is their
   average) and its own parameters (init broadcasts rank 0's); the guards after both
   buffers stay poisoned. */
static int grad_sync(ddp_ctx *ctx, ddp_dtype t, char *why)
{
    enum { N = 100003, REGION = 9001 };
    const int W = ctx->world_size, me = ctx->rank;
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
        test_put(host, t, i, value(i, 3, me));
        params[i] = (float)value(i, 5, me);
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
    for (i = 0; i < N && ok; i++) {
        double tol, want = expect(t, DDP_AVG, W, i, 3, &tol);
        if (!close_to(test_get(back, t, i), want, tol) || !(pback[i] == (float)value(i, 5, 0))) {
            snprintf(why, 400, "%s, rank %d: grad[%zu] = %g (want %g), param = %g (want rank 0's %g)", dtype_names[t], me,
                     i, test_get(back, t, i), want, pback[i], (float)value(i, 5, 0));
            ok = 0;
        }
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

/* More collectives in flight than ddp.h follows at once (its ring of DDP__RING), all
   queued behind 0.3 s of a kernel on the caller's stream: in-place sums of 16-element
   slices, each of which must sum the kernel's values, then a kernel on the stream that
   counts wrong sums. */
static int ring_full(ddp_ctx *ctx, char *why)
{
    enum { SLICE = 16 };
    const int slices = DDP__RING + 44;
    const size_t n = (size_t)slices * SLICE;
    float *a = NULL;
    unsigned long long *wrong = NULL, nwrong = ~0ULL;
    cudaStream_t s = NULL;
    ddp_result r = DDP_OK;
    cudaError_t e;
    int i;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc((void **)&a, n * sizeof *a);
    cudaMalloc((void **)&wrong, sizeof *wrong);
    cudaMemsetAsync(wrong, 0, sizeof *wrong, s);
    slow_fill<<<4, 256, 0, s>>>(a, n, 1.5f, 300000000LL);
    for (i = 0; i < slices && r == DDP_OK; i++)
        r = ddp_all_reduce(ctx, a + (size_t)i * SLICE, a + (size_t)i * SLICE, SLICE, DDP_F32, DDP_SUM, s);
    count_wrong<<<4, 256, 0, s>>>(a, n, 1.5f, (float)ctx->world_size, wrong);
    cudaMemcpyAsync(&nwrong, wrong, sizeof nwrong, cudaMemcpyDeviceToHost, s);
    e = cudaStreamSynchronize(s);
    if (r != DDP_OK) snprintf(why, 400, "all_reduce %d of %d: %.300s", i, slices, ddp_error(ctx));
    else if (e != cudaSuccess) snprintf(why, 400, "%s", cudaGetErrorString(e));
    else if (nwrong) snprintf(why, 400, "%llu of %zu sums wrong after %d all-reduces behind a slow kernel", nwrong, n, slices);
    cudaFree(a);
    cudaFree(wrong);
    cudaStreamDestroy(s);
    return r == DDP_OK && e == cudaSuccess && nwrong == 0;
}

/* Gradient buckets on the backward's stream queue their all-reduces without the host
   waiting for that stream: behind 1 s of a kernel that writes the gradients (rank r:
   r + i / 4), marking every region and ddp_grad_finish return well before the kernel
   ends (on the emulator, whose streams run only when someone waits or asks, any host
   wait would wait for the kernel), and the stream then holds the sums. */
static int grad_sync_no_host_wait(ddp_ctx *ctx, char *why)
{
    enum { N = 100003, REGION = 9001 };
    const int W = ctx->world_size;
    float *g = NULL;
    unsigned long long *wrong = NULL, nwrong = ~0ULL;
    cudaStream_t s = NULL;
    ddp_grad gs;
    ddp_grad_desc gd;
    ddp_result r;
    cudaError_t e;
    double t0, dt = 0;
    long i0;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc((void **)&g, N * sizeof *g);
    cudaMalloc((void **)&wrong, sizeof *wrong);
    cudaMemsetAsync(wrong, 0, sizeof *wrong, s);
    memset(&gd, 0, sizeof gd);
    gd.grads = g;
    gd.count = N;
    gd.sum = 1;
    gd.bucket_bytes = 10000 * sizeof *g;
    gd.stream = s;
    r = ddp_grad_init(&gs, ctx, &gd);
    if (r == DDP_OK) {
        slow_fill<<<64, 256, 0, s>>>(g, N, (float)ctx->rank, 1000000000LL);
        t0 = test_now_s();
        for (i0 = N; r == DDP_OK && i0 > 0; i0 -= REGION)
            r = ddp_grad_ready(&gs, i0 > REGION ? (size_t)(i0 - REGION) : 0, i0 > REGION ? (size_t)REGION : (size_t)i0);
        if (r == DDP_OK) r = ddp_grad_finish(&gs);
        dt = test_now_s() - t0;
    }
    count_wrong<<<64, 256, 0, s>>>(g, N, (float)(W - 1) / 2, (float)W, wrong);
    cudaMemcpyAsync(&nwrong, wrong, sizeof nwrong, cudaMemcpyDeviceToHost, s);
    e = cudaStreamSynchronize(s);
    if (r != DDP_OK) snprintf(why, 400, "%.300s", ddp_error(ctx));
    else if (e != cudaSuccess) snprintf(why, 400, "%s", cudaGetErrorString(e));
    else if (dt > 0.5) snprintf(why, 400, "marking the buckets and ddp_grad_finish took %.2f s behind a 1 s kernel: "
                                "the host waited for the stream", dt);
    else if (nwrong) snprintf(why, 400, "%llu of %d gradient sums wrong", nwrong, (int)N);
    ddp_grad_destroy(&gs);
    cudaFree(g);
    cudaFree(wrong);
    cudaStreamDestroy(s);
    return r == DDP_OK && e == cudaSuccess && dt <= 0.5 && nwrong == 0;
}

/* Collectives from a thread that never selected a GPU (a thread of the program's own,
   one call at a time): on device memory, blocking and async, and on host memory. The
   thread works on GPU 0 unless ddp.h selects the rank's. */
typedef struct other_args { ddp_ctx *ctx; float *dev, host[3]; ddp_result r; } other_args;
static void *other_thread_calls(void *p)
{
    other_args *a = (other_args *)p;
    ddp_work w;
    a->r = ddp_all_reduce(a->ctx, a->dev, a->dev, 1000, DDP_F32, DDP_SUM, NULL);
    if (a->r == DDP_OK) a->r = ddp_all_reduce_async(a->ctx, a->dev, a->dev, 1000, DDP_F32, DDP_SUM, NULL, &w);
    if (a->r == DDP_OK) a->r = ddp_wait(a->ctx, &w, NULL);
    if (a->r == DDP_OK) a->r = ddp_all_reduce(a->ctx, a->host, a->host, 3, DDP_F32, DDP_SUM, NULL);
    return NULL;
}

static int other_thread(ddp_ctx *ctx, char *why)
{
    const float W = (float)ctx->world_size;
    other_args a;
    pthread_t t;
    float back[1000];
    cudaError_t e;
    int i, wrong = 0;
    memset(&a, 0, sizeof a);
    a.ctx = ctx;
    a.host[0] = 1, a.host[1] = 2, a.host[2] = (float)ctx->rank;
    for (i = 0; i < 1000; i++) back[i] = (float)i;
    cudaMalloc((void **)&a.dev, sizeof back);
    cudaMemcpy(a.dev, back, sizeof back, cudaMemcpyHostToDevice);
    if (pthread_create(&t, NULL, other_thread_calls, &a) != 0) { snprintf(why, 400, "pthread_create failed"); return 0; }
    pthread_join(t, NULL);
    e = cudaMemcpy(back, a.dev, sizeof back, cudaMemcpyDeviceToHost);
    cudaFree(a.dev);
    for (i = 0; i < 1000; i++) wrong += back[i] != W * W * (float)i;
    if (a.r != DDP_OK) snprintf(why, 400, "%.300s", ddp_error(ctx));
    else if (e != cudaSuccess) snprintf(why, 400, "%s", cudaGetErrorString(e));
    else if (wrong || a.host[0] != W || a.host[2] != W * (W - 1) / 2)
        snprintf(why, 400, "%d of 1000 device results wrong, host %g %g (want %g %g)", wrong, a.host[0], a.host[2], W,
                 W * (W - 1) / 2);
    return a.r == DDP_OK && e == cudaSuccess && !wrong && a.host[0] == W && a.host[2] == W * (W - 1) / 2;
}

/* Two metrics for every rank: (2, 4) and 1 with a count of 3. */
static int metrics(ddp_ctx *ctx, char *why)
{
    ddp_metric m[2];
    const int W = ctx->world_size;
    memset(m, 0, sizeof m);
    ddp_metric_add(&m[0], 2.0, 1);
    ddp_metric_add(&m[0], 4.0, 1);
    ddp_metric_add(&m[1], 1.0, 3);
    if (ddp_metric_reduce(ctx, m, 2) != DDP_OK) {
        snprintf(why, 400, "%.300s", ddp_error(ctx));
        return 0;
    }
    snprintf(why, 400, "mean %g (want 3), count %g (want %d), max %g (want 4)", ddp_metric_mean(&m[0]), (double)m[1].count,
             3 * W, m[0].max);
    return ddp_metric_mean(&m[0]) == 3.0 && m[1].count == 3 * W && m[0].max == 4.0;
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
    enum { MAXW = 8 };
    const int W = ctx->world_size, me = ctx->rank;
    float x = 2.75f + (float)me, y = -1.0f;
    double v[5] = {0.5, -1.25, 3.125, 1e-3, -7.0}, avg[5];
    int32_t k = me == W - 1 ? 41 : -5, gathered[MAXW + 1];
    int64_t big[2 * MAXW], scat[2] = {0, 0}, want[2] = {0, 0};
    ddp_result r;
    int i, ok = 1;
    for (i = 0; i < 5; i++) {
        v[i] += me;
        avg[i] = -99;
    }
    for (i = 0; i <= MAXW; i++) gathered[i] = -1;
    for (i = 0; i < 2 * W; i++) big[i] = ((int64_t)1 << 40) + 3 + 7 * me + i; /* block r: elements 2r, 2r + 1 */
    for (i = 0; i < W; i++) {
        want[0] += ((int64_t)1 << 40) + 3 + 7 * i + 2 * me;
        want[1] += ((int64_t)1 << 40) + 3 + 7 * i + 2 * me + 1;
    }
    if ((r = ddp_all_reduce(ctx, &x, &y, 1, DDP_F32, DDP_SUM, NULL)) != DDP_OK ||
        y != 2.75f * W + (float)(W * (W - 1) / 2)) {
        snprintf(why, 400, "all_reduce(&x, &y): %.300s, y = %g", r != DDP_OK ? ddp_error(ctx) : "", y);
        return 0;
    }
    if ((r = ddp_all_reduce(ctx, &x, &x, 1, DDP_F32, DDP_MAX, NULL)) != DDP_OK || x != 2.75f + (float)(W - 1)) {
        snprintf(why, 400, "all_reduce(&x, &x): %.300s, x = %g", r != DDP_OK ? ddp_error(ctx) : "", x);
        return 0;
    }
    r = ddp_all_reduce(ctx, v, avg, 5, DDP_F64, DDP_AVG, NULL);
    for (i = 0; i < 5; i++) ok &= close_to(avg[i], v[i] - me + (W - 1) / 2.0, 1e-12);
    if (r != DDP_OK || !ok) {
        snprintf(why, 400, "all_reduce of a host double[5], AVG: %.300s, [0] = %g", r != DDP_OK ? ddp_error(ctx) : "", avg[0]);
        return 0;
    }
    if ((r = ddp_broadcast(ctx, &k, 1, DDP_I32, W - 1, NULL)) != DDP_OK || k != 41) {
        snprintf(why, 400, "broadcast(&k): %.300s, k = %d", r != DDP_OK ? ddp_error(ctx) : "", (int)k);
        return 0;
    }
    k += me;
    r = ddp_all_gather(ctx, &k, gathered, 1, DDP_I32, NULL);
    for (i = 0; i < W; i++) ok &= gathered[i] == 41 + i;
    if (r != DDP_OK || !ok || gathered[W] != -1) {
        snprintf(why, 400, "all_gather(&k): %.300s, got %d %d, guard %d", r != DDP_OK ? ddp_error(ctx) : "",
                 (int)gathered[0], (int)gathered[W - 1], (int)gathered[W]);
        return 0;
    }
    if ((r = ddp_reduce_scatter(ctx, big, scat, 2, DDP_I64, DDP_SUM, NULL)) != DDP_OK || scat[0] != want[0] ||
        scat[1] != want[1]) {
        snprintf(why, 400, "reduce_scatter of a host int64[%d]: %.300s, got %lld %lld, want %lld %lld", 2 * W,
                 r != DDP_OK ? ddp_error(ctx) : "", (long long)scat[0], (long long)scat[1], (long long)want[0],
                 (long long)want[1]);
        return 0;
    }
    return 1;
}

/* Every check of a world; rank 0 reports each, 1 when it held on every rank. */
static int all_ok(ddp_ctx *ctx, int ok)
{
    int32_t bad = !ok;
    return ddp_all_reduce(ctx, &bad, &bad, 1, DDP_I32, DDP_MAX, NULL) == DDP_OK && bad == 0;
}

static void report(ddp_ctx *ctx, const char *check, int ok, const char *why)
{
    char name[96];
    if (!ok && ctx->world_size > 1) fprintf(stderr, "rank %d: %s: %s\n", ctx->rank, check, why);
    ok = ctx->world_size == 1 ? ok : all_ok(ctx, ok);
    if (ctx->world_size == 1) snprintf(name, sizeof name, "nccl.%s", check);
    else snprintf(name, sizeof name, "nccl.w%d.%s", ctx->world_size, check);
    if (ctx->rank == 0) CHECK(name, ok, "%s", why[0] ? why : "failed on another rank (its line is on stderr)");
}

static int run_checks(ddp_ctx *ctx)
{
    /* the larger size crosses the staging chunks; W ranks each check all W inputs */
    const size_t sizes[] = {1, ctx->world_size == 1 ? (size_t)1000003 : (size_t)100003};
    char why[400] = "";
    int c, t, o, s, ok;
    for (c = 0; c < 5; c++) {
        ok = 1;
        why[0] = 0;
        for (t = 0; t < DDP_DTYPE_COUNT && ok; t++)
            for (s = 0; s < 2 && ok; s++)
                if (c == 2) ok = broadcast(ctx, (ddp_dtype)t, sizes[s], why);
                else if (c == 3) ok = out_of_place(ctx, c, (ddp_dtype)t, DDP_SUM, sizes[s], why);
                else
                    for (o = 0; o < DDP_OP_COUNT && ok; o++)
                        ok = out_of_place(ctx, c, (ddp_dtype)t, (ddp_op)o, sizes[s], why);
        report(ctx, checks[c], ok, why);
    }
    why[0] = 0, ok = stream_order(ctx, 0, why), report(ctx, "stream_order", ok, why);
    why[0] = 0, ok = stream_order(ctx, 1, why), report(ctx, "stream_order_async", ok, why);
    why[0] = 0, ok = grad_sync(ctx, DDP_F32, why), report(ctx, "grad_sync", ok, why);
    why[0] = 0, ok = grad_sync(ctx, DDP_BF16, why), report(ctx, "grad_sync_bf16", ok, why);
    why[0] = 0, ok = metrics(ctx, why), report(ctx, "metrics", ok, why);
    why[0] = 0, ok = ring_full(ctx, why), report(ctx, "ring_full", ok, why);
    why[0] = 0, ok = grad_sync_no_host_wait(ctx, why), report(ctx, "grad_sync_no_host_wait", ok, why);
    why[0] = 0, ok = other_thread(ctx, why), report(ctx, "other_thread", ok, why);
    if (ctx->world_size == 1) /* it makes a second context: a world of one's */
        why[0] = 0, ok = deadline_from_start(why), report(ctx, "deadline_from_start", ok, why);
    why[0] = 0, ok = host_memory(ctx, why); /* last: a failure may break the group */
    report(ctx, "host_memory", ok, why);
    return 0;
}

static int world_of_one(void)
{
    ddp_ctx ctx;
    ddp_desc d;
    int c;
    if (!test_gpu_ready("nccl.gpu")) {
        char name[96];
        for (c = 0; c < TEST_COUNT(checks); c++) {
            snprintf(name, sizeof name, "nccl.%s", checks[c]);
            test_skip(name, "no usable GPU (nccl.gpu above says why)");
        }
        test_skip("nccl.deadline_from_start", "no usable GPU (nccl.gpu above says why)");
        TEST_EXIT();
    }
    memset(&d, 0, sizeof d);
    d.backend = DDP_BACKEND_NCCL;
    d.timeout_ms = 60000;
    if (ddp_init(&ctx, &d) != DDP_OK) {
        CHECK("nccl.init", 0, "%s", ddp_error(&ctx));
        TEST_EXIT();
    }
    run_checks(&ctx);
    ddp_destroy(&ctx);
    TEST_EXIT();
}

/* ---- several ranks: forked processes, one GPU each ---- */
static int W_;

/* In a child, so that the parent never initialises CUDA before it forks the ranks
   (CUDA does not survive a fork): are W usable GPUs there? */
static int probe(int rank, void *arg)
{
    int n = 0;
    char name[64];
    (void)rank, (void)arg;
    snprintf(name, sizeof name, "nccl.w%d.gpus", W_);
    if (!test_gpu_ready(name)) return 2;
    cudaGetDeviceCount(&n);
    if (n >= W_) return 0;
    if (getenv("DDP_REQUIRE_GPU") && strcmp(getenv("DDP_REQUIRE_GPU"), "1") == 0) {
        test_report(0, name, "%d GPU(s) for a world of %d (DDP_REQUIRE_GPU=1)", n, W_);
        return 2;
    }
    printf("SKIP %s: %d GPU(s) for a world of %d\n", name, n, W_);
    return 3;
}

static int init(ddp_ctx *ctx, int timeout_ms)
{
    ddp_desc d;
    memset(&d, 0, sizeof d);
    d.backend = DDP_BACKEND_NCCL;
    d.timeout_ms = timeout_ms;
    return ddp_init(ctx, &d) == DDP_OK;
}

static int checks_rank(int rank, void *arg)
{
    ddp_ctx ctx;
    (void)rank, (void)arg;
    if (!init(&ctx, 60000)) return 1;
    run_checks(&ctx);
    ddp_destroy(&ctx);
    return test_failures_ ? 2 : 0;
}

/* The failures; each rank returns 0 when it saw what it should. */
enum { TIMEOUT_MS = 2000, SLACK_S = 30 };
static const char *const fail_meaning[] = {NULL, "init failed", "the collective succeeded",
                                           "another error than expected (its line is on stderr)",
                                           "took too long or too short", "the device sync did not return"};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* the result and message a rank expects, or why not */
static int expect_error(ddp_ctx *ctx, ddp_result r, ddp_result want, const char *text)
{
    if (r == DDP_OK) return 2;
    if (r != want || !strstr(ddp_error(ctx), text)) {
        fprintf(stderr, "rank %d: got %s: %s; want %s naming '%s'\n", ctx->rank, ddp_strerror(r), ddp_error(ctx),
                ddp_strerror(want), text);
        return 3;
    }
    return 0;
}

static int failure_rank(int rank, void *arg)
{
    const int which = *(int *)arg, last = W_ - 1;
    ddp_ctx ctx;
    ddp_result r;
    float x = 1, *dev = NULL;
    char env[64];
    int status = 0;
    double t0, dt;
    if (which == 0) setenv("DDP_CHECK", "1", 1);
    if (which == 1 || which == 2) { /* the last rank never arrives at the first collective */
        snprintf(env, sizeof env, "%d:1", last);
        setenv("DDP_EMU_NCCL_HANG", env, 1);
    }
    if (which == 4) { /* every rank sees GPU 0 alone: ddp_init refuses two ranks on one GPU */
        ddp_desc d;
        setenv("CUDA_VISIBLE_DEVICES", "0", 1);
        memset(&d, 0, sizeof d);
        d.backend = DDP_BACKEND_NCCL;
        d.timeout_ms = 60000;
        if ((r = ddp_init(&ctx, &d)) == DDP_OK) ddp_destroy(&ctx);
        return expect_error(&ctx, r, DDP_ERR_ENV, "would share GPU 0000:01:00.0 of node 0");
    }
    if (!init(&ctx, which == 3 ? 60000 : TIMEOUT_MS)) return 1;
    t0 = now_s();
    switch (which) {
    case 0: /* DDP_CHECK=1: the last rank passes another count; every rank is told, nothing runs */
        r = ddp_all_reduce(&ctx, &x, &x, rank == last ? 2 : 1, DDP_F32, DDP_SUM, NULL);
        status = expect_error(&ctx, r, DDP_ERR_MISMATCH, rank == last ? "passes 2 x f32 sum" : "passes 1 x f32 sum");
        break;
    case 1: /* host memory: ddp.h waits for the staged result within the timeout */
        r = ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
        dt = now_s() - t0;
        status = expect_error(&ctx, r, DDP_ERR_TIMEOUT, "all_reduce #1 did not finish within 2.0 s");
        if (!status && (dt < TIMEOUT_MS / 1000.0 * 0.9 || dt > TIMEOUT_MS / 1000.0 + SLACK_S)) status = 4;
        break;
    case 2: { /* device memory: the call returns at once; only the watchdog, aborting NCCL after the
                 timeout, lets the stream that waits for the collective go on */
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaMalloc((void **)&dev, sizeof x * 256);
        r = ddp_all_reduce(&ctx, dev, dev, 256, DDP_F32, DDP_SUM, s);
        if (r != DDP_OK) {
            status = 3;
            fprintf(stderr, "rank %d: %s\n", rank, ddp_error(&ctx));
        } else if (cudaStreamSynchronize(s) != cudaSuccess) {
            status = 5;
        }
        dt = now_s() - t0;
        if (!status && (dt < TIMEOUT_MS / 1000.0 * 0.9 || dt > TIMEOUT_MS / 1000.0 + SLACK_S)) status = 4;
        break;
    }
    default: /* the last rank dies before the collective: the others fail, long before the timeout,
                whether NCCL (the emulator's) or ddp.h's store sees it first */
        if (rank == last) _exit(7);
        r = ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
        dt = now_s() - t0;
        snprintf(env, sizeof env, "rank %d left the job", last);
        /* (a peer gone is another rank's failure either way: the launcher names that rank) */
        status = expect_error(&ctx, r, DDP_ERR_PEER, strstr(ddp_error(&ctx), "left the job") ? env : "remote process exited");
        if (!status && dt > SLACK_S) status = 4;
        break;
    }
    ddp_destroy(&ctx);
    return status;
}

/* A rank of launched_by_ddp_run: the last exits 0 without ddp_destroy while the others
   wait in a collective (they fail, through NCCL's remote error or the store's word). */
static const char *self_; /* argv[0] */

static int launched_rank(void)
{
    ddp_ctx ctx;
    float x = 1;
    ddp_result r;
    if (!init(&ctx, 20000)) return 1;
    if (ctx.rank == ctx.world_size - 1) return 0;
    r = ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
    ddp_destroy(&ctx);
    return r == DDP_OK ? 0 : 1;
}

/* A rank of launched_by_ddp_run's stuck job: rank 1 is stuck in its own work for good
   while the others wait in a collective; the watchdog ends theirs after 2 s. */
static int launched_stuck_rank(void)
{
    ddp_ctx ctx;
    float x = 1;
    ddp_result r;
    if (!init(&ctx, 2000)) return 1;
    if (ctx.rank == 1)
        for (;;) pause(); /* until the launcher's SIGTERM */
    r = ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
    ddp_destroy(&ctx);
    return r == DDP_OK ? 0 : 3;
}

/* W ranks through ddp.h's launcher: it names the rank that left, not a survivor (NCCL's
   remote error was the survivor's own failure to it); and a rank stuck for good, which
   NCCL's watchdog cannot name (the launcher named only a survivor that timed out) */
static void launched_by_ddp_run(const char *self, int W, int stuck)
{
    char out[] = "/tmp/ddp-nccl-launch-XXXXXX", text[8192] = "", want[64], name[96];
    char *args[] = {(char *)self, (char *)(stuck ? "launched_stuck" : "launched"), NULL};
    int fd = mkstemp(out), st = 0;
    ssize_t n = 0;
    pid_t pid = -1;
    fflush(NULL);
    if (fd >= 0 && (pid = fork()) == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        _exit(ddp_run(W, args));
    }
    if (fd >= 0 && pid > 0) {
        waitpid(pid, &st, 0);
        n = pread(fd, text, sizeof text - 1, 0);
    }
    text[n > 0 ? n : 0] = 0;
    if (fd >= 0) close(fd);
    unlink(out);
    if (stuck) {
        snprintf(name, sizeof name, "nccl.w%d.launcher_names_the_stuck_rank", W);
        CHECK(name, WIFEXITED(st) && WEXITSTATUS(st) == 3 && strstr(text, "after it timed out; rank 1 (pid ") &&
              strstr(text, "is still running and said nothing"), "status %d: %.600s", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
              text);
        return;
    }
    snprintf(want, sizeof want, "ddp: rank %d (pid ", W - 1);
    snprintf(name, sizeof name, "nccl.w%d.launcher_names_the_rank_that_left", W);
    CHECK(name, WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(text, want) &&
          strstr(text, "exited with status 0 while the others still needed it"), "status %d: %.600s",
          WIFEXITED(st) ? WEXITSTATUS(st) : -1, text);
}

static int many_ranks(int W)
{
    test_job job;
    char name[96];
    int c, i;
    W_ = W;
    test_spawn(&job, 1, probe, NULL);
    if (job.status[0] != 0) {
        for (c = 0; c < TEST_COUNT(checks) + TEST_COUNT(failures); c++) {
            snprintf(name, sizeof name, "nccl.w%d.%s", W, c < TEST_COUNT(checks) ? checks[c] : failures[c - TEST_COUNT(checks)]);
            test_skip(name, "not enough usable GPUs (see above)");
        }
        return job.status[0] == 2 && getenv("DDP_REQUIRE_GPU") && strcmp(getenv("DDP_REQUIRE_GPU"), "1") == 0;
    }
    test_spawn(&job, W, checks_rank, NULL);
    snprintf(name, sizeof name, "nccl.w%d.ranks_exit", W);
    CHECK(name, job.failed == 0, "%s", test_job_why(&job, NULL, 0));
    for (i = 0; i < TEST_COUNT(failures); i++) {
        test_spawn(&job, W, failure_rank, &i);
        if (i == 3 && job.status[W - 1] == 7) job.failed--; /* the rank that was meant to die */
        snprintf(name, sizeof name, "nccl.w%d.%s", W, failures[i]);
        CHECK(name, job.failed == 0, "%s (%.1f s)", TEST_JOB_WHY(&job, fail_meaning), job.seconds);
    }
    launched_by_ddp_run(self_, W, 0);
    if (W >= 3) launched_by_ddp_run(self_, W, 1); /* two that time out, one stuck */
    return test_failures_ ? 1 : 0;
}

int main(int argc, char **argv)
{
    const int W = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 1 && strcmp(argv[1], "launched") == 0) return launched_rank();
    if (argc > 1 && strcmp(argv[1], "launched_stuck") == 0) return launched_stuck_rank();
    if (W < 1 || W > 8) {
        printf("FAIL nccl.args: usage: test_nccl [world size 1..8], not '%s'\n", argv[1]);
        return 1;
    }
    self_ = argv[0];
    return W == 1 ? world_of_one() : many_ranks(W);
}
