/* The MPI backend, run by tests/test_mpi.sh under mpirun (built with mpicc -DDDP_MPI;
   the plain build only says how to run it). Every collective x dtype x op against
   results computed here in rank order, bit for bit (so equal to the CPU backend's),
   sums whose bits depend on the order of the additions,
   async work in flight together, metrics, gradient sync, and the failure modes:
   ranks that disagree, a rank that leaves, a rank that is late past the timeout.
   Usage: test_mpi [all|mismatch|leave|late|stuck|leave_stuck|cut]; rank 0 prints the PASS/FAIL lines. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef DDP_MPI
int main(void)
{
    test_skip("mpi", "built without MPI: tests/test_mpi.sh builds this file with mpicc -DDDP_MPI and runs it under mpirun");
    return 0;
}
#else

static int me, W;

/* rank r's element i: varied, non-integer where the type allows, exact in f16 */
static double value(int r, size_t i, ddp_dtype t)
{
    int k = (int)((i * 7 + (size_t)r * 13) % 23) - 11;
    return t == DDP_I32 || t == DDP_I64 ? k * 3 + r : k * 0.375 + r * 0.125;
}

/* what rank order gives for element i: the same accumulation the backend does */
static void expect(void *out, size_t i, size_t count_off, ddp_dtype t, ddp_op op)
{
    double buf[4];
    int r;
    for (r = 0; r < W; r++) { /* gather every rank's element i as stored */
        char one[8];
        test_put(one, t, 0, value(r, count_off + i, t));
        if (r == 0) { memcpy(buf, one, 8); continue; }
        switch (t) {
#define EXPECT_CASE(e, name, T, A, nccl, load, store)                                   \
        case e: {                                                                       \
            T x_, y_;                                                                   \
            A acc, v;                                                                   \
            memcpy(&x_, buf, sizeof x_);                                                \
            memcpy(&y_, one, sizeof y_);                                                \
            acc = load(x_);                                                             \
            v = load(y_);                                                               \
            acc = op == DDP_MIN ? (v < acc ? v : acc) : op == DDP_MAX ? (v > acc ? v : acc) : acc + v; \
            x_ = store(acc);                                                            \
            memcpy(buf, &x_, sizeof x_);                                                \
            break;                                                                      \
        }
        DDP__DTYPES(EXPECT_CASE)
#undef EXPECT_CASE
        default: break;
        }
    }
    memcpy(out, buf, ddp_dtype_size(t));
}

static int fails;
static void report(int ok, const char *name, const char *why)
{
    int all = ok;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (me == 0) test_report(all, name, "%s", all ? "" : (ok ? "another rank failed" : why));
    fails += !all;
}

/* The expectation above accumulates step by step in the storage type, which is what
   the backend does for every type but the 16-bit ones (those accumulate in f32):
   for them compare against an f32 accumulation. */
static double want_value(size_t i, ddp_dtype t, ddp_op op)
{
    float acc = 0;
    int r;
    char one[8];
    if (t != DDP_BF16 && t != DDP_F16) {
        expect(one, i, 0, t, op);
        return test_get(one, t, 0);
    }
    for (r = 0; r < W; r++) {
        float v;
        test_put(one, t, 0, value(r, i, t));
        v = (float)test_get(one, t, 0);
        acc = r == 0 ? v : op == DDP_MIN ? (v < acc ? v : acc) : op == DDP_MAX ? (v > acc ? v : acc) : acc + v;
    }
    if (op == DDP_AVG) acc /= (float)W;
    test_put(one, t, 0, acc);
    return test_get(one, t, 0);
}

static void check_all_reduce(ddp_ctx *ctx, ddp_dtype t, ddp_op op, size_t n, int in_place, int async)
{
    size_t es = ddp_dtype_size(t), i, bad = n;
    char *a = (char *)malloc(n * es + 8), *b = (char *)malloc(n * es + 8), name[96], why[420] = "";
    ddp_result r;
    for (i = 0; i < n; i++) test_put(a, t, i, value(me, i, t));
    memset(b, 0x7f, n * es + 8);
    if (async) {
        ddp_work w;
        r = ddp_all_reduce_async(ctx, a, in_place ? a : b, n, t, op, NULL, &w);
        if (r == DDP_OK) r = ddp_wait(ctx, &w, NULL);
    } else {
        r = ddp_all_reduce(ctx, a, in_place ? a : b, n, t, op, NULL);
    }
    for (i = 0; i < n && r == DDP_OK && bad == n; i++) {
        double got = test_get(in_place ? a : b, t, i), want;
        if (op == DDP_AVG && t != DDP_BF16 && t != DDP_F16) {
            char s[8]; /* the rank-order sum, divided in the accumulator type */
            expect(s, i, 0, t, DDP_SUM);
            switch (t) {
            case DDP_F32: want = (float)test_get(s, t, 0) / (float)W; break;
            case DDP_F64: want = test_get(s, t, 0) / W; break;
            case DDP_I32: want = (int32_t)test_get(s, t, 0) / W; break;
            default: want = (double)((int64_t)test_get(s, t, 0) / W); break;
            }
        } else {
            want = want_value(i, t, op);
        }
        if (got != want) {
            bad = i;
            snprintf(why, sizeof why, "[%zu] = %.9g, want %.9g", i, got, want);
        }
    }
    if (r != DDP_OK) snprintf(why, sizeof why, "%s", ddp_error(ctx));
    snprintf(name, sizeof name, "mpi.w%d.all_reduce%s%s.%s.%s.n%zu", W, in_place ? ".in_place" : "", async ? ".async" : "",
             ddp_dtype_name(t), ddp__ops[op], n);
    report(r == DDP_OK && bad == n, name, why);
    free(a);
    free(b);
}

static void check_others(ddp_ctx *ctx, ddp_dtype t, size_t n)
{
    size_t es = ddp_dtype_size(t), i;
    char *a = (char *)malloc(n * es * (size_t)W + 8), *b = (char *)malloc(n * es * (size_t)W + 8), name[96], why[160] = "";
    int root, ok;
    ddp_result r;
    for (root = 0; root < W; root += W > 2 ? W - 1 : 1) { /* broadcast from the first and the last rank */
        for (i = 0; i < n; i++) test_put(a, t, i, me == root ? value(root, i, t) : -1);
        r = ddp_broadcast(ctx, a, n, t, root, NULL);
        for (ok = r == DDP_OK, i = 0; i < n && ok; i++) {
            char s[8];
            test_put(s, t, 0, value(root, i, t));
            ok = test_get(a, t, i) == test_get(s, t, 0);
        }
        snprintf(name, sizeof name, "mpi.w%d.broadcast.root%d.%s.n%zu", W, root, ddp_dtype_name(t), n);
        report(ok, name, r == DDP_OK ? "wrong value" : ddp_error(ctx));
    }
    for (i = 0; i < n; i++) test_put(a, t, i, value(me, i, t));
    r = ddp_all_gather(ctx, a, b, n, t, NULL);
    for (ok = r == DDP_OK, i = 0; i < n * (size_t)W && ok; i++) {
        char s[8];
        test_put(s, t, 0, value((int)(i / n), i % n, t));
        ok = test_get(b, t, i) == test_get(s, t, 0);
    }
    snprintf(name, sizeof name, "mpi.w%d.all_gather.%s.n%zu", W, ddp_dtype_name(t), n);
    report(ok, name, r == DDP_OK ? "wrong value" : ddp_error(ctx));
    /* reduce_scatter: block k of rank r holds value(r, k n + i); rank me gets block me summed */
    for (i = 0; i < n * (size_t)W; i++) test_put(a, t, i, value(me, i, t));
    r = ddp_reduce_scatter(ctx, a, b, n, t, DDP_SUM, NULL);
    for (ok = r == DDP_OK, i = 0; i < n && ok; i++) {
        double want = want_value((size_t)me * n + i, t, DDP_SUM);
        ok = test_get(b, t, i) == want;
        if (!ok) snprintf(why, sizeof why, "[%zu] = %g, want %g", i, test_get(b, t, i), want);
    }
    snprintf(name, sizeof name, "mpi.w%d.reduce_scatter.%s.n%zu", W, ddp_dtype_name(t), n);
    report(ok, name, r == DDP_OK ? why : ddp_error(ctx));
    free(a);
    free(b);
}

static int run_all(ddp_ctx *ctx)
{
    static const size_t counts[] = {1, 7, 1000, 1500000};
    int t, op;
    size_t k;
    char why[420];
    for (t = 0; t < DDP_DTYPE_COUNT; t++)
        for (op = 0; op < DDP_OP_COUNT; op++)
            for (k = 0; k < sizeof counts / sizeof counts[0]; k++) {
                if (counts[k] > 1000 && (op != DDP_SUM || t == DDP_I64)) continue; /* big ones: one pass is enough */
                check_all_reduce(ctx, (ddp_dtype)t, (ddp_op)op, counts[k], 0, 0);
            }
    check_all_reduce(ctx, DDP_F32, DDP_SUM, 12345, 1, 0);
    check_all_reduce(ctx, DDP_BF16, DDP_AVG, 3000, 1, 1);
    check_all_reduce(ctx, DDP_F32, DDP_SUM, 0, 0, 0);
    for (t = 0; t < DDP_DTYPE_COUNT; t++) {
        check_others(ctx, (ddp_dtype)t, 5);
        check_others(ctx, (ddp_dtype)t, 300000 / (size_t)W);
    }
    { /* values whose sum depends on the order of the additions (large ones cancel, small ones
         are rounded away depending on what they meet): bit for bit the rank order, the one
         host's order, whether hosts chain or exchange */
        enum { N = 300007 };
        static float x[N], y[N];
        static double dx[N], dy[N];
        ddp_result r;
        size_t i;
        int rr, ok = 1;
        for (i = 0; i < N; i++) {
            x[i] = ((me + (int)i) % 2 ? -16777216.0f : 16777216.0f) * (float)(1 + i % 5) + 0.25f * (float)((me * 7 + (int)i) % 13);
            dx[i] = ((me + (int)i) % 2 ? -9007199254740992.0 : 9007199254740992.0) * (double)(1 + i % 5) + 0.25 * ((me * 7 + (int)i) % 13);
        }
        r = ddp_all_reduce(ctx, x, y, N, DDP_F32, DDP_SUM, NULL);
        if (r == DDP_OK) r = ddp_all_reduce(ctx, dx, dy, N, DDP_F64, DDP_SUM, NULL);
        for (i = 0; i < N && ok && r == DDP_OK; i++) {
            float acc = 0.0f;
            double dacc = 0.0;
            for (rr = 0; rr < W; rr++) {
                const float v = ((rr + (int)i) % 2 ? -16777216.0f : 16777216.0f) * (float)(1 + i % 5) + 0.25f * (float)((rr * 7 + (int)i) % 13);
                const double dv = ((rr + (int)i) % 2 ? -9007199254740992.0 : 9007199254740992.0) * (double)(1 + i % 5) + 0.25 * ((rr * 7 + (int)i) % 13);
                acc = rr ? acc + v : v;
                dacc = rr ? dacc + dv : dv;
            }
            ok = y[i] == acc && dy[i] == dacc;
            if (!ok) snprintf(why, sizeof why, "[%zu] = %.9g and %.17g, rank order gives %.9g and %.17g", i, y[i], dy[i], acc, dacc);
        }
        if (r != DDP_OK) snprintf(why, sizeof why, "%s", ddp_error(ctx));
        report(r == DDP_OK && ok, "mpi.all_reduce_in_rank_order", why);
    }
    { /* several async all-reduces in flight, then waited for in order */
        enum { K = 8, N = 50000 };
        static float buf[K][N];
        ddp_work w[K];
        ddp_result r = DDP_OK;
        int j, ok = 1;
        size_t i;
        for (j = 0; j < K; j++) for (i = 0; i < N; i++) buf[j][i] = (float)(me + j);
        for (j = 0; j < K && r == DDP_OK; j++) r = ddp_all_reduce_async(ctx, buf[j], buf[j], N, DDP_F32, DDP_SUM, NULL, &w[j]);
        for (j = 0; j < K && r == DDP_OK; j++) r = ddp_wait(ctx, &w[j], NULL);
        for (j = 0; j < K && ok; j++) ok = buf[j][N - 1] == (float)(W * (W - 1) / 2 + W * j);
        snprintf(why, sizeof why, "%s", r == DDP_OK ? "wrong sums" : ddp_error(ctx));
        report(r == DDP_OK && ok, "mpi.async_in_flight", why);
    }
    { /* metrics and the gradient sync, as a trainer uses them */
        ddp_metric m[2];
        ddp_grad g;
        ddp_grad_desc gd;
        static float grads[100000], params[100000];
        ddp_result r;
        size_t i;
        int ok;
        memset(m, 0, sizeof m);
        ddp_metric_add(&m[0], me + 1.0, 1);
        ddp_metric_add(&m[1], 2.0 * me, 3);
        r = ddp_metric_reduce(ctx, m, 2);
        ok = r == DDP_OK && m[0].count == W && m[0].sum == W * (W + 1) / 2.0 && m[1].count == 3.0 * W && m[0].max == W;
        report(ok, "mpi.metrics", ddp_error(ctx));
        for (i = 0; i < 100000; i++) { params[i] = (float)(me * 1000 + (int)i); grads[i] = (float)me; }
        memset(&gd, 0, sizeof gd);
        gd.grads = grads;
        gd.count = 100000;
        gd.bucket_bytes = 40000;
        gd.params = params;
        r = ddp_grad_init(&g, ctx, &gd);
        for (i = 100000; r == DDP_OK && i > 0; i -= 10000) r = ddp_grad_ready(&g, i - 10000, 10000); /* backward order */
        if (r == DDP_OK) r = ddp_grad_finish(&g);
        ok = r == DDP_OK && params[5] == 5.0f && grads[99999] == (float)(W - 1) / 2.0f;
        report(ok, "mpi.grad_sync", r == DDP_OK ? "wrong values" : ddp_error(ctx));
        ddp_grad_destroy(&g);
    }
    return fails;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "all";
    ddp_ctx ctx;
    ddp_result r;
    int inited = 0;
    float x[100] = {0};
    double t0;
    if (strcmp(mode, "stuck_before_init") == 0) { /* rank 1 never reaches ddp_init; the others end past DDP_TIMEOUT */
        const char *me = getenv("OMPI_COMM_WORLD_RANK") ? getenv("OMPI_COMM_WORLD_RANK") : getenv("PMI_RANK");
        if (me && strcmp(me, "1") == 0)
            for (;;) pause();
    }
    r = ddp_init(&ctx, NULL);
    MPI_Initialized(&inited);
    if (r != DDP_OK || (!inited && ctx.backend == DDP_BACKEND_MPI)) { /* (stuck runs on the CPU backend too) */
        fprintf(stderr, "init: %s %s\n", ddp_strerror(r), ddp_error(&ctx));
        return 1;
    }
    me = ctx.rank;
    W = ctx.world_size;
    if (strcmp(mode, "all") == 0) {
        char why[200];
        snprintf(why, sizeof why, "backend %s, %d nodes", ddp_backend_name(ctx.backend), ctx.num_nodes);
        report(ctx.backend == DDP_BACKEND_MPI, "mpi.backend_chosen", why);
        run_all(&ctx);
        ddp_destroy(&ctx);
        return fails ? 1 : 0;
    }
    if (strcmp(mode, "reinit") == 0) { /* ddp_init again after ddp_destroy finalized MPI: refused, named (it aborted the job) */
        if (ddp_destroy(&ctx) != DDP_OK) return 1;
        r = ddp_init(&ctx, NULL);
        fprintf(stderr, "again: %s: %s\n", ddp_strerror(r), ddp_error(&ctx));
        return r == DDP_ERR_BACKEND ? 0 : 1;
    }
    if (strcmp(mode, "mismatch") == 0) { /* rank 1 passes ten times more */
        r = ddp_all_reduce(&ctx, x, x, me == 1 ? 100 : 10, DDP_F32, DDP_SUM, NULL);
        if (r != DDP_ERR_MISMATCH || !strstr(ddp_error(&ctx), "passes 10 x f32 sum") ||
            !strstr(ddp_error(&ctx), "passes 100 x f32 sum")) {
            fprintf(stderr, "rank %d: got %s '%s'\n", me, ddp_strerror(r), ddp_error(&ctx));
            return 1;
        }
        ddp_destroy(&ctx);
        return 0;
    }
    if (strcmp(mode, "leave") == 0) { /* rank 1 leaves; the others are told in their collective */
        if (me == 1) { ddp_destroy(&ctx); return 0; }
        r = ddp_all_reduce(&ctx, x, x, 10, DDP_F32, DDP_SUM, NULL);
        if (r != DDP_ERR_PEER || !strstr(ddp_error(&ctx), "rank 1 left the job (ddp_destroy)")) {
            fprintf(stderr, "rank %d: got %s '%s'\n", me, ddp_strerror(r), ddp_error(&ctx));
            return 1;
        }
        ddp_destroy(&ctx);
        return 0;
    }
    if (strcmp(mode, "late") == 0) { /* DDP_TIMEOUT=1: rank 1 is 3 s late, the others time out */
        t0 = test_now_s();
        if (me == 1) { struct timespec ts = {3, 0}; nanosleep(&ts, NULL); }
        r = ddp_all_reduce(&ctx, x, x, 10, DDP_F32, DDP_SUM, NULL);
        if (me != 1 && (r != DDP_ERR_TIMEOUT || test_now_s() - t0 > 2.5)) {
            fprintf(stderr, "rank %d: got %s '%s' after %.1f s\n", me, ddp_strerror(r), ddp_error(&ctx), test_now_s() - t0);
            return 1;
        }
        return r == DDP_OK ? 0 : 3; /* a timed-out rank exits non-zero; the launcher ends the job */
    }
    if (strcmp(mode, "stuck") == 0 || strcmp(mode, "leave_stuck") == 0) {
        /* DDP_TIMEOUT=1: rank 1 never comes (stuck in its own work until the launcher ends
           the job), or leaves with ddp_destroy first; the others fail and leave ddp_destroy */
        if (me == 1 && mode[0] == 'l') ddp_destroy(&ctx);
        if (me == 1)
            for (;;) pause();
        r = ddp_all_reduce(&ctx, x, x, 10, DDP_F32, DDP_SUM, NULL);
        t0 = test_now_s();
        ddp_destroy(&ctx);
        fprintf(stderr, "rank %d: %s, then ddp_destroy returned after %.1f s\n", me, ddp_strerror(r), test_now_s() - t0);
        return 3;
    }
    if (strcmp(mode, "cut") == 0) { /* all-reduces until one fails (a host cut off); none of the test's own MPI */
        static float big[1 << 16];
        long n = 0;
        t0 = test_now_s();
        while ((r = ddp_all_reduce(&ctx, big, big, 1 << 16, DDP_F32, DDP_SUM, NULL)) == DDP_OK && test_now_s() - t0 < 60)
            if (++n == 1) {
                printf("rank %d: all-reducing\n", me);
                fflush(stdout);
            }
        return r == DDP_OK ? 1 : 3;
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
#endif
