/* tests/test.h - the smallest possible test harness.
   Each check prints one line: "PASS name", "FAIL name: file:line: why" or
   "SKIP name: why". tests/run.sh counts those lines over all test programs; a
   program that exits non-zero without printing a FAIL line is counted as one failure.
   Also here: test_gpu_ready() for CUDA tests (a GPU that is missing or unusable is
   reported with its real cause; DDP_REQUIRE_GPU=1 turns that SKIP into a FAIL) and
   test_spawn() for multi-process tests (torchrun's variables, each rank's status). */
#ifndef DDP_TEST_H
#define DDP_TEST_H
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int test_failures_;

/* where is "file:line" of the check, or NULL */
static inline void test_vreport(const char *where, int ok, const char *name, const char *fmt, va_list ap)
{
    if (ok) {
        printf("PASS %s\n", name);
    } else {
        printf("FAIL %s: ", name);
        if (where) printf("%s: ", where);
        vprintf(fmt, ap);
        printf("\n");
        test_failures_++;
    }
    fflush(stdout);
}

static inline void test_report(int ok, const char *name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    test_vreport(NULL, ok, name, fmt, ap);
    va_end(ap);
}

static inline void test_report_at(const char *file, int line, int ok, const char *name, const char *fmt, ...)
{
    char where[256];
    va_list ap;
    snprintf(where, sizeof where, "%s:%d", file, line);
    va_start(ap, fmt);
    test_vreport(where, ok, name, fmt, ap);
    va_end(ap);
}

static inline void test_skip(const char *name, const char *why)
{
    printf("SKIP %s: %s\n", name, why);
    fflush(stdout);
}

/* CHECK(name, cond, fmt, ...) reports cond; a failure names this line and explains
   itself with the message. */
#define CHECK(name, cond, ...) test_report_at(__FILE__, __LINE__, (cond) ? 1 : 0, (name), __VA_ARGS__)
#define TEST_EXIT() return test_failures_ ? 1 : 0
#define TEST_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

#ifdef DDP_H_INCLUDED
/* Element i of a buffer of any ddp dtype, as a double (small integers are exact). */
static inline void test_put(void *buf, ddp_dtype t, size_t i, double v)
{
    switch (t) {
    case DDP_F32: ((float *)buf)[i] = (float)v; break;
    case DDP_F64: ((double *)buf)[i] = v; break;
    case DDP_BF16: ((uint16_t *)buf)[i] = ddp_f32_to_bf16((float)v); break;
    case DDP_F16: ((uint16_t *)buf)[i] = ddp_f32_to_f16((float)v); break;
    case DDP_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    default: ((int64_t *)buf)[i] = (int64_t)v; break;
    }
}

static inline double test_get(const void *buf, ddp_dtype t, size_t i)
{
    switch (t) {
    case DDP_F32: return ((const float *)buf)[i];
    case DDP_F64: return ((const double *)buf)[i];
    case DDP_BF16: return ddp_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DDP_F16: return ddp_f16_to_f32(((const uint16_t *)buf)[i]);
    case DDP_I32: return ((const int32_t *)buf)[i];
    default: return (double)((const int64_t *)buf)[i];
    }
}
#endif

#ifdef __CUDACC__
#include <cuda_runtime.h>
/* 1 when a CUDA device is visible and memory can be allocated on it. Otherwise
   reports `name` with the real cause (the CUDA error, the driver and runtime
   versions) as SKIP, or as FAIL when DDP_REQUIRE_GPU=1 (make check-gpu sets it:
   there a test that quietly skips would pass without touching a GPU); returns 0. */
static inline int test_gpu_ready(const char *name)
{
    int n = 0, drv = 0, rt = 0;
    void *p = NULL;
    char why[600], ver[160];
    const char *req = getenv("DDP_REQUIRE_GPU");
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0) {
        if ((e = cudaMalloc(&p, 256)) == cudaSuccess && (e = cudaFree(p)) == cudaSuccess) return 1;
        snprintf(why, sizeof why, "%d CUDA device(s) visible but unusable: cudaMalloc/cudaFree: %s (%s)", n,
                 cudaGetErrorString(e), cudaGetErrorName(e));
    } else if (e != cudaSuccess) {
        snprintf(why, sizeof why, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    } else {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(why, sizeof why, "no CUDA device visible%s%s%s", vis ? " (CUDA_VISIBLE_DEVICES='" : "",
                 vis ? vis : "", vis ? "')" : "");
    }
    cudaGetLastError(); /* a failed probe must not leak into the caller's next check */
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    if (drv == 0)
        snprintf(ver, sizeof ver, "no CUDA driver found (runtime %d.%d)", rt / 1000, rt % 1000 / 10);
    else if (drv < rt)
        snprintf(ver, sizeof ver, "driver %d.%d is older than runtime %d.%d needs", drv / 1000, drv % 1000 / 10,
                 rt / 1000, rt % 1000 / 10);
    else
        snprintf(ver, sizeof ver, "driver %d.%d, runtime %d.%d", drv / 1000, drv % 1000 / 10, rt / 1000,
                 rt % 1000 / 10);
    if (req && strcmp(req, "1") == 0)
        test_report(0, name, "%s; %s (DDP_REQUIRE_GPU=1)", why, ver);
    else {
        char line[800];
        snprintf(line, sizeof line, "%s; %s", why, ver);
        test_skip(name, line);
    }
    return 0;
}
#endif

#if defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200112L
/* ---- multi-process tests ----
   test_spawn forks `world` ranks of one job, each with torchrun's variables (RANK,
   WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT = a
   free port, DDP_JOB_ID unique to the job), runs fn(rank, arg) in each and records
   how each one ended. A child reports through its exit status: 0 for success, and a
   distinct code per way of failing, which test_job_why turns back into words. */
#include <unistd.h>
#include <signal.h>
#include <time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

enum { TEST_MAX_RANKS = 64 };
typedef struct test_job {
    int world, port;
    char id[64];                 /* DDP_JOB_ID */
    int status[TEST_MAX_RANKS];  /* exit code; 128 + signal when killed, as a shell says; -1 not started */
    int failed;                  /* ranks whose status is not 0 */
    double seconds;              /* from the first fork until the last rank ended */
    char why[1024];              /* filled by test_job_why, or by test_spawn when nothing started */
} test_job;

/* A port nobody listens on now (the kernel's choice for a bind to port 0). */
static inline int test_free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int port = 0, fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* A socket listening on 127.0.0.1 at a port the kernel chose (*port), or -1: for a
   test that plays a peer (a fake store, another program on MASTER_PORT). */
static inline int test_listen(int *port)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
                    getsockname(fd, (struct sockaddr *)&a, &len) != 0)) {
        close(fd);
        fd = -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* What a call writes to fd (1 or 2): test_capture, the calls, then test_captured puts fd
   back and leaves the text in got (cap bytes, cut there); its length, or -1. */
typedef struct { FILE *f; int fd, saved; } test_capture_t;
static inline test_capture_t test_capture(int fd)
{
    test_capture_t c;
    c.f = tmpfile();
    c.fd = fd;
    fflush(NULL);
    c.saved = dup(fd);
    if (c.f) dup2(fileno(c.f), fd);
    return c;
}
static inline int test_captured(test_capture_t c, char *got, size_t cap)
{
    int n = -1;
    fflush(NULL);
    dup2(c.saved, c.fd);
    close(c.saved);
    got[0] = 0;
    if (c.f) {
        rewind(c.f);
        n = (int)fread(got, 1, cap - 1, c.f);
        got[n > 0 ? n : 0] = 0;
        fclose(c.f);
    }
    return n;
}

static inline double test_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs the job to its end; returns job->failed. */
static inline int test_spawn(test_job *job, int world, int (*fn)(int rank, void *arg), void *arg)
{
    static int jobs;
    pid_t pids[TEST_MAX_RANKS];
    char v[32];
    int r;
    memset(job, 0, sizeof *job);
    if (world < 1 || world > TEST_MAX_RANKS) { /* nothing runs */
        snprintf(job->why, sizeof job->why, "a world of %d: test_spawn runs 1 to %d ranks", world, TEST_MAX_RANKS);
        return job->failed = 1;
    }
    job->world = world;
    job->port = test_free_port();
    snprintf(job->id, sizeof job->id, "test-%d-%d", (int)getpid(), ++jobs);
    job->seconds = test_now_s();
    fflush(NULL); /* or the children print the parent's buffered lines again */
    for (r = 0; r < world; r++) {
        if ((pids[r] = fork()) == 0) {
            snprintf(v, sizeof v, "%d", r);
            setenv("RANK", v, 1);
            setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", world);
            setenv("WORLD_SIZE", v, 1);
            setenv("LOCAL_WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", job->port);
            setenv("MASTER_PORT", v, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("DDP_JOB_ID", job->id, 1);
            r = fn(r, arg);
            fflush(NULL);
            _exit(r);
        }
    }
    for (r = 0; r < world; r++) {
        int st = 0;
        if (pids[r] < 0) job->status[r] = -1;
        else if (waitpid(pids[r], &st, 0) != pids[r]) job->status[r] = -1;
        else job->status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
        job->failed += job->status[r] != 0;
    }
    job->seconds = test_now_s() - job->seconds;
    return job->failed;
}

/* "rank 1: 11 (all_reduce after a peer died returned another result); rank 2: killed
   by signal 11" for each rank that did not exit 0, with meaning[code] the words for
   an exit code (NULL entries and codes past n are shown as numbers). */
static inline const char *test_job_why(test_job *job, const char *const *meaning, int n)
{
    size_t len = 0;
    int r;
    if (job->world == 0) return job->why; /* never started: test_spawn said why */
    job->why[0] = 0;
    for (r = 0; r < job->world && len < sizeof job->why; r++) {
        int s = job->status[r];
        const char *sep = len ? "; " : "";
        if (s == 0) continue;
        if (s < 0)
            len += snprintf(job->why + len, sizeof job->why - len, "%srank %d was not started or not waited for", sep, r);
        else if (s > 128 && s < 128 + 65)
            len += snprintf(job->why + len, sizeof job->why - len, "%srank %d killed by signal %d", sep, r, s - 128);
        else
            len += snprintf(job->why + len, sizeof job->why - len, "%srank %d exited %d%s%s%s", sep, r, s,
                            s < n && meaning && meaning[s] ? " (" : "", s < n && meaning && meaning[s] ? meaning[s] : "",
                            s < n && meaning && meaning[s] ? ")" : "");
    }
    if (!job->why[0]) snprintf(job->why, sizeof job->why, "all %d ranks exited 0", job->world);
    return job->why;
}
#define TEST_JOB_WHY(job, table) test_job_why((job), (table), TEST_COUNT(table))
#endif

#endif
