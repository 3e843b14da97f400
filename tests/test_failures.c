/* Failure paths: nothing hangs. A rank that exits, a rank that is late, a job whose
   peers never come, a store spoken to by strangers, a launcher whose child fails.
   Timeouts here are a few seconds so that every case ends quickly. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static double now_s(void) { return ddp__now_ms() / 1000.0; }

static int quiet(ddp_ctx *ctx, ddp_desc *d)
{
    memset(d, 0, sizeof *d);
    return ddp_init(ctx, d);
}

/* rank 1 exits after init; the others must see DDP_ERR_PEER naming it, fast */
static const char *const peer_death_codes[] = {
    [10] = "init failed", [11] = "all_reduce with a dead peer returned neither PEER nor ABORTED",
    [12] = "the error does not name rank 1", [13] = "noticing the death took over 5 s",
    [14] = "the broken group accepted another collective",
    [15] = "ddp_destroy of the failed job returned DDP_OK, or a second call did"};
static int peer_death(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp_desc d;
    float x[1000] = {0};
    double t0;
    ddp_result r;
    (void)arg;
    if (quiet(&ctx, &d) != DDP_OK) return 10;
    if (rank == 1) _exit(0); /* gone without a word */
    t0 = now_s();
    r = ddp_all_reduce(&ctx, x, x, 1000, DDP_F32, DDP_SUM, NULL);
    if (r != DDP_ERR_PEER && r != DDP_ERR_ABORTED) return 11;
    if (!strstr(ddp_error(&ctx), "rank 1")) return 12;
    if (now_s() - t0 > 5) return 13;
    /* a broken group refuses further work at once */
    if (ddp_all_reduce(&ctx, x, x, 1, DDP_F32, DDP_SUM, NULL) != DDP_ERR_ABORTED) return 14;
    /* the job's verdict, from every call: an error path's destroy and main's again (the second said DDP_OK) */
    r = ddp_destroy(&ctx);
    if (r == DDP_OK || ddp_destroy(&ctx) != r) return 15;
    return 0;
}

/* rank 0 dies inside an all-reduce it has reached while rank 1 is still late (in its own
   work): rank 2 names rank 0 at once, not once rank 1 comes (an arrived rank was never
   checked: the death went unseen until the late one arrived, or the timeout named only it) */
static const char *const dead_while_late_codes[] = {
    [10] = "init failed", [11] = "rank 2's all_reduce returned neither PEER nor ABORTED",
    [12] = "rank 2's error does not name rank 0", [13] = "rank 2 noticed only after rank 1 came (2.5 s)",
    [14] = "the late rank 1 was not refused"};
static void *exit_soon(void *arg)
{
    struct timespec ts = {0, 400000000L}; /* the scenario: a death while this rank waits */
    (void)arg;
    nanosleep(&ts, NULL);
    _exit(0);
    return NULL;
}
static int dead_while_late(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp_desc d;
    float x = 1;
    ddp_result r;
    double t0;
    pthread_t th;
    (void)arg;
    if (quiet(&ctx, &d) != DDP_OK) return 10;
    if (rank == 0 && pthread_create(&th, NULL, exit_soon, NULL) != 0) return 10;
    if (rank == 1) { /* the scenario itself: a peer stuck in computation */
        struct timespec ts = {2, 500000000L};
        nanosleep(&ts, NULL);
    }
    t0 = now_s();
    r = ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
    if (rank == 1) return r == DDP_OK ? 14 : 0;
    if (r != DDP_ERR_PEER && r != DDP_ERR_ABORTED) return 11;
    if (!strstr(ddp_error(&ctx), "rank 0")) return 12;
    if (now_s() - t0 > 2) return 13;
    ddp_destroy(&ctx);
    return 0;
}

/* rank 1 is late by more than the timeout: rank 0 times out naming rank 1, rank 1
   then finds the collective aborted */
static const char *const late_peer_codes[] = {
    [10] = "init failed", [11] = "rank 0 did not time out", [12] = "rank 0's error does not say 'waiting for rank 1'",
    [13] = "rank 0 timed out before 0.9 s or after 3 s of a 1 s timeout",
    [14] = "rank 1 did not find the collective aborted by rank 0"};
static int late_peer(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp_desc d;
    float x = 1;
    ddp_result r;
    double t0;
    (void)arg;
    if (quiet(&ctx, &d) != DDP_OK) return 10;
    if (rank == 1) { /* the scenario itself: a peer stuck in computation */
        struct timespec ts = {2, 500000000L};
        nanosleep(&ts, NULL);
    }
    t0 = now_s();
    r = ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
    if (rank == 0) {
        if (r != DDP_ERR_TIMEOUT) return 11;
        if (!strstr(ddp_error(&ctx), "waiting for rank 1")) return 12;
        if (now_s() - t0 < 0.9 || now_s() - t0 > 3) return 13;
    } else {
        if (r != DDP_ERR_ABORTED || !strstr(ddp_error(&ctx), "rank 0 failed")) return 14;
    }
    ddp_destroy(&ctx);
    return 0;
}

/* a world of 3 where only ranks 0 and 1 exist: init gives up within the timeout */
static const char *const missing_peer_codes[] = {[1] = "init returned neither TIMEOUT nor PEER"};
static int missing_peer(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp_desc d;
    ddp_result r;
    (void)rank;
    (void)arg;
    setenv("WORLD_SIZE", "3", 1);
    setenv("LOCAL_WORLD_SIZE", "3", 1);
    r = quiet(&ctx, &d);
    ddp_destroy(&ctx);
    /* the first to give up times out; the other may instead learn that it left */
    return r == DDP_ERR_TIMEOUT || r == DDP_ERR_PEER ? 0 : 1;
}

/* rank 1 of another job knocks on this job's store: refused with a reason that
   does not give away the job it serves */
static const char *const foreign_job_codes[] = {
    [1] = "rank 0 (job-a) neither timed out nor lost its peer",
    [2] = "rank 1 (job-b) was not refused with DDP_ERR_REFUSED saying 'another job'",
    [3] = "the refusal named job-a: a stranger learns the job id"};
static int foreign_job(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp_desc d;
    ddp_result r;
    (void)arg;
    setenv("DDP_JOB_ID", rank == 0 ? "job-a" : "job-b", 1);
    r = quiet(&ctx, &d);
    if (rank == 1) {
        int ok = r == DDP_ERR_REFUSED && strstr(ddp_error(&ctx), "another job"), leak = strstr(ddp_error(&ctx), "job-a") != NULL;
        ddp_destroy(&ctx);
        return leak ? 3 : ok ? 0 : 2;
    }
    ddp_destroy(&ctx);
    return r == DDP_ERR_TIMEOUT || r == DDP_ERR_PEER ? 0 : 1;
}

/* two processes both claiming rank 0 of a world of 2 */
static const char *const duplicate_rank_codes[] = {[1] = "init succeeded for a second rank 0"};
static int duplicate_rank(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp_desc d;
    ddp_result r;
    (void)rank;
    (void)arg;
    setenv("RANK", "0", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("DDP_TIMEOUT", "2", 1);
    r = quiet(&ctx, &d);
    ddp_destroy(&ctx);
    /* one of them owns the store; the other cannot bind it or is refused */
    return r != DDP_OK ? 0 : 1;
}

/* Rank 0 names who never joined and why the store refused them. A rank of this job id
   with another world size can never be one of its ranks: both stop at once. Another
   secret, or a job id with a typo, cannot be told from a stranger: rank 0 names it when
   it times out. */
static const char *const misjoin_codes[] = {
    [1] = "rank 0 did not fail, or not with its reason", [2] = "rank 0 took longer than its case allows",
    [3] = "rank 1 was not refused"};
static int misjoin(int rank, void *arg)
{
    const char *how = (const char *)arg, *want;
    ddp_ctx ctx;
    ddp_desc d;
    ddp_result r;
    double t0 = now_s(), limit = 5;
    if (rank == 1 && strcmp(how, "world") == 0) { setenv("WORLD_SIZE", "3", 1); setenv("LOCAL_WORLD_SIZE", "3", 1); }
    if (rank == 0 && strcmp(how, "secret") == 0) setenv("DDP_SECRET", "only-rank-0-has-it", 1);
    if (rank == 1 && strcmp(how, "job_id") == 0) setenv("DDP_JOB_ID", "a-typo", 1);
    if (strcmp(how, "world") == 0) setenv("DDP_TIMEOUT", "30", 1); /* the refusal ends it, not the timeout */
    r = quiet(&ctx, &d);
    if (rank == 1) {
        ddp_destroy(&ctx);
        return r == DDP_OK ? 3 : 0;
    }
    want = strcmp(how, "world") == 0 ? "a process claims rank 1 of a world of 3"
         : strcmp(how, "secret") == 0 ? "rank 1 never joined; the store refused 1 process: rank 1 did not answer the challenge"
                                      : "rank 1 never joined; the store refused 1 process: rank 1 of job 'a-typo'";
    if (r == DDP_OK || !strstr(ddp_error(&ctx), want)) {
        fprintf(stderr, "want '%s'\n", want);
        ddp_destroy(&ctx);
        return 1;
    }
    ddp_destroy(&ctx);
    return now_s() - t0 > limit ? 2 : 0;
}

/* A program that is not a ddp store answers on MASTER_PORT (an HTTP server's 400, an
   echo service): a rank says so at once instead of retrying until the timeout, and a
   rank 0 that finds it there says what holds the port. (The echo of a HELLO was read as
   the store's refusal, its op as a status.) One that takes the connection and never
   answers (an HTTP server waiting for the request's end) holds rank 1 until its timeout,
   which then says so (it said "Connection reset by peer"). */
static char logged[2000]; /* what a rank's log said, line by line */
static void log_lines(void *user, int level, const char *msg)
{
    size_t n = strlen(logged);
    (void)user;
    snprintf(logged + n, sizeof logged - n, "%s%s\n", level == DDP_LOG_ERROR ? "error: " : "", msg);
}

static void test_not_a_store(void)
{
    int port, lfd = test_listen(&port), rank, echo, held[8], n_held = 0;
    if (lfd < 0) {
        test_skip("failures.not_a_store", "cannot listen on 127.0.0.1");
        return;
    }
    for (echo = 0; echo < 4; echo++) /* 2: silent; 3: silent, past DDP__HELLO_WARN_MS (rank 1 only) */
    for (rank = 1; rank >= 0; rank--) {
        char name[64], err[2000] = "";
        int fds[2], st = 0, conns = 0;
        double t0 = now_s(), dt;
        pid_t pid;
        if (echo == 3 && rank == 0) continue;
        if (pipe(fds) != 0) break;
        fflush(NULL);
        if ((pid = fork()) == 0) {
            ddp_ctx ctx;
            ddp_desc d;
            memset(&d, 0, sizeof d);
            d.world_size = 2;
            d.rank = rank;
            d.master_addr = "127.0.0.1";
            d.master_port = port;
            d.job_id = "not-a-store";
            d.timeout_ms = echo == 3 ? 7000 : echo == 2 ? 2000 : 20000;
            d.log = log_lines;
            close(fds[0]);
            if (ddp_init(&ctx, &d) == DDP_OK) _exit(1);
            if (write(fds[1], logged, strlen(logged)) < 0) {}
            _exit(0);
        }
        close(fds[1]);
        while (waitpid(pid, &st, WNOHANG) == 0 && now_s() - t0 < 30) { /* the HTTP server, until the rank gives up */
            struct pollfd pf = {lfd, POLLIN, 0};
            if (poll(&pf, 1, 50) == 1) { /* reads the request, answers 400 or echoes it, hangs up */
                int c = accept(lfd, NULL, NULL);
                const char *http = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                char req[256];
                ssize_t got = 0;
                struct pollfd in = {c, POLLIN, 0};
                if (c < 0) continue;
                if (echo >= 2) { /* takes it, says nothing, keeps it open */
                    if (n_held < 8) held[n_held++] = c;
                    else close(c);
                    conns++;
                    continue;
                }
                if (poll(&in, 1, 1000) == 1 && (got = read(c, req, sizeof req)) < 0) got = 0;
                if (echo ? write(c, req, (size_t)got) < 0 : write(c, http, strlen(http)) < 0) {}
                close(c);
                conns++;
            }
        }
        dt = now_s() - t0;
        if (read(fds[0], err, sizeof err - 1) < 0) err[0] = 0;
        close(fds[0]);
        while (n_held > 0) close(held[--n_held]);
        if (echo == 2 && rank == 1) {
            CHECK("failures.not_a_store.silent.rank1_says_so_at_its_timeout", WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
                  dt < 6 && strstr(err, "took the connection but never answered the hello") && !strstr(err, "warning"),
                  "after %.1f s and %d connections: '%s'", dt, conns, err);
            continue;
        }
        if (echo == 3) { /* a timeout of minutes: a line after 5 s says what the wait is, before the timeout's */
            char warn[200];
            const char *w, *e;
            snprintf(warn, sizeof warn, "rank 1/2: warning: what listens on 127.0.0.1:%d took the connection and has "
                     "not answered the hello in 5 s (another program on MASTER_PORT, or rank 0 stopped?)", port);
            w = strstr(err, warn);
            e = strstr(err, "took the connection but never answered the hello");
            CHECK("failures.not_a_store.silent.rank1_says_so_after_5_s", WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
                  dt > 6.5 && dt < 12 && w && e && w < e && !strstr(w + strlen(warn), "warning"),
                  "after %.1f s and %d connections: '%s'", dt, conns, err);
            continue;
        }
        if (echo == 2) { /* rank 0 asks what holds its port for 2 s, and says that (it named the timeout) */
            CHECK("failures.not_a_store.silent.rank0_says_what_holds_its_port", WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
                  dt < 6 && strstr(err, "the port is in use: what listens there took the connection but did not answer "
                                   "a ddp store's hello within 2 s"), "after %.1f s and %d connections: '%s'", dt, conns, err);
            continue;
        }
        snprintf(name, sizeof name, "failures.not_a_store%s.rank%d_says_so_at_once", echo ? ".echo" : "", rank);
        CHECK(name, WIFEXITED(st) && WEXITSTATUS(st) == 0 && dt < 3 && conns <= 1 && strstr(err, "not as a ddp store"),
              "after %.1f s and %d connections: '%s'", dt, conns, err);
    }
    close(lfd);
}

/* ---- the store, spoken to directly: two ranks as threads of this process ---- */
typedef struct store_rank { int rank, port; ddp_ctx ctx; ddp_result r; pthread_barrier_t *gate; long long sum; char got[16]; } store_rank;

static void *store_main(void *arg)
{
    store_rank *s = (store_rank *)arg;
    ddp_desc d;
    long long v = 0;
    int i;
    char *val = NULL;
    memset(&d, 0, sizeof d);
    d.world_size = 2;
    d.rank = s->rank;
    d.master_addr = "127.0.0.1";
    d.master_port = s->port;
    d.job_id = "store-test";
    d.timeout_ms = 10000;
    if ((s->r = ddp_init(&s->ctx, &d)) != DDP_OK) { pthread_barrier_wait(s->gate); pthread_barrier_wait(s->gate); return NULL; }
    pthread_barrier_wait(s->gate); /* the main thread now throws junk at the store */
    pthread_barrier_wait(s->gate);
    for (i = 0; i < 500 && s->r == DDP_OK; i++) { /* each rank sends i + rank; each sums both */
        char mine[16], *all = NULL;
        const char *parts[2];
        uint32_t lens[2];
        snprintf(mine, sizeof mine, "%d", i + s->rank);
        s->r = ddp__store_gather(&s->ctx, "sum", mine, (uint32_t)strlen(mine), &all, parts, lens, "in the test");
        if (s->r == DDP_OK) v += atoll(parts[0]) + atoll(parts[1]);
        free(all);
    }
    s->sum = v;
    if (s->r == DDP_OK && s->rank == 1) s->r = ddp__store_set(&s->ctx, "greeting", "hello", 5, "in the test");
    if (s->r == DDP_OK && s->rank == 0) s->r = ddp__store_get(&s->ctx, "greeting", &val, NULL, "in the test");
    if (val) { snprintf(s->got, sizeof s->got, "%s", val); free(val); }
    if (s->r == DDP_OK) s->r = ddp__store_barrier(&s->ctx, "counted", "in the test");
    ddp_destroy(&s->ctx);
    return NULL;
}

static int raw_connect(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    return fd;
}

static void test_store(void)
{
    pthread_t th[2];
    pthread_barrier_t gate;
    store_rank s[2];
    int i, port = ddp__free_port(), fd, refused = 0, dropped = 0;
    pthread_barrier_init(&gate, NULL, 3);
    memset(s, 0, sizeof s);
    for (i = 0; i < 2; i++) {
        s[i].rank = i;
        s[i].port = port;
        s[i].gate = &gate;
        pthread_create(&th[i], NULL, store_main, &s[i]);
    }
    pthread_barrier_wait(&gate);
    /* junk: a bad magic number gets the connection closed */
    if ((fd = raw_connect(port)) >= 0) {
        char junk[64], b;
        memset(junk, 0x5a, sizeof junk);
        if (write(fd, junk, sizeof junk) < 0) {}
        dropped = ddp__read_all(fd, &b, 1, ddp__now_ms() + 3000) != 0 && errno == ECONNRESET;
        close(fd);
    }
    /* a stranger's hello: refused with a reason naming the job */
    if ((fd = raw_connect(port)) >= 0) {
        uint32_t h[4], n;
        char reply[256] = "";
        const char *job = "other-job", *val = "1 2";
        h[0] = htonl(DDP__MAGIC); h[1] = htonl(DDP__HELLO);
        h[2] = htonl((uint32_t)strlen(job)); h[3] = htonl((uint32_t)strlen(val));
        if (write(fd, h, 16) < 0 || write(fd, job, strlen(job)) < 0 || write(fd, val, strlen(val)) < 0) {}
        if (ddp__read_all(fd, h, 16, ddp__now_ms() + 3000) == 0 && ntohl(h[1]) == 1) {
            n = ntohl(h[3]);
            if (n < sizeof reply && ddp__read_all(fd, reply, n, ddp__now_ms() + 3000) == 0)
                refused = reply[0] && strstr(reply, "store-test") == NULL; /* without naming the job */
        }
        close(fd);
    }
    pthread_barrier_wait(&gate);
    for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK("store.junk_dropped", dropped, "the store kept a connection that sent garbage");
    CHECK("store.foreign_job_refused", refused, "a hello from another job was not refused, or the refusal named the job");
    CHECK("store.gather_set_get_barrier", s[0].r == DDP_OK && s[1].r == DDP_OK && s[0].sum == 250000 &&
          s[1].sum == 250000 && strcmp(s[0].got, "hello") == 0,
          "results %d %d, counter %lld %lld, got '%s'", (int)s[0].r, (int)s[1].r, s[0].sum, s[1].sum, s[0].got);
    pthread_barrier_destroy(&gate);
}

/* ---- the launcher ---- */
static volatile sig_atomic_t terms; /* SIGTERMs this rank got */
static void count_term(int sig) { (void)sig; terms++; }

static int launched_child(const char *mode)
{
    ddp_ctx ctx;
    ddp_desc d;
    float x = 1;
    FILE *f;
    if (strncmp(mode, "wrapped_", 8) == 0) { /* a wrapper (timeout, a Python script): the rank is its child */
        pid_t pid = fork();
        int st = 0;
        if (pid == 0) {
            execl("/proc/self/exe", "test_failures", "--launched", mode + 8, (char *)NULL);
            _exit(127);
        }
        if (pid < 0 || waitpid(pid, &st, 0) != pid) return 10;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (strncmp(mode, "forks_", 6) == 0) { /* rank 2 first forks a stale copy of itself, refused in its ddp_init */
        pid_t pid;
        int st = 0;
        mode += 6;
        if (getenv("RANK") && strcmp(getenv("RANK"), "2") == 0 && (pid = fork()) >= 0) {
            if (pid == 0) {
                setenv("DDP_SECRET", "not this job's", 1);
                _exit(quiet(&ctx, &d) == DDP_ERR_REFUSED ? 0 : 1);
            }
            if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 12;
        }
    }
    if (strncmp(mode, "closefds_", 9) == 0) { /* its inherited descriptors closed, as Python's subprocess does */
        int fd;
        for (fd = 3; fd < 1024; fd++) close(fd);
        mode += 9;
    }
    f = fopen(getenv("PID_FILE"), "a");
    if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); }
    /* rank 1 leaves before ddp_init with status 0: the others would wait DDP_TIMEOUT for it */
    if (strcmp(mode, "exit0_before_init") == 0 && getenv("RANK") && strcmp(getenv("RANK"), "1") == 0) return 0;
    if (strcmp(mode, "stuck_before_init") == 0 && getenv("RANK") && strcmp(getenv("RANK"), "3") == 0) {
        alarm(20);
        for (;;) pause();
    }
    if (strcmp(mode, "fpe_before_init") == 0) raise(SIGFPE); /* every rank, as where ddp_init was forgotten */
    if (strcmp(mode, "segv_after_failed_init") == 0) { /* it called ddp_init, which failed at once */
        setenv("DDP_TIMEOUT", "bogus", 1);
        if (quiet(&ctx, &d) != DDP_OK) raise(SIGSEGV);
        return 10;
    }
    if (strcmp(mode, "ticking") == 0) { /* a signal every 100 us without SA_RESTART (a profiler's timer) */
        struct sigaction sa;
        struct itimerval it = {{0, 100}, {0, 100}};
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = count_term;
        sigaction(SIGALRM, &sa, NULL);
        setitimer(ITIMER_REAL, &it, NULL);
    }
    if (quiet(&ctx, &d) != DDP_OK) return 10;
    if (strcmp(mode, "ticking") == 0) {
        const ddp_result r = ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
        return r == DDP_OK && x == (float)ctx.world_size && ddp_destroy(&ctx) == DDP_OK ? 0 : 11;
    }
    if (strcmp(mode, "exit3") == 0 && ctx.rank == 2) return 3;
    if (strcmp(mode, "segv") == 0 && ctx.rank == 1) raise(SIGSEGV);
    if (strcmp(mode, "wait") == 0 && ctx.rank != 0) pause(); /* until a signal ends it */
    if (strcmp(mode, "count_term") == 0) { /* says how many SIGTERMs came: the launcher's stop, once */
        struct sigaction sa;
        struct timespec ts = {0, 300000000L};
        char path[300];
        FILE *out;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = count_term;
        sigaction(SIGTERM, &sa, NULL);
        f = fopen(getenv("PID_FILE"), "a");
        if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); } /* ready: the handler is in place */
        while (!terms) pause();
        while (nanosleep(&ts, &ts) != 0) {} /* a second one would come within the launcher's scan of /proc */
        snprintf(path, sizeof path, "%s.%d", getenv("PID_FILE"), ctx.rank);
        if ((out = fopen(path, "w"))) { fprintf(out, "%d\n", (int)terms); fclose(out); }
        _exit(0);
    }
    if (strcmp(mode, "kill5") == 0) { /* rank 5 dies as the OOM killer would take it; the others fail after it */
        if (ctx.rank == 5) raise(SIGKILL);
        return ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) == DDP_OK ? 0 : 1;
    }
    if (strcmp(mode, "stuck_mid_job") == 0 || strcmp(mode, "stuck_after_refusal") == 0) {
        /* rank 2 stuck after one all-reduce; the others' next times out (after_refusal: each
           rank's first failure a refused ddp_wait, which breaks nothing) */
        if (mode[6] == 'a') {
            ddp_work w;
            memset(&w, 0, sizeof w);
            if (ddp_wait(&ctx, &w, NULL) != DDP_ERR_ARG) return 1;
        }
        if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
        if (ctx.rank == 2) {
            alarm(20);
            for (;;) pause();
        }
        if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
        return ddp_destroy(&ctx) == DDP_OK ? 0 : 1;
    }
    if (strcmp(mode, "abort_after_timeout") == 0 || strcmp(mode, "stray_bytes") == 0 ||
        strcmp(mode, "bystander_stopped") == 0) { /* rank 2 (bystander: 1) stuck; the others' all-reduce times out */
        const int stuck = mode[0] == 'b' ? 1 : 2;
        unsigned long ino;
        int fd;
        if (mode[0] == 's' && ctx.rank == 1 && sscanf(getenv("DDP_LAUNCHER"), "%d:%lu", &fd, &ino) == 2) {
            if (write(fd, "7", 1) < 0 || write(fd, "\0junk", 5) < 0) {} /* a program's stray bytes on the pipe */
        }
        if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
        if (ctx.rank == stuck) {
            alarm(20);
            for (;;) pause();
        }
        if (mode[0] == 'b' && ctx.rank == 3) raise(SIGSTOP); /* stopped too, late as well: the timeout names rank 1 */
        if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) == DDP_OK) return ddp_destroy(&ctx) != DDP_OK;
        if (mode[0] == 'a') {
            struct rlimit none = {0, 0};
            setrlimit(RLIMIT_CORE, &none); /* as an assert would end it, without a core file */
            abort();
        }
        return 1;
    }
    if (strcmp(mode, "stuck_at_the_end") == 0) { /* rank 1 stuck; the others' ddp_destroy times out, exit 0 */
        if (ctx.rank == 1) {
            alarm(20); /* (stuck for good but for this: the check fails rather than hang where the job is not ended) */
            for (;;) pause();
        }
        printf("rank %d: ddp_destroy says %s\n", ctx.rank, ddp_strerror(ddp_destroy(&ctx))); /* then ignores it */
        return 0;
    }
    /* rank 1 leaves (or stops) between two collectives */
    if (strcmp(mode, "all_without_destroy") == 0) /* every rank ends well, none with ddp_destroy */
        return ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) == DDP_OK ? 0 : 1;
    if (strcmp(mode, "last_without_destroy") == 0) { /* the others' ddp_destroy loses rank 1, and they exit 0 */
        if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
        if (ctx.rank != 1) ddp_destroy(&ctx);
        return 0;
    }
    if (strcmp(mode, "vanish") == 0 || strcmp(mode, "early_destroy") == 0 || strcmp(mode, "halt") == 0 ||
        strcmp(mode, "early_destroy_said") == 0) {
        if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
        if (ctx.rank == 1 && mode[0] == 'v') return 0; /* without ddp_destroy */
        if (ctx.rank == 1 && mode[0] == 'e') { /* ddp_destroy while the others are in a collective */
            const ddp_result r = ddp_destroy(&ctx);
            return mode[13] == '_' ? (r == DDP_ERR_ARG ? 7 : 8) : 0; /* _said: its verdict is its exit status */
        }
        if (ctx.rank == 1) raise(SIGSTOP);
        if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
        ddp_destroy(&ctx);
        return 0;
    }
    if (strcmp(mode, "own_failure_alive") == 0) { /* rank 1's own failure (an unmarked gradient) stops the others, */
        ddp_grad g;                                 /* and it goes on running a while: the launcher names it, not */
        ddp_grad_desc gd;                           /* rank 2, whose refused ddp_wait before broke nothing */
        ddp_work none;
        static float grad[100];
        struct timespec ts = {5, 0};
        memset(&none, 0, sizeof none);
        if (ctx.rank == 2 && ddp_wait(&ctx, &none, NULL) != DDP_ERR_ARG) return 12;
        memset(&gd, 0, sizeof gd);
        gd.grads = grad;
        gd.count = 100;
        gd.bucket_bytes = 160;
        if (ddp_grad_init(&g, &ctx, &gd) != DDP_OK) return 11;
        ddp_grad_ready(&g, 0, ctx.rank == 1 ? 99 : 100);
        if (ddp_grad_finish(&g) == DDP_OK) return 0;
        if (ctx.rank == 1) nanosleep(&ts, NULL); /* (the launcher's SIGTERM ends it sooner) */
        return 1;
    }
    if (strcmp(mode, "kill_callers_child") == 0 && ctx.rank == 0) kill((pid_t)atoi(getenv("KILL_PID")), SIGKILL);
    if (strcmp(mode, "lastwords") == 0) { /* as lesson 5 with a bad checkpoint: all give up, rank 0 says why */
        ddp_barrier(&ctx);
        if (ctx.rank == 0) { printf("rank 0's last words\n"); fflush(stdout); }
        return 1;
    }
    /* everyone else waits for rank 2 in a collective that never completes */
    ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
    ddp_destroy(&ctx);
    return 0;
}

static void test_launcher(const char *self, const char *mode, int want)
{
    char pidfile[] = "/tmp/ddp-test-pids-XXXXXX", name[64];
    char *args[4];
    int fd = mkstemp(pidfile), rc, orphans = 0, pid;
    double t0 = now_s(), dt;
    FILE *f;
    close(fd);
    setenv("PID_FILE", pidfile, 1);
    setenv("DDP_TIMEOUT", "600", 1); /* only the launcher can end this quickly */
    args[0] = (char *)self; args[1] = (char *)"--launched"; args[2] = (char *)mode; args[3] = NULL;
    rc = ddp_run(4, args);
    dt = now_s() - t0;
    f = fopen(pidfile, "r");
    while (f && fscanf(f, "%d", &pid) == 1) orphans += kill(pid, 0) == 0;
    if (f) fclose(f);
    unlink(pidfile);
    snprintf(name, sizeof name, "launcher.%s_stops_the_job", mode);
    CHECK(name, rc == want && dt < 5 && orphans == 0, "status %d (want %d) after %.1f s, %d ranks left running",
          rc, want, dt, orphans);
}

/* 1 while the process has not ended (a zombie has ended) */
static int running(int pid)
{
    char path[64], buf[512], *p;
    FILE *f;
    size_t n;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (!(f = fopen(path, "r"))) return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return (p = strrchr(buf, ')')) != NULL && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

/* ddp_run(n, self --launched mode) in a child whose output goes to `out`; its status.
   With `late`, the launcher is stopped from the ranks' start until all have ended, as
   a launcher scheduled late on a busy machine finds every rank's end at once. */
static int launch_to_file(const char *self, const char *mode, int n, const char *out, int late)
{
    char *args[4], pidfile[] = "/tmp/ddp-test-pids-XXXXXX";
    int st = 0, pids[64], got = 0, fd = mkstemp(pidfile), i;
    double t0 = now_s();
    pid_t pid;
    close(fd);
    setenv("PID_FILE", pidfile, 1);
    args[0] = (char *)self; args[1] = (char *)"--launched"; args[2] = (char *)mode; args[3] = NULL;
    fflush(NULL);
    if ((pid = fork()) == 0) {
        fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        _exit(ddp_run(n, args));
    }
    while (late && got < n && now_s() - t0 < 10) { /* each rank writes its pid as it starts */
        struct timespec ts = {0, 5000000L};
        FILE *f = fopen(pidfile, "r");
        for (got = 0; f && got < n && fscanf(f, "%d", &pids[got]) == 1; got++) {}
        if (f) fclose(f);
        if (got < n) nanosleep(&ts, NULL); /* polling a file the ranks write */
    }
    if (late && got == n) {
        kill(pid, SIGSTOP);
        for (i = 0; i < n && now_s() - t0 < 20; i += !running(pids[i])) {
            struct timespec ts = {0, 20000000L};
            if (running(pids[i])) nanosleep(&ts, NULL); /* polling /proc until the ranks have ended */
        }
        kill(pid, SIGCONT);
    }
    waitpid(pid, &st, 0);
    unlink(pidfile);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int file_has(const char *path, const char *text)
{
    char buf[16384];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    return strstr(buf, text) != NULL;
}

/* The launcher names the rank that failed first on its own (here killed by SIGKILL, as
   an OOM kill), with its status, not one that failed because it was gone; and ranks
   that give up together all get to say why before the launcher stops the rest. */
static void test_launcher_blame(const char *self)
{
    char out[] = "/tmp/ddp-test-out-XXXXXX";
    int fd = mkstemp(out), i, named = 0, spoke = 0, rc, runs = 3;
    char bad[300] = "";
    double t0, dt;
    close(fd);
    setenv("DDP_TIMEOUT", "600", 1);
    for (i = 0; i < runs; i++) {
        rc = launch_to_file(self, "kill5", 8, out, i > 0);
        if (rc == 128 + SIGKILL && file_has(out, "ddp: rank 5 (pid ")) named++;
        else if (!bad[0]) snprintf(bad, sizeof bad, "status %d, %s", rc, file_has(out, "ddp: rank 5 (pid ") ? "rank 5 named" : "rank 5 not named");
    }
    CHECK("launcher.names_the_killed_rank", named == runs, "%d of %d runs named rank 5 with status 137; the first other: %s",
          named, runs, bad);
    for (i = 0; i < 10; i++)
        spoke += launch_to_file(self, "lastwords", 8, out, 0) == 1 && file_has(out, "rank 0's last words");
    CHECK("launcher.last_words_reach_the_output", spoke == 10, "rank 0's line was in the output of %d of 10 runs", spoke);
    /* a rank that exits 0 mid-job is what failed, not the rank that lost it first */
    for (named = 0, bad[0] = 0, i = 0; i < runs; i++) {
        rc = launch_to_file(self, "vanish", 5, out, i > 0);
        if (rc == 1 && file_has(out, "ddp: rank 1 (pid ") && file_has(out, "status 0 while the others still needed it")) named++;
        else if (!bad[0]) snprintf(bad, sizeof bad, "status %d, %s", rc, file_has(out, "ddp: rank 1 (pid ") ? "rank 1 named" : "rank 1 not named");
    }
    CHECK("launcher.names_the_rank_that_left_mid_job", named == runs, "%d of %d runs named rank 1 with status 1; the first other: %s",
          named, runs, bad);
    /* ddp_init under a signal every 100 us: its connect() was interrupted every time, and
       every rank failed ("cannot reach rank 0's store ... Interrupted system call") */
    setenv("DDP_TIMEOUT", "3", 1); /* (retried until it timed out) */
    rc = launch_to_file(self, "ticking", 3, out, 0);
    CHECK("launcher.ranks_meet_under_a_signal_every_100us", rc == 0, "status %d", rc);
    setenv("DDP_TIMEOUT", "600", 1);
    /* the same where the program is a wrapper's child (its reports come from a pid the
       launcher did not start), or closed the descriptors it inherited (the report pipe's
       among them): another rank was blamed, or rank 1 said to have left before ddp_init */
    for (i = 0; i < 2; i++) {
        rc = launch_to_file(self, i ? "closefds_vanish" : "wrapped_vanish", 3, out, 0);
        CHECK(i ? "launcher.names_the_rank_that_left_mid_job_with_its_descriptors_closed"
                : "launcher.names_the_rank_that_left_mid_job_under_a_wrapper",
              rc == 1 && file_has(out, "ddp: rank 1 (pid ") && file_has(out, "status 0 while the others still needed it"),
              "status %d, %s", rc, file_has(out, "ddp: rank 1 (pid ") ? "rank 1 named" : "rank 1 not named");
    }
    /* rank 2's own child failed in its ddp_init before rank 2 joined: the launcher took that
       child's report for rank 2's and named rank 2 (under a wrapper 10 runs of 10) */
    for (i = 0; i < 2; i++) {
        rc = launch_to_file(self, i ? "forks_vanish" : "wrapped_forks_vanish", 3, out, 0);
        CHECK(i ? "launcher.a_ranks_failed_child_is_not_the_rank" : "launcher.a_ranks_failed_child_is_not_the_rank_under_a_wrapper",
              rc == 1 && file_has(out, "ddp: rank 1 (pid ") && file_has(out, "status 0 while the others still needed it"),
              "status %d, %s", rc, file_has(out, "ddp: rank 2 (pid ") ? "rank 2 named" : "rank 1 not named");
    }
    /* the ranks stopped by one whose failure was its own and that goes on running: that one is named */
    for (named = 0, bad[0] = 0, i = 0; i < 2; i++) {
        rc = launch_to_file(self, "own_failure_alive", 3, out, 0);
        if (rc == 1 && file_has(out, "after rank 1 (pid ") && file_has(out, "failed on its own (invalid argument) and went on running"))
            named++;
        else if (!bad[0]) snprintf(bad, sizeof bad, "status %d, rank 1 %s", rc, file_has(out, "after rank 1 (pid ") ? "named" : "not named");
    }
    CHECK("launcher.names_a_rank_that_failed_on_its_own_and_runs_on", named == 2, "%d of 2 runs; the first other: %s", named, bad);
    /* the same rank exiting with its ddp_destroy's verdict, not 0: it is named, and its status
       is the job's (a rank it stopped was blamed, with status 1) */
    /* a rank that dies before ddp_init (a division by a zeroed ddp_ctx's world_size) is said
       to, and one that dies after it is not */
    rc = launch_to_file(self, "fpe_before_init", 3, out, 0);
    CHECK("launcher.says_a_rank_died_before_ddp_init", rc == 128 + SIGFPE &&
          file_has(out, "was killed by signal 8 (Floating point exception) before it called ddp_init"), "status %d", rc);
    /* (the line ends "; stopped the other 2" only where the launcher saw the crash before the
       others saw rank 1 gone and exited on their own: 3% of runs on a loaded machine did not) */
    rc = launch_to_file(self, "segv", 3, out, 0);
    CHECK("launcher.says_nothing_of_ddp_init_for_a_rank_that_joined", rc == 128 + SIGSEGV &&
          file_has(out, "ddp: rank 1 (pid ") && file_has(out, "was killed by signal 11 (Segmentation fault)") &&
          !file_has(out, "before it called ddp_init"), "status %d", rc);
    rc = launch_to_file(self, "segv_after_failed_init", 2, out, 0);
    CHECK("launcher.says_nothing_of_ddp_init_for_a_rank_whose_ddp_init_failed", rc == 128 + SIGSEGV &&
          file_has(out, "(Segmentation fault)") && !file_has(out, "before it called ddp_init"), "status %d", rc);
    /* no rank calls ddp_destroy: the job ends well (each did its part), with a warning; a
       job whose ranks all do has none */
    rc = launch_to_file(self, "all_without_destroy", 3, out, 0);
    CHECK("launcher.warns_when_no_rank_called_ddp_destroy", rc == 0 &&
          file_has(out, "ddp: warning: no rank called ddp_destroy before it exited"), "status %d", rc);
    rc = launch_to_file(self, "exit0", 3, out, 0);
    CHECK("launcher.no_warning_when_every_rank_called_ddp_destroy", rc == 0 && !file_has(out, "warning"), "status %d",
          rc);
    rc = launch_to_file(self, "early_destroy_said", 3, out, 0);
    CHECK("launcher.names_the_rank_that_destroyed_early_and_failed", rc == 7 && file_has(out, "ddp: rank 1 (pid ") &&
          file_has(out, "exited with status 7"), "status %d, %s", rc,
          file_has(out, "ddp: rank 1 (pid ") ? "rank 1 named" : "rank 1 not named");
    rc = launch_to_file(self, "early_destroy", 3, out, 0);
    CHECK("launcher.names_the_rank_that_destroyed_early", rc == 1 && file_has(out, "ddp: rank 1 (pid ") &&
          file_has(out, "status 0 while the others still needed it"), "status %d, %s", rc,
          file_has(out, "ddp: rank 1 (pid ") ? "rank 1 named" : "rank 1 not named");
    /* every rank exits 0, but rank 1 never came to the ddp_destroy the others lost it in:
       the job failed (it ended 0), and rank 1 is why */
    for (named = 0, bad[0] = 0, i = 0; i < runs; i++) {
        rc = launch_to_file(self, "last_without_destroy", 3, out, i > 0);
        if (rc == 1 && file_has(out, "ddp: rank 1 (pid ") && file_has(out, "status 0 while the others still needed it")) named++;
        else if (!bad[0]) snprintf(bad, sizeof bad, "status %d, %s", rc, file_has(out, "ddp: rank 1 (pid ") ? "rank 1 named" : "rank 1 not named");
    }
    CHECK("launcher.names_the_rank_missing_from_ddp_destroy", named == runs,
          "%d of %d runs named rank 1 with status 1; the first other: %s", named, runs, bad);
    /* a stopped rank is why the others time out; it is continued to take the launcher's SIGTERM */
    setenv("DDP_TIMEOUT", "1", 1);
    /* a rank stuck for good while the others reach ddp_destroy, time out there and exit 0:
       their failure ends the job (the launcher waited for the stuck rank forever) */
    t0 = now_s();
    rc = launch_to_file(self, "stuck_at_the_end", 3, out, 0);
    dt = now_s() - t0;
    CHECK("launcher.ends_a_job_whose_ranks_failed_in_ddp_destroy", rc == 1 &&
          file_has(out, "exited with status 0 after it timed out waiting for rank 1 (pid ") &&
          file_has(out, ", still running); stopped the other") && dt < 8, "status %d after %.1f s", rc, dt);
    CHECK("launcher.ddp_destroy_says_the_job_failed", file_has(out, "rank 0: ddp_destroy says timed out") ||
          file_has(out, "rank 0: ddp_destroy says the process group was aborted"), "rank 0's line is not in the output");
    /* the rank the first failure waited for is the one to look at: the summary names it */
    for (named = 0, bad[0] = 0, i = 0; i < runs; i++) {
        rc = launch_to_file(self, "stuck_mid_job", 4, out, 0); /* (late: the stuck rank never ends) */
        if (rc == 1 && file_has(out, "exited with status 1 after it timed out waiting for rank 2 (pid ") &&
            file_has(out, ", still running); stopped the other")) named++;
        else if (!bad[0]) snprintf(bad, sizeof bad, "status %d, %s", rc, file_has(out, "waiting for rank 2 (pid ") ?
                                   "rank 2 named" : "rank 2 not named in the summary");
    }
    CHECK("launcher.names_the_rank_a_timeout_waited_for", named == runs,
          "%d of %d runs named rank 2 with status 1; the first other: %s", named, runs, bad);
    /* the same after a failure of each rank's own that broke nothing: what broke the group
       is told with the rank it waited for (the launcher said only 'rank 0 exited with status 1') */
    rc = launch_to_file(self, "stuck_after_refusal", 4, out, 0);
    CHECK("launcher.names_the_rank_a_timeout_waited_for_after_a_refusal", rc == 1 &&
          file_has(out, "exited with status 1 after it timed out waiting for rank 2 (pid "), "status %d, %s", rc,
          file_has(out, "waiting for rank 2 (pid ") ? "rank 2 named" : "rank 2 not named in the summary");
    rc = launch_to_file(self, "stuck_before_init", 4, out, 0);
    CHECK("launcher.names_a_rank_stuck_before_ddp_init", rc == 10 &&
          file_has(out, "after it timed out waiting for rank 3 (pid ") && file_has(out, "not yet in ddp_init)"),
          "status %d, %s", rc, file_has(out, "waiting for rank 3 (pid ") ? "rank 3 named" : "rank 3 not named");
    rc = launch_to_file(self, "abort_after_timeout", 4, out, 0);
    CHECK("launcher.names_the_rank_a_killed_rank_waited_for", rc == 128 + SIGABRT &&
          file_has(out, "(Aborted) after it timed out waiting for rank 2 (pid "), "status %d, %s", rc,
          file_has(out, "waiting for rank 2 (pid ") ? "rank 2 named" : "rank 2 not named");
    rc = launch_to_file(self, "stray_bytes", 4, out, 0);
    CHECK("launcher.reports_survive_stray_bytes", rc == 1 && file_has(out, "after it timed out waiting for rank 2 (pid "),
          "status %d, %s", rc, file_has(out, "waiting for rank 2 (pid ") ? "rank 2 named" : "rank 2 not named");
    rc = launch_to_file(self, "bystander_stopped", 4, out, 0);
    CHECK("launcher.names_the_waited_rank_before_a_stopped_one", rc == 1 &&
          file_has(out, "after it timed out waiting for rank 1 (pid ") && !file_has(out, "stayed stopped"),
          "status %d, %s", rc, file_has(out, "stayed stopped") ? "the stopped rank 3 named" : "rank 1 not named");
    t0 = now_s();
    rc = launch_to_file(self, "halt", 3, out, 0);
    dt = now_s() - t0;
    CHECK("launcher.names_the_stopped_rank", rc == 1 && file_has(out, "ddp: rank 1 (pid ") && file_has(out, "stayed stopped by signal") &&
          dt < 6, "status %d after %.1f s, %s", rc, dt, file_has(out, "ddp: rank 1 (pid ") ? "rank 1 named" : "rank 1 not named");
    unlink(out);
    unsetenv("DDP_TIMEOUT");
}

/* ddp_run waits for its own ranks only: a child the calling program started is still
   there for the program to wait for (the launcher took any child's end), and the
   program's SIGCHLD handler hears of it. Rank 0 ends that child during the run. */
static volatile sig_atomic_t chlds; /* SIGCHLDs the caller's handler got */
static void on_chld(int sig) { (void)sig; chlds++; }

static void test_launcher_children(const char *self)
{
    char *args[4], num[16];
    int st = 0, rc;
    pid_t mine, got;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_chld;
    sigaction(SIGCHLD, &sa, &old);
    setenv("PID_FILE", "/dev/null", 1);
    fflush(NULL);
    if ((mine = fork()) == 0) {
        for (;;) pause(); /* until rank 0 kills it */
    }
    snprintf(num, sizeof num, "%d", (int)mine);
    setenv("KILL_PID", num, 1);
    chlds = 0;
    args[0] = (char *)self; args[1] = (char *)"--launched"; args[2] = (char *)"kill_callers_child"; args[3] = NULL;
    rc = ddp_run(3, args);
    got = waitpid(mine, &st, 0);
    CHECK("launcher.leaves_the_callers_children", rc == 0 && got == mine && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL &&
          chlds > 0, "ddp_run gave %d; the caller's own child: waitpid %s, %s; its SIGCHLD handler ran %d times", rc,
          got == mine ? "found it" : "did not find it", got == mine && WIFSIGNALED(st) ? "killed" : "not killed", (int)chlds);
    unsetenv("KILL_PID");
    sigaction(SIGCHLD, &old, NULL);
}

/* Polls the file the ranks append their pids to until it has `want` lines (10 s at
   most); returns how many it has. */
static int pid_lines(const char *path, int want)
{
    double t0;
    int lines = 0, pid;
    FILE *f;
    for (t0 = now_s(); lines < want && now_s() - t0 < 10;) {
        struct timespec ts = {0, 20000000L};
        lines = 0;
        if ((f = fopen(path, "r")) != NULL) {
            while (fscanf(f, "%d", &pid) == 1) lines++;
            fclose(f);
        }
        if (lines < want) nanosleep(&ts, NULL);
    }
    return lines;
}

/* SIGTERM to the launcher reaches every rank: the job ends, nothing is left. */
static void test_launcher_signal(const char *self)
{
    char pidfile[] = "/tmp/ddp-test-pids-XXXXXX";
    char *args[4];
    int fd = mkstemp(pidfile), st = 0, orphans = 0, pid, lines = 0;
    double t0, dt;
    pid_t launcher;
    FILE *f;
    close(fd);
    setenv("PID_FILE", pidfile, 1);
    setenv("DDP_TIMEOUT", "600", 1);
    args[0] = (char *)self; args[1] = (char *)"--launched"; args[2] = (char *)"wait"; args[3] = NULL;
    fflush(NULL);
    if ((launcher = fork()) == 0) _exit(ddp_run(3, args));
    lines = pid_lines(pidfile, 3); /* all three ranks have started: each appends its pid to the file */
    t0 = now_s();
    kill(launcher, SIGTERM);
    waitpid(launcher, &st, 0);
    dt = now_s() - t0;
    f = fopen(pidfile, "r");
    while (f && fscanf(f, "%d", &pid) == 1) orphans += kill(pid, 0) == 0;
    if (f) fclose(f);
    unlink(pidfile);
    unsetenv("DDP_TIMEOUT");
    CHECK("launcher.sigterm_reaches_every_rank", lines == 3 && WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM &&
          dt < 5 && orphans == 0, "%d ranks started, launcher status %d after %.1f s, %d ranks left running",
          lines, WIFEXITED(st) ? WEXITSTATUS(st) : -1, dt, orphans);
}

/* A stop signal reaches each rank once (it came twice: to the rank, and again from the
   scan for the attempt's other processes; "save on the first, abort on the second" aborted). */
static void test_launcher_signal_once(const char *self)
{
    char pidfile[] = "/tmp/ddp-test-pids-XXXXXX", path[64];
    char *args[4];
    int fd = mkstemp(pidfile), st = 0, lines, r, counts[3] = {0, 0, 0};
    pid_t launcher;
    FILE *f;
    close(fd);
    setenv("PID_FILE", pidfile, 1);
    setenv("DDP_TIMEOUT", "600", 1);
    args[0] = (char *)self; args[1] = (char *)"--launched"; args[2] = (char *)"count_term"; args[3] = NULL;
    fflush(NULL);
    if ((launcher = fork()) == 0) _exit(ddp_run(3, args));
    lines = pid_lines(pidfile, 6); /* each rank: its pid twice (started, handler set) */
    kill(launcher, SIGTERM);
    waitpid(launcher, &st, 0);
    for (r = 0; r < 3; r++) {
        snprintf(path, sizeof path, "%s.%d", pidfile, r);
        if ((f = fopen(path, "r"))) { if (fscanf(f, "%d", &counts[r]) != 1) counts[r] = -1; fclose(f); }
        unlink(path);
    }
    unlink(pidfile);
    unsetenv("DDP_TIMEOUT");
    CHECK("launcher.stop_signal_reaches_each_rank_once", lines == 6 && counts[0] == 1 && counts[1] == 1 &&
          counts[2] == 1 && WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM,
          "SIGTERMs per rank %d %d %d (want 1 each), launcher status %d", counts[0], counts[1], counts[2],
          WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* A rank started with its standard files closed (prog >&-, <&- >&- 2>&-) prints, then
   works: its prints went into the store's socket or the arena, which took those numbers. */
static const char *const closed_std_codes[] = {
    [10] = "init failed", [11] = "a collective after the prints failed", [12] = "a sum is wrong",
    [13] = "ddp_agree_on (through the store) failed after the prints"};
static int closed_std(int rank, void *arg)
{
    ddp_ctx ctx;
    float x[3000];
    int i, k;
    close(1);
    if (strcmp((const char *)arg, "all") == 0) { close(0); close(2); }
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    for (k = 0; k < 20; k++) {
        printf("rank %d, step %d: a line for stdout\n", rank, k);
        fflush(stdout);
        fprintf(stderr, "rank %d, step %d: a line for stderr\n", rank, k);
        for (i = 0; i < 3000; i++) x[i] = (float)(rank + i);
        if (ddp_all_reduce(&ctx, x, x, 3000, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 11;
        for (i = 0; i < 3000; i++)
            if (x[i] != (float)(ctx.world_size * i + ctx.world_size * (ctx.world_size - 1) / 2)) return 12;
    }
    if (ddp_agree_on(&ctx, "a setting", "1") != DDP_OK) return 13;
    ddp_destroy(&ctx);
    return 0;
}

/* ddp_init again right after ddp_destroy, 30 times, as a program that runs jobs one
   after another does: the ranks that left first joined rank 0's old store, which was
   ending (refused: "rank 1 left the job"), nearly every time. */
static const char *const again_codes[] = {[10] = "init failed (again)", [11] = "an all_reduce failed", [12] = "a sum is wrong"};
static int init_again(int rank, void *arg)
{
    ddp_ctx ctx;
    int k, x;
    (void)arg;
    for (k = 0; k < 30; k++) {
        if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
        x = rank + k;
        if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_I32, DDP_SUM, NULL) != DDP_OK) return 11;
        if (x != ctx.world_size * k + ctx.world_size * (ctx.world_size - 1) / 2) return 12;
        ddp_destroy(&ctx);
    }
    return 0;
}

/* ddp_init twice: on the same live ddp_ctx, and on another for the rank this process
   holds already. Both are refused by name (the first was said as two launches on one
   port, or in a world of one leaked silently), and the live context goes on. */
static const char *const twice_codes[] = {
    [10] = "init failed", [11] = "ddp_init on the live ddp_ctx was not refused, named",
    [12] = "the live context broke", [13] = "a second ddp_ctx for the rank was not refused, named",
    [14] = "ddp_destroy of the refused ddp_ctx did not return its failure", [15] = "ddp_destroy failed",
    [16] = "ddp_grad_init failed", [17] = "ddp_grad_init on the live ddp_grad was not refused, named",
    [18] = "the live ddp_grad broke", [19] = "ddp_grad_init after ddp_grad_destroy failed",
    [20] = "ddp_grad_init of another ddp_grad where one was left undestroyed failed"};
static int init_twice(int rank, void *arg)
{
    ddp_ctx ctx, other;
    ddp_grad g;
    ddp_grad_desc gd;
    float grads[8] = {0};
    int x = rank;
    ddp_result r;
    (void)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    memset(&gd, 0, sizeof gd);
    gd.grads = grads;
    gd.count = 8;
    if (ddp_grad_init(&g, &ctx, &gd) != DDP_OK) return 16;
    if (ddp_grad_init(&g, &ctx, &gd) != DDP_ERR_ARG ||
        !strstr(ddp_error(&ctx), "ddp_grad_init on a ddp_grad that ddp_grad_init set up before: ddp_grad_destroy it "
                                 "first"))
        return 17;
    grads[3] = (float)rank;
    if (ddp_grad_ready(&g, 0, 8) != DDP_OK || ddp_grad_finish(&g) != DDP_OK ||
        grads[3] != (float)(ctx.world_size * (ctx.world_size - 1) / 2) / (float)ctx.world_size)
        return 18;
    ddp_grad_destroy(&g);
    if (ddp_grad_init(&g, &ctx, &gd) != DDP_OK) return 19;
    memset(&g, 0, sizeof g); /* as another function's ddp_grad where a returned one was left (leaked) */
    if (ddp_grad_init(&g, &ctx, &gd) != DDP_OK) return 20;
    ddp_grad_destroy(&g);
    if (ddp_init(&ctx, NULL) != DDP_ERR_ARG || !strstr(ddp_error(&ctx), "ddp_init on a ddp_ctx that ddp_init set up "
                                                                       "before: ddp_destroy it first"))
        return 11;
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_I32, DDP_SUM, NULL) != DDP_OK ||
        x != ctx.world_size * (ctx.world_size - 1) / 2)
        return 12;
    if (ctx.world_size > 1) {
        char want[64];
        snprintf(want, sizeof want, "this process holds rank %d of job '", rank);
        if (ddp_init(&other, NULL) != DDP_ERR_ARG || !strstr(ddp_error(&other), want)) return 13;
        if ((r = ddp_destroy(&other)) != DDP_ERR_ARG) return 14;
        if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_I32, DDP_SUM, NULL) != DDP_OK) return 12;
    }
    return ddp_destroy(&ctx) == DDP_OK ? 0 : 15;
}

/* ddp_init again on the ddp_ctx of a failed ddp_init, without ddp_destroy (a loop that
   waits for rank 0 to come up): each try tries again and says why it failed, where the
   first failure's state was taken for a live context's and refused for good. */
static void test_init_retry(void)
{
    int fds[2], st = 0, n = 0;
    char said[2][400] = {"", ""};
    pid_t pid;
    if (pipe(fds) != 0 || (pid = fork()) < 0) {
        CHECK("failures.init_retry_after_a_failed_init", 0, "pipe or fork failed");
        return;
    }
    if (pid == 0) {
        ddp_ctx ctx;
        ddp_desc d;
        int k;
        char port[16];
        close(fds[0]);
        snprintf(port, sizeof port, "%d", 20000 + (int)(getpid() % 20000));
        setenv("RANK", "1", 1), setenv("WORLD_SIZE", "2", 1), setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", port, 1), setenv("DDP_TIMEOUT", "0.3", 1);
        unsetenv("DDP_LAUNCHER");
        for (k = 0; k < 2; k++) {
            ddp_result r = quiet(&ctx, &d);
            dprintf(fds[1], "%d %s\n", (int)r, ddp_error(&ctx));
        }
        _exit(ddp_destroy(&ctx) == DDP_OK ? 0 : 3);
    }
    close(fds[1]);
    {
        FILE *f = fdopen(fds[0], "r");
        while (f && n < 2 && fgets(said[n], sizeof said[n], f)) n++;
        if (f) fclose(f);
    }
    waitpid(pid, &st, 0);
    CHECK("failures.init_retry_after_a_failed_init", n == 2 && atoi(said[0]) == DDP_ERR_TIMEOUT &&
          atoi(said[1]) == DDP_ERR_TIMEOUT && strstr(said[1], "rank 0's store") && WIFEXITED(st) && WEXITSTATUS(st) == 3,
          "tries said '%s' and '%s', status %d", said[0], said[1], st);
}

/* Rank 1 forks a worker that never execs (a data loader's), then dies: the worker
   shares rank 1's lock on the arena, which said rank 1 lived; rank 0 waited DDP_TIMEOUT. */
static const char *const forked_codes[] = {
    [10] = "init failed", [11] = "rank 0's all_reduce did not fail", [12] = "the error does not say rank 1 exited",
    [13] = "noticing took over 5 s", [14] = "fork failed"};
static int forked_then_died(int rank, void *arg)
{
    ddp_ctx ctx;
    float x = 1;
    double t0;
    (void)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (rank == 1) {
        pid_t worker = fork();
        if (worker < 0) return 14;
        if (worker == 0) { /* lives on 8 s (then the lock goes: what rank 0 noticed before) */
            poll(NULL, 0, 8000);
            _exit(0);
        }
        _exit(0); /* without a word */
    }
    t0 = now_s();
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) == DDP_OK) return 11;
    if (!strstr(ddp_error(&ctx), "rank 1 (pid ")) return 12;
    if (now_s() - t0 > 5) return 13;
    ddp_destroy(&ctx);
    return 0;
}

int main(int argc, char **argv)
{
    test_job job;
    if (argc > 2 && strcmp(argv[1], "--launched") == 0) return launched_child(argv[2]);
    setenv("DDP_TIMEOUT", "30", 1);
    test_spawn(&job, 3, peer_death, NULL);
    CHECK("failures.peer_death_detected", job.failed == 0 && job.seconds < 10, "%s, %.1f s",
          TEST_JOB_WHY(&job, peer_death_codes), job.seconds);
    test_spawn(&job, 3, dead_while_late, NULL);
    CHECK("failures.death_seen_while_another_is_late", job.failed == 0, "%s, %.1f s",
          TEST_JOB_WHY(&job, dead_while_late_codes), job.seconds);
    setenv("DDP_TIMEOUT", "1", 1);
    test_spawn(&job, 2, late_peer, NULL);
    CHECK("failures.timeout_names_late_rank", job.failed == 0, "%s", TEST_JOB_WHY(&job, late_peer_codes));
    setenv("DDP_TIMEOUT", "1.5", 1);
    test_spawn(&job, 2, missing_peer, NULL);
    CHECK("failures.missing_peer_times_out", job.failed == 0 && job.seconds < 5, "%s, %.1f s",
          TEST_JOB_WHY(&job, missing_peer_codes), job.seconds);
    test_spawn(&job, 2, foreign_job, NULL);
    CHECK("failures.foreign_job_refused", job.failed == 0 && job.seconds < 5, "%s, %.1f s",
          TEST_JOB_WHY(&job, foreign_job_codes), job.seconds);
    test_spawn(&job, 2, duplicate_rank, NULL);
    CHECK("failures.duplicate_rank_refused", job.failed == 0 && job.seconds < 5, "%s, %.1f s",
          TEST_JOB_WHY(&job, duplicate_rank_codes), job.seconds);
    test_spawn(&job, 2, misjoin, (void *)"world");
    CHECK("failures.rank0_names.world_size_differs_at_once", job.failed == 0, "%s, %.1f s", TEST_JOB_WHY(&job, misjoin_codes),
          job.seconds);
    test_spawn(&job, 2, misjoin, (void *)"secret");
    CHECK("failures.rank0_names.secret_on_rank0_only", job.failed == 0, "%s", TEST_JOB_WHY(&job, misjoin_codes));
    test_spawn(&job, 2, misjoin, (void *)"job_id");
    CHECK("failures.rank0_names.job_id_typo", job.failed == 0, "%s", TEST_JOB_WHY(&job, misjoin_codes));
    test_not_a_store();
    setenv("DDP_TIMEOUT", "30", 1);
    test_spawn(&job, 2, forked_then_died, NULL);
    CHECK("failures.death_noticed_past_a_forked_worker", job.failed == 0, "%s, %.1f s",
          TEST_JOB_WHY(&job, forked_codes), job.seconds);
    test_spawn(&job, 3, init_again, NULL);
    CHECK("failures.init_again_after_destroy", job.failed == 0, "%s", TEST_JOB_WHY(&job, again_codes));
    test_init_retry();
    test_spawn(&job, 1, init_twice, NULL);
    CHECK("failures.init_twice_refused_world_of_one", job.failed == 0, "%s", TEST_JOB_WHY(&job, twice_codes));
    test_spawn(&job, 3, init_twice, NULL);
    CHECK("failures.init_twice_refused", job.failed == 0, "%s", TEST_JOB_WHY(&job, twice_codes));
    setenv("DDP_SHM_CHUNK", "4096", 1); /* several chunks per collective */
    test_spawn(&job, 3, closed_std, (void *)"out");
    CHECK("failures.stdout_closed", job.failed == 0, "%s", TEST_JOB_WHY(&job, closed_std_codes));
    test_spawn(&job, 3, closed_std, (void *)"all");
    CHECK("failures.stdin_stdout_stderr_closed", job.failed == 0, "%s", TEST_JOB_WHY(&job, closed_std_codes));
    unsetenv("DDP_SHM_CHUNK");
    unsetenv("DDP_TIMEOUT");
    test_store();
    test_launcher(argv[0], "exit3", 3);
    test_launcher(argv[0], "segv", 128 + SIGSEGV);
    test_launcher(argv[0], "exit0_before_init", 1);
    test_launcher_signal(argv[0]);
    test_launcher_signal_once(argv[0]);
    test_launcher_blame(argv[0]);
    test_launcher_children(argv[0]);
    TEST_EXIT();
}
