/* Two identical launches on one port never merge: no rank ever gets DDP_OK with the
   other job's data. Each job's ranks contribute a value of their own (1 for job A,
   1000 for job B) to one all-reduce, so a merged job shows in its sum. Hand-launched
   jobs (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, no job id, as a shell loop or a
   course's lab script starts them) are started in every order, at once or with the
   gaps of the shell lines; then two `mpiexec.hydra` launches at once, where
   MPICH is installed. What must hold in each interleaving: a rank whose all-reduce
   returns DDP_OK has its own job's sum (the guarantee README "Security model" states).
   The interleavings not run here are those it names as undetectable: one launch's
   rank joining and finishing the other's job before any other process of either
   launch reaches the port. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <stdlib.h>
#include <string.h>

enum { OWN = 0, FAILED = 1, MERGED = 2 };

/* One rank: its all-reduce is its own job's sum (OWN), fails (FAILED), or returns DDP_OK
   with another job's data in it (MERGED). */
static int one_rank(long long value)
{
    ddp_ctx ctx;
    ddp_desc d;
    long long x = value;
    ddp_result r;
    memset(&d, 0, sizeof d);
    if (ddp_init(&ctx, &d) != DDP_OK) return FAILED;
    r = ddp_all_reduce(&ctx, &x, &x, 1, DDP_I64, DDP_SUM, NULL);
    ddp_destroy(&ctx);
    if (r != DDP_OK) return FAILED;
    return x == value * ctx.world_size ? OWN : MERGED;
}

/* ---- hand-launched: 2 W processes, started in `order` with gaps of gap_ms ---------- */
typedef struct launch { int world, order[10], gap_ms[10]; const char *what; } launch;

/* Process i is rank i % W of job i / W (0: A, 1: B). Starts each on its turn; fills
   status[] with OWN, FAILED or MERGED. */
static void run_launch(const launch *l, int port, int *status)
{
    int go[10][2], i, n = 2 * l->world;
    pid_t pid[10];
    fflush(NULL);
    for (i = 0; i < n; i++) {
        if (pipe(go[i]) != 0) { status[i] = -1; continue; }
        if ((pid[i] = fork()) == 0) {
            char v[32], b;
            int k, devnull = open("/dev/null", O_WRONLY);
            for (k = 0; k <= i; k++) close(go[k][1]);
            dup2(devnull, 2); /* the refusals and collisions say why on stderr: not needed here */
            snprintf(v, sizeof v, "%d", i % l->world);
            setenv("RANK", v, 1);
            setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", l->world);
            setenv("WORLD_SIZE", v, 1);
            setenv("LOCAL_WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", port);
            setenv("MASTER_PORT", v, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("DDP_TIMEOUT", "3", 1);
            unsetenv("DDP_JOB_ID");
            if (read(go[i][0], &b, 1) != 1) _exit(FAILED); /* its turn in the order */
            _exit(one_rank(i < l->world ? 1 : 1000));
        }
        close(go[i][0]);
    }
    for (i = 0; i < n; i++) {
        struct timespec ts;
        ts.tv_sec = l->gap_ms[i] / 1000;
        ts.tv_nsec = (long)(l->gap_ms[i] % 1000) * 1000000L;
        nanosleep(&ts, NULL); /* the launch's own timing: the gap before this process starts */
        if (write(go[l->order[i]][1], "g", 1) != 1) {}
        close(go[l->order[i]][1]);
    }
    for (i = 0; i < n; i++) {
        int st = 0;
        status[i] = waitpid(pid[i], &st, 0) == pid[i] && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
}

/* "A0 B1 +300ms B0 A1" */
static void describe(const launch *l, char *out, size_t n)
{
    size_t k = 0;
    int i;
    for (i = 0; i < 2 * l->world && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, "%s%s%c%d", i ? " " : "", l->gap_ms[i] >= 100 ? "+" : "",
                              "AB"[l->order[i] / l->world], l->order[i] % l->world);
}

static int next_permutation(int *a, int n)
{
    int i = n - 2, j = n - 1, t;
    while (i >= 0 && a[i] >= a[i + 1]) i--;
    if (i < 0) return 0;
    while (a[j] <= a[i]) j--;
    t = a[i]; a[i] = a[j]; a[j] = t;
    for (i++, j = n - 1; i < j; i++, j--) { t = a[i]; a[i] = a[j]; a[j] = t; }
    return 1;
}

static unsigned rnd_state = 12345;
static int rnd(int n) { rnd_state = rnd_state * 1103515245u + 12345u; return (int)((rnd_state >> 16) % (unsigned)n); }

/* Runs the launches 4 at a time (each on its own port); counts merged ranks. */
static void run_all(launch *ls, int count, const char *name)
{
    int done = 0, merged = 0, both_own = 0, i;
    char first[200] = "";
    while (done < count) {
        int batch = count - done < 4 ? count - done : 4, status[4][10], k;
        pid_t kids[4];
        int pipes[4][2];
        for (k = 0; k < batch; k++) { /* each launch from its own child: they run side by side */
            if (pipe(pipes[k]) != 0) continue;
            fflush(NULL);
            if ((kids[k] = fork()) == 0) {
                run_launch(&ls[done + k], test_free_port(), status[k]);
                if (write(pipes[k][1], status[k], sizeof status[k]) < 0) {}
                _exit(0);
            }
            close(pipes[k][1]);
        }
        for (k = 0; k < batch; k++) {
            const launch *l = &ls[done + k];
            int own[2] = {0, 0};
            if (read(pipes[k][0], status[k], sizeof status[k]) != (ssize_t)sizeof status[k])
                for (i = 0; i < 10; i++) status[k][i] = -1;
            close(pipes[k][0]);
            waitpid(kids[k], NULL, 0);
            for (i = 0; i < 2 * l->world; i++) {
                own[i / l->world] += status[k][i] == OWN;
                if (status[k][i] != MERGED) continue;
                if (!merged++) {
                    char how[120];
                    describe(l, how, sizeof how);
                    snprintf(first, sizeof first, "%s (%s): %c%d got DDP_OK with the other job's data", how, l->what,
                             "AB"[i / l->world], i % l->world);
                }
            }
            both_own += own[0] == l->world && own[1] == l->world;
        }
        done += batch;
    }
    CHECK(name, merged == 0, "%d ranks in %d launches got DDP_OK with the other job's data; the first: %s", merged, count,
          first);
    printf("two_jobs: %s: %d pairs of launches, %d where both jobs completed on their own\n", name, count, both_own);
}

static void hand_launched(void)
{
    launch ls[64];
    int n = 0, i, a[4] = {0, 1, 2, 3};
    memset(ls, 0, sizeof ls);
    do { /* world 2: every order of A0 A1 B0 B1, started within 20 ms of each other */
        ls[n].world = 2;
        ls[n].what = "at once";
        for (i = 0; i < 4; i++) { ls[n].order[i] = a[i]; ls[n].gap_ms[i] = i ? rnd(20) : 0; }
        n++;
    } while (next_permutation(a, 4));
    { /* the shell lines: A0 & 0.3 s, B0 (fails), B1 & 0.3 s, A1; and with the B ranks swapped */
        static const int orders[2][4] = {{0, 2, 3, 1}, {0, 3, 2, 1}};
        for (i = 0; i < 2; i++) {
            int k;
            ls[n].world = 2;
            ls[n].what = "0.3 s apart, the second rank 0 second";
            for (k = 0; k < 4; k++) { ls[n].order[k] = orders[i][k]; ls[n].gap_ms[k] = k ? 300 : 0; }
            n++;
        }
    }
    for (i = 0; i < 6; i++) { /* world 3: random orders of six processes, at once */
        int k, b[6] = {0, 1, 2, 3, 4, 5};
        ls[n].world = 3;
        ls[n].what = "world 3, at once";
        for (k = 5; k > 0; k--) { int j = rnd(k + 1), t = b[k]; b[k] = b[j]; b[j] = t; }
        for (k = 0; k < 6; k++) { ls[n].order[k] = b[k]; ls[n].gap_ms[k] = k ? rnd(20) : 0; }
        n++;
    }
    run_all(ls, n, "two_jobs.hand_launched_never_merge");
}

/* ---- two mpiexec.hydra launches at once -------------------------------------------- */
static void hydra(const char *self)
{
    char cmd[1200], line[256], why[256] = "";
    int round, merged = 0, own = 0, lines = 0, k;
    if (system("command -v mpiexec.hydra >/dev/null 2>&1") != 0) {
        test_skip("two_jobs.hydra_never_merge", "mpiexec.hydra not found (apt-get install mpich)");
        return;
    }
    for (round = 0; round < 4; round++) {
        FILE *p;
        /* two launches of two ranks at once, no MASTER_PORT: each rank prints its outcome */
        snprintf(cmd, sizeof cmd, "unset MASTER_PORT MASTER_ADDR DDP_JOB_ID RANK WORLD_SIZE; export DDP_TIMEOUT=10; "
                 "(mpiexec.hydra -n 2 %s --rank 1 & mpiexec.hydra -n 2 %s --rank 1000 & wait) 2>&1", self, self);
        if (!(p = popen(cmd, "r"))) break;
        while (fgets(line, sizeof line, p))
            if (sscanf(line, "two_jobs: rank %d", &k) == 1) {
                lines++;
                merged += strstr(line, "merged") != NULL;
                own += strstr(line, " own") != NULL;
            } else if (!why[0] && strstr(line, "error")) {
                snprintf(why, sizeof why, "%s", line); /* the first error, for the report */
            }
        pclose(p);
    }
    CHECK("two_jobs.hydra_never_merge", lines == 16 && merged == 0, "%d of 16 ranks answered, %d got DDP_OK with the "
          "other launch's data", lines, merged);
    /* each launch has its own id (Hydra's kvsname), so its own port: both complete */
    CHECK("two_jobs.hydra_each_its_own_job", own == 16, "%d of 16 ranks completed their own job; the first error: %s", own,
          why);
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "--rank") == 0) { /* a rank under mpiexec.hydra */
        int r = one_rank(atoll(argv[2]));
        printf("two_jobs: rank %s %s\n", getenv("PMI_RANK") ? getenv("PMI_RANK") : "?",
               r == OWN ? "own" : r == MERGED ? "merged" : "failed");
        return 0;
    }
    hand_launched();
    hydra(argv[0]);
    TEST_EXIT();
}
