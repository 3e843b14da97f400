/* tests/test_trace.c - ddp_trace_*: a Chrome trace-event file with a process per rank.
   The driver runs this program as 1, 3 and 4 ranks (ddp_run); every rank traces a
   few steps of gradient sync with nested spans of its own, rank 0 reads the saved
   file back (one event per line, as ddp.h writes it) and checks what a viewer needs:
   rows per rank, spans nested inside their parents, gradient buckets on the
   collectives row after the backward span that completes each (whether they overlap
   the rest depends on free cores: the lessons show it), names escaped, drops counted,
   and that a file that cannot be written is an error on every rank. Where python3
   is installed, its json module must load the file too. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

typedef struct span { char name[64]; int pid, tid; double ts, dur; } span;

/* Reads the "X" events of a trace written by ddp.h; -1 if a line is not what it writes. */
static int read_trace(const char *path, span *out, int cap, long long dropped[8], int *ranks)
{
    FILE *f = fopen(path, "r");
    char line[512];
    int n = 0;
    *ranks = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        span s;
        char *p;
        if (strstr(line, "\"process_name\"")) (*ranks)++;
        if ((p = strstr(line, "\"dropped\""))) {
            int k = 0;
            p = strchr(p, '[');
            while (p && *p && *p != ']' && k < 8) dropped[k++] = strtoll(p + 1, &p, 10);
        }
        if (!strstr(line, "\"ph\":\"X\"")) continue;
        /* the name is a JSON string: copy it raw, escapes and all, up to its closing quote */
        p = line + strlen("{\"name\":\"");
        {
            size_t k = 0;
            while (*p && !(*p == '"' && p[-1] != '\\') && k < sizeof s.name - 1) s.name[k++] = *p++;
            s.name[k] = 0;
        }
        if (sscanf(p, "\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%lf,\"dur\":%lf}", &s.pid, &s.tid, &s.ts, &s.dur) != 4) {
            fclose(f);
            return -1;
        }
        if (n < cap) out[n++] = s;
    }
    fclose(f);
    return n;
}

/* The start of rank pid's nth (0, 1, ...) span called name; -1 if there is none. */
static double nth_start(const span *ev, int n, int pid, const char *name, int nth)
{
    int i;
    for (i = 0; i < n; i++)
        if (ev[i].pid == pid && !strcmp(ev[i].name, name) && nth-- == 0) return ev[i].ts;
    return -1;
}

static int inside(const span *child, const span *parent)
{
    return child->pid == parent->pid && child->ts >= parent->ts && child->ts + child->dur <= parent->ts + parent->dur + 0.002;
}

static int all_ok(ddp_ctx *ctx, int ok)
{
    int32_t bad = !ok;
    if (ddp_all_reduce(ctx, &bad, &bad, 1, DDP_I32, DDP_MAX, NULL) != DDP_OK) return 0;
    return !bad;
}

static char last_error[400], last_info[400];
static void capture(void *user, int level, const char *msg)
{
    (void)user;
    if (level == DDP_LOG_ERROR) snprintf(last_error, sizeof last_error, "%s", msg);
    else snprintf(last_info, sizeof last_info, "%s", msg);
}

static int work(int *argc, char **argv)
{
    enum { COUNT = 4 << 16, LAYERS = 4, STEPS = 3 };
    static span ev[4096];
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_grad g;
    ddp_grad_desc gd = {0};
    float *grads = (float *)calloc(COUNT, sizeof *grads);
    char name[160], cmd[512], path[256];
    long long dropped[8] = {0};
    int s, l, i, k, n, ranks, W;
    desc.argc = argc;
    desc.argv = argv;
    desc.log = capture;
    if (!grads || ddp_init(&ctx, &desc) != DDP_OK) return 1;
    W = ctx.world_size;
    snprintf(path, sizeof path, "%s", argv[2]);
    gd.grads = grads;
    gd.count = COUNT;
    gd.bucket_bytes = COUNT; /* four buckets */
    if (ddp_grad_init(&g, &ctx, &gd) != DDP_OK) return 2;

    ddp_trace_begin(&ctx, "tracing is off: nothing happens");
    ddp_trace_end(&ctx);
    ddp_trace_end(&ctx);
    s = ddp_trace_save(&ctx, path);
    snprintf(name, sizeof name, "trace W=%d: save before start is an error on every rank, nobody waits", W);
    if (ctx.rank == 0) CHECK(name, s == DDP_ERR_ARG && strstr(last_error, "ddp_trace_start"), "got %d '%s'", s, last_error);
    if (W > 1) { /* only rank 1's start fails: every rank hears it at once, and saves refuse everywhere */
        s = ddp_trace_start(&ctx, ctx.rank == 1 ? (size_t)1 << 62 : 0);
        /* DDP_ERR_PEER where the failure is another rank's: the launcher names rank 1 */
        k = all_ok(&ctx, s == (ctx.rank == 1 ? DDP_ERR_ARG : DDP_ERR_PEER) &&
                             strstr(last_error, ctx.rank == 1 ? "too many" : "another rank"));
        s = ddp_trace_save(&ctx, path);
        k = all_ok(&ctx, k && s == DDP_ERR_ARG && strstr(last_error, "not started on this rank"));
        snprintf(name, sizeof name, "trace W=%d: one rank's failed start fails every rank's start and save", W);
        if (ctx.rank == 0) CHECK(name, k, "got %d '%s' (or another rank did not get the error)", s, last_error);
        /* the last rank saves while the others start: each is told what the others call */
        s = ctx.rank == W - 1 ? ddp_trace_save(&ctx, path) : ddp_trace_start(&ctx, 0);
        k = all_ok(&ctx, s == DDP_ERR_ARG && strstr(last_error, ctx.rank == W - 1 ? "ddp_trace_save: another rank is "
                                                                                   "in ddp_trace_start"
                                                                                 : "ddp_trace_start: another rank is "
                                                                                   "in ddp_trace_save"));
        snprintf(name, sizeof name, "trace W=%d: a save meeting the others' start names the other call", W);
        if (ctx.rank == 0) CHECK(name, k, "got %d '%s' (or another rank did not get the error)", s, last_error);
    }
    if (ddp_trace_start(&ctx, 0) != DDP_OK) return 3;
    for (s = 0; s < STEPS; s++) {
        ddp_trace_begin(&ctx, "step");
        ddp_trace_begin(&ctx, "forward");
        for (i = 0; i < COUNT; i++) grads[i] = (float)(i % 7 + ctx.rank);
        ddp_trace_end(&ctx);
        for (l = LAYERS - 1; l >= 0; l--) {
            snprintf(name, sizeof name, "backward layer %d", l);
            ddp_trace_begin(&ctx, name);
            for (i = 0; i < COUNT / LAYERS; i++) grads[l * (COUNT / LAYERS) + i] *= 0.5f;
            if (ddp_grad_ready(&g, (size_t)l * (COUNT / LAYERS), COUNT / LAYERS) != DDP_OK) return 4;
            ddp_trace_end(&ctx);
        }
        if (ddp_grad_finish(&g) != DDP_OK) return 5;
        ddp_trace_end(&ctx);
    }
    for (i = 0; i < ctx.rank * 3; i++) { /* ranks record different numbers of events */
        ddp_trace_begin(&ctx, "extra");
        ddp_trace_end(&ctx);
    }
    ddp_trace_begin(&ctx, "quote \" backslash \\ newline \n and a name longer than forty-three bytes");
    ddp_trace_end(&ctx);
    ddp_trace_begin(&ctx, "\xe5\x90\x8e\xe5\x90\x91\xe4\xbc\xa0\xe6\x92\xad \xe5\x92\x8c \xe6\xa2\xaf\xe5\xba\xa6"
                          "\xe5\x90\x8c\xe6\xad\xa5\xe7\x9a\x84\xe9\x87\x8d\xe5\x8f\xa0\xe9\x83\xa8\xe5\x88\x86"); /* Chinese, 50 bytes */
    ddp_trace_end(&ctx);
    ddp_trace_begin(&ctx, "left open: ends at the save");
    last_info[0] = 0;
    if (!all_ok(&ctx, ddp_trace_save(&ctx, path) == DDP_OK)) {
        if (ctx.rank == 0) CHECK("trace: save", 0, "%s", last_error);
        return 6;
    }
    snprintf(name, sizeof name, "trace W=%d: a whole trace's save says nothing", W);
    if (ctx.rank == 0) CHECK(name, !last_info[0], "said '%s'", last_info);
    if (ctx.rank == 0) {
        int per_rank_steps[8] = {0}, buckets[8] = {0}, extra[8] = {0}, seen[8][LAYERS] = {{0}}, nested = 1, causal = 1;
        int escaped = 0, open_end = 0;
        double last_end[8] = {0};
        n = read_trace(path, ev, TEST_COUNT(ev), dropped, &ranks);
        snprintf(name, sizeof name, "trace W=%d: every event line reads back; a process per rank", W);
        CHECK(name, n > 0 && ranks == W, "%d events, %d ranks", n, ranks);
        for (i = 0; i < n; i++) {
            const span *e = &ev[i];
            int j;
            if (e->pid < 0 || e->pid >= W || e->ts < 0 || e->dur < 0) { nested = 0; continue; }
            if (!strcmp(e->name, "step")) per_rank_steps[e->pid]++;
            if (!strcmp(e->name, "extra")) extra[e->pid]++;
            if (!strcmp(e->name, "left open: ends at the save")) open_end++;
            if (!strcmp(e->name, "quote \\\" backslash \\\\ newline \\u000a and a name lo")) escaped++;
            if (!strcmp(e->name, "\xe5\x90\x8e\xe5\x90\x91\xe4\xbc\xa0\xe6\x92\xad \xe5\x92\x8c \xe6\xa2\xaf\xe5\xba\xa6"
                                 "\xe5\x90\x8c\xe6\xad\xa5\xe7\x9a\x84\xe9\x87\x8d\xe5\x8f\xa0\xe9\x83\xa8")) escaped++;
            if (strncmp(e->name, "backward", 8) == 0 || !strcmp(e->name, "forward")) {
                int has_parent = 0;
                for (j = 0; j < n; j++)
                    if (!strcmp(ev[j].name, "step") && inside(e, &ev[j])) has_parent = 1;
                nested &= has_parent;
            }
            if (strncmp(e->name, "bucket ", 7) == 0 && strstr(e->name, "all_reduce 262.1 KB")) {
                /* bucket k holds layer LAYERS-1-k: it cannot start before that layer's backward
                   began, and the buckets of one rank run one after another */
                int k = atoi(e->name + 7), step = k >= 0 && k < LAYERS ? seen[e->pid][k]++ : -1;
                double began;
                snprintf(cmd, sizeof cmd, "backward layer %d", LAYERS - 1 - k);
                began = step < 0 ? -1 : nth_start(ev, n, e->pid, cmd, step);
                causal &= began >= 0 && e->ts + 0.002 >= began && e->ts + 0.002 >= last_end[e->pid];
                last_end[e->pid] = e->ts + e->dur;
                buckets[e->pid]++;
                if (W > 1 && e->tid != 1) nested = 0; /* async work belongs on the collectives row */
            }
        }
        for (i = 0; i < W; i++) {
            snprintf(name, sizeof name, "trace W=%d: rank %d has its %d steps, 4 buckets each, %d extra spans", W, i, STEPS,
                     i * 3);
            CHECK(name, per_rank_steps[i] == STEPS && buckets[i] == 4 * STEPS && extra[i] == i * 3 && dropped[i] == 0,
                  "steps %d, buckets %d, extra %d, dropped %lld", per_rank_steps[i], buckets[i], extra[i], dropped[i]);
        }
        snprintf(name, sizeof name, "trace W=%d: forward and backward spans lie inside their step", W);
        CHECK(name, nested, "a span outside its parent, on the wrong row or with a negative time");
        snprintf(name, sizeof name, "trace W=%d: names escaped, cut at 43 bytes (not inside a UTF-8 character); open spans end at the save", W);
        CHECK(name, escaped == 2 * W && open_end == W, "escaped %d, open %d of %d", escaped, open_end, W);
        snprintf(name, sizeof name, "trace W=%d: each bucket starts after its layer's backward began, one after another", W);
        CHECK(name, causal, "a bucket span before its layer's backward or overlapping the previous bucket");
        if (system("command -v python3 >/dev/null 2>&1") == 0) {
            snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys; d = json.load(open(sys.argv[1], encoding=\"utf-8\")); "
                                      "assert all(\"ph\" in e and \"pid\" in e for e in d[\"traceEvents\"])' %s", path);
            s = system(cmd);
            snprintf(name, sizeof name, "trace W=%d: python's json module loads the file", W);
            CHECK(name, s == 0, "python3 exited %d", s);
        }
    }

    /* a small buffer: the rest is counted as dropped, the file is still whole */
    if (ddp_trace_start(&ctx, 5) != DDP_OK) return 7;
    for (i = 0; i < 20; i++) {
        ddp_trace_begin(&ctx, "many");
        ddp_trace_end(&ctx);
    }
    last_info[0] = 0;
    if (!all_ok(&ctx, ddp_trace_save(&ctx, path) == DDP_OK)) return 8;
    if (ctx.rank == 0) {
        char said[600];
        n = read_trace(path, ev, TEST_COUNT(ev), dropped, &ranks);
        snprintf(name, sizeof name, "trace W=%d: past max_events, events are dropped and counted", W);
        CHECK(name, n == 5 * W && dropped[0] == 15 && dropped[W - 1] == 15, "%d events, dropped %lld", n, dropped[0]);
        snprintf(said, sizeof said, "warning: ddp_trace_save: '%s' ends early: rank 0 dropped 15 events past "
                 "ddp_trace_start's max_events", path);
        snprintf(name, sizeof name, "trace W=%d: a trace that ends early is said to, on rank 0", W);
        CHECK(name, strcmp(last_info, said) == 0, "said '%s'", last_info);
    }

    /* rank 0 cannot write: every rank gets the error, and the group goes on */
    if (ddp_trace_start(&ctx, 0) != DDP_OK) return 9;
    last_error[0] = 0;
    s = ddp_trace_save(&ctx, "/nonexistent-ddp-dir/trace.json");
    {
        int ok = ctx.rank == 0 ? s == DDP_ERR_ARG && strstr(last_error, "No such file") != NULL
                               : s == DDP_ERR_PEER && strstr(last_error, "rank 0 cannot write") != NULL;
        float one = 1;
        ok = all_ok(&ctx, ok);
        if (ddp_all_reduce(&ctx, &one, &one, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK || one != (float)W) ok = 0;
        snprintf(name, sizeof name, "trace W=%d: an unwritable path fails on every rank, the group goes on", W);
        if (ctx.rank == 0) CHECK(name, ok, "got %d '%s'", s, last_error);
    }

    /* rank 0's write fails half way (a file-size limit: EFBIG, as a full disk gives ENOSPC):
       the trace saved before keeps its name and content, and no temporary file stays */
    if (ddp_trace_start(&ctx, 0) != DDP_OK) return 11;
    for (i = 0; i < 200; i++) {
        ddp_trace_begin(&ctx, "a span with a long enough name to pass the file-size limit");
        ddp_trace_end(&ctx);
    }
    if (ctx.rank == 0) {
        FILE *f = fopen(path, "w");
        struct rlimit lim = {4096, RLIM_INFINITY};
        if (!f || fputs("the old trace\n", f) < 0 || fclose(f) != 0) return 12;
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &lim);
    }
    last_error[0] = 0;
    s = ddp_trace_save(&ctx, path);
    snprintf(name, sizeof name, "trace W=%d: the other ranks hear of rank 0's failed write as another rank's", W);
    k = all_ok(&ctx, ctx.rank == 0 || (s == DDP_ERR_PEER && strstr(last_error, "rank 0 could not write")));
    if (ctx.rank == 0) CHECK(name, k, "a rank did not get DDP_ERR_PEER");
    if (ctx.rank == 0) {
        char line[64] = "", cmd[300];
        FILE *f = fopen(path, "r");
        struct rlimit lim = {RLIM_INFINITY, RLIM_INFINITY};
        int left;
        setrlimit(RLIMIT_FSIZE, &lim);
        if (f) {
            if (!fgets(line, sizeof line, f)) line[0] = 0;
            fclose(f);
        }
        snprintf(cmd, sizeof cmd, "ls %s.tmp* >/dev/null 2>&1", path);
        left = system(cmd) == 0;
        snprintf(name, sizeof name, "trace W=%d: a failed write keeps the old file and leaves no temporary", W);
        CHECK(name, s == DDP_ERR_SYSTEM && strstr(last_error, "writing") && !strcmp(line, "the old trace\n") && !left,
              "got %d '%s'; the file begins '%s'; %s", s, last_error, line, left ? "a PATH.tmp* file stayed" : "no PATH.tmp");
    }
    ddp_grad_destroy(&g);
    ddp_destroy(&ctx);
    free(grads);
    return test_failures_ ? 10 : 0;
}

int main(int argc, char **argv)
{
    static const int worlds[] = {1, 3, 4};
    char worker_flag[] = "--worker", path[64];
    char *args[4];
    int k;
    if (argc > 2 && strcmp(argv[1], "--worker") == 0) return work(&argc, argv);
    snprintf(path, sizeof path, "/tmp/ddp_trace_test.%d.json", (int)getpid());
    args[0] = argv[0];
    args[1] = worker_flag;
    args[2] = path;
    args[3] = NULL;
    for (k = 0; k < TEST_COUNT(worlds); k++) {
        int status = ddp_run(worlds[k], args);
        char name[64];
        snprintf(name, sizeof name, "trace W=%d: every rank exited 0", worlds[k]);
        CHECK(name, status == 0, "ddp_run returned %d", status);
    }
    remove(path);
    (void)test_skip;
    TEST_EXIT();
}
