/* tests/test_gradsync.c - gradient synchronisation and metrics over real processes.
   The driver runs this program as 1..5 ranks (ddp_run); every rank fills gradients
   from (rank, index), syncs them, and compares with the average it computes alone.
   Each check's result is combined over ranks and rank 0 prints it. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct worker {
    ddp_ctx ctx;
    char last_error[400]; /* the library's error reports land here, not on stderr */
    int failures;
} worker;

static void capture_log(void *user, int level, const char *msg)
{
    worker *w = (worker *)user;
    if (level == DDP_LOG_ERROR) snprintf(w->last_error, sizeof w->last_error, "%s", msg);
}

/* Every rank reports; the check passes only if it passed on every rank. */
static void check_all(worker *w, const char *name, int ok, const char *why)
{
    int32_t bad = ok ? 0 : 1;
    char full[200];
    if (!ok) ddp_log(&w->ctx, "%s: %s\n", name, why);
    if (ddp_all_reduce(&w->ctx, &bad, &bad, 1, DDP_I32, DDP_MAX, NULL) != DDP_OK) bad = 1;
    snprintf(full, sizeof full, "gradsync W=%d: %s", w->ctx.world_size, name);
    if (w->ctx.rank == 0) test_report(!bad, full, "failed on at least one rank (see its line above)");
    if (bad) w->failures++;
}

static double grad_value(int rank, size_t i, int step)
{
    return (double)((rank * 7 + (int)i * 3 + step * 5) % 17) * 0.125 - 1.0 + 0.001 * (double)(i % 100);
}

/* Marks [0, n) as regions of odd sizes 1, 3, 5, ... 13 in the order given by `order`
   (0: last region first, as a backward pass does; 1: first region first;
   2: interleaved from both ends). With `fill`, each region gets its values only just
   before it is marked, as in a backward pass (the rest holds garbage until then). */
static ddp_result mark_regions(ddp_grad *g, size_t n, int order, float *fill, int rank, int step)
{
    size_t offs[4096], lens[4096], m = 0, o = 0, i;
    ddp_result r = DDP_OK;
    while (o < n && m < 4096) {
        size_t len = 2 * (m % 7) + 1;
        if (len > n - o) len = n - o;
        offs[m] = o;
        lens[m++] = len;
        o += len;
    }
    for (i = 0; i < m && r == DDP_OK; i++) {
        size_t j = order == 0 ? m - 1 - i : order == 1 ? i : (i % 2 ? i / 2 : m - 1 - i / 2);
        size_t e;
        for (e = offs[j]; fill && e < offs[j] + lens[j]; e++) fill[e] = (float)grad_value(rank, e, step);
        r = ddp_grad_ready(g, offs[j], lens[j]);
    }
    return r;
}

static void f32_average(worker *w, int order, size_t bucket_bytes, const char *name)
{
    const size_t n = 1013;
    float *grads = (float *)malloc(n * sizeof *grads);
    ddp_grad g;
    ddp_grad_desc d;
    char why[512] = "";
    int ok = 1, step;
    size_t i;
    memset(&d, 0, sizeof d);
    d.grads = grads;
    d.count = n;
    d.bucket_bytes = bucket_bytes;
    ok = ddp_grad_init(&g, &w->ctx, &d) == DDP_OK;
    for (step = 0; step < 3 && ok; step++) { /* several steps: the state resets */
        for (i = 0; i < n; i++) grads[i] = 1e30f;
        if (mark_regions(&g, n, order, grads, w->ctx.rank, step) != DDP_OK || ddp_grad_finish(&g) != DDP_OK) {
            snprintf(why, sizeof why, "step %d: %s", step, ddp_error(&w->ctx));
            ok = 0;
        }
        for (i = 0; i < n && ok; i++) {
            double want = 0;
            int r;
            for (r = 0; r < w->ctx.world_size; r++) want += (double)(float)grad_value(r, i, step);
            want /= w->ctx.world_size;
            if (fabs(grads[i] - want) > 1e-6 * (1 + fabs(want))) {
                snprintf(why, sizeof why, "step %d element %zu: %.9g, want %.9g", step, i, grads[i], want);
                ok = 0;
            }
        }
    }
    ddp_grad_destroy(&g);
    free(grads);
    check_all(w, name, ok, why);
}

/* Small integers are exact in bf16, so their sums are too. */
static void bf16_sum(worker *w)
{
    const size_t n = 301;
    uint16_t *grads = (uint16_t *)malloc(n * sizeof *grads);
    ddp_grad g;
    ddp_grad_desc d;
    char why[512] = "";
    int ok;
    size_t i;
    memset(&d, 0, sizeof d);
    d.grads = grads;
    d.count = n;
    d.dtype = DDP_BF16;
    d.bucket_bytes = 50;
    d.sum = 1;
    for (i = 0; i < n; i++) grads[i] = ddp_f32_to_bf16((float)((w->ctx.rank + (int)i) % 9 - 4));
    ok = ddp_grad_init(&g, &w->ctx, &d) == DDP_OK && mark_regions(&g, n, 0, NULL, 0, 0) == DDP_OK &&
         ddp_grad_finish(&g) == DDP_OK;
    if (!ok) snprintf(why, sizeof why, "%s", ddp_error(&w->ctx));
    for (i = 0; i < n && ok; i++) {
        double want = 0;
        int r;
        for (r = 0; r < w->ctx.world_size; r++) want += (double)((r + (int)i) % 9 - 4);
        if (ddp_bf16_to_f32(grads[i]) != want) {
            snprintf(why, sizeof why, "element %zu: %g, want %g", i, ddp_bf16_to_f32(grads[i]), want);
            ok = 0;
        }
    }
    ddp_grad_destroy(&g);
    free(grads);
    check_all(w, "bf16 sum, 25-element buckets", ok, why);
}

/* Two micro-steps without communication, then one that syncs: the average of the
   ranks' accumulated sums. Also: the default bucket (one) and ddp_grad_all_reduce. */
static void accumulation(worker *w)
{
    const size_t n = 517;
    double *grads = (double *)calloc(n, sizeof *grads);
    ddp_grad g;
    ddp_grad_desc d;
    char why[512] = "";
    int ok, micro;
    size_t i;
    memset(&d, 0, sizeof d);
    d.grads = grads;
    d.count = n;
    d.dtype = DDP_F64;
    d.bucket_bytes = 8 * 40;
    ok = ddp_grad_init(&g, &w->ctx, &d) == DDP_OK && ddp_grad_no_sync(&g, 1) == DDP_OK;
    for (micro = 0; micro < 3 && ok; micro++) {
        if (micro == 2) ok = ddp_grad_no_sync(&g, 0) == DDP_OK;
        for (i = 0; i < n; i++) grads[i] += grad_value(w->ctx.rank, i, micro);
        /* marking is optional while no_sync is on; the last micro-step marks scattered
           pieces (the last one first) and lets ddp_grad_all_reduce fill the 26 gaps */
        if (ok && micro == 0) ok = mark_regions(&g, n, 0, NULL, 0, 0) == DDP_OK;
        if (ok && micro == 2) ok = ddp_grad_ready(&g, n - 4, 4) == DDP_OK;
        for (i = 5; ok && micro == 2 && i + 3 < n - 4; i += 20) ok = ddp_grad_ready(&g, i, 3) == DDP_OK;
        if (ok) ok = (micro == 2 ? ddp_grad_all_reduce(&g) : ddp_grad_finish(&g)) == DDP_OK;
        if (!ok) snprintf(why, sizeof why, "micro-step %d: %s", micro, ddp_error(&w->ctx));
        if (ok && micro < 2) /* nothing was exchanged */
            for (i = 0; i < n && ok; i++) {
                double want = 0;
                int s;
                for (s = 0; s <= micro; s++) want += grad_value(w->ctx.rank, i, s);
                if (grads[i] != want) {
                    snprintf(why, sizeof why, "micro-step %d changed element %zu", micro, i);
                    ok = 0;
                }
            }
    }
    for (i = 0; i < n && ok; i++) {
        double want = 0;
        int r, s;
        for (r = 0; r < w->ctx.world_size; r++)
            for (s = 0; s < 3; s++) want += grad_value(r, i, s);
        want /= w->ctx.world_size;
        if (fabs(grads[i] - want) > 1e-12) {
            snprintf(why, sizeof why, "element %zu: %.17g, want %.17g", i, grads[i], want);
            ok = 0;
        }
    }
    ddp_grad_destroy(&g);
    free(grads);
    check_all(w, "accumulation (no_sync micro-steps) then f64 average", ok, why);
}

static void broadcast_params(worker *w)
{
    const size_t n = 97;
    float params[97], grads[97];
    ddp_grad g;
    ddp_grad_desc d;
    int ok;
    size_t i;
    for (i = 0; i < n; i++) params[i] = (float)(w->ctx.rank * 1000 + (int)i);
    memset(&d, 0, sizeof d);
    d.grads = grads;
    d.count = n;
    d.params = params;
    ok = ddp_grad_init(&g, &w->ctx, &d) == DDP_OK;
    for (i = 0; i < n && ok; i++) ok = params[i] == (float)i;
    ddp_grad_destroy(&g);
    check_all(w, "init broadcasts rank 0's parameters", ok, "parameters differ from rank 0's");
}

/* Misuse is reported on every rank before anything is exchanged, so the job goes on. */
static void errors(worker *w)
{
    float grads[64];
    ddp_grad g;
    ddp_grad_desc d;
    ddp_result r1, r2;
    int ok;
    memset(&d, 0, sizeof d);
    d.grads = grads;
    d.count = 64;
    ok = ddp_grad_init(&g, &w->ctx, &d) == DDP_OK; /* one bucket: nothing starts early */
    r1 = ddp_grad_ready(&g, 0, 10);
    w->last_error[0] = 0;
    r2 = ddp_grad_ready(&g, 5, 10);
    ok = ok && r1 == DDP_OK && r2 == DDP_ERR_ARG && strstr(ddp_error(&w->ctx), "already marked") &&
         strstr(w->last_error, "already marked");
    check_all(w, "a region marked twice is an error with a message", ok, ddp_error(&w->ctx));
    ok = ddp_grad_ready(&g, 60, 5) == DDP_ERR_ARG && ddp_grad_ready(&g, 65, 0) == DDP_ERR_ARG;
    check_all(w, "a region past the end is an error, also an empty one", ok, "accepted");
    ddp_grad_destroy(&g);
    d.dtype = DDP_I32; /* an average in integers truncates: refused, the sum is fine */
    ok = ddp_grad_init(&g, &w->ctx, &d) == DDP_ERR_ARG && strstr(ddp_error(&w->ctx), "truncation");
    d.sum = 1;
    ok = ok && ddp_grad_init(&g, &w->ctx, &d) == DDP_OK;
    ddp_grad_destroy(&g);
    check_all(w, "integer gradients: the average refused, the sum taken", ok, ddp_error(&w->ctx));
    d.dtype = DDP_F32;
    d.sum = 0;
    d.count = SIZE_MAX / 2;
    ok = ddp_grad_init(&g, &w->ctx, &d) == DDP_ERR_ARG && strstr(ddp_error(&w->ctx), "more bytes");
    check_all(w, "gradients past memory are an error", ok, ddp_error(&w->ctx));
    /* each call on a ddp_grad destroyed (and on that refused one) says so in ddp_error: it was
       empty, the refusal on stderr only */
    d.count = 64;
    ok = ddp_grad_init(&g, &w->ctx, &d) == DDP_OK;
    ddp_grad_destroy(&g);
    ok = ok && ddp_grad_ready(&g, 0, 64) == DDP_ERR_ARG &&
         strstr(ddp_error(&w->ctx), "ddp_grad_ready on a ddp_grad that was destroyed (or never set up)");
    ok = ok && ddp_grad_finish(&g) == DDP_ERR_ARG && strstr(ddp_error(&w->ctx), "ddp_grad_finish on a ddp_grad that was");
    ok = ok && ddp_grad_all_reduce(&g) == DDP_ERR_ARG && strstr(ddp_error(&w->ctx), "ddp_grad_all_reduce on a ddp_grad");
    ok = ok && ddp_grad_no_sync(&g, 1) == DDP_ERR_ARG && strstr(ddp_error(&w->ctx), "ddp_grad_no_sync on a ddp_grad");
    d.count = SIZE_MAX / 2;
    ok = ok && ddp_grad_init(&g, &w->ctx, &d) == DDP_ERR_ARG && ddp_grad_ready(&g, 0, 1) == DDP_ERR_ARG &&
         strstr(ddp_error(&w->ctx), "ddp_grad_ready on a ddp_grad that was destroyed");
    check_all(w, "calls on a destroyed ddp_grad are errors that ddp_error names", ok, ddp_error(&w->ctx));
}

/* One rank leaves two elements unmarked (their bucket never sent): it gets the error
   naming them, the others an error too rather than its next step's bucket, and the group
   stops. Last, and each rank reports alone: the group is broken after it. */
static void unmarked_on_one_rank(worker *w)
{
    float grads[8];
    ddp_grad g;
    ddp_grad_desc d;
    const int W = w->ctx.world_size, me = w->ctx.rank;
    char name[120];
    ddp_result r;
    int ok, i;
    memset(&d, 0, sizeof d);
    d.grads = grads;
    d.count = 8;
    d.bucket_bytes = 8; /* 4 buckets of 2 */
    for (i = 0; i < 8; i++) grads[i] = (float)i;
    w->last_error[0] = 0; /* (before the buckets: a failing one logs from the worker thread) */
    ok = ddp_grad_init(&g, &w->ctx, &d) == DDP_OK;
    ok = ok && ddp_grad_ready(&g, 2, 6) == DDP_OK && (me != W - 1 ? ddp_grad_ready(&g, 0, 2) == DDP_OK : 1);
    r = ddp_grad_finish(&g);
    if (me == W - 1)
        ok = ok && r == DDP_ERR_ARG && strstr(ddp_error(&w->ctx), "2 of 8 gradient elements were never marked ready, "
                                               "the first at [0, 2)");
    else /* the failure itself, not the refusal of the buckets after it */
        ok = ok && r != DDP_OK && !strstr(ddp_error(&w->ctx), "refused");
    ok = ok && ddp_grad_ready(&g, 0, 8) != DDP_OK; /* the next step is refused on every rank */
    snprintf(name, sizeof name, "gradsync W=%d rank %d: elements unmarked on rank %d stop every rank", W, me, W - 1);
    test_report(ok, name, "finish gave %s: %s", ddp_strerror(r), ddp_error(&w->ctx));
    if (!ok) w->failures++;
    ddp_grad_destroy(&g);
}

/* Each rank adds the real samples of its sampler part: the totals are exact. */
static void metrics(worker *w)
{
    const size_t n = 23;
    ddp_sampler s;
    ddp_sampler_desc sd;
    ddp_metric m[2];
    double exact = 0, lo = 1e300, hi = -1e300;
    size_t i, k;
    int ok;
    char why[512] = "";
    for (i = 0; i < n; i++) {
        double v = (double)((i * 37) % 11) + 0.25 * (double)i;
        exact += v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = n;
    sd.seed = 3;
    memset(m, 0, sizeof m);
    ok = ddp_sampler_init(&s, &w->ctx, &sd) == DDP_OK && ddp_sampler_epoch(&s, 1) != NULL;
    for (k = 0; ok && k < s.num_real; k++) {
        size_t j = s.indices[k];
        ddp_metric_add(&m[0], (double)((j * 37) % 11) + 0.25 * (double)j, 1);
        ddp_metric_add(&m[1], j % 4 == 0 ? 1 : 0, 1);
    }
    ok = ok && ddp_metric_reduce(&w->ctx, m, 2) == DDP_OK;
    if (ok && (m[0].count != (double)n || fabs(m[0].sum - exact) > 1e-9 || m[0].min != lo || m[0].max != hi ||
               fabs(ddp_metric_percent(&m[1]) - 100.0 * 6 / 23) > 1e-9)) {
        snprintf(why, sizeof why, "count %g sum %.17g min %g max %g pct %g; want %zu %.17g %g %g %g", m[0].count,
                 m[0].sum, m[0].min, m[0].max, ddp_metric_percent(&m[1]), n, exact, lo, hi, 100.0 * 6 / 23);
        ok = 0;
    }
    ddp_sampler_destroy(&s);
    check_all(w, "metrics reduce: exact mean, count, min, max with padding", ok, why);
}

/* A NaN loss on one rank: every rank's min and max are NaN after the reduce, whichever
   rank held it and whatever came before or after it (they were NaN on some ranks only). */
static void metrics_nan(worker *w)
{
    ddp_metric m, alone;
    const int nan_rank = w->ctx.world_size > 1 ? 1 : 0;
    int ok = 1;
    char why[200] = "";
    memset(&m, 0, sizeof m);
    memset(&alone, 0, sizeof alone);
    ddp_metric_add(&alone, 1, 1);
    ddp_metric_add(&alone, NAN, 1); /* after a number: it counts too */
    ddp_metric_add(&alone, 2, 1);
    if (!isnan(alone.min) || !isnan(alone.max)) ok = 0, snprintf(why, sizeof why, "alone: min %g max %g", alone.min, alone.max);
    ddp_metric_add(&m, 1.0 + w->ctx.rank, 1);
    if (w->ctx.rank == nan_rank) ddp_metric_add(&m, NAN, 1);
    ddp_metric_add(&m, 2.0 + w->ctx.rank, 1);
    ok = ddp_metric_reduce(&w->ctx, &m, 1) == DDP_OK && ok;
    if (ok && (!isnan(m.min) || !isnan(m.max) || !isnan(m.sum)))
        ok = 0, snprintf(why, sizeof why, "min %g max %g sum %g", m.min, m.max, m.sum);
    check_all(w, "metrics reduce: a NaN on one rank is every rank's min and max", ok, why);
}

/* ddp_metric_reduce again on reduced metrics counted every rank's part W times with
   DDP_OK: it is refused on every rank, the totals kept, and so after an add or a merge
   into one; zeroed, a metric reduces again. */
static void metrics_again(worker *w)
{
    ddp_metric m[2], fresh;
    const double W = w->ctx.world_size;
    int ok;
    char why[600] = "";
    memset(m, 0, sizeof m);
    ddp_metric_add(&m[1], 1.0 + w->ctx.rank, 1);
    ok = ddp_metric_reduce(&w->ctx, m, 2) == DDP_OK && m[1].count == W && m[0].reduced && m[1].reduced;
    ok = ok && ddp_metric_reduce(&w->ctx, m, 2) == DDP_ERR_ARG && m[1].count == W &&
         m[1].sum == W * (W + 1) / 2 && strstr(ddp_error(&w->ctx), "ddp_metric_reduce: metric 0 holds totals over the "
                                                "ranks already (reduced before, or merged with such): zero it to start again");
    if (!ok) snprintf(why, sizeof why, "again: count %g sum %g: %s", m[1].count, m[1].sum, ddp_error(&w->ctx));
    check_all(w, "metrics reduce again is refused, the totals kept", ok, why);
    ddp_metric_add(&m[1], 5, 1);
    ok = ddp_metric_reduce(&w->ctx, m + 1, 1) == DDP_ERR_ARG && m[1].count == W + 1;
    memset(&fresh, 0, sizeof fresh);
    ddp_metric_merge(&fresh, m, 1);
    ok = ok && fresh.reduced && ddp_metric_reduce(&w->ctx, &fresh, 1) == DDP_ERR_ARG;
    memset(m, 0, sizeof m);
    ddp_metric_add(&m[0], 2, 1);
    ok = ok && ddp_metric_reduce(&w->ctx, m, 2) == DDP_OK && m[0].count == W && m[0].sum == 2 * W;
    check_all(w, "metrics added to or merged from reduced ones are refused; zeroed they reduce", ok, ddp_error(&w->ctx));
}

/* ddp_init for a job of its own: errors go to a log nobody prints (each rank reports) */
static ddp_result init_quiet(ddp_ctx *ctx, int *argc, char **argv)
{
    static worker quiet; /* its last_error takes the log's lines */
    ddp_desc d;
    memset(&d, 0, sizeof d);
    d.argc = argc;
    d.argv = argv;
    d.log = capture_log;
    d.log_user = &quiet;
    return ddp_init(ctx, &d);
}

/* ddp_metric_reduce of no metrics on rank 1 and two on the others: every rank hears of
   it (the rank with none returned DDP_OK without taking part). A job of its own: the
   group is broken after it; each rank prints its line. */
static int metrics_count_differs(int *argc, char **argv)
{
    ddp_ctx ctx;
    ddp_metric m[2];
    ddp_result r;
    char name[120];
    if (init_quiet(&ctx, argc, argv) != DDP_OK) return 1;
    memset(m, 0, sizeof m);
    r = ddp_metric_reduce(&ctx, m, ctx.rank == 1 ? 0 : 2);
    snprintf(name, sizeof name, "gradsync W=%d rank %d: metrics reduce of 0 metrics on rank 1, 2 elsewhere: named",
             ctx.world_size, ctx.rank);
    test_report(r == DDP_ERR_MISMATCH && strstr(ddp_error(&ctx), "pass from 0 to 2 metrics"), name, "%s: %s", ddp_strerror(r),
                ddp_error(&ctx));
    ddp_destroy(&ctx);
    return r == DDP_ERR_MISMATCH ? 0 : 1;
}

/* ddp_grad_no_sync on different steps on different ranks (variant 0: rank r accumulates
   step 1 + r; 1: only rank 1 accumulates, at step 1): the first sync that pairs sums of
   different step counts is a named mismatch on every rank (it paired them with DDP_OK,
   each rank's average mixing another number of micro-steps). Variant 2: with desc.sum,
   rank r adds r + 2 micro-steps to each sync, and that is no mismatch (the caller scales
   the sum: uneven micro-batches). A job of its own. */
static int nosync_differs(int *argc, char **argv, int variant)
{
    ddp_ctx ctx;
    ddp_grad g;
    ddp_grad_desc gd;
    float grad[4] = {0};
    ddp_result r = DDP_OK;
    char name[160];
    int step, i;
    if (init_quiet(&ctx, argc, argv) != DDP_OK) return 1;
    memset(&gd, 0, sizeof gd);
    gd.grads = grad;
    gd.count = 4;
    gd.sum = variant == 2;
    if (ddp_grad_init(&g, &ctx, &gd) != DDP_OK) return 1;
    if (variant == 2) {
        const float want = (float)(ctx.world_size * (ctx.world_size + 3) / 2);
        int k, ok = 1;
        for (step = 0; step < 3 && r == DDP_OK; step++) {
            memset(grad, 0, sizeof grad);
            for (k = 0; k < ctx.rank + 2 && r == DDP_OK; k++) {
                r = ddp_grad_no_sync(&g, k < ctx.rank + 1);
                for (i = 0; i < 4; i++) grad[i] += 1.0f;
                if (r == DDP_OK) r = ddp_grad_all_reduce(&g);
            }
            ok = ok && grad[0] == want;
        }
        snprintf(name, sizeof name, "gradsync W=%d rank %d: uneven no_sync steps with desc.sum: the sum of all",
                 ctx.world_size, ctx.rank);
        test_report(r == DDP_OK && ok, name, "%s: %s; %g, want %g", ddp_strerror(r), ddp_error(&ctx), grad[0], want);
        ddp_grad_destroy(&g);
        return ddp_destroy(&ctx) == DDP_OK && r == DDP_OK && ok ? 0 : 1;
    }
    for (step = 0; step < 4 && r == DDP_OK; step++) {
        const int acc = variant == 0 ? step == 1 + ctx.rank : ctx.rank == 1 && step == 1;
        if (ddp_grad_no_sync(&g, acc) != DDP_OK) return 1;
        for (i = 0; i < 4; i++) grad[i] += (float)(10 * step + ctx.rank);
        r = ddp_grad_all_reduce(&g);
        if (!acc) memset(grad, 0, sizeof grad);
    }
    snprintf(name, sizeof name, "gradsync W=%d rank %d: no_sync on %s: the first sync of other step counts named",
             ctx.world_size, ctx.rank, variant == 0 ? "each rank's own step" : "rank 1 only");
    test_report(r == DDP_ERR_MISMATCH && strstr(ddp_error(&ctx), "avg of gradients of 2 steps") &&
                    strstr(ddp_error(&ctx), "avg of gradients of 1 step"),
                name, "%s: %s", ddp_strerror(r), ddp_error(&ctx));
    ddp_grad_destroy(&g);
    ddp_destroy(&ctx);
    return r == DDP_ERR_MISMATCH ? 0 : 1;
}

static int work(int *argc, char **argv)
{
    worker w;
    ddp_desc d;
    memset(&w, 0, sizeof w);
    memset(&d, 0, sizeof d);
    d.argc = argc;
    d.argv = argv;
    d.log = capture_log;
    d.log_user = &w;
    if (ddp_init(&w.ctx, &d) != DDP_OK) {
        printf("FAIL gradsync: ddp_init: %s\n", w.last_error);
        return 1;
    }
    broadcast_params(&w);
    f32_average(&w, 0, 100, "f32 average, 25-element buckets, regions marked last first");
    f32_average(&w, 1, 100, "f32 average, regions marked first first");
    f32_average(&w, w.ctx.rank % 3, 36, "f32 average, each rank marks in its own order");
    f32_average(&w, 0, 0, "f32 average, default 25 MiB bucket");
    bf16_sum(&w);
    accumulation(&w);
    errors(&w);
    metrics(&w);
    metrics_nan(&w);
    metrics_again(&w);
    unmarked_on_one_rank(&w);
    ddp_destroy(&w.ctx);
    return w.failures ? 1 : 0;
}

/* Two threads marking one ddp_grad at once (disjoint elements, one at a time, 100000 calls
   each): a call while the other is in one is refused, naming why, and the group stops; two
   threads marking at once corrupted the heap (a double free, 3 of 3 runs crashed). World 1.
   Where the scheduler ran the two one after the other (seen under AddressSanitizer on a
   busy machine), nothing overlapped: then every mark holds and the step ends DDP_OK. */
static ddp_grad two_g;
static ddp_result two_r[2];
static void *two_mark(void *arg)
{
    const size_t t = (size_t)arg;
    size_t i;
    for (i = t; i < 200000 && two_r[t] == DDP_OK; i += 2) two_r[t] = ddp_grad_ready(&two_g, i, 1);
    return NULL;
}
static void two_threads(void)
{
    ddp_ctx ctx;
    ddp_desc d;
    ddp_grad_desc gd;
    static float grad[200000];
    pthread_t t[2];
    int ok;
    memset(&d, 0, sizeof d);
    d.world_size = 1;
    memset(&gd, 0, sizeof gd);
    gd.grads = grad;
    gd.count = 200000;
    ok = ddp_init(&ctx, &d) == DDP_OK && ddp_grad_init(&two_g, &ctx, &gd) == DDP_OK;
    pthread_create(&t[0], NULL, two_mark, (void *)0);
    pthread_create(&t[1], NULL, two_mark, (void *)1);
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    if (two_r[0] == DDP_OK && two_r[1] == DDP_OK) /* they never met */
        ok = ok && ddp_grad_finish(&two_g) == DDP_OK;
    else
        ok = ok && (two_r[0] == DDP_ERR_ARG || two_r[1] == DDP_ERR_ARG) &&
             strstr(ddp_error(&ctx), "another thread is in a call of this ddp_grad") && ddp_grad_finish(&two_g) != DDP_OK;
    CHECK("gradsync: two threads marking one ddp_grad at once: one refused and the group stopped, or they never met",
          ok, "results %d %d, then: %s", (int)two_r[0], (int)two_r[1], ddp_error(&ctx));
    ddp_grad_destroy(&two_g);
    ddp_destroy(&ctx);
}

int main(int argc, char **argv)
{
    char worker_flag[] = "--worker";
    char *args[3];
    int nproc;
    if (argc > 1 && strcmp(argv[1], "--worker") == 0) return work(&argc, argv);
    if (argc > 1 && strcmp(argv[1], "--count-differs") == 0) return metrics_count_differs(&argc, argv);
    if (argc > 2 && strcmp(argv[1], "--nosync-differs") == 0) return nosync_differs(&argc, argv, atoi(argv[2]));
    args[0] = argv[0];
    args[1] = worker_flag;
    args[2] = NULL;
    for (nproc = 1; nproc <= 5; nproc++) {
        int status = ddp_run(nproc, args);
        char name[64];
        snprintf(name, sizeof name, "gradsync W=%d: every rank exited 0", nproc);
        CHECK(name, status == 0, "ddp_run returned %d", status);
    }
    args[1] = (char *)"--count-differs";
    CHECK("gradsync W=3: metrics reduce of another count on one rank: every rank named it", ddp_run(3, args) == 0,
          "a rank did not get DDP_ERR_MISMATCH (its line above)");
    {
        char *nosync[4] = {argv[0], (char *)"--nosync-differs", (char *)"0", NULL};
        CHECK("gradsync W=2: no_sync on different steps: every rank named it", ddp_run(2, nosync) == 0,
              "a rank did not get DDP_ERR_MISMATCH (its line above)");
        nosync[2] = (char *)"1";
        CHECK("gradsync W=3: no_sync on one rank only: every rank named it", ddp_run(3, nosync) == 0,
              "a rank did not get DDP_ERR_MISMATCH (its line above)");
        nosync[2] = (char *)"2";
        CHECK("gradsync W=3: uneven no_sync steps with desc.sum: no mismatch", ddp_run(3, nosync) == 0,
              "a rank failed (its line above)");
    }
    two_threads();
    (void)test_skip;
    TEST_EXIT();
}
