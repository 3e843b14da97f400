/* Ranks that disagree get a named error, never a result: collectives whose arguments
   differ (count, dtype, op, kind, root, a skipped call), settings that must match (ddp.h's
   and the program's own, ddp_agree_on),
   gradient buckets cut differently, a rank that leaves while others wait, and a
   timeout that says where every late rank is. Also the launcher's refusals of nested
   launches and bad timeouts, and the per-launch job identities. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <stdlib.h>
#include <string.h>

typedef struct call { int kind; size_t count; ddp_dtype dtype; ddp_op op; int root; int async; } call;

/* One collective as a rank makes it; its result code. */
static ddp_result do_call(ddp_ctx *ctx, const call *c)
{
    static double buf[4096];
    ddp_work w;
    ddp_result r;
    switch (c->kind) {
    case DDP__BROADCAST: return ddp_broadcast(ctx, buf, c->count, c->dtype, c->root, NULL);
    case DDP__BARRIER: return ddp_barrier(ctx);
    default:
        if (!c->async) return ddp_all_reduce(ctx, buf, buf, c->count, c->dtype, c->op, NULL);
        r = ddp_all_reduce_async(ctx, buf, buf, c->count, c->dtype, c->op, NULL, &w);
        return r == DDP_OK ? ddp_wait(ctx, &w, NULL) : r;
    }
}

typedef struct scenario {
    const char *name;
    call same, odd;     /* what ranks 0 and 2 call, what rank 1 calls */
    const char *rank0;  /* rank 0's error must contain this */
} scenario;

static const char *const codes[] = {
    [10] = "init failed", [11] = "the disagreeing collective did not return DDP_ERR_MISMATCH",
    [12] = "rank 0's error does not name both sides as expected", [13] = "the error does not name rank 1",
    [14] = "a collective after the mismatch was not refused", [15] = "the agreeing warm-up collective failed",
    [16] = "a second refusal does not cite the first cause once, unnested"};

static int disagree(int rank, void *arg)
{
    const scenario *s = (const scenario *)arg;
    call warm = {DDP__ALL_REDUCE, 8, DDP_F32, DDP_SUM, 0, 0};
    ddp_ctx ctx;
    ddp_result r;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (do_call(&ctx, &warm) != DDP_OK) return 15;
    r = do_call(&ctx, rank == 1 ? &s->odd : &s->same);
    if (r != DDP_ERR_MISMATCH) return 11;
    if (rank == 0 && !strstr(ddp_error(&ctx), s->rank0)) { fprintf(stderr, "got: %s\n", ddp_error(&ctx)); return 12; }
    if (rank != 1 && !strstr(ddp_error(&ctx), "rank 1")) return 13;
    if (do_call(&ctx, &warm) != DDP_ERR_ABORTED) return 14;
    if (do_call(&ctx, &warm) != DDP_ERR_ABORTED) return 14;
    {   /* each refusal names the mismatch itself, not the refusal before it */
        const char *e = ddp_error(&ctx), *again = strstr(e, "failed earlier");
        if (!again || strstr(again + 1, "failed earlier") || (rank == 0 && !strstr(e, s->rank0))) {
            fprintf(stderr, "got: %s\n", e);
            return 16;
        }
    }
    ddp_destroy(&ctx);
    return 0;
}

static void test_collectives(void)
{
    static const scenario cases[] = {
        {"count", {0, 100, DDP_F32, DDP_SUM, 0, 0}, {0, 1000, DDP_F32, DDP_SUM, 0, 0},
         "all_reduce #2: rank 0 passes 100 x f32 sum, rank 1 passes 1000 x f32 sum"},
        {"dtype", {0, 100, DDP_F32, DDP_SUM, 0, 0}, {0, 100, DDP_F64, DDP_SUM, 0, 0},
         "rank 0 passes 100 x f32 sum, rank 1 passes 100 x f64 sum"},
        {"op", {0, 100, DDP_F32, DDP_SUM, 0, 0}, {0, 100, DDP_F32, DDP_MAX, 0, 0},
         "rank 0 passes 100 x f32 sum, rank 1 passes 100 x f32 max"},
        {"kind", {0, 100, DDP_F32, DDP_SUM, 0, 0}, {DDP__BROADCAST, 100, DDP_F32, DDP_SUM, 0, 0},
         "ranks call different collectives: rank 0 all_reduce #2 (100 x f32 sum), rank 1 broadcast #2 (100 x f32 from rank 0)"},
        {"root", {DDP__BROADCAST, 100, DDP_F32, DDP_SUM, 0, 0}, {DDP__BROADCAST, 100, DDP_F32, DDP_SUM, 2, 0},
         "broadcast #2: rank 0 passes 100 x f32 from rank 0, rank 1 passes 100 x f32 from rank 2"},
        {"empty_vs_full", {0, 0, DDP_F32, DDP_SUM, 0, 0}, {0, 100, DDP_F32, DDP_SUM, 0, 0},
         "rank 0 passes 0 x f32 sum, rank 1 passes 100 x f32 sum"},
        {"barrier_vs_all_reduce", {DDP__BARRIER, 0, DDP_F32, DDP_SUM, 0, 0}, {0, 100, DDP_F32, DDP_SUM, 0, 0},
         "rank 0 barrier #2, rank 1 all_reduce #2 (100 x f32 sum)"},
        {"async_count", {0, 100, DDP_F32, DDP_SUM, 0, 1}, {0, 1000, DDP_F32, DDP_SUM, 0, 1},
         "rank 0 passes 100 x f32 sum, rank 1 passes 1000 x f32 sum"},
        {"large_count", {0, 4000, DDP_F64, DDP_SUM, 0, 0}, {0, 3000, DDP_F64, DDP_SUM, 0, 0},
         "rank 0 passes 4000 x f64 sum, rank 1 passes 3000 x f64 sum"},
    };
    test_job job;
    char name[96];
    size_t i;
    setenv("DDP_TIMEOUT", "30", 1); /* a mismatch must not wait for the timeout */
    setenv("DDP_SHM_CHUNK", "4096", 1); /* several chunks: ranks would fall out of step */
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_spawn(&job, 3, disagree, (void *)&cases[i]);
        snprintf(name, sizeof name, "mismatch.%s", cases[i].name);
        CHECK(name, job.failed == 0 && job.seconds < 5, "%s, %.1f s", TEST_JOB_WHY(&job, codes), job.seconds);
    }
    unsetenv("DDP_SHM_CHUNK");
}

/* DDP_CHECK's comparison through the store, driven directly (any backend uses it). */
static int store_check(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp__coll c;
    ddp_result r;
    (void)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    memset(&c, 0, sizeof c);
    c.seq = 7; c.kind = DDP__ALL_REDUCE; c.dtype = DDP_BF16; c.op = DDP_AVG; c.count = 64;
    if (ddp__store_check(&ctx, &c) != DDP_OK) return 15; /* agreeing ranks pass */
    c.seq = 8;
    if (rank == 1) c.count = 65;
    r = ddp__store_check(&ctx, &c);
    if (r != DDP_ERR_MISMATCH) return 11;
    if (rank == 0 && !strstr(ddp_error(&ctx), "all_reduce #8: rank 0 passes 64 x bf16 avg, rank 1 passes 65 x bf16 avg"))
        return 12;
    ddp_destroy(&ctx);
    return 0;
}

/* the same through the public calls with DDP_CHECK=1 */
static int checked_job(int rank, void *arg)
{
    ddp_ctx ctx;
    float x[64] = {0};
    (void)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (ddp_all_reduce(&ctx, x, x, 64, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 15;
    if (ddp_all_reduce(&ctx, x, x, rank == 1 ? 32 : 64, DDP_F32, DDP_SUM, NULL) != DDP_ERR_MISMATCH) return 11;
    if (rank == 0 && !strstr(ddp_error(&ctx), "rank 0 passes 64 x f32 sum, rank 1 passes 32 x f32 sum")) return 12;
    ddp_destroy(&ctx);
    return 0;
}

/* rank 1 starts with another DDP_SHM_CHUNK: init names the setting on every rank */
static const char *const setting_codes[] = {
    [1] = "init did not return DDP_ERR_MISMATCH", [2] = "the error does not name shm_chunk with both values",
    [3] = "the error does not say which variable sets it"};
static int settings(int rank, void *arg)
{
    ddp_ctx ctx;
    const char *e;
    (void)arg;
    if (rank == 1) setenv("DDP_SHM_CHUNK", "65536", 1);
    if (ddp_init(&ctx, NULL) != DDP_ERR_MISMATCH) return 1;
    e = ddp_error(&ctx);
    if (!strstr(e, "shm_chunk=1048576") || !strstr(e, "shm_chunk=65536")) return 2;
    if (!strstr(e, "DDP_SHM_CHUNK")) return 3;
    ddp_destroy(&ctx);
    return 0;
}

/* rank 1 leaves after four collectives; the others learn it in their fifth, at once */
/* A call refused on rank 1 only (a NULL buffer): its next call must not pair with the
   others' refused one (the sums were shifted a step, with DDP_OK): a named mismatch. */
static const char *const refused_codes[] = {
    [10] = "init failed", [11] = "rank 1's NULL buffer was not refused",
    [12] = "rank 1's next call did not get DDP_ERR_MISMATCH", [13] = "another rank's call did not fail",
    [14] = "the error does not say where the other rank is (all_reduce #1 or #2, 1 x f32 sum)"};
static int refused_on_one(int rank, void *arg)
{
    ddp_ctx ctx;
    float x = 1;
    ddp_result r1, r2;
    (void)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    r1 = ddp_all_reduce(&ctx, &x, rank == 1 ? NULL : &x, 1, DDP_F32, DDP_SUM, NULL);
    r2 = ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
    if (rank == 1 && r1 != DDP_ERR_ARG) return 11;
    if (rank == 1 && r2 != DDP_ERR_MISMATCH) return 12;
    if (rank != 1 && r1 == DDP_OK) return 13;
    /* each names where the other is, not a slot the other never wrote */
    if (!strstr(ddp_error(&ctx), rank == 1 ? "rank 0 all_reduce #1 (1 x f32 sum)" : "rank 1 all_reduce #2 (1 x f32 sum)"))
        return 14;
    return 0;
}

static const char *const leave_codes[] = {
    [10] = "init failed", [11] = "the fifth collective did not return DDP_ERR_PEER",
    [12] = "the error does not say rank 1 left in ddp_destroy during all_reduce #5",
    [13] = "noticing took over 3 s", [14] = "an agreeing collective failed"};
static int leave_early(int rank, void *arg)
{
    ddp_ctx ctx;
    float x = 1;
    double t0;
    int i;
    (void)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    for (i = 0; i < 4; i++)
        if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 14;
    if (rank == 1) { ddp_destroy(&ctx); return 0; }
    t0 = test_now_s();
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_ERR_PEER) return 11;
    if (!strstr(ddp_error(&ctx), "rank 1 left the job (ddp_destroy) while rank") ||
        !strstr(ddp_error(&ctx), "waits in all_reduce #5"))
        return 12;
    if (test_now_s() - t0 > 3) return 13;
    ddp_destroy(&ctx);
    return 0;
}

/* rank 2 is stuck between collectives: rank 0's timeout says where rank 2 is */
static const char *const behind_codes[] = {
    [10] = "init failed", [11] = "rank 0 did not time out",
    [12] = "rank 0's error does not say rank 2 is still at all_reduce #1 while it waits in #2",
    [14] = "the first collective failed"};
static int behind(int rank, void *arg)
{
    ddp_ctx ctx;
    float x = 1;
    (void)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 14;
    if (rank == 2) { /* the scenario: a rank busy far longer than the timeout */
        struct timespec ts = {2, 0};
        nanosleep(&ts, NULL);
    }
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) == DDP_OK) return rank == 0 ? 11 : 0;
    if (rank == 0 && !strstr(ddp_error(&ctx), "all_reduce #2 timed out after 1.0 s waiting for rank 2 (last in all_reduce #1)"))
        return 12;
    ddp_destroy(&ctx);
    return 0;
}

/* ranks cut their gradients differently: ddp_grad_init says how; arg "params": one rank
   alone gives params to broadcast (they went to nobody: DDP_OK, and the next call paired
   with that broadcast) */
static const char *const grad_codes[] = {
    [10] = "init failed", [11] = "ddp_grad_init did not return DDP_ERR_MISMATCH",
    [12] = "the error does not give both layouts"};
static int grad_layout(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp_grad g;
    ddp_grad_desc gd;
    static float grads[1000], params[1000];
    const int p = arg != NULL;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    memset(&gd, 0, sizeof gd);
    gd.grads = grads;
    gd.count = rank == 1 && !p ? 999 : 1000;
    gd.bucket_bytes = 400;
    if (p && rank == 1) gd.params = params;
    if (ddp_grad_init(&g, &ctx, &gd) != DDP_ERR_MISMATCH) return 11;
    if (rank == 0 && !strstr(ddp_error(&ctx), p ? "rank 0 has 1000 x f32 in buckets of 100, no params to broadcast, "
                                                   "rank 1 has 1000 x f32 in buckets of 100, 1000 x f32 params"
                                                 : "rank 0 has 1000 x f32 in buckets of 100, rank 1 has 999 x f32 in "
                                                   "buckets of 100"))
        return 12;
    ddp_destroy(&ctx);
    return 0;
}

static int child_hello(void)
{
    ddp_ctx ctx;
    int x = 1;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_I32, DDP_SUM, NULL) != DDP_OK || x != ctx.world_size) return 11;
    ddp_destroy(&ctx);
    return ctx.world_size == 2 ? 0 : 12;
}

/* A DDP_SECRET of the user's reaches the ranks whole (the launcher cut it to 64
   bytes); one longer than a rank takes is one line from the launcher. */
static void test_launch_secret(const char *self)
{
    char secret[300], *a1[] = {(char *)self, (char *)"--child-secret", (char *)"--nproc", (char *)"2", NULL};
    char *a2[] = {(char *)self, (char *)"--child-secret", (char *)"--nproc", (char *)"2", NULL};
    int n1 = 4, n2 = 4, rc;
    double t0;
    memset(secret, 's', 200);
    secret[200] = 0;
    setenv("DDP_SECRET", secret, 1);
    rc = ddp_launch(&n1, a1);
    CHECK("launch.users_secret_reaches_the_ranks_whole", rc == 0, "the ranks returned %d", rc);
    memset(secret, 's', 299);
    secret[299] = 0;
    setenv("DDP_SECRET", secret, 1);
    t0 = test_now_s();
    rc = ddp_launch(&n2, a2);
    CHECK("launch.secret_too_long_refused_once", rc == 2 && test_now_s() - t0 < 1, "ddp_launch returned %d", rc);
    unsetenv("DDP_SECRET");
}

static int child_secret(void)
{
    ddp_ctx ctx;
    const char *s = getenv("DDP_SECRET");
    if (!s || strlen(s) != 200 || strspn(s, "s") != 200) return 13;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    ddp_destroy(&ctx);
    return 0;
}

static void test_launch_refusals(const char *self)
{
    char *a1[] = {(char *)self, (char *)"--child", (char *)"--nproc", (char *)"2", (char *)"--nproc=3", NULL};
    char *a2[] = {(char *)self, (char *)"--child", (char *)"--nproc", (char *)"2", NULL};
    char *a3[] = {(char *)self, (char *)"--child", (char *)"--nproc_per_node=2", NULL};
    char *a4[] = {(char *)self, (char *)"--child", (char *)"--nproc-per-node", (char *)"2", NULL};
    char *a5[] = {(char *)self, (char *)"--child", (char *)"--nproc", (char *)"2", NULL};
    char *a6[] = {(char *)self, (char *)"--child", (char *)"--nproc", (char *)"2", NULL};
    int n1 = 5, n2 = 4, n3 = 3, n4 = 4, n5 = 4, n6 = 4, rc;
    double t0 = test_now_s();
    char *a7[] = {(char *)self, (char *)"--child", (char *)"--nproc", (char *)"257", NULL};
    int n7 = 4;
    rc = ddp_launch(&n1, a1);
    CHECK("launch.nproc_twice_refused", rc == 2 && test_now_s() - t0 < 1, "ddp_launch returned %d", rc);
    /* one host runs at most 256 ranks: one line, not 257 ranks each refusing */
    t0 = test_now_s();
    rc = ddp_launch(&n7, a7);
    CHECK("launch.nproc_past_one_hosts_ranks_refused", rc == 2 && test_now_s() - t0 < 1, "ddp_launch returned %d", rc);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    rc = ddp_launch(&n2, a2);
    CHECK("launch.inside_a_job_refused", rc == 2, "ddp_launch inside a torchrun-style job returned %d", rc);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    /* a Slurm step of one task (srun --pty bash, then ./prog --nproc 2) launches like a shell */
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "1", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    rc = ddp_launch(&n5, a5);
    CHECK("launch.inside_a_step_of_one_task", rc == 0, "--nproc 2 in a step of one task ran a job that returned %d", rc);
    setenv("SLURM_NTASKS", "2", 1);
    rc = ddp_launch(&n6, a6);
    CHECK("launch.inside_a_step_of_two_tasks_refused", rc == 2, "ddp_launch in a step of two tasks returned %d", rc);
    unsetenv("SLURM_PROCID");
    unsetenv("SLURM_NTASKS");
    unsetenv("SLURM_STEP_ID");
    rc = ddp_launch(&n3, a3);
    CHECK("launch.nproc_per_node_equals", rc == 0, "--nproc_per_node=2 ran a job that returned %d", rc);
    rc = ddp_launch(&n4, a4);
    CHECK("launch.nproc_per_node_space", rc == 0, "--nproc-per-node 2 ran a job that returned %d", rc);
    test_launch_secret(self);
}

/* Settings from the environment: a timeout below a millisecond is refused, and each
   launcher's own identity for the launch becomes the job id. */
/* Samplers set up differently: rank 1 reads a dataset one sample longer (arg NULL) or
   uses another seed (arg "seed"); both are named at ddp_sampler_init on every rank, after
   an agreeing one went through. */
static const char *const sampler_codes[] = {
    [10] = "init failed", [11] = "ddp_sampler_init did not return DDP_ERR_MISMATCH",
    [12] = "the error does not name the field and its range", [13] = "the agreeing sampler failed",
    [14] = "a sampler on a destroyed context was not refused (it skipped the ranks' agreement)"};
static int sampler_setup(int rank, void *arg)
{
    const char *what = arg ? (const char *)arg : "size";
    const int seed = !strcmp(what, "seed"), batch = !strcmp(what, "batch");
    ddp_ctx ctx;
    ddp_sampler smp;
    ddp_sampler_desc sd;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = 1000;
    sd.batch_size = 8;
    if (ddp_sampler_init(&smp, &ctx, &sd) != DDP_OK) return 13;
    ddp_sampler_destroy(&smp);
    if (rank == 1 && seed) sd.seed = (uint64_t)7 << 32;
    if (rank == 1 && batch) sd.batch_size += (size_t)1 << 62; /* the same low 62 bits: it passed */
    if (rank == 1 && !seed && !batch) sd.dataset_size = 1001;
    if (ddp_sampler_init(&smp, &ctx, &sd) != DDP_ERR_MISMATCH) return 11;
    if (!strstr(ddp_error(&ctx), seed ? "seed (high 32 bits): from 0 to 7" : batch ? "batch_size (top 2 bits): from 0 to 1"
                                                                              : "dataset_size: from 1000 to 1001"))
        return 12;
    ddp_destroy(&ctx);
    if (ddp_sampler_init(&smp, &ctx, &sd) != DDP_ERR_ARG || !strstr(ddp_error(&ctx), "destroyed")) return 14;
    return 0;
}

/* ddp_agree_on, the program's own settings, in a world of 4: equal values pass; rank 2's
   other --lr is named with both values on every rank; a long value that differs only past
   what is shown still differs (and is shown cut short); ranks that check different names
   (calls out of order) are told so; the group still works after each refusal (nothing
   moved data). */
static const char *const agree_codes[] = {
    [10] = "init failed", [11] = "equal values did not return DDP_OK",
    [12] = "rank 2's --lr: not DDP_ERR_MISMATCH, or the error does not name rank 2 and both values",
    [13] = "a long value differing at its end: not DDP_ERR_MISMATCH, or not shown cut short",
    [14] = "different names: not DDP_ERR_MISMATCH, or the error does not say so",
    [15] = "an all_reduce after the refusals failed", [16] = "a NULL value was not DDP_ERR_ARG"};
static int agree_on(int rank, void *arg)
{
    char long_value[400];
    float x = 1.0f;
    ddp_ctx ctx;
    (void)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (ddp_agree_on(&ctx, "--lr", "0.001") != DDP_OK || ddp_agree_on(&ctx, "empty", "") != DDP_OK) return 11;
    if (ddp_agree_on(&ctx, "--lr", rank == 2 ? "0.002" : "0.001") != DDP_ERR_MISMATCH ||
        !strstr(ddp_error(&ctx), "ranks disagree on --lr: rank 2 has 0.002, rank 0 has 0.001"))
        return 12;
    memset(long_value, 'a', sizeof long_value - 1);
    long_value[sizeof long_value - 1] = 0;
    if (rank == 3) long_value[sizeof long_value - 2] = 'b';
    if (ddp_agree_on(&ctx, "--data", long_value) != DDP_ERR_MISMATCH ||
        !strstr(ddp_error(&ctx), "ranks disagree on --data: rank 3 has aaaa") || !strstr(ddp_error(&ctx), "a..., rank 0") ||
        !strstr(ddp_error(&ctx), "(alike in what is shown: they differ further on)"))
        return 13;
    if (ddp_agree_on(&ctx, rank == 1 ? "--steps" : "--lr", "1") != DDP_ERR_MISMATCH ||
        !strstr(ddp_error(&ctx), "rank 1 checks another setting than rank 0"))
        return 14;
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK || x != 4.0f) return 15;
    if (ddp_agree_on(&ctx, "--lr", NULL) != DDP_ERR_ARG) return 16;
    ddp_destroy(&ctx);
    return 0;
}

static void test_settings(void)
{
    static const struct { const char *vars[6]; const char *job; } ids[] = {
        {{"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1", "PMIX_NAMESPACE=prterun-host-4242@1"}, "prterun-host-4242@1"},
        {{"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_JOB_ID=77", "SLURM_STEP_ID=3"}, "77.3"},
        {{"RANK=0", "WORLD_SIZE=1", "TORCHELASTIC_RUN_ID=a1b2"}, "a1b2"},
        {{"RANK=0", "WORLD_SIZE=1", "TORCHELASTIC_RUN_ID=a1b2", "DDP_JOB_ID=mine"}, "mine"},
        {{"PMI_RANK=0", "PMI_SIZE=1"}, "ddp"},
    };
    static const char *const hosts[][2] = {
        {"node[01-04,07]", "node01"}, {"a1,b[2-3]", "a1"}, {"gpu[3-4]-ib", "gpu3-ib"}, {"single", "single"},
        {"x[]", ""}, {"", ""}};
    static const struct { const char *list; int node, world, here; } tasks[] = { /* 0: malformed or inconsistent */
        {"2(x2)", 1, 4, 2}, {"2(x3),1", 3, 7, 1}, {"2(x3),1", 2, 7, 2}, {"3,1", 0, 4, 3}, {"4", 0, 4, 4},
        {"2(x2)", 2, 4, 0}, {"2(x2)", 0, 5, 0}, {"2(x2", 0, 4, 0}, {"2x2", 0, 4, 0}, {"0(x4)", 0, 0, 0},
        {"2,", 0, 2, 0}, {",2", 0, 2, 0}, {"", 0, 1, 0}, {"2(x-1)", 0, 2, 0}, {"99999999999", 0, 4, 0}};
    ddp_ctx ctx;
    ddp_result r;
    size_t i, j;
    char out[64], name[64];
    setenv("DDP_TIMEOUT", "0.0001", 1);
    r = ddp_init(&ctx, NULL);
    CHECK("settings.tiny_timeout_refused", r == DDP_ERR_ENV && strstr(ddp_error(&ctx), "DDP_TIMEOUT='0.0001'"),
          "got %s: %s", ddp_strerror(r), ddp_error(&ctx));
    ddp_destroy(&ctx);
    setenv("DDP_TIMEOUT", "0.001", 1);
    r = ddp_init(&ctx, NULL);
    CHECK("settings.millisecond_timeout_honoured", r == DDP_OK && ctx.st->cfg.timeout_ms == 1, "got %s, %d ms",
          ddp_strerror(r), r == DDP_OK ? ctx.st->cfg.timeout_ms : -1);
    ddp_destroy(&ctx);
    unsetenv("DDP_TIMEOUT");
    for (i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        char keep[6][64];
        for (j = 0; j < 6 && ids[i].vars[j]; j++) {
            snprintf(keep[j], sizeof keep[j], "%s", ids[i].vars[j]);
            putenv(keep[j]);
        }
        r = ddp_init(&ctx, NULL);
        snprintf(name, sizeof name, "settings.job_id.%zu", i);
        CHECK(name, r == DDP_OK && strcmp(ctx.st->cfg.job_id, ids[i].job) == 0, "%s: job id '%s', want '%s'",
              ids[i].vars[0], r == DDP_OK ? ctx.st->cfg.job_id : ddp_error(&ctx), ids[i].job);
        ddp_destroy(&ctx);
        for (j = 0; j < 6 && ids[i].vars[j]; j++) {
            *strchr(keep[j], '=') = 0;
            unsetenv(keep[j]);
        }
    }
    for (i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
        int ok = ddp__slurm_first_host(hosts[i][0], out, sizeof out);
        snprintf(name, sizeof name, "settings.slurm_first_host.%zu", i);
        CHECK(name, hosts[i][1][0] ? ok && strcmp(out, hosts[i][1]) == 0 : !ok, "'%s' gave %d '%s', want '%s'",
              hosts[i][0], ok, ok ? out : "", hosts[i][1]);
    }
    for (i = 0; i < sizeof tasks / sizeof tasks[0]; i++) {
        int here = ddp__slurm_tasks_here(tasks[i].list, tasks[i].node, tasks[i].world);
        snprintf(name, sizeof name, "settings.slurm_tasks_per_node.%zu", i);
        CHECK(name, here == tasks[i].here, "'%s', node %d of a world of %d: %d tasks, want %d", tasks[i].list,
              tasks[i].node, tasks[i].world, here, tasks[i].here);
    }
}

/* Another rank's fingerprint is words from outside (the store's answer under DDP_CHECK,
   which a stranger can fake without a secret): an op, dtype or kind past the tables
   reads "?", not past them (an op of 0x2f000000 segfaulted rank 1). */
static void stranger_fingerprint(void)
{
    ddp__fp mine, theirs;
    char why[300];
    memset(&mine, 0, sizeof mine);
    mine.seq = 3, mine.count = 1, mine.kind = DDP__ALL_REDUCE;
    theirs = mine;
    theirs.op = 0x2f000000, theirs.dtype = -5;
    ddp__fp_diff(why, sizeof why, 1, &mine, 0, &theirs);
    CHECK("mismatch.stranger_fingerprint_op", strstr(why, "rank 0 passes 1 x ? ?") != NULL, "'%s'", why);
    theirs.kind = 0x40000000;
    ddp__fp_diff(why, sizeof why, 1, &mine, 0, &theirs);
    CHECK("mismatch.stranger_fingerprint_kind", strstr(why, "rank 0 ? #3") != NULL, "'%s'", why);
}

/* A helper's call refused on rank 1 only (its arguments) before the collectives it makes:
   rank 1 still meets the others there, so each rank returns an error (rank 1 its own,
   the others DDP_ERR_PEER naming it) and the group goes on; before, the others' gather
   paired with rank 1's next collective (metric means mixed across steps, with DDP_OK).
   An async all-reduce refused for want of a handle takes its number as the others do. */
static const char *const helper_codes[] = {
    [10] = "init failed", [11] = "rank 1's call was not refused", [12] = "another rank's call did not fail",
    [13] = "another rank's error does not name rank 1's refusal", [14] = "the group did not go on",
    [15] = "the next metric_reduce gave a wrong mean", [16] = "rank 1's next call paired with the others' refused one",
    [17] = "unknown mode", [18] = "rank 1's refusal left ddp_error empty",
    [19] = "rank 1's live sampler changed, or its refusal did not say why"};
static int refused_in_helper(int rank, void *arg)
{
    const char *mode = (const char *)arg;
    ddp_ctx ctx;
    ddp_result r;
    float x = 1;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (strcmp(mode, "metric") == 0) {
        ddp_metric m = {0, 0, 0, 0, 0};
        ddp_metric_add(&m, 100.0 * (rank + 1), 1);
        r = ddp_metric_reduce(&ctx, rank == 1 ? NULL : &m, 1);
    } else if (strcmp(mode, "metric_again") == 0) { /* rank 1 passes its reduced metric again */
        ddp_metric m = {0, 0, 0, 0, 0}, next = {0, 0, 0, 0, 0};
        ddp_metric_add(&m, 100.0 * (rank + 1), 1);
        if (ddp_metric_reduce(&ctx, &m, 1) != DDP_OK) return 10;
        r = ddp_metric_reduce(&ctx, rank == 1 ? &m : &next, 1);
    } else if (strcmp(mode, "grad") == 0) {
        int32_t g[4] = {0, 0, 0, 0};
        ddp_grad grad;
        ddp_grad_desc d;
        memset(&d, 0, sizeof d);
        d.grads = g;
        d.count = 4;
        d.dtype = rank == 1 ? DDP_I32 : DDP_F32; /* an integer average is refused */
        r = ddp_grad_init(&grad, &ctx, &d);
        ddp_grad_destroy(&grad);
    } else if (strcmp(mode, "sampler") == 0) {
        ddp_sampler s;
        ddp_sampler_desc d;
        memset(&d, 0, sizeof d);
        d.dataset_size = rank == 1 ? SIZE_MAX : 100; /* more than memory can index */
        r = ddp_sampler_init(&s, &ctx, &d);
        ddp_sampler_destroy(&s);
    } else if (strcmp(mode, "grad_null") == 0 || strcmp(mode, "grad_params") == 0) {
        const int no_object = rank == 1 && strcmp(mode, "grad_null") == 0;
        float g[4] = {0, 0, 0, 0}, p[4] = {1, 2, 3, 4};
        ddp_grad grad;
        ddp_grad_desc d;
        memset(&d, 0, sizeof d);
        d.grads = g;
        d.count = 4;
        d.params = p;
        if (rank == 1 && strcmp(mode, "grad_params") == 0) d.param_dtype = (ddp_dtype)77; /* no such dtype */
        r = ddp_grad_init(no_object ? NULL : &grad, &ctx, &d);
        if (!no_object) ddp_grad_destroy(&grad);
    } else if (strcmp(mode, "sampler_null") == 0) {
        ddp_sampler s;
        ddp_sampler_desc d;
        memset(&d, 0, sizeof d);
        d.dataset_size = 100;
        r = ddp_sampler_init(rank == 1 ? NULL : &s, &ctx, &d);
        if (rank != 1) ddp_sampler_destroy(&s);
    } else if (strcmp(mode, "sampler_live") == 0) { /* rank 1 sets up its live sampler again */
        ddp_sampler s;
        ddp_sampler_desc d;
        memset(&d, 0, sizeof d);
        d.dataset_size = 100;
        if (ddp_sampler_init(&s, &ctx, &d) != DDP_OK) return 10;
        if (rank != 1) ddp_sampler_destroy(&s);
        d.dataset_size = 200;
        r = ddp_sampler_init(&s, &ctx, &d);
        if (rank == 1 && (s.dataset_size != 100 || !ddp_sampler_epoch(&s, 0) ||
                          !strstr(ddp_error(&ctx), "ddp_sampler_init on a ddp_sampler that ddp_sampler_init set up before")))
            return 19;
        ddp_sampler_destroy(&s);
    } else if (strcmp(mode, "agree") == 0) {
        r = ddp_agree_on(&ctx, "data", rank == 1 ? NULL : "train.bin");
    } else if (strcmp(mode, "async") == 0) {
        ddp_work w;
        r = ddp_all_reduce_async(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL, rank == 1 ? NULL : &w);
        if (rank != 1 && r == DDP_OK) r = ddp_wait(&ctx, &w, NULL);
        if (rank == 1 && r != DDP_ERR_ARG) return 11;
        if (rank != 1 && r == DDP_OK) return 12;
        if (rank == 1 && ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_ERR_MISMATCH) return 16;
        return 0;
    } else
        return 17;
    if (rank == 1 && r != DDP_ERR_ARG && r != DDP_ERR_NOMEM) return 11;
    if (rank == 1 && !*ddp_error(&ctx)) return 18; /* and says why */
    if (rank != 1 && r != DDP_ERR_PEER) return 12;
    if (rank != 1 && !strstr(ddp_error(&ctx), "rank 1's call was refused")) return 13;
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK || x != (float)ctx.world_size) return 14;
    if (strncmp(mode, "metric", 6) == 0) { /* the next one pairs with the others' next one */
        ddp_metric m = {0, 0, 0, 0, 0};
        ddp_metric_add(&m, 1.0 + rank, 1);
        if (ddp_metric_reduce(&ctx, &m, 1) != DDP_OK || ddp_metric_mean(&m) != (1.0 + ctx.world_size) / 2) return 15;
    }
    return ddp_destroy(&ctx) != DDP_OK ? 14 : 0;
}

/* A barrier (a meeting only) and then a call refused alike on every rank, many times: a
   rank out of the barrier first, whose refused call took a number, wrote its next
   fingerprint over the one a slower rank was still comparing (a false mismatch that
   stopped the group, 5 runs of 5). */
static const char *const meet_codes[] = {
    [10] = "init failed", [11] = "a barrier failed", [12] = "the NULL buffer was not refused",
    [13] = "a count-0 all-reduce failed", [14] = "ddp_destroy failed"};
static int barrier_then_refused(int rank, void *arg)
{
    ddp_ctx ctx;
    float x = 1;
    int i;
    (void)rank;
    (void)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    for (i = 0; i < 200; i++) {
        if (ddp_barrier(&ctx) != DDP_OK) return 11;
        if (ddp_all_reduce(&ctx, NULL, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_ERR_ARG) return 12;
        if (ddp_all_reduce(&ctx, &x, &x, 0, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 13;
        if (ddp_broadcast(&ctx, &x, 1, DDP_F32, -1, NULL) != DDP_ERR_ARG) return 12;
    }
    return ddp_destroy(&ctx) != DDP_OK ? 14 : 0;
}

/* Counts past an address space are refused by name, not read (a broadcast of 2^60
   floats crashed; an all-reduce of 2^61 was called overlapping), and a metric count whose
   buffer would overflow size_t is refused, not wrapped. */
static const char *const huge_codes[] = {
    [10] = "init failed", [11] = "the broadcast of 2^60 floats was not refused as past memory",
    [12] = "the all-reduce of 2^61 floats was not refused as past memory",
    [13] = "metric_reduce of 2^59 + 1 metrics was not refused", [14] = "the group did not go on"};
static int huge_counts(int rank, void *arg)
{
    ddp_ctx ctx;
    float a[4] = {1, 1, 1, 1}, b[4];
    ddp_metric m[4];
    (void)rank;
    (void)arg;
    memset(m, 0, sizeof m);
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (ddp_broadcast(&ctx, a, (size_t)1 << 60, DDP_F32, 0, NULL) != DDP_ERR_ARG ||
        !strstr(ddp_error(&ctx), "more bytes than memory holds"))
        return 11;
    if (ddp_all_reduce(&ctx, a, b, (size_t)1 << 61, DDP_F32, DDP_SUM, NULL) != DDP_ERR_ARG ||
        !strstr(ddp_error(&ctx), "more bytes than memory holds"))
        return 12;
    if (ddp_metric_reduce(&ctx, m, ((size_t)1 << 59) + 1) != DDP_ERR_ARG) return 13;
    if (ddp_all_reduce(&ctx, a, a, 4, DDP_F32, DDP_SUM, NULL) != DDP_OK || a[0] != (float)ctx.world_size) return 14;
    return ddp_destroy(&ctx) != DDP_OK ? 14 : 0;
}

int main(int argc, char **argv)
{
    test_job job;
    if (argc > 1 && strcmp(argv[1], "--child") == 0) return child_hello();
    if (argc > 1 && strcmp(argv[1], "--child-secret") == 0) return child_secret();
    test_collectives();
    stranger_fingerprint();
    setenv("DDP_TIMEOUT", "30", 1);
    test_spawn(&job, 3, store_check, NULL);
    CHECK("mismatch.store_check", job.failed == 0, "%s", TEST_JOB_WHY(&job, codes));
    setenv("DDP_CHECK", "1", 1);
    test_spawn(&job, 2, checked_job, NULL);
    CHECK("mismatch.ddp_check_env", job.failed == 0, "%s", TEST_JOB_WHY(&job, codes));
    unsetenv("DDP_CHECK");
    test_spawn(&job, 3, settings, NULL);
    CHECK("mismatch.settings_shm_chunk", job.failed == 0 && job.seconds < 5, "%s, %.1f s",
          TEST_JOB_WHY(&job, setting_codes), job.seconds);
    test_spawn(&job, 2, refused_on_one, NULL);
    CHECK("mismatch.refused_on_one_rank_does_not_shift_the_others", job.failed == 0, "%s", TEST_JOB_WHY(&job, refused_codes));
    test_spawn(&job, 3, refused_on_one, NULL);
    CHECK("mismatch.refused_on_one_of_three", job.failed == 0, "%s", TEST_JOB_WHY(&job, refused_codes));
    {
        static const char *const helpers[] = {"metric", "metric_again", "grad", "grad_null", "grad_params", "sampler",
                                               "sampler_null", "sampler_live", "agree", "async"};
        char name[96];
        size_t i;
        for (i = 0; i < sizeof helpers / sizeof helpers[0]; i++) {
            snprintf(name, sizeof name, "mismatch.refused_on_one_rank_in_%s", helpers[i]);
            test_spawn(&job, 3, refused_in_helper, (void *)helpers[i]);
            CHECK(name, job.failed == 0, "%s", TEST_JOB_WHY(&job, helper_codes));
        }
    }
    test_spawn(&job, 2, barrier_then_refused, NULL);
    CHECK("mismatch.refused_after_a_barrier_w2", job.failed == 0, "%s", TEST_JOB_WHY(&job, meet_codes));
    test_spawn(&job, 5, barrier_then_refused, NULL);
    CHECK("mismatch.refused_after_a_barrier_w5", job.failed == 0, "%s", TEST_JOB_WHY(&job, meet_codes));
    test_spawn(&job, 2, huge_counts, NULL);
    CHECK("mismatch.counts_past_an_address_space", job.failed == 0, "%s", TEST_JOB_WHY(&job, huge_codes));
    test_spawn(&job, 3, leave_early, NULL);
    CHECK("mismatch.destroy_while_others_wait", job.failed == 0, "%s", TEST_JOB_WHY(&job, leave_codes));
    test_spawn(&job, 4, grad_layout, NULL);
    CHECK("mismatch.grad_bucket_layout", job.failed == 0, "%s", TEST_JOB_WHY(&job, grad_codes));
    test_spawn(&job, 3, grad_layout, (void *)"params");
    CHECK("mismatch.grad_params_on_one_rank", job.failed == 0, "%s", TEST_JOB_WHY(&job, grad_codes));
    test_spawn(&job, 4, agree_on, NULL);
    CHECK("mismatch.agree_on_program_settings", job.failed == 0, "%s", TEST_JOB_WHY(&job, agree_codes));
    test_spawn(&job, 3, sampler_setup, NULL);
    CHECK("mismatch.sampler_dataset_size", job.failed == 0, "%s", TEST_JOB_WHY(&job, sampler_codes));
    test_spawn(&job, 2, sampler_setup, (void *)"seed");
    CHECK("mismatch.sampler_seed", job.failed == 0, "%s", TEST_JOB_WHY(&job, sampler_codes));
    test_spawn(&job, 2, sampler_setup, (void *)"batch");
    CHECK("mismatch.sampler_batch_size_past_2_62", job.failed == 0, "%s", TEST_JOB_WHY(&job, sampler_codes));
    setenv("DDP_TIMEOUT", "1", 1);
    test_spawn(&job, 3, behind, NULL);
    CHECK("mismatch.timeout_says_where_ranks_are", job.failed == 0, "%s", TEST_JOB_WHY(&job, behind_codes));
    unsetenv("DDP_TIMEOUT");
    test_launch_refusals(argv[0]);
    test_settings();
    TEST_EXIT();
}
