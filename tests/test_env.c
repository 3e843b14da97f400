/* Where rank and world size come from: each launcher's variables, the legacy
   --local_rank argument, and clear errors for values that cannot be right. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <stdlib.h>
#include <string.h>

static const char *const all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_STEP_ID", "PMI_JOBID",
    "MPI_LOCALNRANKS", "PMI_FD", "SLURM_STEP_TASKS_PER_NODE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "DDP_BACKEND", "DDP_TIMEOUT", "DDP_JOB_ID",
    "TORCHELASTIC_RUN_ID", "DDP_SHM_CHUNK", "MPIR_CVAR_CH3_INTERFACE_HOSTNAME", "DDP_CHECK", "DDP_DEBUG", "OMP_NUM_THREADS",
    "DDP_LAUNCHER", NULL};

static void clear_env(void)
{
    int i;
    for (i = 0; all_vars[i]; i++) unsetenv(all_vars[i]);
}

/* "A=1 B=2" -> setenv each */
static void set_env(const char *spec)
{
    char buf[512], *tok, *save = NULL;
    snprintf(buf, sizeof buf, "%s", spec);
    for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        *eq = 0;
        setenv(tok, eq + 1, 1);
    }
}

static void silent(void *user, int level, const char *msg) { (void)user; (void)level; (void)msg; }

/* MASTER_PORT set to a port free now: checks whose rank 0 opens a store do not meet
   another job (or a second run of this test) on the default port. */
static void free_port(void)
{
    char v[16];
    snprintf(v, sizeof v, "%d", test_free_port());
    setenv("MASTER_PORT", v, 1);
}

/* A desc of defaults that keeps ddp.h's error lines off stderr (the checks read ddp_error). */
static ddp_desc silent_desc(void)
{
    ddp_desc d;
    memset(&d, 0, sizeof d);
    d.log = silent;
    return d;
}

/* The error line a topology that does not hold gives carries no "rank r/w": the rank
   and world are what is wrong (a stray WORLD_SIZE=8 inside a job of 2 said "rank 0/8"). */
static char logged[512];
static void keep_error(void *user, int level, const char *msg)
{
    (void)user;
    if (level == DDP_LOG_ERROR) snprintf(logged, sizeof logged, "%s", msg);
}
static void world_not_said(const char *name, const char *spec)
{
    ddp_ctx ctx;
    ddp_desc d = silent_desc();
    ddp_result r;
    d.log = keep_error;
    logged[0] = 0;
    clear_env();
    free_port();
    set_env(spec);
    r = ddp_init(&ctx, &d);
    CHECK(name, r == DDP_ERR_ENV && logged[0] && !strstr(logged, "rank "), "%s: got %s, logged '%s'", spec,
          ddp_strerror(r), logged);
    ddp_destroy(&ctx);
}

/* ddp_init must fail with `want` and a message containing `needle`. */
/* 127 bytes, and one more makes an id too long: two that differed past 127 were one job's */
#define LONG_ID "run-x0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890-"
static void bad_env(const char *name, const char *spec, ddp_result want, const char *needle)
{
    ddp_ctx ctx;
    ddp_desc d = silent_desc();
    ddp_result r;
    clear_env();
    free_port();
    set_env(spec);
    r = ddp_init(&ctx, &d);
    CHECK(name, r == want && strstr(ddp_error(&ctx), needle), "%s: got %s '%s', want %s mentioning '%s'", spec,
          ddp_strerror(r), ddp_error(&ctx), ddp_strerror(want), needle);
    ddp_destroy(&ctx);
}

/* DDP_CHECK=off is off (any non-"0" value turned the check on) */
static void switches(void)
{
    static const struct { const char *v; int on; } cases[] = {
        {"off", 0}, {"false", 0}, {"No", 0}, {"0", 0}, {"", 0}, {"1", 1}, {"TRUE", 1}, {"yes", 1}, {"on", 1}};
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ddp_ctx ctx;
        ddp_desc d = silent_desc();
        char name[64];
        ddp_result r;
        clear_env();
        setenv("DDP_CHECK", cases[i].v, 1);
        r = ddp_init(&ctx, &d);
        snprintf(name, sizeof name, "env.check_switch.%s", cases[i].v[0] ? cases[i].v : "empty");
        CHECK(name, r == DDP_OK && ctx.st->cfg.check == cases[i].on, "DDP_CHECK='%s': %s, check %d, want %d", cases[i].v,
              r == DDP_OK ? "ok" : ddp_error(&ctx), r == DDP_OK ? ctx.st->cfg.check : -1, cases[i].on);
        ddp_destroy(&ctx);
    }
}

static void legacy_argv(void)
{
    char a0[] = "prog", a1[] = "--local_rank=0", a2[] = "x", b1[] = "--local-rank", b2[] = "0";
    char *argv1[] = {a0, a1, a2, NULL}, *argv2[] = {a0, b1, b2, a2, NULL};
    int argc1 = 3, argc2 = 4;
    ddp_ctx ctx;
    ddp_desc d;
    ddp_result r;
    clear_env();
    memset(&d, 0, sizeof d);
    d.argc = &argc1;
    d.argv = argv1;
    r = ddp_init(&ctx, &d);
    CHECK("env.legacy_local_rank_removed", r == DDP_OK && argc1 == 2 && strcmp(argv1[1], "x") == 0 && !argv1[2],
          "result %s, argc %d", ddp_strerror(r), argc1);
    ddp_destroy(&ctx);
    d.argc = &argc2;
    d.argv = argv2;
    r = ddp_init(&ctx, &d);
    CHECK("env.legacy_local_dash_rank_removed", r == DDP_OK && argc2 == 2 && strcmp(argv2[1], "x") == 0,
          "result %s, argc %d", ddp_strerror(r), argc2);
    ddp_destroy(&ctx);
    { /* given twice: refused (the second went on to the program) */
        char c1[] = "--local_rank=0", c2[] = "--local_rank=3";
        char *argv3[] = {a0, c1, c2, NULL};
        int argc3 = 3;
        d.argc = &argc3;
        d.argv = argv3;
        r = ddp_init(&ctx, &d);
        CHECK("env.legacy_local_rank_twice_refused", r == DDP_ERR_ENV && strstr(ddp_error(&ctx), "--local_rank given twice (0 and 3)"),
              "result %s '%s', argc %d", ddp_strerror(r), ddp_error(&ctx), argc3);
        ddp_destroy(&ctx);
    }
    { /* past the world: named as given, in the arguments (it said "local_rank=3") */
        char c1[] = "--local-rank", c2[] = "3";
        char *argv3[] = {a0, c1, c2, NULL};
        int argc3 = 3;
        d.argc = &argc3;
        d.argv = argv3;
        r = ddp_init(&ctx, &d);
        CHECK("env.legacy_local_rank_past_the_world_named", r == DDP_ERR_ENV &&
              strstr(ddp_error(&ctx), "--local_rank=3 is outside 0..0 (world_size=1"), "result %s '%s'", ddp_strerror(r),
              ddp_error(&ctx));
        ddp_destroy(&ctx);
    }
    { /* the same in the caller's desc is a bad argument, not a bad environment */
        ddp_desc bad;
        memset(&bad, 0, sizeof bad);
        bad.world_size = 2;
        bad.rank = 2;
        r = ddp_init(&ctx, &bad);
        CHECK("env.desc_rank_past_the_world_is_a_bad_argument", r == DDP_ERR_ARG &&
              strstr(ddp_error(&ctx), "rank=2 is outside 0..1 (world_size=2, ddp_desc)"), "result %s '%s'",
              ddp_strerror(r), ddp_error(&ctx));
        ddp_destroy(&ctx);
        bad.rank = 0;
        bad.local_rank = 5;
        r = ddp_init(&ctx, &bad);
        CHECK("env.desc_local_rank_past_the_world_is_a_bad_argument", r == DDP_ERR_ARG &&
              strstr(ddp_error(&ctx), "local_rank=5 is outside 0..1"), "result %s '%s'", ddp_strerror(r), ddp_error(&ctx));
        ddp_destroy(&ctx);
    }
    { /* after "--" the arguments are the program's: left alone (a local rank of 3 failed init) */
        char c1[] = "--", c2[] = "--local_rank", c3[] = "3";
        char *argv3[] = {a0, c1, c2, c3, NULL};
        int argc3 = 4;
        d.argc = &argc3;
        d.argv = argv3;
        r = ddp_init(&ctx, &d);
        CHECK("env.legacy_local_rank_after_double_dash_left", r == DDP_OK && argc3 == 4 && strcmp(argv3[2], "--local_rank") == 0,
              "result %s '%s', argc %d", ddp_strerror(r), ddp_error(&ctx), argc3);
        ddp_destroy(&ctx);
    }
}

/* ---- multi-process: the launchers' own variables ----
   Each child (started by test_spawn with torchrun's variables) clears them, sets
   one launcher's variables instead, inits, and checks the context. */
static const char *const child_codes[] = {
    [1] = "wrong topology or all-reduce result (its line on stderr says which)", [10] = "init failed"};

/* what mpirun's and mpiexec's ranks inherit from the step that srun made for their daemons */
#define SLURM_DAEMON_STEP "SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_JOB_ID=77 SLURM_STEP_ID=1"

static int child(int rank, void *arg)
{
    const char *which = (const char *)arg;
    int world = atoi(getenv("WORLD_SIZE")), port = atoi(getenv("MASTER_PORT"));
    char spec[512];
    ddp_ctx ctx;
    ddp_desc d;
    int want_local = rank, want_local_world = world, want_node = 0, ok;
    char a0[] = "prog", a1[32];
    char *argv[] = {a0, a1, NULL};
    int argc = 2;
    clear_env();
    snprintf(a1, sizeof a1, "--local_rank=%d", rank);
    memset(&d, 0, sizeof d);
    if (strcmp(which, "torchrun") == 0)
        snprintf(spec, sizeof spec, "RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d GROUP_RANK=0", rank, world, rank, world);
    else if (strcmp(which, "torchrun_two_nodes_one_host") == 0) { /* torchrun --nnodes=2 twice, as a rehearsal on one machine */
        want_local = rank % 2;
        want_local_world = 2;
        want_node = rank / 2;
        snprintf(spec, sizeof spec, "RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=2 GROUP_RANK=%d TORCHELASTIC_RUN_ID=none",
                 rank, world, rank % 2, rank / 2);
    }
    else if (strcmp(which, "torch.distributed.launch") == 0) {
        snprintf(spec, sizeof spec, "RANK=%d WORLD_SIZE=%d", rank, world);
        d.argc = &argc;
        d.argv = argv;
    } else if (strcmp(which, "slurm") == 0)
        snprintf(spec, sizeof spec, "SLURM_PROCID=%d SLURM_NTASKS=%d SLURM_LOCALID=%d SLURM_NODEID=0 SLURM_JOB_ID=77 SLURM_STEP_ID=0", rank, world, rank);
    else if (strcmp(which, "openmpi") == 0)
        snprintf(spec, sizeof spec, "OMPI_COMM_WORLD_RANK=%d OMPI_COMM_WORLD_SIZE=%d", rank, world); /* local: derived */
    else if (strcmp(which, "openmpi_inside_slurm") == 0) /* mpirun's daemons were a Slurm step of one task */
        snprintf(spec, sizeof spec, "OMPI_COMM_WORLD_RANK=%d OMPI_COMM_WORLD_SIZE=%d " SLURM_DAEMON_STEP, rank, world);
    else if (strcmp(which, "hydra_inside_slurm") == 0)
        snprintf(spec, sizeof spec, "PMI_RANK=%d PMI_SIZE=%d MPI_LOCALRANKID=%d MPI_LOCALNRANKS=%d " SLURM_DAEMON_STEP,
                 rank, world, rank, world);
    else if (strcmp(which, "srun_pmi2") == 0) /* srun --mpi=pmi2: PMI-2 on PMI_FD, which ddp.h must not speak to */
        snprintf(spec, sizeof spec, "SLURM_PROCID=%d SLURM_NTASKS=%d SLURM_LOCALID=%d SLURM_NODEID=0 SLURM_JOB_ID=78 "
                 "SLURM_STEP_ID=2 SLURM_STEP_TASKS_PER_NODE=%d PMI_RANK=%d PMI_SIZE=%d PMI_JOBID=78.2 PMI_FD=99",
                 rank, world, rank, world, rank, world);
    else
        snprintf(spec, sizeof spec, "PMI_RANK=%d PMI_SIZE=%d MPI_LOCALRANKID=%d", rank, world, rank);
    set_env(spec);
    /* under torchrun's run id the store takes MASTER_PORT + 1: the port found free */
    snprintf(spec, sizeof spec, "MASTER_ADDR=127.0.0.1 MASTER_PORT=%d DDP_TIMEOUT=20",
             getenv("TORCHELASTIC_RUN_ID") ? port - 1 : port);
    set_env(spec);
    if (ddp_init(&ctx, &d) != DDP_OK) return 10;
    ok = ctx.rank == rank && ctx.world_size == world && ctx.local_rank == want_local &&
         ctx.local_world_size == want_local_world && ctx.node_rank == want_node && ctx.num_nodes == 1 &&
         ctx.backend == DDP_BACKEND_CPU && (d.argc == NULL || argc == 1);
    if (!ok)
        fprintf(stderr, "%s rank %d: got rank %d/%d local %d/%d node %d/%d argc %d\n", which, rank, ctx.rank,
                ctx.world_size, ctx.local_rank, ctx.local_world_size, ctx.node_rank, ctx.num_nodes, argc);
    {
        int x = rank + 1;
        ok &= ddp_all_reduce(&ctx, &x, &x, 1, DDP_I32, DDP_SUM, NULL) == DDP_OK && x == world * (world + 1) / 2;
    }
    ddp_destroy(&ctx);
    return ok ? 0 : 1;
}

/* Two ranks on this host whose launcher's variables do not fit together: both stop at
   ddp_init naming what, never a job with two local rank 0s or the wrong local world. */
static int misfit_child(int rank, void *arg)
{
    const char *which = (const char *)arg;
    int port = atoi(getenv("MASTER_PORT"));
    char spec[300];
    ddp_ctx ctx;
    ddp_desc d = silent_desc();
    ddp_result r;
    int ok;
    clear_env();
    if (strcmp(which, "same_local_rank") == 0) /* no node given: the host is the node */
        snprintf(spec, sizeof spec, "RANK=%d WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2", rank);
    else if (strcmp(which, "same_local_rank_on_a_node") == 0)
        snprintf(spec, sizeof spec, "RANK=%d WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=%d", rank, rank / 2);
    else /* "local_world_too_small": node 0 has both ranks */
        snprintf(spec, sizeof spec, "RANK=%d WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 GROUP_RANK=0", rank);
    set_env(spec);
    snprintf(spec, sizeof spec, "MASTER_ADDR=127.0.0.1 MASTER_PORT=%d DDP_TIMEOUT=3", port);
    set_env(spec);
    r = ddp_init(&ctx, &d);
    ok = r == DDP_ERR_ENV && !strchr(ddp_error(&ctx), '\n') &&
         strstr(ddp_error(&ctx), strcmp(which, "same_local_rank") == 0 ? "ranks 0 and 1 both have local rank 0 on host 0"
                                 : strcmp(which, "local_world_too_small") == 0
                                     ? "rank 0 has a local world of 1, but 2 ranks are on its node 0"
                                     : "both have local rank 0 on node ");
    if (!ok) fprintf(stderr, "%s rank %d: %s '%s'\n", which, rank, ddp_strerror(r), ddp_error(&ctx));
    ddp_destroy(&ctx);
    return ok ? 0 : 1;
}

/* Runs fn in `world` ranks of one job: the check passes when every rank returns 0. */
static void job_check(const char *name, int world, int (*fn)(int, void *), const char *which, const char *failed)
{
    test_job job;
    test_spawn(&job, world, fn, (void *)which);
    CHECK(name, job.failed == 0, "%d of %d ranks %s: %s", job.failed, world, failed, TEST_JOB_WHY(&job, child_codes));
}

static void misfit(const char *which, int world)
{
    char name[96];
    snprintf(name, sizeof name, "env.misfit.%s", which);
    job_check(name, world, misfit_child, which, "did not stop with the one-line error");
}

/* Two launchers' variables at once, or values that cannot be: one line at ddp_init. */
static void launcher_conflicts(void)
{
    ddp_ctx ctx;
    ddp_desc d;
    ddp_result r;
    char a0[] = "prog", a1[] = "--local_rank=1";
    char *argv[] = {a0, a1, NULL};
    int argc = 2;
    d = silent_desc();
    /* an empty value counts as unset: it does not hide the launcher that started the rank */
    bad_env("env.empty_RANK_leaves_open_mpis_world", "RANK= OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 "
            "MASTER_ADDR=127.0.0.1 DDP_TIMEOUT=0.3", DDP_ERR_TIMEOUT, "rank 1 never joined");
    bad_env("env.empty_WORLD_SIZE_leaves_slurms_world", "WORLD_SIZE= SLURM_JOB_ID=5 SLURM_STEP_ID=0 SLURM_PROCID=0 "
            "SLURM_NTASKS=2 MASTER_ADDR=127.0.0.1 DDP_TIMEOUT=0.3", DDP_ERR_TIMEOUT, "rank 1 never joined");
    /* local ranks that do not fit, by the variables' names (they said "local world size -1") */
    bad_env("env.local_rank_past_the_world_named", "RANK=0 WORLD_SIZE=1 LOCAL_RANK=5", DDP_ERR_ENV,
            "LOCAL_RANK=5 is outside 0..0 (WORLD_SIZE=1, torchrun)");
    bad_env("env.local_world_past_the_world_named", "RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1",
            DDP_ERR_ENV, "LOCAL_WORLD_SIZE=3 is more than WORLD_SIZE=2 (torchrun)");
    /* torchrun's store takes MASTER_PORT + 1: 0 gave port 1, -1 was said as 0 */
    bad_env("env.master_port_0_under_torchrun", "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=0 "
            "TORCHELASTIC_RUN_ID=x", DDP_ERR_ENV, "MASTER_PORT=0 is not a TCP port");
    bad_env("env.master_port_negative_said_as_set", "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=-1 "
            "TORCHELASTIC_RUN_ID=x", DDP_ERR_ENV, "MASTER_PORT=-1 is not a TCP port");
    /* libgomp crashed (SIGSEGV) at the first parallel region with 99999 threads */
    bad_env("env.absurd_OMP_NUM_THREADS", "OMP_NUM_THREADS=99999", DDP_ERR_ENV,
            "OMP_NUM_THREADS=99999 is more threads than this machine takes");
    /* a timeout under a tenth of a second is said as it is (it was "0.0 s") */
    bad_env("env.short_timeout_said_as_set", "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 DDP_TIMEOUT=0.005", DDP_ERR_TIMEOUT,
            "timed out after 0.005 s");
    /* torchrun's names for one node inside mpirun or srun of several tasks: each task alone */
    bad_env("env.leftover_world_of_one_inside_mpirun", "RANK=0 WORLD_SIZE=1 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2",
            DDP_ERR_ENV, "WORLD_SIZE=1 (one node of torchrun's) inside a job of 2 tasks started by Open MPI: each task "
            "would train alone");
    /* ddp's launcher around mpirun: its ranks' names are torchrun's, but torchrun did not set them */
    bad_env("env.ddp_launcher_around_mpirun", "RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 DDP_LAUNCHER=1 "
            "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2", DDP_ERR_ENV,
            "ddp's launcher started Open MPI, whose 2 tasks share one RANK=0: start the ranks with one launcher");
    bad_env("env.torchrun_of_one_node_per_srun_task", "RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 SLURM_JOB_ID=5 "
            "SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_NTASKS=2 DDP_TIMEOUT=0.3", DDP_ERR_ENV, "inside a job of 2 tasks started by Slurm");
    /* a real torchrun per srun task (a sweep) makes separate jobs, and torchrun across the
       nodes of an srun step one job: either way rank 1 only looks for its rank 0's store */
    bad_env("env.torchrun_per_srun_task_is_a_sweep", "RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=sweep1 "
            "SLURM_JOB_ID=5 SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_NTASKS=2 MASTER_ADDR=127.0.0.1 DDP_TIMEOUT=0.3",
            DDP_ERR_TIMEOUT, "rank 0's store");
    bad_env("env.torchrun_across_srun_nodes_is_one_job", "RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 LOCAL_RANK=1 GROUP_RANK=0 "
            "SLURM_JOB_ID=5 SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_NTASKS=2 MASTER_ADDR=127.0.0.1 DDP_TIMEOUT=0.3",
            DDP_ERR_TIMEOUT, "rank 0's store");
    bad_env("env.shm_chunk_negative_refused", "DDP_SHM_CHUNK=-18446744073709551552", DDP_ERR_ENV,
            "DDP_SHM_CHUNK='-18446744073709551552' must be a byte count");
    bad_env("env.check_neither_on_nor_off", "DDP_CHECK=garbage", DDP_ERR_ENV, "DDP_CHECK='garbage' is neither on");
    bad_env("env.debug_neither_on_nor_off", "DDP_DEBUG=2", DDP_ERR_ENV, "DDP_DEBUG='2' is neither on");
    switches();
    bad_env("env.job_id_past_127_bytes", "DDP_JOB_ID=" LONG_ID "a DDP_TIMEOUT=0.3", DDP_ERR_ENV,
            "the job id from DDP_JOB_ID is longer than 127 bytes");
    bad_env("env.torchrun_run_id_past_127_bytes", "RANK=0 WORLD_SIZE=1 TORCHELASTIC_RUN_ID=" LONG_ID "b DDP_TIMEOUT=0.3",
            DDP_ERR_ENV, "the job id from TORCHELASTIC_RUN_ID is longer than 127 bytes");
    bad_env("env.world_past_what_ddp_takes", "RANK=0 WORLD_SIZE=2147483647 DDP_TIMEOUT=0.3", DDP_ERR_ENV,
            "WORLD_SIZE=2147483647 is more ranks than ddp.h takes");
    bad_env("env.local_world_zero", "RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=0 DDP_TIMEOUT=0.3", DDP_ERR_ENV,
            "LOCAL_WORLD_SIZE=0 does not fit a world of 2 (torchrun)");
    bad_env("env.local_rank_negative", "RANK=0 WORLD_SIZE=2 LOCAL_RANK=-7 DDP_TIMEOUT=0.3", DDP_ERR_ENV, "LOCAL_RANK=-7 does not fit");
    bad_env("env.node_past_world", "RANK=0 WORLD_SIZE=2 GROUP_RANK=7 DDP_TIMEOUT=0.3", DDP_ERR_ENV, "GROUP_RANK=7 does not fit a world of 2");
    bad_env("env.local_rank_past_world", "RANK=0 WORLD_SIZE=2 LOCAL_RANK=5 DDP_TIMEOUT=0.3", DDP_ERR_ENV, "LOCAL_RANK=5 is outside 0..1");
    /* torch.distributed.launch's --local_rank against torchrun's LOCAL_RANK */
    clear_env();
    set_env("RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 DDP_TIMEOUT=0.3");
    d.argc = &argc;
    d.argv = argv;
    r = ddp_init(&ctx, &d);
    CHECK("env.argv_local_rank_against_LOCAL_RANK", r == DDP_ERR_ENV && strstr(ddp_error(&ctx), "--local_rank 1 in the "
          "arguments, but LOCAL_RANK=0 (torchrun)"), "%s: %s", ddp_strerror(r), ddp_error(&ctx));
    ddp_destroy(&ctx);
    misfit("same_local_rank", 2);
    misfit("same_local_rank_on_a_node", 4);
    misfit("local_world_too_small", 2);
}

/* A program that never calls ddp_launch hears that it ignores --nproc (as info, not an
   error); not of arguments after "--", which are the program's own, or of other flags. */
static char warned[400];
static void keep_warning(void *user, int level, const char *msg)
{
    (void)user;
    if (level == DDP_LOG_INFO && strstr(msg, "warning")) snprintf(warned, sizeof warned, "%s", msg);
}

static void nproc_warning(void)
{
    static const struct { const char *name, *a1, *a2; int warns; } cases[] = {
        {"env.nproc_warning", "--nproc", "2", 1},
        {"env.nproc_per_node_warning", "--nproc_per_node=2", "x", 1},
        {"env.nproc_after_double_dash_no_warning", "--", "--nproc", 0},
        {"env.nprocs_no_warning", "--nprocs", "2", 0},
    };
    int i;
    for (i = 0; i < TEST_COUNT(cases); i++) {
        char a0[] = "prog", a1[40], a2[40];
        char *argv[] = {a0, a1, a2, NULL};
        int argc = 3;
        ddp_ctx ctx;
        ddp_desc d;
        ddp_result r;
        snprintf(a1, sizeof a1, "%s", cases[i].a1);
        snprintf(a2, sizeof a2, "%s", cases[i].a2);
        memset(&d, 0, sizeof d);
        d.argc = &argc;
        d.argv = argv;
        d.log = keep_warning;
        warned[0] = 0;
        clear_env();
        r = ddp_init(&ctx, &d);
        CHECK(cases[i].name, r == DDP_OK && (cases[i].warns ? strstr(warned, "does not call ddp_launch") != NULL : !warned[0]),
              "%s %s: %s, logged '%s'", cases[i].a1, cases[i].a2, ddp_strerror(r), warned);
        ddp_destroy(&ctx);
    }
}

/* A desc with a local world: local ranks default to rank % local_world_size (two hosts
   of two rehearsed on one: rank 2 is local rank 0). */
static int desc_child(int rank, void *arg)
{
    int port = atoi(getenv("MASTER_PORT")), ok;
    char spec[100];
    ddp_ctx ctx;
    ddp_desc d;
    (void)arg;
    clear_env();
    snprintf(spec, sizeof spec, "MASTER_ADDR=127.0.0.1 MASTER_PORT=%d DDP_TIMEOUT=20", port);
    set_env(spec);
    memset(&d, 0, sizeof d);
    d.world_size = 4;
    d.rank = rank;
    d.local_world_size = 2;
    if (ddp_init(&ctx, &d) != DDP_OK) return 10;
    ok = ctx.local_rank == rank % 2 && ctx.local_world_size == 2;
    if (!ok) fprintf(stderr, "desc rank %d: local %d/%d\n", rank, ctx.local_rank, ctx.local_world_size);
    ddp_destroy(&ctx);
    return ok ? 0 : 1;
}

static void launcher(const char *which, int world)
{
    char name[96];
    snprintf(name, sizeof name, "env.%s.world%d", which, world);
    job_check(name, world, child, which, "saw the wrong topology or failed");
}

/* A stand-in for Hydra's PMI-1 server on one end of a socketpair: it answers init and
   get_my_kvsname, then put, barrier_in and get as `how` says ("ok" with `value` for the
   get, "refuse" the put, "silent" at the barrier, "close" at the barrier, "missing" the
   key), and keeps every command it was sent. */
typedef struct {
    int fd;
    const char *how, *value;
    char log[2048];
} fake_hydra;

static void *fake_hydra_serve(void *arg)
{
    fake_hydra *h = (fake_hydra *)arg;
    char line[512], answer[600];
    size_t got = 0;
    while (got + 1 < sizeof line && read(h->fd, line + got, 1) == 1) {
        if (line[got++] != '\n') continue;
        line[got] = 0;
        got = 0;
        if (strlen(h->log) + strlen(line) < sizeof h->log) strcat(h->log, line);
        answer[0] = 0;
        if (!strncmp(line, "cmd=init", 8)) strcpy(answer, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
        else if (!strncmp(line, "cmd=get_my_kvsname", 18)) strcpy(answer, "cmd=my_kvsname kvsname=kvs_77_0\n");
        else if (!strncmp(line, "cmd=put", 7))
            strcpy(answer, strcmp(h->how, "refuse") ? "cmd=put_result rc=0 msg=success\n" : "cmd=put_result rc=-1 msg=full\n");
        else if (!strncmp(line, "cmd=barrier_in", 14)) {
            if (!strcmp(h->how, "silent")) continue;
            if (!strcmp(h->how, "close")) break;
            strcpy(answer, "cmd=barrier_out\n");
        } else if (!strncmp(line, "cmd=get ", 8)) {
            if (strcmp(h->how, "missing")) snprintf(answer, sizeof answer, "cmd=get_result rc=0 msg=success value=%s\n", h->value);
            else strcpy(answer, "cmd=get_result rc=-1 msg=key_ddp-master_not_found value=unknown\n");
        } else if (!strncmp(line, "cmd=finalize", 12)) strcpy(answer, "cmd=finalize_ack\n");
        if (answer[0] && write(h->fd, answer, strlen(answer)) < 0) break;
    }
    close(h->fd);
    return NULL;
}

/* Under Hydra across hosts with no MASTER_ADDR, rank 0 puts its host's name in Hydra's
   key-value space and every rank reads it after PMI's barrier; each way that exchange
   can fail is one line. Rank `rank` of 2, one per host; `env` adds variables; ddp_init
   must fail with `want` (-1: any failure) and `needle` (no second rank ever comes), the
   server must have been sent `sent` and not `unsent`. */
static void hydra_pmi(const char *name, int rank, const char *env, const char *how, const char *value, ddp_result want,
                      const char *needle, const char *sent, const char *unsent)
{
    fake_hydra h;
    pthread_t t;
    int sv[2];
    char spec[300];
    ddp_ctx ctx;
    ddp_desc d;
    ddp_result r;
    double start = test_now_s();
    memset(&h, 0, sizeof h);
    d = silent_desc();
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        CHECK(name, 0, "socketpair: %s", strerror(errno));
        return;
    }
    h.fd = sv[1];
    h.how = how;
    h.value = value;
    pthread_create(&t, NULL, fake_hydra_serve, &h);
    clear_env();
    free_port();
    snprintf(spec, sizeof spec, "PMI_RANK=%d PMI_SIZE=2 MPI_LOCALRANKID=0 MPI_LOCALNRANKS=1 PMI_FD=%d DDP_TIMEOUT=0.3 %s",
             rank, sv[0], env);
    set_env(spec);
    r = ddp_init(&ctx, &d);
    CHECK(name, ((int)want < 0 ? r != DDP_OK : r == want) && strstr(ddp_error(&ctx), needle) &&
          !strchr(ddp_error(&ctx), '\n') && test_now_s() - start < 10, "got %s '%s' after %.1f s, want %s mentioning '%s'",
          ddp_strerror(r), ddp_error(&ctx), test_now_s() - start, ddp_strerror(want), needle);
    ddp_destroy(&ctx);
    close(sv[0]);
    pthread_join(t, NULL);
    CHECK(name, strstr(h.log, sent) && !(unsent && strstr(h.log, unsent)), "Hydra was sent '%s', want '%s'%s%s", h.log,
          sent, unsent ? " and not " : "", unsent ? unsent : "");
}

static void hydra_across_hosts(void)
{
    char host[256] = "", sent[400];
    /* rank 0 publishes Hydra's name for its host, then serves the store there (alone: rank 1 never joins) */
    hydra_pmi("env.hydra_rank0_puts_its_host", 0, "MPIR_CVAR_CH3_INTERFACE_HOSTNAME=127.0.0.1", "ok", "127.0.0.1",
              DDP_ERR_TIMEOUT, "rank 1 never joined", "cmd=put kvsname=kvs_77_0 key=ddp-master value=127.0.0.1\n"
              "cmd=barrier_in\ncmd=get kvsname=kvs_77_0 key=ddp-master\n", NULL);
    /* without Hydra's name for the host, rank 0 puts gethostname's (where the store goes
       then depends on this machine's names: any failure) */
    if (gethostname(host, sizeof host - 1) == 0 && host[0] && !host[strcspn(host, " =")]) {
        snprintf(sent, sizeof sent, "key=ddp-master value=%s\ncmd=barrier_in\n", host);
        hydra_pmi("env.hydra_rank0_puts_gethostname", 0, "", "ok", host, (ddp_result)-1, "", sent, NULL);
    }
    /* rank 1 reaches for the store where rank 0 said (nobody listens on 127.0.0.9) */
    hydra_pmi("env.hydra_rank1_reads_rank0s_host", 1, "", "ok", "127.0.0.9", DDP_ERR_TIMEOUT, "store at 127.0.0.9:",
              "cmd=barrier_in\ncmd=get kvsname=kvs_77_0 key=ddp-master\n", "cmd=put");
    hydra_pmi("env.hydra_master_addr_wins", 1, "MASTER_ADDR=127.0.0.9", "ok", "127.0.0.5", DDP_ERR_TIMEOUT,
              "store at 127.0.0.9:", "get_my_kvsname", "barrier_in");
    hydra_pmi("env.hydra_host_name_with_an_equals_sign", 0, "MPIR_CVAR_CH3_INTERFACE_HOSTNAME=h1=b", "ok", "x", DDP_ERR_ENV,
              "cannot be passed on", "get_my_kvsname", "cmd=put");
    hydra_pmi("env.hydra_put_refused", 0, "MPIR_CVAR_CH3_INTERFACE_HOSTNAME=h1", "refuse", "x", DDP_ERR_ENV,
              "Hydra's PMI refused rank 0's host: 'cmd=put_result rc=-1 msg=full'", "cmd=put", "barrier_in");
    hydra_pmi("env.hydra_barrier_times_out", 1, "", "silent", "x", DDP_ERR_TIMEOUT,
              "timed out after 0.3 s in Hydra's PMI barrier", "barrier_in", "cmd=get ");
    hydra_pmi("env.hydra_barrier_connection_lost", 1, "", "close", "x", DDP_ERR_ENV,
              "Hydra's PMI barrier, where every rank learns rank 0's host, failed", "barrier_in", "cmd=get ");
    hydra_pmi("env.hydra_key_missing", 1, "", "missing", "x", DDP_ERR_ENV, "rank 0's host is not in Hydra's PMI: "
              "'cmd=get_result rc=-1 msg=key_ddp-master_not_found value=unknown'", "cmd=get ", NULL);
}

/* ddp_thread_share: OMP_NUM_THREADS first, else the host's cores shared by its ranks,
   else (a rank bound to its own cores) all of those. */
static void thread_share(void)
{
    ddp_ctx c;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned long one = 1, all[64];
    long got;
    memset(&c, 0, sizeof c);
    c.world_size = c.local_world_size = 2;
    setenv("OMP_NUM_THREADS", "3", 1);
    CHECK("env.thread_share_is_OMP_NUM_THREADS", ddp_thread_share(&c) == 3, "got %d", ddp_thread_share(&c));
    setenv("OMP_NUM_THREADS", "5,2", 1); /* OpenMP's nested form: the outer level */
    CHECK("env.thread_share_nested_OMP_NUM_THREADS", ddp_thread_share(&c) == 5, "got %d", ddp_thread_share(&c));
    unsetenv("OMP_NUM_THREADS");
    got = syscall(SYS_sched_getaffinity, 0, sizeof all, all);
    if (got > 0 && online > 1 && ddp__cores_allowed() == online) {
        CHECK("env.thread_share_divides_the_host", ddp_thread_share(&c) == (online / 2 > 1 ? online / 2 : 1),
              "got %d of %ld cores for 2 ranks", ddp_thread_share(&c), online);
        c.local_world_size = (int)online * 4;
        CHECK("env.thread_share_at_least_one", ddp_thread_share(&c) == 1, "got %d", ddp_thread_share(&c));
        c.local_world_size = 2;
        if (syscall(SYS_sched_setaffinity, 0, sizeof one, &one) == 0) { /* bound to CPU 0, as mpirun would */
            CHECK("env.thread_share_of_a_bound_rank", ddp_thread_share(&c) == 1, "got %d", ddp_thread_share(&c));
            syscall(SYS_sched_setaffinity, 0, (size_t)got, all);
        }
    } else {
        test_skip("env.thread_share_divides_the_host", "one core, or this process is already bound to some");
    }
}

/* The NCCL backend's choice of GPU (ddp__device_for), as launchers hand out GPUs. */
static void device_rule(void)
{
    static const struct { const char *name; int local_rank, visible, want; } cases[] = {
        {"one_visible_is_used_by_local_rank_0", 0, 1, 0},
        {"one_visible_is_used_by_local_rank_5", 5, 1, 0}, /* Slurm's per-task binding */
        {"local_rank_picks_among_8", 3, 8, 3},
        {"last_of_8", 7, 8, 7},
        {"local_rank_past_2_visible", 2, 2, -1},
        {"local_rank_past_4_visible", 5, 4, -1},
    };
    char why[300], name[96];
    int i, got;
    for (i = 0; i < TEST_COUNT(cases); i++) {
        why[0] = 0;
        got = ddp__device_for(cases[i].local_rank, cases[i].visible, "0,1", why, sizeof why);
        snprintf(name, sizeof name, "env.device.%s", cases[i].name);
        if (cases[i].want >= 0)
            CHECK(name, got == cases[i].want, "local rank %d, %d visible: GPU %d, want %d", cases[i].local_rank,
                  cases[i].visible, got, cases[i].want);
        else /* a one-line error naming the counts and CUDA_VISIBLE_DEVICES */
            CHECK(name, got == -1 && strstr(why, "CUDA_VISIBLE_DEVICES='0,1'") && !strchr(why, '\n') &&
                  strstr(why, cases[i].visible == 2 ? "2 are visible" : "4 are visible"),
                  "local rank %d, %d visible: GPU %d, '%s'", cases[i].local_rank, cases[i].visible, got, why);
    }
    why[0] = 0;
    got = ddp__device_for(3, 2, NULL, why, sizeof why);
    CHECK("env.device.unset_visible_devices_named", got == -1 && strstr(why, "CUDA_VISIBLE_DEVICES=unset"), "'%s'", why);
}

int main(void)
{
    ddp_ctx ctx;
    ddp_desc quiet;
    ddp_result r;
    memset(&quiet, 0, sizeof quiet);
    quiet.log = silent;
    thread_share();
    /* nothing set: a world of one, no networking */
    clear_env();
    r = ddp_init(&ctx, NULL);
    CHECK("env.nothing_set_is_world_of_one", r == DDP_OK && ctx.world_size == 1 && ctx.rank == 0 &&
          ctx.local_rank == 0 && ctx.backend == DDP_BACKEND_CPU, "result %s", ddp_strerror(r));
    ddp_destroy(&ctx);
    bad_env("env.rank_beyond_world", "RANK=4 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1", DDP_ERR_ENV, "RANK=4");
    world_not_said("env.stray_world_size_not_said_as_the_world", "WORLD_SIZE=8");
    world_not_said("env.stray_rank_not_said_as_the_rank", "RANK=1");
    world_not_said("env.rank_not_a_number_not_said_as_a_rank", "RANK=abc WORLD_SIZE=2");
    world_not_said("env.rank_beyond_world_not_said_as_a_rank", "RANK=5 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1");
    bad_env("env.rank_not_a_number", "RANK=one WORLD_SIZE=2", DDP_ERR_ENV, "RANK='one'");
    bad_env("env.rank_without_world", "RANK=0", DDP_ERR_ENV, "WORLD_SIZE");
    bad_env("env.world_zero", "RANK=0 WORLD_SIZE=0", DDP_ERR_ENV, "WORLD_SIZE=0");
    bad_env("env.missing_master_addr", "RANK=0 WORLD_SIZE=2", DDP_ERR_ENV, "MASTER_ADDR");
    /* rank 0 alone on loopback in a job of two hosts: the reason its peers may never come */
    bad_env("env.loopback_store_across_hosts_named", "RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 "
            "DDP_TIMEOUT=0.3", DDP_ERR_TIMEOUT, "rank 1 never joined: the store listens on 127.0.0.1 "
            "(MASTER_ADDR=127.0.0.1), a loopback address that ranks on other hosts cannot reach");
    clear_env();
    free_port();
    set_env("RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 DDP_TIMEOUT=0.3");
    r = ddp_init(&ctx, &quiet);
    CHECK("env.loopback_store_on_one_host_not_named", r == DDP_ERR_TIMEOUT && strstr(ddp_error(&ctx), "never joined") &&
          !strstr(ddp_error(&ctx), "loopback"), "%s: %s", ddp_strerror(r), ddp_error(&ctx));
    ddp_destroy(&ctx);
    bad_env("env.bad_master_port", "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=70000", DDP_ERR_ENV, "MASTER_PORT=70000");
    bad_env("env.master_port_not_a_number", "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=x", DDP_ERR_ENV, "MASTER_PORT='x'");
    bad_env("env.slurm_rank_beyond", "SLURM_PROCID=5 SLURM_NTASKS=2 SLURM_STEP_ID=0", DDP_ERR_ENV, "SLURM_PROCID=5");
    /* outside a step Slurm's count is the allocation's, not this process's */
    bad_env("env.slurm_batch_script_says_srun", "SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=4", DDP_ERR_ENV,
            "batch script or salloc's shell (SLURM_NTASKS=4, no SLURM_STEP_ID), which run once: start the ranks with srun");
    bad_env("env.salloc_shell_says_srun", "SLURM_JOB_ID=7 SLURM_NTASKS=3", DDP_ERR_ENV, "start the ranks with srun");
    clear_env();
    set_env("SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=1");
    r = ddp_init(&ctx, NULL);
    CHECK("env.slurm_batch_script_of_one_task_is_world_of_one", r == DDP_OK && ctx.world_size == 1, "result %s: %s",
          ddp_strerror(r), ddp_error(&ctx));
    ddp_destroy(&ctx);
    bad_env("env.openmpi_size_not_a_number", "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=abc", DDP_ERR_ENV,
            "OMPI_COMM_WORLD_SIZE='abc'");
    bad_env("env.pmi_negative_rank", "PMI_RANK=-1 PMI_SIZE=2", DDP_ERR_ENV, "PMI_RANK=-1");
    bad_env("env.local_rank_beyond_local_world", "RANK=0 WORLD_SIZE=3 LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 "
            "MASTER_ADDR=127.0.0.1 DDP_TIMEOUT=0.3", DDP_ERR_ENV, "LOCAL_RANK=2 is outside 0..1 (LOCAL_WORLD_SIZE=2");
    bad_env("env.unknown_backend", "DDP_BACKEND=gpu", DDP_ERR_ENV, "DDP_BACKEND='gpu' is not a backend (cpu, nccl, mpi)");
    bad_env("env.hex_timeout", "DDP_TIMEOUT=0x10", DDP_ERR_ENV, "DDP_TIMEOUT='0x10'");
    bad_env("env.torchrun_port_65535", "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=65535 TORCHELASTIC_RUN_ID=x",
            DDP_ERR_ENV, "MASTER_PORT=65535: under torchrun the store takes MASTER_PORT+1");
#ifndef DDP_NCCL
    bad_env("env.nccl_not_built", "DDP_BACKEND=nccl", DDP_ERR_BACKEND, "without it");
#endif
    bad_env("env.bad_timeout", "DDP_TIMEOUT=-3", DDP_ERR_ENV, "DDP_TIMEOUT='-3'");
    legacy_argv();
    launcher("torchrun", 3);
    launcher("torchrun_two_nodes_one_host", 4);
    launcher("torch.distributed.launch", 2);
    launcher("slurm", 4);
    launcher("openmpi", 3);
    launcher("mpich", 5);
    launcher("openmpi_inside_slurm", 3);
    launcher("hydra_inside_slurm", 4);
    launcher("srun_pmi2", 3);
    hydra_across_hosts();
    launcher_conflicts();
    nproc_warning();
    job_check("env.desc_local_rank_defaults_to_rank_mod_local_world", 4, desc_child, NULL, "saw other local ranks");
    device_rule();
    TEST_EXIT();
}
