/* The CPU backend's shared memory and processes: an arena left by a crash is removed
   (by the launcher, or by the next job once nobody holds it), a full /dev/shm is a
   clear error rather than a SIGBUS, ranks in different PID namespaces tell live from
   dead, and ranks that share a host name but not /dev/shm are told so. The namespace
   cases need root (CI has it) and say why they skip otherwise. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>

static int shm_exists(const char *name)
{
    char path[300];
    struct stat sb;
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return stat(path, &sb) == 0;
}

/* makes /dev/shm/<name> look a minute old */
static void age(const char *name)
{
    struct timespec t[2];
    int fd = shm_open(name, O_RDWR, 0);
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= 60;
    t[1] = t[0];
    if (fd >= 0) { futimens(fd, t); close(fd); }
}

static int plain_job(int rank, void *arg)
{
    ddp_ctx ctx;
    float x = (float)rank;
    (void)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 11;
    ddp_destroy(&ctx);
    return 0;
}

/* Rank 0 is real; rank 1 is played here through the store's protocol, so rank 0 can
   be killed at the one moment its arena has a name: after creating it, before all
   have mapped it. */
static int leak_rank0(int rank, void *arg)
{
    (void)arg;
    if (rank != 0) return 0;
    return plain_job(0, NULL);
}

static int store_call(int fd, uint32_t op, const char *key, const char *val, char *out, size_t n)
{
    uint32_t status = 0, len = 0;
    char *reply = NULL;
    if (ddp__store_io(fd, op, key, val, (uint32_t)strlen(val), ddp__now_ms() + 10000, &status, &reply, &len, NULL) != 0)
        return -1;
    snprintf(out, n, "%.*s", (int)len, reply);
    free(reply);
    return (int)status;
}

static void test_crash_leaves_nothing(void)
{
    char name[200] = "", hello[80], settings[700], host[400], reply[1024];
    int port = test_free_port(), fd = -1, leaked = 0, gone, k;
    pid_t rank0;
    test_job job;
    double t0 = test_now_s();
    fflush(NULL);
    if ((rank0 = fork()) == 0) { /* rank 0 of a job of two, the real code */
        char v[16];
        snprintf(v, sizeof v, "%d", port);
        setenv("RANK", "0", 1); setenv("WORLD_SIZE", "2", 1); setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", v, 1); setenv("DDP_JOB_ID", "leak-test", 1);
        _exit(leak_rank0(0, NULL));
    }
    while (fd < 0 && test_now_s() - t0 < 10) {
        struct sockaddr_in a;
        struct timespec ts = {0, 10000000L};
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); fd = -1; nanosleep(&ts, NULL); }
    }
    ddp__host_id(host, sizeof host);
    snprintf(hello, sizeof hello, "1 2 00112233445566778899aabbccddeeff");
    snprintf(settings, sizeof settings, "%s\n-1 -1 -1\nddp.h=%s backend=cpu shm_chunk=%zu mpi_chunk=0 check=0", host, DDP__VERSION, DDP__DEFAULT_CHUNK);
    k = fd >= 0 && store_call(fd, DDP__HELLO, "leak-test", hello, reply, sizeof reply) == 0 &&
        store_call(fd, DDP__GATHER, "meet", settings, reply, sizeof reply) == 0 &&
        store_call(fd, DDP__GET, "shm", "", reply, sizeof reply) == 0 && sscanf(reply, "%199s", name) == 1;
    if (k) leaked = shm_exists(name);
    kill(rank0, SIGKILL); /* the crash: rank 0 waits for rank 1 to map the arena */
    waitpid(rank0, NULL, 0);
    if (fd >= 0) close(fd);
    leaked = leaked && shm_exists(name);
    age(name);
    test_spawn(&job, 2, plain_job, NULL); /* the next job on this host */
    gone = !shm_exists(name);
    if (!gone) shm_unlink(name);
    CHECK("shm.crash_leftover_removed_by_next_job", k && leaked && gone && job.failed == 0,
          "rank 0 made '%s' (%s); killed, it was %s; after the next job (%s) it is %s", name, k ? "seen" : "not seen",
          leaked ? "left behind" : "not there", test_job_why(&job, NULL, 0), gone ? "gone" : "still there");
}

/* Rank 0 of a job started by hand (no launcher to clean up after it) is killed the
   moment its arena has a name: the other rank, failing, removes it. No later job on
   the host is needed. The name lasts a millisecond or so: tries until it was caught
   three times. */
static void test_killed_rank0_leaves_nothing(void)
{
    int t, seen = 0, left = 0;
    for (t = 0; t < 40 && seen < 3; t++) { /* a loaded machine misses most */
        char job[64], name[200], path[260];
        int port = test_free_port(), r, appeared = 0;
        double t0 = test_now_s();
        pid_t pid[2];
        snprintf(job, sizeof job, "orphan-%d-%d", (int)getpid(), t);
        fflush(NULL);
        for (r = 0; r < 2; r++)
            if ((pid[r] = fork()) == 0) {
                char v[16];
                int devnull = open("/dev/null", O_WRONLY);
                dup2(devnull, 2);
                snprintf(v, sizeof v, "%d", r);
                setenv("RANK", v, 1); setenv("WORLD_SIZE", "2", 1); setenv("MASTER_ADDR", "127.0.0.1", 1);
                snprintf(v, sizeof v, "%d", port);
                setenv("MASTER_PORT", v, 1); setenv("DDP_JOB_ID", job, 1);
                _exit(plain_job(r, NULL));
            }
        snprintf(name, sizeof name, "/ddp.%016llx.%d", (unsigned long long)ddp__hash(job), (int)pid[0]);
        snprintf(path, sizeof path, "/dev/shm%s", name);
        while (!(appeared = access(path, F_OK) == 0) && test_now_s() - t0 < 10) {
            struct timespec ts = {0, 100000L};
            if (waitpid(pid[0], NULL, WNOHANG) == pid[0]) { pid[0] = 0; break; } /* missed: the job is over */
            nanosleep(&ts, NULL); /* polling /dev/shm for the arena's name */
        }
        if (appeared) kill(pid[1], SIGSTOP); /* rank 1 waits while rank 0 dies */
        if (pid[0]) {
            kill(pid[0], SIGKILL);
            waitpid(pid[0], NULL, 0);
        }
        kill(pid[1], SIGCONT);
        waitpid(pid[1], NULL, 0);
        seen += appeared;
        if (shm_exists(name)) { left++; shm_unlink(name); }
    }
    CHECK("shm.killed_rank0_leaves_nothing", seen == 3 && left == 0, "rank 0 was killed with its arena named in %d of "
          "%d tries; the arena was left in /dev/shm after %d", seen, t, left);
}

/* An arena someone still holds is never removed, however old. */
static void test_held_arena_kept(void)
{
    const char *name = "/ddp.heldbytest.1";
    struct flock fl;
    test_job job;
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600), kept;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 3;
    fl.l_len = 1;
    if (fd < 0 || ftruncate(fd, 4096) != 0 || fcntl(fd, F_OFD_SETLK, &fl) != 0) {
        test_skip("shm.held_arena_kept", "cannot create and lock a test arena in /dev/shm");
        if (fd >= 0) close(fd);
        shm_unlink(name);
        return;
    }
    age(name);
    test_spawn(&job, 2, plain_job, NULL);
    kept = shm_exists(name);
    close(fd);
    shm_unlink(name);
    CHECK("shm.held_arena_kept", kept && job.failed == 0, "a locked arena was %s; job: %s", kept ? "kept" : "removed",
          test_job_why(&job, NULL, 0));
}

/* The launcher removes whatever its job left in /dev/shm, crash or not. */
static int launched_leaker(void)
{
    char name[128];
    int fd;
    snprintf(name, sizeof name, "/ddp.%016llx.%d", (unsigned long long)ddp__hash(getenv("DDP_JOB_ID")), (int)getpid());
    fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return 10;
    close(fd);
    printf("%s\n", name);
    return 3; /* a failing rank, its arena left behind */
}

static void test_launcher_sweeps(const char *self)
{
    char *args[] = {(char *)self, (char *)"--leak", NULL};
    char out[] = "/tmp/ddp-shm-test-XXXXXX", name[160] = "";
    int fd = mkstemp(out), saved = dup(1), rc, left = 0;
    FILE *f;
    fflush(NULL);
    dup2(fd, 1);
    rc = ddp_run(2, args);
    fflush(NULL);
    dup2(saved, 1);
    close(saved);
    close(fd);
    f = fopen(out, "r");
    while (f && fscanf(f, "%159s", name) == 1) left += shm_exists(name);
    if (f) fclose(f);
    unlink(out);
    CHECK("shm.launcher_removes_its_arenas", rc == 3 && name[0] && left == 0, "status %d, %d arenas left (%s)", rc, left,
          name);
}

/* What is not an arena stays, and does not stop a job: a FIFO named like an arena (any
   user can make one in /dev/shm; opening it waited for a writer, and the job timed out),
   a FIFO and a file that only start with "ddp." (they were deleted). */
static void test_strangers_in_dev_shm(void)
{
    const char *fifo = "/dev/shm/ddp.0123456789abcdef.99999999", *other = "/dev/shm/ddp.test-not-an-arena";
    const char *odd = "/dev/shm/ddp.test-fifo";
    char p[3][64];
    test_job job;
    double t0;
    int k, made, kept;
    unlink(fifo);
    unlink(other);
    unlink(odd);
    made = mkfifo(fifo, 0666) == 0 && mkfifo(odd, 0666) == 0;
    k = open(other, O_WRONLY | O_CREAT | O_EXCL, 0600);
    made = made && k >= 0 && write(k, "x", 1) == 1;
    if (k >= 0) close(k);
    snprintf(p[0], sizeof p[0], "/%s", fifo + 9);
    snprintf(p[1], sizeof p[1], "/%s", other + 9);
    snprintf(p[2], sizeof p[2], "/%s", odd + 9);
    for (k = 0; k < 3; k++) { /* a minute old: past the sweep's age */
        struct timespec t[2];
        clock_gettime(CLOCK_REALTIME, &t[0]);
        t[0].tv_sec -= 60;
        t[1] = t[0];
        utimensat(AT_FDCWD, k == 0 ? fifo : k == 1 ? other : odd, t, 0);
    }
    t0 = test_now_s();
    test_spawn(&job, 2, plain_job, NULL);
    t0 = test_now_s() - t0;
    kept = shm_exists(p[0]) && shm_exists(p[1]) && shm_exists(p[2]);
    unlink(fifo);
    unlink(other);
    unlink(odd);
    CHECK("shm.strangers_in_dev_shm_kept_and_harmless", made && job.failed == 0 && kept && t0 < 8,
          "made %d; the job: %s in %.1f s; FIFOs and file %s", made, test_job_why(&job, NULL, 0), t0,
          kept ? "kept" : "removed");
}

/* ---- namespaces (root) ---- */

/* A private /dev/shm of `size` for this process and its children. */
static int private_shm(const char *size)
{
    char opts[64];
    snprintf(opts, sizeof opts, "size=%s", size);
    return unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
           mount("tmpfs", "/dev/shm", "tmpfs", 0, opts) == 0 ? 0 : -1;
}

static const char *const small_codes[] = {
    [1] = "init succeeded on a /dev/shm too small for the arena",
    [2] = "rank 0's error does not name /dev/shm's free space and what is needed"};
static int small_shm_rank(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp_result r;
    (void)arg;
    r = ddp_init(&ctx, NULL);
    if (r == DDP_OK) return 1;
    if (rank == 0 && (r != DDP_ERR_SYSTEM || !strstr(ddp_error(&ctx), "/dev/shm has") || !strstr(ddp_error(&ctx), "MiB free") ||
                      !strstr(ddp_error(&ctx), "needs")))
        return 2;
    ddp_destroy(&ctx);
    return 0;
}

/* ulimit -f below the arena's size: rank 0 says which limit (growing the file past it
   was SIGXFSZ: rank 0 dumped core inside ddp_init) */
static const char *const fsize_codes[] = {
    [1] = "init succeeded past the file size limit", [2] = "rank 0's error does not name ulimit -f",
    [3] = "setrlimit failed"};
static int fsize_rank(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp_result r;
    struct rlimit lim;
    (void)arg;
    if (getrlimit(RLIMIT_FSIZE, &lim) != 0) return 3;
    lim.rlim_cur = 256 << 10;
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) return 3;
    r = ddp_init(&ctx, NULL);
    if (r == DDP_OK) return 1;
    if (rank == 0 && (r != DDP_ERR_SYSTEM || !strstr(ddp_error(&ctx), "file size limit of 256 KiB (ulimit -f)"))) return 2;
    ddp_destroy(&ctx);
    return 0;
}

static void test_file_size_limit(void)
{
    test_job job;
    setenv("DDP_TIMEOUT", "10", 1);
    test_spawn(&job, 2, fsize_rank, NULL);
    CHECK("shm.file_size_limit_is_an_error", job.failed == 0 && job.seconds < 5, "%s, %.1f s",
          TEST_JOB_WHY(&job, fsize_codes), job.seconds);
    unsetenv("DDP_TIMEOUT");
}

static void test_small_shm(void)
{
    pid_t pid;
    int st = 0;
    fflush(NULL);
    if ((pid = fork()) == 0) {
        test_job job;
        if (private_shm("1m") != 0) _exit(77);
        setenv("DDP_SHM_CHUNK", "1048576", 1); /* 3 ranks + 1 slots of 1 MiB: 4 MiB */
        setenv("DDP_TIMEOUT", "10", 1);
        test_spawn(&job, 3, small_shm_rank, NULL);
        CHECK("shm.small_dev_shm_is_an_error", job.failed == 0 && job.seconds < 5, "%s, %.1f s",
              TEST_JOB_WHY(&job, small_codes), job.seconds);
        _exit(0);
    }
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        test_skip("shm.small_dev_shm_is_an_error", "cannot mount a small tmpfs on /dev/shm (needs root and mount namespaces)");
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        CHECK("shm.small_dev_shm_is_an_error", 0, "the test's child ended with status %d", st);
}

/* Rank 1 runs in its own PID namespace with its own /proc (a container of one pod):
   rank 0's pid means nothing there. A late peer is not a dead one, and a dead one
   is still noticed. */
static int pidns_rank(int rank, void *arg)
{
    ddp_ctx ctx;
    float x = 1;
    int mode = *(int *)arg;
    if (ddp_init(&ctx, NULL) != DDP_OK) return 10;
    if (rank == 0) { /* the scenario: rank 0 is busy longer than a liveness check */
        struct timespec ts = {0, 400000000L};
        nanosleep(&ts, NULL);
        if (mode == 1) _exit(0); /* then gone */
    }
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) {
        if (mode == 1 && rank == 1 && strstr(ddp_error(&ctx), "rank 0") && strstr(ddp_error(&ctx), "exited")) return 0;
        return 11;
    }
    if (mode == 1) return 12;
    ddp_destroy(&ctx);
    return x == 2 ? 0 : 13;
}

static void test_pid_namespace(void)
{
    static const char *const names[] = {"shm.pid_namespace_late_peer_alive", "shm.pid_namespace_dead_peer_noticed"};
    int mode;
    for (mode = 0; mode < 2; mode++) {
        int port = test_free_port(), st[2] = {0, 0}, r;
        pid_t pids[2];
        double t0 = test_now_s();
        fflush(NULL);
        for (r = 0; r < 2; r++) {
            if ((pids[r] = fork()) != 0) continue;
            {
                char v[16];
                snprintf(v, sizeof v, "%d", port);
                setenv("MASTER_PORT", v, 1);
                snprintf(v, sizeof v, "%d", r);
                setenv("RANK", v, 1); setenv("LOCAL_RANK", v, 1);
                setenv("WORLD_SIZE", "2", 1); setenv("LOCAL_WORLD_SIZE", "2", 1);
                setenv("MASTER_ADDR", "127.0.0.1", 1); setenv("DDP_JOB_ID", "pidns-test", 1);
                setenv("DDP_TIMEOUT", "10", 1);
            }
            if (r == 1) { /* into a new PID namespace with its own /proc */
                pid_t inner;
                int ist = 0;
                if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) _exit(77);
                if ((inner = fork()) == 0) {
                    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
                        mount("proc", "/proc", "proc", 0, NULL) != 0) _exit(77);
                    _exit(pidns_rank(1, &mode));
                }
                waitpid(inner, &ist, 0);
                _exit(WIFEXITED(ist) ? WEXITSTATUS(ist) : 99);
            }
            _exit(pidns_rank(0, &mode));
        }
        for (r = 0; r < 2; r++) waitpid(pids[r], &st[r], 0);
        if (WIFEXITED(st[1]) && WEXITSTATUS(st[1]) == 77) {
            test_skip(names[mode], "cannot make a PID namespace with its own /proc (needs root)");
            continue;
        }
        CHECK(names[mode], WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0 && WIFEXITED(st[1]) && WEXITSTATUS(st[1]) == 0 &&
              test_now_s() - t0 < 5, "rank 0 status %d, rank 1 (own PID namespace) status %d, %.1f s",
              WIFEXITED(st[0]) ? WEXITSTATUS(st[0]) : -1, WIFEXITED(st[1]) ? WEXITSTATUS(st[1]) : -1, test_now_s() - t0);
    }
}

/* Rank 1 has the host name and boot of rank 0 but its own /dev/shm (a container
   with a private tmpfs): not one host for the CPU backend, and it says so. */
static const char *const sep_codes[] = {
    [1] = "rank 1 initialised with a /dev/shm it does not share with rank 0",
    [2] = "rank 1's error does not explain separate /dev/shm", [77] = "no mount namespace"};
static int separate_rank(int rank, void *arg)
{
    ddp_ctx ctx;
    ddp_result r;
    (void)arg;
    if (rank == 1 && private_shm("16m") != 0) return 77;
    r = ddp_init(&ctx, NULL);
    if (rank == 1 && r == DDP_OK) return 1;
    if (rank == 1 && !strstr(ddp_error(&ctx), "separate /dev/shm")) return 2;
    ddp_destroy(&ctx);
    return 0;
}

static void test_separate_shm(void)
{
    test_job job;
    setenv("DDP_TIMEOUT", "3", 1);
    test_spawn(&job, 2, separate_rank, NULL);
    unsetenv("DDP_TIMEOUT");
    if (job.status[1] == 77)
        test_skip("shm.separate_dev_shm_named", "cannot mount a private /dev/shm (needs root and mount namespaces)");
    else
        CHECK("shm.separate_dev_shm_named", job.status[1] == 0, "%s", TEST_JOB_WHY(&job, sep_codes));
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--leak") == 0) return launched_leaker();
    setenv("DDP_TIMEOUT", "10", 1);
    test_crash_leaves_nothing();
    test_killed_rank0_leaves_nothing();
    test_held_arena_kept();
    test_launcher_sweeps(argv[0]);
    test_strangers_in_dev_shm();
    unsetenv("DDP_TIMEOUT");
    test_small_shm();
    test_file_size_limit();
    test_pid_namespace();
    test_separate_shm();
    TEST_EXIT();
}
