/* Restarts (ddp_run_restarts, --max-restarts): a job whose ranks die comes back as a
   new job, and only once the old one is gone.
   The main job runs 3 ranks with 2 restarts. Attempt 0: rank 1 is SIGKILLed after
   init while ranks 0 and 2 linger 0.3 s after the launcher's SIGTERM, and rank 0
   leaves a file in /dev/shm named as its job's arena. Attempt 1: before its own init,
   rank 1 starts a stale rank carrying attempt 0's job id and secret, aimed at attempt
   1's store, which must be refused; then rank 0 is SIGKILLed. Attempt 2 finishes.
   Every rank writes what it saw to files in a directory of the test's own; the
   driver checks them: a new job id, secret and port per attempt, the attempt number
   from ddp_restart_count(), no process of an attempt alive when the next one starts,
   the old attempt's arena gone, one log line per restart. Then: a job that fails on
   every attempt ends with its cause's status after max_restarts + 1 attempts; a
   SIGTERM to the launcher is not restarted; ddp_launch's --max-restarts. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <fcntl.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/stat.h>

enum { WORLD = 3, RESTARTS = 2, MAX_LINES = 64 };

/* Appends one line to dir/name (one write, O_APPEND: lines of several ranks never mix). */
static void note(const char *dir, const char *name, const char *fmt, ...)
{
    char path[512], line[512];
    int fd, n;
    va_list ap;
    va_start(ap, fmt);
    n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if ((fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600)) < 0) return;
    if (write(fd, line, (size_t)n) != n) {}
    close(fd);
}

/* What one rank of one attempt wrote to dir/attempts. */
typedef struct attempt_line {
    int attempt, rank, pid;
    char job[64], secret[80], port[16];
} attempt_line;

static int read_attempts(const char *dir, attempt_line *a, int max)
{
    char path[512];
    int n = 0;
    FILE *f;
    snprintf(path, sizeof path, "%s/attempts", dir);
    if (!(f = fopen(path, "r"))) return 0;
    while (n < max && fscanf(f, "%d %d %d %63s %79s %15s", &a[n].attempt, &a[n].rank, &a[n].pid, a[n].job, a[n].secret,
                             a[n].port) == 6)
        n++;
    fclose(f);
    return n;
}

/* The name an arena of this job would have: what the launcher sweeps after an attempt. */
static void arena_name(char *out, size_t n, const char *job)
{
    snprintf(out, n, "/ddp.%016llx.1", (unsigned long long)ddp__hash(job)); /* <job>.<creator pid> */
}

/* Before init, attempt k > 0 checks what attempt k - 1 left behind. */
static void check_previous(const char *dir, int attempt, int rank)
{
    attempt_line a[MAX_LINES];
    char name[128];
    int i, n = read_attempts(dir, a, MAX_LINES), fd;
    for (i = 0; i < n; i++) {
        if (a[i].attempt != attempt - 1) continue;
        if (kill(a[i].pid, 0) == 0 || errno != ESRCH)
            note(dir, "results", "FAIL attempt %d rank %d started while attempt %d's rank %d (pid %d) still existed\n",
                 attempt, rank, attempt - 1, a[i].rank, a[i].pid);
        arena_name(name, sizeof name, a[i].job);
        if (a[i].rank == 0 && (fd = shm_open(name, O_RDONLY, 0)) >= 0) {
            close(fd);
            note(dir, "results", "FAIL attempt %d: attempt %d's arena %s is still in /dev/shm\n", attempt, attempt - 1,
                 name);
        }
    }
}

/* Attempt 1's rank 1, before its own init: a process with attempt 0's job id and secret
   (as a rank of attempt 0 that somehow lived on would have) tries to join attempt 1's
   store. Its ddp_init result goes to dir/results. */
static void stale_rank(const char *dir)
{
    attempt_line a[MAX_LINES];
    int i, n = read_attempts(dir, a, MAX_LINES), st = 0;
    pid_t pid;
    for (i = 0; i < n && !(a[i].attempt == 0 && a[i].rank == 1); i++) {}
    if (i == n) {
        note(dir, "results", "FAIL no line of attempt 0's rank 1 to impersonate\n");
        return;
    }
    if ((pid = fork()) == 0) {
        ddp_ctx ctx;
        ddp_desc d;
        memset(&d, 0, sizeof d);
        setenv("DDP_JOB_ID", a[i].job, 1);
        setenv("DDP_SECRET", a[i].secret, 1);
        setenv("DDP_TIMEOUT", "20", 1);
        _exit(ddp_init(&ctx, &d));
    }
    waitpid(pid, &st, 0);
    note(dir, "results", "stale %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}

static int rank_main(const char *dir, const char *mode)
{
    const int attempt = ddp_restart_count(), rank = atoi(getenv("RANK"));
    const char *env = getenv("TORCHELASTIC_RESTART_COUNT");
    ddp_ctx ctx;
    int x = rank + 1, fd, sig;
    char name[128];
    sigset_t term;
    note(dir, "attempts", "%d %d %d %s %s %s\n", attempt, rank, (int)getpid(), getenv("DDP_JOB_ID"),
         getenv("DDP_SECRET"), getenv("MASTER_PORT"));
    if (!env || atoi(env) != attempt)
        note(dir, "results", "FAIL rank %d: ddp_restart_count() %d, TORCHELASTIC_RESTART_COUNT '%s'\n", rank, attempt,
             env ? env : "(unset)");
    if (strcmp(mode, "segv") == 0) { /* every attempt fails the same way */
        if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
        if (rank == 1) raise(SIGSEGV);
        ddp_all_reduce(&ctx, &x, &x, 1, DDP_I32, DDP_SUM, NULL); /* fails: rank 1 is gone */
        return 1;
    }
    if (strcmp(mode, "wait") == 0) { /* until the launcher's signal ends it */
        if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
        for (;;) pause();
    }
    if (attempt > 0) check_previous(dir, attempt, rank);
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    if (attempt == 0 && rank != 1) sigprocmask(SIG_BLOCK, &term, NULL); /* taken by sigwait below; threads inherit it */
    if (attempt == 0 && rank == 0) { /* as if an arena had been left by a crash */
        arena_name(name, sizeof name, getenv("DDP_JOB_ID"));
        if ((fd = shm_open(name, O_RDWR | O_CREAT, 0600)) >= 0) close(fd);
    }
    if (attempt == 1 && rank == 1) stale_rank(dir);
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (attempt == 0) {
        struct timespec linger = {0, 300000000L};
        if (rank == 1) raise(SIGKILL);
        sigwait(&term, &sig); /* the launcher stops the job: slow to go, the next attempt must wait */
        nanosleep(&linger, NULL);
        _exit(0);
    }
    if (attempt == 1 && rank == 0) raise(SIGKILL);
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_I32, DDP_SUM, NULL) != DDP_OK) return 11;
    if (x != WORLD * (WORLD + 1) / 2) note(dir, "results", "FAIL attempt %d rank %d: sum %d\n", attempt, rank, x);
    ddp_destroy(&ctx);
    note(dir, "results", "done %d %d\n", attempt, rank);
    return 0;
}

/* Reads a whole small file into buf; "" if missing. */
static const char *slurp(const char *dir, const char *name, char *buf, size_t n)
{
    char path[512];
    size_t got = 0;
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    buf[0] = 0;
    if ((f = fopen(path, "r")) != NULL) {
        got = fread(buf, 1, n - 1, f);
        fclose(f);
    }
    buf[got] = 0;
    return buf;
}

static int count_of(const char *text, const char *what)
{
    int n = 0;
    for (; (text = strstr(text, what)) != NULL; text++) n++;
    return n;
}

/* The launcher's line "<cause>; stopped the other N; <then>": N counts the ranks still
   running when it saw the cause, and a peer that saw the failure first may have ended
   on its own (then fewer, and with none the clause is left out). */
static int has_stop_line(const char *log, const char *cause, const char *then)
{
    char line[512];
    int n;
    for (n = 0; n < WORLD; n++) {
        if (n) snprintf(line, sizeof line, "%s; stopped the other %d; %s", cause, n, then);
        else snprintf(line, sizeof line, "%s; %s", cause, then);
        if (strstr(log, line)) return 1;
    }
    return 0;
}

/* Starts the launcher in a child with its stderr in dir/launcher; with a signal > 0,
   sends it once every rank of the first attempt has written its line. Waits at most
   `limit` seconds (then SIGKILL: the ranks go with it). Returns its status. */
static int launch(const char *self, const char *dir, const char *mode, int restarts, int sig, double limit)
{
    char path[512];
    char *args[] = {(char *)self, (char *)"--rank", (char *)dir, (char *)mode, NULL};
    double t0 = test_now_s();
    int st = 0, fd;
    pid_t pid;
    attempt_line a[MAX_LINES];
    snprintf(path, sizeof path, "%s/launcher", dir);
    fflush(NULL);
    if ((pid = fork()) == 0) {
        if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600)) >= 0) dup2(fd, 2);
        _exit(ddp_run_restarts(WORLD, restarts, args));
    }
    while (waitpid(pid, &st, WNOHANG) == 0) {
        struct timespec ts = {0, 20000000L};
        if (sig > 0 && read_attempts(dir, a, MAX_LINES) >= WORLD) {
            nanosleep(&ts, NULL); /* the ranks are in init or past it: either way the signal reaches them */
            kill(pid, sig);
            sig = 0;
        }
        if (test_now_s() - t0 > limit) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        nanosleep(&ts, NULL); /* polling the files the ranks write, and the launcher */
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void cleanup(const char *dir)
{
    static const char *const files[] = {"attempts", "results", "launcher"};
    char path[512];
    int i;
    for (i = 0; i < TEST_COUNT(files); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void test_restarted_job(const char *self)
{
    char dir[] = "/tmp/ddp-test-restart-XXXXXX", results[4096], log[4096], name[128];
    attempt_line a[MAX_LINES];
    int rc, n, i, j, per[RESTARTS + 1] = {0}, identity_ok = 1, fd, stale = -1;
    const char *s;
    if (!mkdtemp(dir)) {
        CHECK("restart.job", 0, "mkdtemp: %s", strerror(errno));
        return;
    }
    rc = launch(self, dir, "job", RESTARTS, 0, 60);
    n = read_attempts(dir, a, MAX_LINES);
    for (i = 0; i < n; i++)
        if (a[i].attempt >= 0 && a[i].attempt <= RESTARTS) per[a[i].attempt]++;
    slurp(dir, "results", results, sizeof results);
    slurp(dir, "launcher", log, sizeof log);
    CHECK("restart.job_finishes_after_two_restarts",
          rc == 0 && n == WORLD * (RESTARTS + 1) && per[0] == WORLD && per[1] == WORLD && per[2] == WORLD &&
              count_of(results, "done 2 ") == WORLD,
          "status %d, %d rank lines (%d, %d, %d per attempt), results: %s; launcher: %s", rc, n, per[0], per[1], per[2],
          results, log);
    /* one identity per attempt: the same for its ranks, different from every other attempt's */
    for (i = 0; i < n; i++)
        for (j = 0; j < n; j++) {
            int same_attempt = a[i].attempt == a[j].attempt;
            if (same_attempt != (strcmp(a[i].job, a[j].job) == 0) ||
                same_attempt != (strcmp(a[i].secret, a[j].secret) == 0) ||
                same_attempt != (strcmp(a[i].port, a[j].port) == 0))
                identity_ok = 0;
            /* the id crosses the network in every hello: no piece of the secret */
            if (strncmp(a[i].job, "run-", 4) != 0 || strlen(a[i].job) < 12 || strstr(a[i].secret, a[i].job + 4))
                identity_ok = 0;
        }
    CHECK("restart.each_attempt_a_new_job_id_secret_and_port", n > WORLD && identity_ok,
          "%d lines; job ids %s %s %s, ports %s %s %s", n, a[0].job, n > WORLD ? a[WORLD].job : "-",
          n > 2 * WORLD ? a[2 * WORLD].job : "-", a[0].port, n > WORLD ? a[WORLD].port : "-",
          n > 2 * WORLD ? a[2 * WORLD].port : "-");
    CHECK("restart.attempt_number_in_the_environment", n == WORLD * (RESTARTS + 1) && !strstr(results, "ddp_restart_count"),
          "%s", results);
    if ((s = strstr(results, "stale ")) != NULL) stale = atoi(s + 6);
    CHECK("restart.stale_rank_of_an_old_attempt_refused", stale == DDP_ERR_REFUSED && rc == 0,
          "the stale rank's ddp_init returned %d (%s), want %d (%s); job status %d", stale,
          stale >= 0 && stale < DDP_RESULT_COUNT ? ddp_strerror((ddp_result)stale) : "-", DDP_ERR_REFUSED,
          ddp_strerror(DDP_ERR_REFUSED), rc);
    CHECK("restart.new_attempt_starts_after_every_process_of_the_old_one_ended",
          per[1] == WORLD && !strstr(results, "still existed"), "%s", results);
    for (i = 0, fd = -1; i < n && fd < 0; i++) {
        arena_name(name, sizeof name, a[i].job);
        if ((fd = shm_open(name, O_RDONLY, 0)) >= 0) shm_unlink(name);
    }
    CHECK("restart.old_attempts_arena_swept", per[1] == WORLD && fd < 0 && !strstr(results, "/dev/shm"),
          "%s%s", fd >= 0 ? "an arena named after an attempt's job is left in /dev/shm; " : "", results);
    if (fd >= 0) close(fd);
    CHECK("restart.one_line_per_restart",
          count_of(log, "restarting the job") == RESTARTS &&
              strstr(log, "ddp: rank 1 (pid ") &&
              has_stop_line(log, "was killed by signal 9 (Killed) (not by this launcher: the kernel's out-of-memory "
                            "killer, or someone's kill -9)", "restarting the job: attempt 2 of 3\n") &&
              strstr(log, "ddp: rank 0 (pid ") && strstr(log, "restarting the job: attempt 3 of 3\n"),
          "launcher's stderr: %s", log);
    CHECK("restart.no_failure_seen_by_the_ranks", !strstr(results, "FAIL"), "%s", results);
    cleanup(dir);
}

/* A rank that fails on every attempt: max_restarts + 1 attempts, then its status. */
static void test_exhausted(const char *self)
{
    char dir[] = "/tmp/ddp-test-restart-XXXXXX", log[4096];
    attempt_line a[MAX_LINES];
    int rc, n;
    if (!mkdtemp(dir)) return;
    rc = launch(self, dir, "segv", RESTARTS, 0, 60);
    n = read_attempts(dir, a, MAX_LINES);
    slurp(dir, "launcher", log, sizeof log);
    CHECK("restart.exhausted_ends_with_the_causes_status",
          rc == 128 + SIGSEGV && n == WORLD * (RESTARTS + 1) && count_of(log, "restarting the job") == RESTARTS &&
              strstr(log, "ddp: rank 1 (pid ") &&
              has_stop_line(log, "was killed by signal 11 (Segmentation fault)", "no restart left (attempt 3 of 3)\n"),
          "status %d (want %d), %d rank lines (want %d); launcher: %s", rc, 128 + SIGSEGV, n, WORLD * (RESTARTS + 1), log);
    cleanup(dir);
}

/* SIGTERM to the launcher stops the job for good, whatever restarts are left. */
static void test_signal_not_restarted(const char *self)
{
    char dir[] = "/tmp/ddp-test-restart-XXXXXX", log[4096];
    attempt_line a[MAX_LINES];
    int rc, n;
    if (!mkdtemp(dir)) return;
    setenv("DDP_TIMEOUT", "600", 1); /* only the launcher can end this quickly */
    rc = launch(self, dir, "wait", 3, SIGTERM, 30);
    setenv("DDP_TIMEOUT", "30", 1);
    n = read_attempts(dir, a, MAX_LINES);
    slurp(dir, "launcher", log, sizeof log);
    CHECK("restart.sigterm_to_the_launcher_is_not_restarted",
          rc == 128 + SIGTERM && n == WORLD && !strstr(log, "restarting"),
          "status %d (want %d), %d rank lines (want %d: one attempt); launcher: %s", rc, 128 + SIGTERM, n, WORLD, log);
    cleanup(dir);
}

/* ddp_launch takes --max-restarts (and torchrun's --max_restarts) next to --nproc, and
   refuses it alone, with a bad count, or twice. */
static void test_launch_flags(const char *self)
{
    char dir[] = "/tmp/ddp-test-restart-XXXXXX";
    char *ok[] = {(char *)self, (char *)"--rank", dir, (char *)"segv", (char *)"--max_restarts=1", (char *)"--nproc",
                  (char *)"3", NULL};
    char *alone[] = {(char *)self, (char *)"--max-restarts", (char *)"1", NULL};
    char *bad[] = {(char *)self, (char *)"--nproc", (char *)"2", (char *)"--max-restarts", (char *)"x", NULL};
    char *twice[] = {(char *)self, (char *)"--max-restarts", (char *)"1", (char *)"--nproc=2", (char *)"--max_restarts=2",
                     NULL};
    attempt_line a[MAX_LINES];
    int argc = 7, rc, n, saved = dup(2), fd = open("/dev/null", O_WRONLY);
    if (!mkdtemp(dir)) return;
    dup2(fd, 2); /* the launcher's lines: not this test's output */
    rc = ddp_launch(&argc, ok);
    dup2(saved, 2);
    n = read_attempts(dir, a, MAX_LINES);
    CHECK("restart.ddp_launch_takes_max_restarts", rc == 128 + SIGSEGV && n == 2 * WORLD && argc == 4,
          "status %d, %d rank lines (want %d), argc %d (want 4)", rc, n, 2 * WORLD, argc);
    argc = 3;
    rc = ddp_launch(&argc, alone);
    CHECK("restart.ddp_launch_refuses_max_restarts_without_nproc", rc == 2, "status %d", rc);
    argc = 5;
    rc = ddp_launch(&argc, bad);
    CHECK("restart.ddp_launch_refuses_a_bad_count", rc == 2, "status %d", rc);
    argc = 5;
    rc = ddp_launch(&argc, twice);
    CHECK("restart.ddp_launch_refuses_max_restarts_twice", rc == 2, "status %d", rc);
    close(fd);
    close(saved);
    cleanup(dir);
}

/* ddp_restart_count() reads torchrun's variable; ddp_init refuses one that is not a count. */
static void test_restart_count(void)
{
    static const struct { const char *value; int count; } cases[] = {
        {NULL, 0}, {"0", 0}, {"3", 3}, {"x", -1}, {"-1", -1}, {"2 ", -1}, {"99999999999", -1}};
    ddp_ctx ctx;
    ddp_result r;
    int i, ok = 1;
    char why[200] = "";
    for (i = 0; i < TEST_COUNT(cases); i++) {
        if (cases[i].value) setenv("TORCHELASTIC_RESTART_COUNT", cases[i].value, 1);
        else unsetenv("TORCHELASTIC_RESTART_COUNT");
        if (ddp_restart_count() != cases[i].count && ok) {
            snprintf(why, sizeof why, "'%s' gave %d, want %d", cases[i].value ? cases[i].value : "(unset)",
                     ddp_restart_count(), cases[i].count);
            ok = 0;
        }
    }
    CHECK("restart.ddp_restart_count_reads_torchelastic_restart_count", ok, "%s", why);
    setenv("TORCHELASTIC_RESTART_COUNT", "x", 1);
    r = ddp_init(&ctx, NULL);
    CHECK("restart.ddp_init_refuses_a_restart_count_that_is_not_one",
          r == DDP_ERR_ENV && strstr(ddp_error(&ctx), "TORCHELASTIC_RESTART_COUNT='x' is not a restart count"),
          "%s: %s", ddp_strerror(r), ddp_error(&ctx));
    ddp_destroy(&ctx);
    unsetenv("TORCHELASTIC_RESTART_COUNT");
}

int main(int argc, char **argv)
{
    if (argc > 3 && strcmp(argv[1], "--rank") == 0) return rank_main(argv[2], argv[3]);
    test_restart_count();
    setenv("DDP_TIMEOUT", "30", 1);
    test_restarted_job(argv[0]);
    test_exhausted(argv[0]);
    test_signal_not_restarted(argv[0]);
    test_launch_flags(argv[0]);
    TEST_EXIT();
}
