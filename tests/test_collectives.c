/* Collectives on the CPU backend, for real, in many processes: every op x dtype,
   sizes 0, 1, odd and larger than the shared-memory chunk, in place and not, for
   world sizes 1..6 (and a tiny chunk so that everything crosses chunk borders);
   async all-reduce; two contexts in one process. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const ddp_dtype dtypes[] = {DDP_F32, DDP_F64, DDP_BF16, DDP_F16, DDP_I32, DDP_I64};
static const char *const dtype_names[] = {"f32", "f64", "bf16", "f16", "i32", "i64"};
static const char *const op_names[] = {"sum", "avg", "min", "max"};
static const size_t sizes[] = {0, 1, 7, 1000, 300001};

/* A small integer, different per rank and element: exact in every dtype. */
static double value(int rank, size_t i) { return (double)((rank * 7 + (int)(i % 101) * 3) % 13) - 6.0; }


/* What a reduction over ranks 0..W-1 must give, rounded the way the dtype rounds. */
static double expect(ddp_dtype t, ddp_op op, int world, size_t i)
{
    double acc = value(0, i), tmp;
    int r;
    char one[8];
    for (r = 1; r < world; r++) {
        double v = value(r, i);
        acc = op == DDP_MIN ? (v < acc ? v : acc) : op == DDP_MAX ? (v > acc ? v : acc) : acc + v;
    }
    if (op != DDP_AVG) return acc;
    switch (t) {
    case DDP_F32: case DDP_BF16: case DDP_F16: tmp = (float)acc / (float)world; break;
    case DDP_F64: tmp = acc / world; break;
    default: tmp = (double)((int64_t)acc / world); break;
    }
    test_put(one, t, 0, tmp);
    return test_get(one, t, 0);
}

static int all_ok(ddp_ctx *ctx, int ok)
{
    int32_t bad = !ok;
    if (ddp_all_reduce(ctx, &bad, &bad, 1, DDP_I32, DDP_MAX, NULL) != DDP_OK) return 0;
    return bad == 0;
}

static void report(ddp_ctx *ctx, const char *what, const char *dt, int ok, const char *detail)
{
    char name[128];
    if (!ok) fprintf(stderr, "rank %d: %s %s: %s\n", ctx->rank, what, dt, detail);
    ok = all_ok(ctx, ok);
    snprintf(name, sizeof name, "collectives.w%d%s.%s.%s", ctx->world_size,
             getenv("DDP_SHM_CHUNK") ? ".smallchunk" : "", what, dt);
    if (ctx->rank == 0) CHECK(name, ok, "%s", detail);
}

/* Calls at the API's edges: refused with a message, the group still usable after them;
   integer sums wrap, a NaN in MIN/MAX wins whichever rank holds it. */
static void edges(ddp_ctx *ctx, float *a)
{
    const int W = ctx->world_size, me = ctx->rank;
    ddp_work good, refused, never;
    int32_t big = INT32_MAX, want_big = (int32_t)(uint32_t)((uint64_t)INT32_MAX * (uint64_t)W);
    float v[2];
    int ok;
    ddp_result r;
    r = ddp_all_reduce(ctx, a, a, SIZE_MAX / 4 + 2, DDP_F32, DDP_SUM, NULL);
    report(ctx, "edges.count_past_memory", "f32", r == DDP_ERR_ARG && strstr(ddp_error(ctx), "more bytes"), ddp_error(ctx));
    r = ddp_all_gather(ctx, a, a, SIZE_MAX / 8 / (size_t)W + 1, DDP_F64, NULL);
    report(ctx, "edges.all_gather_world_x_count_past_memory", "f64", W == 1 ? r == DDP_ERR_ARG || r == DDP_OK : r == DDP_ERR_ARG,
           ddp_error(ctx));
    r = ddp_all_reduce(ctx, a, a + 1, 1000, DDP_F32, DDP_SUM, NULL);
    report(ctx, "edges.overlapping_send_recv", "f32", r == DDP_ERR_ARG && strstr(ddp_error(ctx), "overlap"), ddp_error(ctx));
    r = ddp_all_gather(ctx, a + 1, a, 100, DDP_F32, NULL); /* in place is a + rank x 100 */
    report(ctx, "edges.all_gather_overlapping_not_in_place", "f32", r == DDP_ERR_ARG && strstr(ddp_error(ctx), "overlap"),
           ddp_error(ctx));
    r = ddp_reduce_scatter(ctx, a, a + 1, 100, DDP_F32, DDP_SUM, NULL);
    report(ctx, "edges.reduce_scatter_overlapping_not_in_place", "f32",
           r == DDP_ERR_ARG && strstr(ddp_error(ctx), "overlap"), ddp_error(ctx));
    memset(&never, 0, sizeof never);
    ok = ddp_all_reduce_async(ctx, a, a, 4, DDP_F32, DDP_SUM, NULL, &good) == DDP_OK &&
         ddp_all_reduce_async(ctx, NULL, a, 4, DDP_F32, DDP_SUM, NULL, &refused) == DDP_ERR_ARG &&
         ddp_wait(ctx, &refused, NULL) == DDP_ERR_ARG && strstr(ddp_error(ctx), "not filled by a collective") &&
         ddp_wait(ctx, &never, NULL) == DDP_ERR_ARG && ddp_wait(ctx, &good, NULL) == DDP_OK;
    report(ctx, "edges.wait_on_a_refused_or_unfilled_handle", "f32", ok, ddp_error(ctx));
    r = ddp_all_reduce(ctx, &big, &big, 1, DDP_I32, DDP_SUM, NULL);
    report(ctx, "edges.i32_sum_wraps", "i32", r == DDP_OK && big == want_big, ddp_error(ctx));
    v[0] = me == W - 1 ? NAN : 1.0f; /* the last rank's NaN, then the first's */
    v[1] = me == 0 ? NAN : 1.0f;
    ok = ddp_all_reduce(ctx, v, v, 2, DDP_F32, DDP_MAX, NULL) == DDP_OK && isnan(v[0]) && isnan(v[1]);
    v[0] = me == W - 1 ? NAN : 1.0f;
    v[1] = me == 0 ? NAN : 1.0f;
    ok = ok && ddp_all_reduce(ctx, v, v, 2, DDP_F32, DDP_MIN, NULL) == DDP_OK && isnan(v[0]) && isnan(v[1]);
    report(ctx, "edges.nan_wins_min_and_max_on_any_rank", "f32", ok, ddp_error(ctx));
    v[0] = 1;
    r = ddp_all_reduce(ctx, v, v, 1, DDP_F32, DDP_SUM, NULL);
    report(ctx, "edges.group_usable_after_refusals", "f32", r == DDP_OK && v[0] == (float)W, ddp_error(ctx));
    /* a child of fork() (a checkpoint written in the background) holds a copy of the
       context: its collective is refused (it joined its parent's, adding 100), and so is
       its ddp_wait of the parent's handle (it waited for good on a worker thread it does
       not have, or took the parent's result as its own); its ddp_destroy leaves the
       parent's group alone (it ended the job) */
    {
        int st = -1;
        pid_t child;
        ddp_work w;
        float y = 1;
        fflush(NULL);
        ok = ddp_all_reduce_async(ctx, &y, &y, 1, DDP_F32, DDP_SUM, NULL, &w) == DDP_OK;
        if ((child = fork()) == 0) {
            float x = 100;
            ddp_result rc = ddp_all_reduce(ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
            ok = rc == DDP_ERR_ARG && strstr(ddp_error(ctx), "fork()") && x == 100;
            alarm(30); /* (the hang it was) */
            ok = ok && ddp_wait(ctx, &w, NULL) == DDP_ERR_ARG && strstr(ddp_error(ctx), "ddp_wait: this ddp_ctx belongs");
            ddp_destroy(ctx);
            _exit(ok ? 0 : 1);
        }
        waitpid(child, &st, 0);
        ok = ok && ddp_wait(ctx, &w, NULL) == DDP_OK && y == (float)W;
        v[0] = 1;
        r = ddp_all_reduce(ctx, v, v, 1, DDP_F32, DDP_SUM, NULL);
        report(ctx, "edges.fork_child_refused_parent_goes_on", "f32",
               ok && child > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && r == DDP_OK && v[0] == (float)W,
               ddp_error(ctx));
    }
}

static int worker(void)
{
    ddp_ctx ctx;
    size_t maxn = sizes[sizeof sizes / sizeof sizes[0] - 1], si, i;
    int d, W, me;
    char detail[400];
    void *a = malloc(maxn * 8 * 6), *b = malloc(maxn * 8 * 6);
    if (!a || !b || ddp_init(&ctx, NULL) != DDP_OK) return 1;
    W = ctx.world_size;
    me = ctx.rank;
    edges(&ctx, (float *)a);
    for (d = 0; d < 6; d++) {
        ddp_dtype t = dtypes[d];
        int ok = 1, op, inplace;
        /* all_reduce: every op and size, in place and out of place */
        for (op = 0; op < 4; op++)
            for (si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
                for (inplace = 0; inplace < 2; inplace++) {
                    size_t n = sizes[si];
                    void *out = inplace ? a : b;
                    for (i = 0; i < n; i++) test_put(a, t, i, value(me, i));
                    memset(b, 0xff, n * 8);
                    if (ddp_all_reduce(&ctx, a, out, n, t, (ddp_op)op, NULL) != DDP_OK) {
                        snprintf(detail, sizeof detail, "%s", ddp_error(&ctx));
                        ok = 0;
                    }
                    for (i = 0; i < n && ok; i++)
                        if (test_get(out, t, i) != expect(t, (ddp_op)op, W, i)) {
                            snprintf(detail, sizeof detail, "%s n=%zu%s: [%zu] = %g, want %g", op_names[op], n,
                                     inplace ? " in place" : "", i, test_get(out, t, i), expect(t, (ddp_op)op, W, i));
                            ok = 0;
                        }
                }
        report(&ctx, "all_reduce", dtype_names[d], ok, detail);

        /* broadcast from the last rank */
        ok = 1;
        for (si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            size_t n = sizes[si];
            for (i = 0; i < n; i++) test_put(a, t, i, me == W - 1 ? value(W - 1, i) : 99);
            if (ddp_broadcast(&ctx, a, n, t, W - 1, NULL) != DDP_OK) ok = 0;
            for (i = 0; i < n && ok; i++)
                if (test_get(a, t, i) != value(W - 1, i)) {
                    snprintf(detail, sizeof detail, "n=%zu: [%zu] = %g, want %g", n, i, test_get(a, t, i), value(W - 1, i));
                    ok = 0;
                }
        }
        report(&ctx, "broadcast", dtype_names[d], ok, detail);

        /* all_gather: rank r's block lands at r * n */
        ok = 1;
        for (si = 0; si < 4; si++) {
            size_t n = sizes[si] * 3 + 1, r;
            for (i = 0; i < n; i++) test_put(a, t, i, value(me, i));
            if (ddp_all_gather(&ctx, a, b, n, t, NULL) != DDP_OK) ok = 0;
            for (r = 0; r < (size_t)W && ok; r++)
                for (i = 0; i < n && ok; i++)
                    if (test_get(b, t, r * n + i) != value((int)r, i)) {
                        snprintf(detail, sizeof detail, "n=%zu: block %zu [%zu] = %g", n, r, i, test_get(b, t, r * n + i));
                        ok = 0;
                    }
        }
        report(&ctx, "all_gather", dtype_names[d], ok, detail);

        /* reduce_scatter: rank r gets the reduction of block r */
        ok = 1;
        for (op = 0; op < 4; op++)
            for (si = 0; si < 4; si++) {
                size_t n = sizes[si] * 3 + 2, r;
                for (r = 0; r < (size_t)W; r++)
                    for (i = 0; i < n; i++) test_put(a, t, r * n + i, value(me, r * n + i));
                if (ddp_reduce_scatter(&ctx, a, b, n, t, (ddp_op)op, NULL) != DDP_OK) ok = 0;
                for (i = 0; i < n && ok; i++)
                    if (test_get(b, t, i) != expect(t, (ddp_op)op, W, (size_t)me * n + i)) {
                        snprintf(detail, sizeof detail, "%s n=%zu: [%zu] = %g, want %g", op_names[op], n, i,
                                 test_get(b, t, i), expect(t, (ddp_op)op, W, (size_t)me * n + i));
                        ok = 0;
                    }
            }
        report(&ctx, "reduce_scatter", dtype_names[d], ok, detail);
    }

    { /* async: several in flight, a sync one in between keeps the order */
        enum { K = 5, N = 40000 };
        ddp_work w[K];
        float *x = (float *)a;
        int k, ok = 1;
        for (k = 0; k < K; k++) {
            for (i = 0; i < N; i++) x[k * N + i] = (float)value(me + k, i);
            if (ddp_all_reduce_async(&ctx, x + k * N, x + k * N, N, DDP_F32, DDP_SUM, NULL, &w[k]) != DDP_OK) ok = 0;
        }
        ok &= ddp_barrier(&ctx) == DDP_OK;
        for (k = K - 1; k >= 0; k--) ok &= ddp_wait(&ctx, &w[k], NULL) == DDP_OK;
        for (k = 0; k < K && ok; k++)
            for (i = 0; i < N && ok; i++) {
                double want = 0;
                int r;
                for (r = 0; r < W; r++) want += value(r + k, i);
                if (x[k * N + i] != want) {
                    snprintf(detail, sizeof detail, "op %d [%zu] = %g, want %g", k, i, x[k * N + i], want);
                    ok = 0;
                }
            }
        report(&ctx, "all_reduce_async", "f32", ok, detail);
    }
    ddp_destroy(&ctx);
    free(a);
    free(b);
    return test_failures_ ? 1 : 0;
}

static void quiet(void *user, int level, const char *msg) { (void)user; (void)level; (void)msg; }

/* Two ranks of one job as two threads of this process: no hidden global state. */
typedef struct twin { int rank, port; ddp_result r; float x; } twin;

/* rank of a world of 2 whose ranks are threads of this process */
static ddp_desc twin_desc(int rank, int port, const char *job)
{
    ddp_desc d;
    memset(&d, 0, sizeof d);
    d.world_size = 2;
    d.rank = rank;
    d.master_addr = "127.0.0.1";
    d.master_port = port;
    d.job_id = job;
    d.timeout_ms = 20000;
    return d;
}

static void *twin_main(void *arg)
{
    twin *t = (twin *)arg;
    ddp_ctx ctx;
    ddp_desc d = twin_desc(t->rank, t->port, "twins");
    t->x = (float)(t->rank + 1);
    if ((t->r = ddp_init(&ctx, &d)) != DDP_OK) return NULL;
    t->r = ddp_all_reduce(&ctx, &t->x, &t->x, 1, DDP_F32, DDP_SUM, NULL);
    ddp_destroy(&ctx);
    return NULL;
}

/* A destroy while another thread of the rank is in a call (rank 1's helper thread waits
   in a collective that rank 0 has not made): the group stops, that call returns, and
   only then is the state freed (it was freed under the call: a crash, 3 runs of 3).
   Mode 0: ddp_destroy during ddp_all_reduce; mode 1: ddp_grad_destroy during
   ddp_grad_all_reduce. Rank 0 calls once rank 1 is done, and learns it failed. */
typedef struct held_rank {
    int rank, port, mode;
    ddp_ctx ctx;
    ddp_grad g;
    ddp_result init, call, destroy, after;
    char log[600];
    pthread_barrier_t *gate;
} held_rank;
static void held_log(void *user, int level, const char *msg)
{
    held_rank *h = (held_rank *)user;
    size_t n = strlen(h->log);
    if (level == DDP_LOG_ERROR && n + 2 < sizeof h->log) snprintf(h->log + n, sizeof h->log - n, "%s|", msg);
}
static void *held_call(void *arg)
{
    held_rank *h = (held_rank *)arg;
    static float x[2];
    h->call = h->mode ? ddp_grad_all_reduce(&h->g) : ddp_all_reduce(&h->ctx, x, x, 1, DDP_F32, DDP_SUM, NULL);
    return NULL;
}
static void *held_main(void *arg)
{
    held_rank *h = (held_rank *)arg;
    float grads[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ddp_desc d = twin_desc(h->rank, h->port, h->mode ? "held1" : "held0");
    ddp_grad_desc gd;
    pthread_t th;
    d.log = held_log;
    d.log_user = h;
    memset(&gd, 0, sizeof gd);
    gd.grads = grads;
    gd.count = 8;
    h->init = ddp_init(&h->ctx, &d);
    if (h->init == DDP_OK && h->mode) h->init = ddp_grad_init(&h->g, &h->ctx, &gd);
    if (h->init != DDP_OK) {
        pthread_barrier_wait(h->gate);
        return NULL;
    }
    if (h->rank == 1) {
        pthread_create(&th, NULL, held_call, h);
        /* until the helper is inside its call (it stays there: rank 0 waits at the gate) */
        while (!__atomic_load_n(h->mode ? &h->g.st->busy.state : &h->ctx.st->busy.state, __ATOMIC_ACQUIRE)) ddp__sleep_ms(1);
        if (h->mode) ddp_grad_destroy(&h->g);
        h->destroy = ddp_destroy(&h->ctx);
        pthread_join(th, NULL);
        pthread_barrier_wait(h->gate);
    } else {
        pthread_barrier_wait(h->gate);
        h->call = h->mode ? ddp_grad_all_reduce(&h->g) : ddp_barrier(&h->ctx);
        if (h->mode) ddp_grad_destroy(&h->g);
        h->destroy = ddp_destroy(&h->ctx);
    }
    return NULL;
}
/* A call that starts as another thread destroys its object returns DDP_OK (it came
   first), a refusal, or DDP_ERR_ABORTED (a call the destroy stopped), and never reads
   freed memory (ddp_wait crashed 30 runs of 30, ddp_grad_no_sync 20 of 20, and
   ddp_all_reduce read freed memory under ASan). Mode 0: ddp_all_reduce during
   ddp_destroy; 1: ddp_wait; 2: ddp_grad_no_sync during ddp_grad_destroy, then
   ddp_destroy. A world of one, 300 rounds each. */
typedef struct racer {
    int mode;
    ddp_ctx ctx;
    ddp_work work;
    ddp_grad g;
    ddp_result last;
    pthread_barrier_t go;
} racer;
static void *racer_calls(void *arg)
{
    racer *r = (racer *)arg;
    float x = 1;
    pthread_barrier_wait(&r->go);
    do /* until the object is gone */
        r->last = r->mode == 2 ? ddp_grad_no_sync(&r->g, 0)
                  : r->mode    ? ddp_wait(&r->ctx, &r->work, NULL)
                               : ddp_all_reduce(&r->ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
    while (r->last == DDP_OK);
    return NULL;
}
static void call_while_destroyed(int mode)
{
    static const char *const name[3] = {"all_reduce", "wait", "grad_no_sync"};
    static racer r;
    float grads[16] = {0}, x = 1;
    char got[100], check[120];
    int round, ok = 1;
    test_capture_t cap = test_capture(2); /* (a refusal without a context is said on stderr) */
    memset(&r, 0, sizeof r);
    r.mode = mode;
    pthread_barrier_init(&r.go, NULL, 2);
    for (round = 0; ok && round < 300; round++) {
        ddp_desc d;
        ddp_grad_desc gd;
        pthread_t th;
        memset(&d, 0, sizeof d);
        memset(&gd, 0, sizeof gd);
        d.world_size = 1;
        d.log = quiet;
        gd.grads = grads;
        gd.count = 16;
        r.last = DDP_OK;
        ok = ddp_init(&r.ctx, &d) == DDP_OK && ddp_all_reduce_async(&r.ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL, &r.work) == DDP_OK &&
             (mode != 2 || ddp_grad_init(&r.g, &r.ctx, &gd) == DDP_OK);
        if (!ok) break;
        pthread_create(&th, NULL, racer_calls, &r);
        pthread_barrier_wait(&r.go);
        if (mode == 2) ddp_grad_destroy(&r.g);
        ddp_destroy(&r.ctx);
        pthread_join(th, NULL);
        ok = r.last == DDP_ERR_ARG || r.last == DDP_ERR_ABORTED; /* refused, or stopped by the destroy */
    }
    test_captured(cap, got, sizeof got);
    pthread_barrier_destroy(&r.go);
    snprintf(check, sizeof check, "collectives.%s_starting_as_another_thread_destroys_is_refused", name[mode]);
    CHECK(check, ok, "round %d: the call's last result %d (%s)", round, (int)r.last, ddp_strerror(r.last));
}

/* A fork() while another thread's call holds the lock that calls take a moment: the
   child's copy of it stayed locked, and its ddp_destroy hung (78 of 5000 forks). 300
   forks, each child destroying its copy within 5 s. */
static ddp_ctx forked_ctx;
static int forking_done;
static void *calls_until_done(void *arg)
{
    float x[4] = {0};
    (void)arg;
    while (!__atomic_load_n(&forking_done, __ATOMIC_ACQUIRE)) ddp_all_reduce(&forked_ctx, x, x, 4, DDP_F32, DDP_SUM, NULL);
    return NULL;
}
static void fork_while_called(void)
{
    ddp_desc d;
    pthread_t th;
    int i, hung = 0, other = 0;
    memset(&d, 0, sizeof d);
    d.world_size = 1;
    d.log = quiet;
    if (ddp_init(&forked_ctx, &d) != DDP_OK) {
        CHECK("collectives.fork_while_another_thread_calls", 0, "ddp_init failed");
        return;
    }
    pthread_create(&th, NULL, calls_until_done, NULL);
    for (i = 0; i < 300; i++) {
        int st = 0;
        pid_t pid;
        fflush(NULL);
        if ((pid = fork()) == 0) {
            alarm(5);
            _exit(ddp_destroy(&forked_ctx) == DDP_OK ? 0 : 1);
        }
        if (pid < 0 || waitpid(pid, &st, 0) != pid) { other++; continue; }
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) hung++;
        else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) other++;
    }
    __atomic_store_n(&forking_done, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    CHECK("collectives.fork_while_another_thread_calls", hung == 0 && other == 0 && ddp_destroy(&forked_ctx) == DDP_OK,
          "of 300 children, %d hung in ddp_destroy and %d failed otherwise", hung, other);
}

/* ddp_destroy from a log callback inside a ddp_grad call (or ddp_wait) on the same thread:
   refused at once (it waited out the timeout for its own caller, then left the context
   half torn down; before that, a crash), and said once to a callback that destroys on
   every error (the refusal's own line called it again, without end); a child forked
   there drops its copy (it was refused, and hung on the log's lock) */
static ddp_ctx cb_ctx;
static ddp_result cb_destroy = DDP_OK;
static int cb_calls, cb_child = -1;
static void destroy_in_log(void *user, int level, const char *msg)
{
    ddp_result r;
    (void)user; (void)msg;
    if (level != DDP_LOG_ERROR) return;
    if (cb_calls++ == 0) {
        int st = 0;
        pid_t pid;
        fflush(NULL);
        if ((pid = fork()) == 0) {
            alarm(5);
            _exit(ddp_destroy(&cb_ctx) == DDP_OK ? 0 : 1);
        }
        cb_child = pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : 2;
    }
    r = ddp_destroy(&cb_ctx); /* on every error, as a callback that ends the run may */
    if (cb_destroy == DDP_OK) cb_destroy = r;
}
static void destroy_from_a_log_callback(void)
{
    ddp_desc d;
    ddp_grad g;
    ddp_grad_desc gd;
    static float grads[64];
    double t0 = ddp__now_ms();
    ddp_result ready = DDP_OK;
    int ok;
    memset(&d, 0, sizeof d);
    memset(&gd, 0, sizeof gd);
    d.world_size = 1;
    d.log = destroy_in_log;
    d.timeout_ms = 3000;
    gd.grads = grads;
    gd.count = 64;
    ok = ddp_init(&cb_ctx, &d) == DDP_OK && ddp_grad_init(&g, &cb_ctx, &gd) == DDP_OK;
    if (ok) ready = ddp_grad_ready(&g, 60, 10); /* past the buffer: an error, said through the log */
    ok = ok && ready == DDP_ERR_ARG && cb_destroy == DDP_ERR_ARG && ddp__now_ms() - t0 < 2000 && cb_calls == 2 &&
         cb_child == 0 && strstr(ddp_error(&cb_ctx), "on the same thread (a log callback?): refused");
    ddp_grad_destroy(&g);
    CHECK("collectives.destroy_from_a_log_callback_in_a_grad_call_refused", ok && ddp_destroy(&cb_ctx) == DDP_OK,
          "ddp_grad_ready %d, the callback's ddp_destroy %d after %.1f s, %d callbacks, the child's exit %d: %s",
          (int)ready, (int)cb_destroy, (ddp__now_ms() - t0) / 1000.0, cb_calls, cb_child, ddp_error(&cb_ctx));
}

static void destroy_while_called(int mode)
{
    static const char *const want[2] = {"ddp_destroy while another thread is in a collective of this ddp_ctx",
                                        "ddp_grad_destroy while another thread is in a call of this ddp_grad"};
    pthread_t th[2];
    pthread_barrier_t gate;
    held_rank h[2];
    int i, port = ddp__free_port();
    char name[120];
    pthread_barrier_init(&gate, NULL, 2);
    for (i = 0; i < 2; i++) {
        memset(&h[i], 0, sizeof h[i]);
        h[i].rank = i;
        h[i].port = port;
        h[i].mode = mode;
        h[i].gate = &gate;
        pthread_create(&th[i], NULL, held_main, &h[i]);
    }
    for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&gate);
    snprintf(name, sizeof name, "collectives.%s_while_another_thread_calls_stops_the_group", mode ? "grad_destroy" : "destroy");
    CHECK(name, h[0].init == DDP_OK && h[1].init == DDP_OK && h[1].call != DDP_OK && h[1].destroy != DDP_OK &&
          strstr(h[1].log, want[mode]) && h[0].call != DDP_OK && strstr(h[0].log, "rank 1"),
          "init %d %d, rank 1's call %d and destroy %d, rank 0's call %d; rank 1 said '%s', rank 0 '%s'", (int)h[0].init,
          (int)h[1].init, (int)h[1].call, (int)h[1].destroy, (int)h[0].call, h[1].log, h[0].log);
}

int main(int argc, char **argv)
{
    static const int worlds[] = {1, 2, 3, 4, 5, 6};
    char *args[3];
    size_t w;
    if (argc > 1 && strcmp(argv[1], "--worker") == 0) return worker();
    args[0] = argv[0];
    args[1] = (char *)"--worker";
    args[2] = NULL;
    for (w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        int rc = ddp_run(worlds[w], args);
        if (rc != 0) CHECK("collectives.run", 0, "world %d exited with %d", worlds[w], rc);
    }
    setenv("DDP_SHM_CHUNK", "4096", 1); /* sizes from 1000 up cross chunk borders */
    if (ddp_run(3, args) != 0 || ddp_run(5, args) != 0) CHECK("collectives.run.smallchunk", 0, "failed");
    unsetenv("DDP_SHM_CHUNK");
    {
        pthread_t th[2];
        twin t[2];
        int i, port = ddp__free_port();
        for (i = 0; i < 2; i++) {
            t[i].rank = i;
            t[i].port = port;
            pthread_create(&th[i], NULL, twin_main, &t[i]);
        }
        for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
        CHECK("collectives.two_contexts_one_process", t[0].r == DDP_OK && t[1].r == DDP_OK && t[0].x == 3 && t[1].x == 3,
              "results %d %d, sums %g %g", (int)t[0].r, (int)t[1].r, t[0].x, t[1].x);
    }
    destroy_while_called(0);
    destroy_while_called(1);
    call_while_destroyed(0);
    call_while_destroyed(1);
    call_while_destroyed(2);
    fork_while_called();
    destroy_from_a_log_callback();
    { /* a handle is its context's: another context's ddp_wait refuses it, and so does the
         context made after its own was destroyed (whose state may take the same memory);
         both returned DDP_OK */
        ddp_ctx c1, c2;
        ddp_desc d;
        ddp_work w;
        float x = 1;
        int ok;
        memset(&d, 0, sizeof d);
        d.world_size = 1;
        d.log = quiet;
        ok = ddp_init(&c1, &d) == DDP_OK && ddp_init(&c2, &d) == DDP_OK &&
             ddp_all_reduce_async(&c1, &x, &x, 1, DDP_F32, DDP_SUM, NULL, &w) == DDP_OK &&
             ddp_wait(&c2, &w, NULL) == DDP_ERR_ARG && strstr(ddp_error(&c2), "not filled by a collective of this context") &&
             ddp_wait(&c1, &w, NULL) == DDP_OK && x == 1;
        CHECK("collectives.wait_with_another_contexts_handle_refused", ok, "%s", ddp_error(&c2));
        ddp_destroy(&c2);
        ok = ddp_destroy(&c1) == DDP_OK && ddp_init(&c1, &d) == DDP_OK && ddp_wait(&c1, &w, NULL) == DDP_ERR_ARG &&
             strstr(ddp_error(&c1), "not filled by a collective of this context");
        CHECK("collectives.wait_with_a_destroyed_contexts_handle_refused", ok, "%s", ddp_error(&c1));
        ddp_destroy(&c1);
    }
    { /* a call on a context never initialised, destroyed, or NULL: one line on stderr naming
         the call (DDP_ERR_ARG said nothing: a rank exited 1 without a word) */
        ddp_ctx c;
        char got[600];
        float x = 1;
        test_capture_t cap = test_capture(2);
        int ok;
        memset(&c, 0, sizeof c);
        ok = ddp_all_reduce(&c, &x, &x, 1, DDP_F32, DDP_SUM, NULL) == DDP_ERR_ARG && ddp_barrier(NULL) == DDP_ERR_ARG &&
             ddp_agree_on(&c, "a", "b") == DDP_ERR_ARG && ddp_init(NULL, NULL) == DDP_ERR_ARG &&
             ddp_destroy(NULL) == DDP_ERR_ARG && ddp_destroy(&c) == DDP_OK; /* (destroyed twice: no error) */
        test_captured(cap, got, sizeof got);
        ok = ok && strcmp(got, "ddp: error: ddp_all_reduce: this ddp_ctx was destroyed, or never initialised (ddp_init first)\n"
                               "ddp: error: ddp_barrier: no ddp_ctx (NULL)\n"
                               "ddp: error: ddp_agree_on: this ddp_ctx was destroyed, or never initialised (ddp_init first)\n"
                               "ddp: error: ddp_init: no ddp_ctx (NULL)\n"
                               "ddp: error: ddp_destroy: no ddp_ctx (NULL)\n") == 0;
        CHECK("collectives.call_without_a_context_said", ok, "stderr: '%s'", got);
    }
    { /* a gradient sync whose context was destroyed under it, or destroyed and set up again,
         and one never set up, destroyed or NULL: each call says so on stderr under its own
         name (ddp_grad_ready named itself ddp_grad_all_reduce, ddp_grad_finish crashed, the
         rest said nothing; the old sync's ddp_grad_destroy waited in the new context and put
         a false failure in it); likewise ddp_sampler_init and ddp_all_reduce_async */
        static const char *const want =
            "ddp: error: ddp_grad_ready: this ddp_ctx was destroyed, or never initialised (ddp_init first)\n"
            "ddp: error: ddp_grad_finish: this ddp_ctx was destroyed, or never initialised (ddp_init first)\n"
            "ddp: error: ddp_grad_all_reduce: this ddp_ctx was destroyed, or never initialised (ddp_init first)\n"
            "ddp: error: ddp_grad_no_sync: this ddp_ctx was destroyed, or never initialised (ddp_init first)\n"
            "ddp: error: ddp_sampler_init: this ddp_ctx was destroyed, or never initialised (ddp_init first)\n"
            "ddp: error: ddp_all_reduce_async: this ddp_ctx was destroyed, or never initialised (ddp_init first)\n"
            "ddp: error: ddp_all_reduce_async: no ddp_ctx (NULL)\n"
            "ddp: error: ddp_grad_ready: its ddp_ctx was destroyed and set up again since ddp_grad_init (ddp_grad_init it again)\n"
            "ddp: error: ddp_grad_finish: its ddp_ctx was destroyed and set up again since ddp_grad_init (ddp_grad_init it again)\n"
            "ddp: error: ddp_grad_ready: this ddp_grad was destroyed, or never initialised (ddp_grad_init first)\n"
            "ddp: error: ddp_grad_all_reduce: this ddp_grad was destroyed, or never initialised (ddp_grad_init first)\n"
            "ddp: error: ddp_grad_no_sync: no ddp_grad (NULL)\n"
            "ddp: error: ddp_grad_finish: no ddp_grad (NULL)\n";
        ddp_ctx c;
        ddp_desc d;
        ddp_grad g, never;
        ddp_grad_desc gd;
        ddp_sampler sm;
        ddp_work w;
        float grads[8] = {0}, x = 1;
        char got[2000];
        test_capture_t cap;
        int ok;
        memset(&d, 0, sizeof d);
        memset(&gd, 0, sizeof gd);
        memset(&never, 0, sizeof never);
        d.backend = DDP_BACKEND_CPU;
        d.world_size = 1;
        gd.grads = grads;
        gd.count = 8;
        gd.dtype = DDP_F32;
        ok = ddp_init(&c, &d) == DDP_OK && ddp_grad_init(&g, &c, &gd) == DDP_OK && ddp_grad_ready(&g, 0, 4) == DDP_OK &&
             ddp_destroy(&c) == DDP_OK;
        cap = test_capture(2);
        ok = ok && ddp_grad_ready(&g, 4, 4) == DDP_ERR_ARG && ddp_grad_finish(&g) == DDP_ERR_ARG &&
             ddp_grad_all_reduce(&g) == DDP_ERR_ARG && ddp_grad_no_sync(&g, 1) == DDP_ERR_ARG &&
             ddp_sampler_init(&sm, &c, NULL) == DDP_ERR_ARG &&
             ddp_all_reduce_async(&c, &x, &x, 1, DDP_F32, DDP_SUM, NULL, NULL) == DDP_ERR_ARG &&
             ddp_all_reduce_async(NULL, &x, &x, 1, DDP_F32, DDP_SUM, NULL, &w) == DDP_ERR_ARG;
        /* the same ddp_ctx set up again: the old sync is not the new context's */
        ok = ok && ddp_init(&c, &d) == DDP_OK && ddp_grad_ready(&g, 4, 4) == DDP_ERR_ARG && ddp_grad_finish(&g) == DDP_ERR_ARG;
        ddp_grad_destroy(&g);
        ok = ok && ddp_all_reduce(&c, &x, &x, 1, DDP_F32, DDP_SUM, NULL) == DDP_OK && !ddp_error(&c)[0];
        ddp_destroy(&c);
        ok = ok && ddp_grad_ready(&g, 0, 8) == DDP_ERR_ARG && ddp_grad_all_reduce(&never) == DDP_ERR_ARG &&
             ddp_grad_no_sync(NULL, 0) == DDP_ERR_ARG && ddp_grad_finish(NULL) == DDP_ERR_ARG;
        test_captured(cap, got, sizeof got);
        ok = ok && strcmp(got, want) == 0;
        CHECK("collectives.grad_sync_after_ddp_destroy_said", ok, "stderr: '%s'", got);
    }

    { /* the desc's staging size is bounded as DDP_SHM_CHUNK is */
        static const size_t bad[] = {32, (size_t)1 << 31, (size_t)1 << 62, (size_t)-1};
        ddp_ctx ctx;
        ddp_desc d;
        int i;
        for (i = 0; i < 4; i++) {
            ddp_result r;
            memset(&d, 0, sizeof d);
            d.shm_chunk_bytes = bad[i];
            d.log = quiet;
            r = ddp_init(&ctx, &d);
            CHECK("collectives.desc_shm_chunk_bytes_bounded", r == DDP_ERR_ARG && strstr(ddp_error(&ctx), "2^30"),
                  "%zu: %s '%s'", bad[i], ddp_strerror(r), ddp_error(&ctx));
            ddp_destroy(&ctx);
        }
    }
    { /* a destroyed context: refused, and ddp_error says why */
        ddp_ctx ctx;
        float x = 1;
        ddp_result r = ddp_init(&ctx, NULL);
        ddp_destroy(&ctx);
        r = r == DDP_OK ? ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) : r;
        CHECK("collectives.destroyed_context_refused_with_a_reason", r == DDP_ERR_ARG && strstr(ddp_error(&ctx), "destroyed"),
              "%s '%s'", ddp_strerror(r), ddp_error(&ctx));
    }
    /* printing helpers without a context: a world of one */
    CHECK("collectives.null_context_is_main", ddp_is_main(NULL) == 1, "ddp_is_main(NULL) = %d", ddp_is_main(NULL));
    ddp_log(NULL, "a line from ddp_log without a context\n");
    { /* a line past ddp_log's 1 KB is cut, marked, and still ends (the next was glued to it);
         NULL metrics merge nothing and NULL formats print nothing (they crashed) */
        static char big[1500];
        char got[3000];
        ddp_metric m[2];
        test_capture_t cap;
        int n, ok;
        memset(big, 'x', 1400);
        memset(m, 0, sizeof m);
        cap = test_capture(1);
        ddp_log(NULL, "long %s\n", big);
        ddp_log(NULL, "short\n");
        ddp_print(NULL, NULL);
        ddp_log(NULL, NULL);
        n = test_captured(cap, got, sizeof got);
        ddp_metric_merge(NULL, m, 2);
        ddp_metric_merge(m, NULL, 2);
        ok = n == 1023 + 17 && strncmp(got, "[rank 0/1] long xxx", 19) == 0 && strncmp(got + 1019, "...\n", 4) == 0 &&
             strcmp(got + 1023, "[rank 0/1] short\n") == 0;
        CHECK("collectives.ddp_log_cuts_a_long_line_and_ends_it", ok, "%d bytes, ending '%s'", n, n > 40 ? got + n - 40 : got);
    }
    TEST_EXIT();
}
