/* ddp.h - v0.1 - PyTorch-style DistributedDataParallel for C and CUDA programs

   One header. Process group, launcher, rendezvous, collectives on NCCL (GPUs) or a
   built-in shared-memory CPU backend, distributed sampler, gradient sync, averaged
   metrics, rank-0 helpers. The same program runs as 4 CPU processes on a laptop and
   as 8 GPU processes on a server.

   USAGE
     In exactly one C or C++ file, before any other #include:
         #define DDP_IMPLEMENTATION
         #include "ddp.h"
     (the implementation needs POSIX and GNU declarations; if the file includes
     system headers first, compile it with -D_GNU_SOURCE). Other files include
     "ddp.h" alone. Link with -lpthread (and -lcudart -lnccl for NCCL).

   OPTIONS (#define before including)
     DDP_STATIC    make every function static (private to the including file)
     DDP_NCCL      compile the NCCL backend (on by default under nvcc; with gcc,
                   define it and link -lcudart -lnccl); DDP_NO_NCCL turns it off
     DDP_MALLOC/DDP_FREE  replace malloc/free (define both or neither)

   EXAMPLE (each rank adds rank+1; every rank ends with the sum)
     #define DDP_IMPLEMENTATION
     #include "ddp.h"
     int main(int argc, char **argv) {
         int status = ddp_launch(&argc, argv);    // "./prog --nproc 4" starts 4 ranks
         if (status != DDP_WORKER) return status; // the launcher: job finished
         ddp_ctx ctx;
         ddp_desc desc = {0};                     // zero means default
         desc.argc = &argc;                       // lets init take --local_rank N
         desc.argv = argv;
         if (ddp_init(&ctx, &desc) != DDP_OK) return 1; // the reason went to stderr
         float x = (float)(ctx.rank + 1);
         ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL);
         ddp_print(&ctx, "sum %g over %d ranks\n", x, ctx.world_size); // rank 0 only
         ddp_destroy(&ctx);
         return 0;
     }

   LAUNCHING (any of these; the program reads whichever environment it finds)
     ./prog --nproc 4 args                    built-in launcher (ddp_launch)
     ddprun -n 4 ./prog args                  examples/ddprun.c, for any program
     torchrun --nproc_per_node=4 prog args    (RANK, WORLD_SIZE, LOCAL_RANK, ...)
     python -m torch.distributed.launch --nproc_per_node=4 prog   (--local_rank=N)
     mpirun -np 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 ./prog
     srun -n 4 ./prog                         (with MASTER_ADDR/MASTER_PORT exported)

   ENVIRONMENT
     RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT
                    torchrun's names; read first
     SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NODEID      Slurm
     OMPI_COMM_WORLD_RANK _SIZE _LOCAL_RANK _LOCAL_SIZE           Open MPI
     PMI_RANK PMI_SIZE MPI_LOCALRANKID                            MPICH / Hydra
     DDP_BACKEND=cpu|nccl   force a backend (default: nccl if a GPU is visible)
     DDP_TIMEOUT=seconds    how long any wait may take (default 300)
     DDP_JOB_ID             set by the launcher; ranks of other jobs are refused
     DDP_SHM_CHUNK=bytes    CPU backend: per-rank staging size (default 1 MiB)
     DDP_DEBUG=1            log what init decided, on every rank

   DOES NOT
     - run the CPU backend across hosts (one host; NCCL spans hosts)
     - host the store inside torchrun's agent: under torchrun, rank 0 opens its own
       store on MASTER_PORT+1
     - hide failures: every call returns a ddp_result; after a failure the context
       refuses further collectives (the job is broken, like NCCL's)
     - call exit() or print anything but errors unless asked (DDP_DEBUG, ddp_print)

   VERSION HISTORY
     0.1 (2026-12-02) process group, launcher, TCP store, CPU + NCCL collectives,
                      sampler, gradient sync, metrics
*/
#ifndef DDP_H_INCLUDED
#define DDP_H_INCLUDED

#if defined(DDP_IMPLEMENTATION) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* before the first system header: futex, CLOCK_*, getaddrinfo */
#endif
#include <stddef.h>
#include <stdint.h>

#ifdef DDP_STATIC
#define DDPDEF static
#else
#define DDPDEF extern
#endif

#if defined(__CUDACC__) && !defined(DDP_NO_NCCL) && !defined(DDP_NCCL)
#define DDP_NCCL
#endif

#if defined(__GNUC__)
#define DDP__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define DDP__PRINTF(f, a)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Result codes. 0 is success; ddp_strerror() names a code, ddp_error() gives the
   context's detail for the last failure ("rank 3 exited during all_reduce #12"). */
#define DDP__RESULTS(X)                                                              \
    X(DDP_OK, "ok")                                                                  \
    X(DDP_ERR_ARG, "invalid argument")                                               \
    X(DDP_ERR_ENV, "invalid or inconsistent environment")                            \
    X(DDP_ERR_SYSTEM, "operating system call failed")                                \
    X(DDP_ERR_NOMEM, "out of memory")                                                \
    X(DDP_ERR_TIMEOUT, "timed out")                                                  \
    X(DDP_ERR_PEER, "a peer rank failed or exited")                                  \
    X(DDP_ERR_PROTOCOL, "unexpected message from a peer")                            \
    X(DDP_ERR_BACKEND, "backend unavailable or failed")                              \
    X(DDP_ERR_ABORTED, "the process group was aborted by an earlier error")
typedef enum ddp_result {
#define DDP__ENUM(name, text) name,
    DDP__RESULTS(DDP__ENUM)
#undef DDP__ENUM
    DDP_RESULT_COUNT
} ddp_result;

typedef enum ddp_backend { DDP_BACKEND_DEFAULT = 0, DDP_BACKEND_CPU, DDP_BACKEND_NCCL } ddp_backend;
typedef enum ddp_dtype { DDP_F32 = 0, DDP_F64, DDP_BF16, DDP_F16, DDP_I32, DDP_I64, DDP_DTYPE_COUNT } ddp_dtype;
typedef enum ddp_op { DDP_SUM = 0, DDP_AVG, DDP_MIN, DDP_MAX, DDP_OP_COUNT } ddp_op;
enum { DDP_LOG_ERROR = 0, DDP_LOG_INFO = 1 };

/* Zero means default for every field. */
typedef struct ddp_desc {
    int *argc;            /* optional: lets init read and remove --local_rank N */
    char **argv;
    int world_size;       /* >0: take rank/world_size/local_* from here, not the env */
    int rank;
    int local_rank;       /* with world_size > 0: default = rank */
    int local_world_size; /* with world_size > 0: default = world_size */
    ddp_backend backend;  /* default: DDP_BACKEND env, then nccl if a GPU is visible */
    int timeout_ms;       /* default: DDP_TIMEOUT seconds, then 300 s */
    const char *master_addr; /* default: MASTER_ADDR */
    int master_port;         /* default: MASTER_PORT */
    const char *job_id;      /* default: DDP_JOB_ID, then TORCHELASTIC_RUN_ID */
    size_t shm_chunk_bytes;  /* CPU backend staging per rank; default DDP_SHM_CHUNK, 1 MiB */
    void (*log)(void *user, int level, const char *msg); /* default: errors to stderr */
    void *log_user;
} ddp_desc;

/* Filled by ddp_init; keep it at one address until ddp_destroy (a CPU worker thread
   refers to it). */
typedef struct ddp_ctx {
    int rank, world_size;
    int local_rank, local_world_size;
    int node_rank, num_nodes;
    int device;            /* CUDA device (= local_rank) with NCCL, -1 on the CPU */
    ddp_backend backend;   /* what init chose */
    struct ddp__state *st; /* private */
} ddp_ctx;

/* Asynchronous work: filled by *_async, finished by ddp_wait. */
typedef struct ddp_work {
    uint64_t seq;
    void *event; /* NCCL: completion event */
} ddp_work;

/* ---- launcher ------------------------------------------------------------------
   Call first in main. Without --nproc (or inside a launched job) it returns
   DDP_WORKER and the program goes on as one rank. With "--nproc N" in argv this
   process becomes the launcher: it runs N copies of the program (argv without
   --nproc), forwards SIGINT/SIGTERM, stops everything when one rank fails, and
   returns the exit status for main to return. */
#define DDP_WORKER (-1)
DDPDEF int ddp_launch(int *argc, char **argv);
/* Runs nproc copies of argv (argv[0] looked up in PATH) as ranks 0..nproc-1 of one
   job on this host; returns 0 if all succeeded, else the first failure's status
   (128+signal for a signal). Prints one line naming the failed rank. */
DDPDEF int ddp_run(int nproc, char *const argv[]);

/* ---- process group ------------------------------------------------------------ */
DDPDEF ddp_result ddp_init(ddp_ctx *ctx, const ddp_desc *desc);
DDPDEF void ddp_destroy(ddp_ctx *ctx); /* waits for the others to arrive, then frees */
DDPDEF const char *ddp_strerror(ddp_result r);
DDPDEF const char *ddp_error(const ddp_ctx *ctx); /* detail of the last failure, or "" */
DDPDEF size_t ddp_dtype_size(ddp_dtype t);
DDPDEF const char *ddp_backend_name(ddp_backend b);

/* ---- collectives -----------------------------------------------------------------
   Every rank calls the same collectives in the same order. Counts are elements.
   NCCL: device pointers, `stream` a cudaStream_t (NULL: the legacy default stream);
   the call returns once the work is queued after `stream`'s earlier work.
   CPU: host pointers, `stream` ignored; the call returns when the result is there.
   send == recv is in place. AVG of integers truncates toward zero. 16-bit floats
   accumulate in f32 on the CPU. */
DDPDEF ddp_result ddp_all_reduce(ddp_ctx *ctx, const void *send, void *recv, size_t count,
                                 ddp_dtype dtype, ddp_op op, void *stream);
DDPDEF ddp_result ddp_all_reduce_async(ddp_ctx *ctx, const void *send, void *recv, size_t count,
                                       ddp_dtype dtype, ddp_op op, void *stream, ddp_work *work);
/* Waits for async work: returns when the result is in place (NCCL: the host waits
   for the GPU, within the timeout, and `stream` is ordered after the work). */
DDPDEF ddp_result ddp_wait(ddp_ctx *ctx, ddp_work *work, void *stream);
DDPDEF ddp_result ddp_broadcast(ddp_ctx *ctx, void *buf, size_t count, ddp_dtype dtype,
                                int root, void *stream);
/* recv holds world_size * count elements, rank r's at r * count. */
DDPDEF ddp_result ddp_all_gather(ddp_ctx *ctx, const void *send, void *recv, size_t count,
                                 ddp_dtype dtype, void *stream);
/* send holds world_size * count elements; rank r receives the reduction of block r. */
DDPDEF ddp_result ddp_reduce_scatter(ddp_ctx *ctx, const void *send, void *recv, size_t count,
                                     ddp_dtype dtype, ddp_op op, void *stream);
DDPDEF ddp_result ddp_barrier(ddp_ctx *ctx); /* host barrier, every backend */

/* ---- rank-0 helpers --------------------------------------------------------------- */
DDPDEF int ddp_is_main(const ddp_ctx *ctx); /* rank 0 */
DDPDEF void ddp_print(const ddp_ctx *ctx, const char *fmt, ...) DDP__PRINTF(2, 3); /* rank 0 only, stdout */
DDPDEF void ddp_log(const ddp_ctx *ctx, const char *fmt, ...) DDP__PRINTF(2, 3);   /* every rank, "[rank r/w] " */

/* ---- 16-bit float conversion (round to nearest even) ----------------------------- */
DDPDEF float ddp_bf16_to_f32(uint16_t h);
DDPDEF uint16_t ddp_f32_to_bf16(float f);
DDPDEF float ddp_f16_to_f32(uint16_t h);
DDPDEF uint16_t ddp_f32_to_f16(float f);

/* ---- distributed sampler (torch.utils.data.distributed.DistributedSampler) --------
   Splits N samples over the ranks: each rank gets num_samples = ceil(N / world_size)
   positions (floor with drop_last) of one shuffled list, rank r taking positions
   r, r + world_size, r + 2 world_size, ... Without drop_last the list is padded to
   num_samples * world_size by repeating it from its start, so the last positions of
   some ranks are duplicates: a rank's first num_real positions are real samples,
   the rest padding (count only the real ones in metrics). The shuffle for epoch e is
   torch.randperm(N) of a generator seeded with seed + e: the same order as PyTorch.
   There is no set_epoch to forget: every call that returns indices takes the epoch. */
typedef struct ddp_sampler_desc {
    size_t dataset_size;  /* N, number of samples; 0 is allowed */
    size_t batch_size;    /* per rank, for ddp_sampler_batch (as in the template); default 1 */
    uint64_t seed;        /* epoch e shuffles with seed + e; default 0 (PyTorch's) */
    int no_shuffle;       /* 1: positions in order 0..N-1 (shuffle=False) */
    int drop_last;        /* 1: drop the tail that does not divide by world_size, no padding */
    int drop_last_batch;  /* 1: no partial last batch (DataLoader's drop_last) */
    int world_size;       /* >0: use rank/world_size instead of the context's */
    int rank;
} ddp_sampler_desc;

typedef struct ddp_sampler {
    size_t dataset_size;  /* N */
    size_t num_samples;   /* positions per rank, the same on every rank */
    size_t total_size;    /* num_samples * world_size */
    size_t num_real;      /* this rank's positions [0, num_real) are real, the rest padding */
    size_t batch_size, num_batches; /* per rank */
    int rank, world_size;
    int shuffle, drop_last, drop_last_batch;
    uint64_t seed;
    uint64_t epoch;       /* the epoch `indices` holds, once has_epoch */
    int has_epoch;
    size_t *indices;      /* num_samples dataset indices of this rank for `epoch` */
    size_t *perm_;        /* private: the shuffled list */
} ddp_sampler;

/* One per-rank batch of an epoch. */
typedef struct ddp_batch {
    const size_t *indices; /* count dataset indices */
    size_t count;          /* 0 past the last batch */
    size_t num_real;       /* indices[0, num_real) are real samples, the rest padding */
    size_t global_count;   /* real samples in this batch over all ranks: divide summed
                              losses and gradients by it to get the global-batch mean */
} ddp_batch;

/* ctx gives rank and world size (or desc->world_size; with neither, a world of one). */
DDPDEF ddp_result ddp_sampler_init(ddp_sampler *s, const ddp_ctx *ctx, const ddp_sampler_desc *desc);
DDPDEF void ddp_sampler_destroy(ddp_sampler *s);
/* set_epoch and iter() in one: this rank's num_samples indices for `epoch`. */
DDPDEF const size_t *ddp_sampler_epoch(ddp_sampler *s, uint64_t epoch);
/* Batch b (0 <= b < num_batches) of this rank for `epoch`. With per-rank batch size
   B, global batch b is positions [b B W, (b+1) B W) of the shuffled list: the same
   samples as batch b of one rank with batch size B W. */
DDPDEF ddp_batch ddp_sampler_batch(ddp_sampler *s, uint64_t epoch, size_t b);

/* ---- metrics ---------------------------------------------------------------------
   A metric is a sum and a count, so the global mean is exact: sum over all ranks
   divided by count over all ranks (not the template's mean of per-rank means, which
   counts padding and weights ranks equally). Zero-initialise, add real samples only,
   reduce once per epoch. min/max are those of the added values. */
typedef struct ddp_metric {
    double sum, count;
    double min, max; /* meaningful when count > 0 */
} ddp_metric;

/* Adds `value` with weight `weight` (1 for one sample): sum += value * weight. */
DDPDEF void ddp_metric_add(ddp_metric *m, double value, double weight);
/* into[i] += from[i] for n metrics (sums, counts, min, max). */
DDPDEF void ddp_metric_merge(ddp_metric *into, const ddp_metric *from, size_t n);
/* Replaces n metrics on every rank by their totals over all ranks: one collective
   (f64), combined in rank order so every rank gets the same bits. Host memory on
   every backend. */
DDPDEF ddp_result ddp_metric_reduce(ddp_ctx *ctx, ddp_metric *m, size_t n);
DDPDEF double ddp_metric_mean(const ddp_metric *m);    /* sum / count; 0 when empty */
DDPDEF double ddp_metric_percent(const ddp_metric *m); /* 100 sum / count: accuracy in % */

/* ---- gradient synchronisation (DistributedDataParallel) ---------------------------
   All parameters' gradients live in one flat buffer. Init broadcasts the parameters
   from rank 0 (as DDP's constructor does). Each step, as the backward pass produces
   gradients (last layer first), mark those regions ready: every bucket (default
   25 MiB) whose regions are all ready starts an asynchronous all-reduce at once, so
   communication overlaps the rest of the backward pass. Buckets are reduced in the
   same order on every rank (from the end of the buffer) whatever order regions are
   marked in. ddp_grad_finish launches what is left, waits, and leaves the average
   over ranks in place. Every element must be marked exactly once per step; a region
   marked twice, or finish with elements never marked, returns DDP_ERR_ARG and
   ddp_error(ctx) says which elements. */
typedef struct ddp_grad_desc {
    void *grads;           /* flat gradient buffer of `count` elements (device memory on NCCL) */
    size_t count;
    ddp_dtype dtype;       /* default DDP_F32; DDP_BF16, DDP_F64 also work */
    size_t bucket_bytes;   /* default 25 MiB (PyTorch's bucket_cap_mb) */
    int sum;               /* 1: leave the sum over ranks instead of the average */
    void *params;          /* optional: broadcast from rank 0 by ddp_grad_init */
    size_t param_count;    /* default: count */
    ddp_dtype param_dtype; /* default DDP_F32 */
    void *stream;          /* NCCL: the cudaStream_t the backward pass runs on */
} ddp_grad_desc;

typedef struct ddp_grad {
    ddp_ctx *ctx;
    void *grads;
    size_t count;
    ddp_dtype dtype;
    void *stream;
    size_t bucket_count, num_buckets; /* elements per bucket, buckets */
    int sum, no_sync;
    struct ddp__grad_state *st;       /* private */
} ddp_grad;

DDPDEF ddp_result ddp_grad_init(ddp_grad *g, ddp_ctx *ctx, const ddp_grad_desc *desc);
DDPDEF void ddp_grad_destroy(ddp_grad *g); /* waits for buckets still in flight */
/* Elements [offset, offset + count) of the gradient are final for this step. */
DDPDEF ddp_result ddp_grad_ready(ddp_grad *g, size_t offset, size_t count);
/* Ends the step: all-reduces the buckets not yet started and waits for all of them.
   Error if some elements were never marked. */
DDPDEF ddp_result ddp_grad_finish(ddp_grad *g);
/* No overlap: marks whatever is not marked yet and finishes. */
DDPDEF ddp_result ddp_grad_all_reduce(ddp_grad *g);
/* Gradient accumulation (PyTorch's no_sync()): while on, steps do no communication
   (ready checks its arguments, finish only ends the step) and gradients accumulate
   locally; the first step after turning it off averages the accumulated sums.
   Change it between steps only. */
DDPDEF ddp_result ddp_grad_no_sync(ddp_grad *g, int on);

#ifdef __cplusplus
} /* extern "C" */
inline ddp_result ddp_init(ddp_ctx *ctx, const ddp_desc &desc) { return ddp_init(ctx, &desc); }
inline ddp_result ddp_sampler_init(ddp_sampler *s, const ddp_ctx *ctx, const ddp_sampler_desc &desc)
{
    return ddp_sampler_init(s, ctx, &desc);
}
inline ddp_result ddp_grad_init(ddp_grad *g, ddp_ctx *ctx, const ddp_grad_desc &desc) { return ddp_grad_init(g, ctx, &desc); }
#endif
#endif /* DDP_H_INCLUDED */

/* ==================================================================================
   Implementation. Stop here if you only want the API.
   Layers, each calling only downward: platform -> environment -> TCP store ->
   backends (cpu, nccl) -> collectives -> launcher.
   ================================================================================== */
#ifdef DDP_IMPLEMENTATION
#ifndef DDP__IMPLEMENTATION_DONE
#define DDP__IMPLEMENTATION_DONE

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#ifdef DDP_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#if defined(__GLIBC__) && !(defined(__USE_XOPEN2K8) && defined(__USE_MISC))
#error "ddp.h: the implementation needs POSIX 2008: define DDP_IMPLEMENTATION and include ddp.h before any other header, or compile with -D_GNU_SOURCE"
#endif
#if defined(DDP_MALLOC) != defined(DDP_FREE)
#error "define both DDP_MALLOC and DDP_FREE, or neither"
#endif
#ifndef DDP_MALLOC
#define DDP_MALLOC(n) malloc(n)
#define DDP_FREE(p) free(p)
#endif

#define DDP__DEFAULT_TIMEOUT_MS 300000
#define DDP__DEFAULT_CHUNK ((size_t)1 << 20)
#define DDP__MAX_CPU_RANKS 256
#define DDP__QUEUE 64 /* async collectives in flight per context (CPU) */
#define DDP__SPIN_NS 20000 /* CPU barrier: spin this long, then sleep */

#ifdef __cplusplus
#define DDP__CAST(T, x) ((T)(x))
#else
#define DDP__CAST(T, x) (x)
#endif

/* ---- platform: time, errors, logging ---------------------------------------------- */

static int64_t ddp__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void ddp__sleep_ms(int ms)
{
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

typedef struct ddp__coll {
    int kind; /* DDP__ALL_REDUCE ... */
    const void *send;
    void *recv;
    size_t count;
    ddp_dtype dtype;
    ddp_op op;
    int root;
    uint64_t seq;
} ddp__coll;
enum { DDP__ALL_REDUCE, DDP__BROADCAST, DDP__ALL_GATHER, DDP__REDUCE_SCATTER, DDP__BARRIER };
static const char *const ddp__coll_names[] = {"all_reduce", "broadcast", "all_gather",
                                               "reduce_scatter", "barrier"};

typedef struct ddp__shm ddp__shm;
typedef struct ddp__server ddp__server;

struct ddp__state {
    char err[320];
    void (*log)(void *user, int level, const char *msg);
    void *log_user;
    int debug;
    int timeout_ms;
    ddp_result broken;    /* set once a collective fails: later ones refuse */
    char job_id[64];
    char master_addr[256];
    int master_port;
    int store_fd;         /* connection to rank 0's store, -1 in a world of one */
    ddp__server *server;  /* rank 0 only */
    uint64_t seq;         /* collectives issued */
    /* CPU backend */
    ddp__shm *shm;
    size_t shm_size, chunk;
    int spin;             /* spin DDP__SPIN_NS before sleeping (only when ranks <= cores) */
    /* CPU async: one worker thread runs queued collectives in issue order */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t worker;
    int worker_started, worker_stop;
    ddp__coll queue[DDP__QUEUE];
    uint64_t queued, done; /* counts; queue holds seqs (done, queued] */
    ddp_result async_err;
#ifdef DDP_NCCL
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ready;
#endif
};

static void ddp__default_log(void *user, int level, const char *msg)
{
    (void)user;
    fprintf(stderr, "%s%s\n", level == DDP_LOG_ERROR ? "ddp: error: " : "ddp: ", msg);
}

static void ddp__info(ddp_ctx *ctx, const char *fmt, ...) DDP__PRINTF(2, 3);
static void ddp__info(ddp_ctx *ctx, const char *fmt, ...)
{
    char msg[400];
    int n;
    va_list ap;
    if (!ctx->st->debug) return;
    n = snprintf(msg, sizeof msg, "rank %d/%d: ", ctx->rank, ctx->world_size);
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    ctx->st->log(ctx->st->log_user, DDP_LOG_INFO, msg);
}

/* Records the detail for ddp_error(), reports it, returns the code. */
static ddp_result ddp__fail(ddp_ctx *ctx, ddp_result code, const char *fmt, ...) DDP__PRINTF(3, 4);
static ddp_result ddp__fail(ddp_ctx *ctx, ddp_result code, const char *fmt, ...)
{
    va_list ap;
    char msg[400];
    va_start(ap, fmt);
    vsnprintf(ctx->st->err, sizeof ctx->st->err, fmt, ap);
    va_end(ap);
    snprintf(msg, sizeof msg, "rank %d/%d: %s", ctx->rank, ctx->world_size, ctx->st->err);
    ctx->st->log(ctx->st->log_user, DDP_LOG_ERROR, msg);
    return code;
}

const char *ddp_strerror(ddp_result r)
{
    static const char *const text[] = {
#define DDP__TEXT(name, text) text,
        DDP__RESULTS(DDP__TEXT)
#undef DDP__TEXT
    };
    return (unsigned)r < DDP_RESULT_COUNT ? text[r] : "unknown ddp_result";
}

const char *ddp_error(const ddp_ctx *ctx) { return ctx && ctx->st ? ctx->st->err : ""; }

size_t ddp_dtype_size(ddp_dtype t)
{
    static const size_t size[DDP_DTYPE_COUNT] = {4, 8, 2, 2, 4, 8};
    return (unsigned)t < DDP_DTYPE_COUNT ? size[t] : 0;
}

const char *ddp_backend_name(ddp_backend b)
{
    return b == DDP_BACKEND_CPU ? "cpu" : b == DDP_BACKEND_NCCL ? "nccl" : "default";
}

int ddp_is_main(const ddp_ctx *ctx) { return ctx->rank == 0; }

void ddp_print(const ddp_ctx *ctx, const char *fmt, ...)
{
    va_list ap;
    if (ctx->rank != 0) return;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void ddp_log(const ddp_ctx *ctx, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    int n = snprintf(line, sizeof line, "[rank %d/%d] ", ctx->rank, ctx->world_size);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fflush(stdout); /* one write per line keeps ranks' lines whole */
    if (write(STDOUT_FILENO, line, strlen(line)) < 0) {}
}

/* ---- 16-bit floats ------------------------------------------------------------------ */

/* strncpy that always terminates (and truncates quietly) */
static void ddp__copy(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src);
    if (n >= size) n = size - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

static uint32_t ddp__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float ddp__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float ddp_bf16_to_f32(uint16_t h) { return ddp__bits_f32((uint32_t)h << 16); }

uint16_t ddp_f32_to_bf16(float f)
{
    uint32_t u = ddp__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float ddp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return ddp__bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return ddp__bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t ddp_f32_to_f16(float f)
{
    uint32_t u = ddp__f32_bits(f), sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);          /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);         /* rounds to inf */
    if (a < 0x38800000u) {                                          /* subnormal or 0 */
        /* scale so the f16 subnormal step (2^-24) becomes 1.0, round to even */
        float v = ddp__bits_f32(a) * 16777216.0f;
        uint32_t m = (uint32_t)v;
        float rest = v - (float)m;
        if (rest > 0.5f || (rest == 0.5f && (m & 1))) m++;
        return (uint16_t)(sign | m);
    }
    a += 0xfffu + ((a >> 13) & 1) - (112u << 23);
    return (uint16_t)(sign | (a >> 13));
}

/* ---- platform: sockets --------------------------------------------------------------- */

static int ddp__write_all(int fd, const void *buf, size_t n, int64_t deadline)
{
    const char *p = (const char *)buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) { p += k; n -= (size_t)k; continue; }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf;
            int64_t left = deadline - ddp__now_ms();
            pf.fd = fd; pf.events = POLLOUT; pf.revents = 0;
            if (left <= 0 || poll(&pf, 1, (int)left) == 0) { errno = ETIMEDOUT; return -1; }
            continue;
        }
        return -1;
    }
    return 0;
}

/* Reads exactly n bytes before the deadline; -1 with errno ETIMEDOUT, or ECONNRESET on EOF. */
static int ddp__read_all(int fd, void *buf, size_t n, int64_t deadline)
{
    char *p = (char *)buf;
    while (n > 0) {
        struct pollfd pf;
        int64_t left = deadline - ddp__now_ms();
        ssize_t k;
        pf.fd = fd; pf.events = POLLIN; pf.revents = 0;
        if (left <= 0) { errno = ETIMEDOUT; return -1; }
        k = poll(&pf, 1, left > 1000 ? 1000 : (int)left);
        if (k < 0 && errno != EINTR) return -1;
        if (k <= 0) continue;
        k = recv(fd, p, n, 0);
        if (k == 0) { errno = ECONNRESET; return -1; }
        if (k < 0) { if (errno == EINTR || errno == EAGAIN) continue; return -1; }
        p += k; n -= (size_t)k;
    }
    return 0;
}

/* ---- TCP store: a key-value server on rank 0 -------------------------------------------
   Message: 16-byte header {magic, op or status, key length, value length} in network
   order, then key and value. The first message of a connection is HELLO carrying the
   job id and world size; a store of another job answers with an error and hangs up.
   GET waits on the server until the key exists, so nobody polls. */

#define DDP__MAGIC 0x44445053u /* "DDPS" */
#define DDP__MAX_KEY 1024u
#define DDP__MAX_VALUE (64u << 20)
enum { DDP__HELLO = 1, DDP__SET, DDP__GET, DDP__ADD };

typedef struct ddp__conn { int fd, rank; char *buf; size_t len, cap; } ddp__conn;
typedef struct ddp__kv { char *key; char *val; uint32_t vlen; } ddp__kv;
typedef struct ddp__waiter { int fd; char *key; } ddp__waiter;

struct ddp__server {
    int listen_fd, wake[2], world;
    char job_id[64];
    pthread_t thread;
    ddp__conn *conns; int nconns;
    ddp__kv *kv; int nkv;
    ddp__waiter *waiters; int nwaiters;
    int closing;         /* the job is shutting down: disconnects are expected */
    int64_t stop_deadline; /* set by ddp__server_stop: leave once everyone is gone */
    char broken[200];    /* why the job can no longer make progress */
};

static void *ddp__grow(void *p, int n, size_t elem)
{
    /* arrays grow in powers of two; called when n is a power of two (or 0) */
    void *q;
    if (n & (n - 1)) return p;
    q = DDP_MALLOC(elem * (size_t)(n ? 2 * n : 4));
    if (!q) return NULL;
    if (n) memcpy(q, p, elem * (size_t)n);
    DDP_FREE(p);
    return q;
}

static void ddp__reply(int fd, uint32_t status, const void *val, uint32_t vlen)
{
    uint32_t h[4];
    h[0] = htonl(DDP__MAGIC); h[1] = htonl(status); h[2] = 0; h[3] = htonl(vlen);
    /* a peer that does not read within 10 s is dropped by its own timeout anyway */
    if (ddp__write_all(fd, h, sizeof h, ddp__now_ms() + 10000) == 0 && vlen)
        ddp__write_all(fd, val, vlen, ddp__now_ms() + 10000);
}

static ddp__kv *ddp__kv_find(ddp__server *s, const char *key)
{
    int i;
    for (i = 0; i < s->nkv; i++)
        if (strcmp(s->kv[i].key, key) == 0) return &s->kv[i];
    return NULL;
}

static void ddp__kv_put(ddp__server *s, const char *key, const char *val, uint32_t vlen)
{
    ddp__kv *e = ddp__kv_find(s, key);
    char *copy = DDP__CAST(char *, DDP_MALLOC(vlen + 1));
    int i;
    if (!copy) return;
    memcpy(copy, val, vlen);
    copy[vlen] = 0;
    if (!e) {
        ddp__kv *grown = DDP__CAST(ddp__kv *, ddp__grow(s->kv, s->nkv, sizeof *s->kv));
        if (!grown) { DDP_FREE(copy); return; }
        s->kv = grown;
        e = &s->kv[s->nkv++];
        e->key = DDP__CAST(char *, DDP_MALLOC(strlen(key) + 1));
        strcpy(e->key, key);
    } else {
        DDP_FREE(e->val);
    }
    e->val = copy;
    e->vlen = vlen;
    for (i = 0; i < s->nwaiters;) { /* answer everyone waiting for this key */
        if (strcmp(s->waiters[i].key, key) == 0) {
            ddp__reply(s->waiters[i].fd, 0, e->val, e->vlen);
            DDP_FREE(s->waiters[i].key);
            s->waiters[i] = s->waiters[--s->nwaiters];
        } else {
            i++;
        }
    }
}

static void ddp__server_break(ddp__server *s, const char *why)
{
    int i;
    if (s->broken[0] || s->closing) return;
    snprintf(s->broken, sizeof s->broken, "%s", why);
    for (i = 0; i < s->nwaiters; i++) {
        ddp__reply(s->waiters[i].fd, 1, s->broken, (uint32_t)strlen(s->broken));
        DDP_FREE(s->waiters[i].key);
    }
    s->nwaiters = 0;
}

/* Handles one complete message; returns 0 to keep the connection, -1 to drop it. */
static int ddp__server_handle(ddp__server *s, ddp__conn *c, uint32_t op, char *key, char *val,
                              uint32_t vlen)
{
    char text[200];
    ddp__kv *e;
    if (op != DDP__HELLO && c->rank < 0) return -1;
    switch (op) {
    case DDP__HELLO: {
        int rank = -1, world = -1;
        sscanf(val, "%d %d", &rank, &world);
        if (strcmp(key, s->job_id) != 0 || world != s->world || rank < 0 || rank >= world) {
            snprintf(text, sizeof text,
                     "the store belongs to job '%s' with world size %d, not job '%s' with %d",
                     s->job_id, s->world, key, world);
            ddp__reply(c->fd, 1, text, (uint32_t)strlen(text));
            return -1;
        }
        c->rank = rank;
        ddp__reply(c->fd, 0, NULL, 0);
        return 0;
    }
    case DDP__SET:
        ddp__reply(c->fd, 0, NULL, 0);
        ddp__kv_put(s, key, val, vlen);
        return 0;
    case DDP__GET:
        if ((e = ddp__kv_find(s, key)) != NULL) {
            ddp__reply(c->fd, 0, e->val, e->vlen);
        } else if (s->broken[0]) {
            ddp__reply(c->fd, 1, s->broken, (uint32_t)strlen(s->broken));
        } else {
            ddp__waiter *grown = DDP__CAST(ddp__waiter *,
                                           ddp__grow(s->waiters, s->nwaiters, sizeof *s->waiters));
            if (!grown) return -1;
            s->waiters = grown;
            s->waiters[s->nwaiters].fd = c->fd;
            s->waiters[s->nwaiters].key = DDP__CAST(char *, DDP_MALLOC(strlen(key) + 1));
            strcpy(s->waiters[s->nwaiters++].key, key);
        }
        return 0;
    case DDP__ADD: {
        long long sum = strtoll(val, NULL, 10);
        if ((e = ddp__kv_find(s, key)) != NULL) sum += strtoll(e->val, NULL, 10);
        snprintf(text, sizeof text, "%lld", sum);
        ddp__reply(c->fd, 0, text, (uint32_t)strlen(text));
        ddp__kv_put(s, key, text, (uint32_t)strlen(text));
        return 0;
    }
    }
    return -1;
}

static void ddp__server_drop(ddp__server *s, int i)
{
    ddp__conn *c = &s->conns[i];
    int j;
    for (j = 0; j < s->nwaiters;) {
        if (s->waiters[j].fd == c->fd) {
            DDP_FREE(s->waiters[j].key);
            s->waiters[j] = s->waiters[--s->nwaiters];
        } else {
            j++;
        }
    }
    if (c->rank >= 0 && !s->closing) {
        char why[200];
        snprintf(why, sizeof why, "rank %d left the job (its process exited or failed)", c->rank);
        ddp__server_break(s, why);
    }
    close(c->fd);
    DDP_FREE(c->buf);
    s->conns[i] = s->conns[--s->nconns];
}

/* Reads what a connection has; handles every complete message in its buffer. */
static int ddp__server_read(ddp__server *s, ddp__conn *c)
{
    ssize_t k;
    if (c->cap - c->len < 4096) {
        size_t cap = c->cap ? c->cap * 2 : 8192;
        char *b = DDP__CAST(char *, DDP_MALLOC(cap));
        if (!b) return -1;
        if (c->len) memcpy(b, c->buf, c->len);
        DDP_FREE(c->buf);
        c->buf = b; c->cap = cap;
    }
    k = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
    if (k <= 0) return (k < 0 && (errno == EINTR || errno == EAGAIN)) ? 0 : -1;
    c->len += (size_t)k;
    while (c->len >= 16) {
        uint32_t h[4], klen, vlen;
        size_t total;
        char *key, *val, saved;
        memcpy(h, c->buf, 16);
        klen = ntohl(h[2]); vlen = ntohl(h[3]);
        if (ntohl(h[0]) != DDP__MAGIC || klen > DDP__MAX_KEY || vlen > DDP__MAX_VALUE) return -1;
        total = 16 + (size_t)klen + vlen;
        if (c->len < total) {
            if (c->cap < total + 1) { /* make room for the whole message */
                char *b = DDP__CAST(char *, DDP_MALLOC(total + 1));
                if (!b) return -1;
                memcpy(b, c->buf, c->len);
                DDP_FREE(c->buf);
                c->buf = b; c->cap = total + 1;
            }
            break;
        }
        /* key and value become C strings in place: the byte after each is saved */
        key = DDP__CAST(char *, DDP_MALLOC(klen + 1));
        if (!key) return -1;
        memcpy(key, c->buf + 16, klen);
        key[klen] = 0;
        val = c->buf + 16 + klen;
        saved = val[vlen];
        val[vlen] = 0;
        k = ddp__server_handle(s, c, ntohl(h[1]), key, val, vlen);
        val[vlen] = saved;
        DDP_FREE(key);
        if (k < 0) return -1;
        memmove(c->buf, c->buf + total, c->len - total);
        c->len -= total;
    }
    return 0;
}

static void *ddp__server_main(void *arg)
{
    ddp__server *s = (ddp__server *)arg;
    for (;;) {
        struct pollfd pf[1 + 1 + 1024];
        int i, n = 0, nc = s->nconns > 1024 ? 1024 : s->nconns, stopping = s->stop_deadline != 0;
        if (stopping && (s->nconns == 0 || ddp__now_ms() > s->stop_deadline)) break;
        pf[n].fd = s->wake[0]; pf[n++].events = POLLIN;
        pf[n].fd = s->listen_fd; pf[n++].events = POLLIN;
        for (i = 0; i < nc; i++) { pf[n].fd = s->conns[i].fd; pf[n++].events = POLLIN; }
        for (i = 0; i < n; i++) pf[i].revents = 0;
        if (poll(pf, (nfds_t)n, 200) <= 0) continue;
        if (pf[0].revents) {
            char b[64];
            if (read(s->wake[0], b, sizeof b) < 0) {}
            s->stop_deadline = ddp__now_ms() + 5000; /* wait briefly for the others to hang up */
            s->closing = 1;
        }
        for (i = nc - 1; i >= 0; i--) /* backwards: dropping moves the last one into i */
            if (pf[2 + i].revents && ddp__server_read(s, &s->conns[i]) < 0) ddp__server_drop(s, i);
        if (pf[1].revents) {
            int fd = accept(s->listen_fd, NULL, NULL), one = 1;
            ddp__conn *grown;
            if (fd < 0) continue;
            grown = DDP__CAST(ddp__conn *, ddp__grow(s->conns, s->nconns, sizeof *s->conns));
            if (!grown || s->nconns >= 1024) { close(fd); continue; }
            s->conns = grown;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            fcntl(fd, F_SETFL, O_NONBLOCK);
            memset(&s->conns[s->nconns], 0, sizeof *s->conns);
            s->conns[s->nconns].fd = fd;
            s->conns[s->nconns++].rank = -1;
        }
    }
    return NULL;
}

static void ddp__server_free(ddp__server *s)
{
    int i;
    while (s->nconns) ddp__server_drop(s, s->nconns - 1);
    for (i = 0; i < s->nkv; i++) { DDP_FREE(s->kv[i].key); DDP_FREE(s->kv[i].val); }
    for (i = 0; i < s->nwaiters; i++) DDP_FREE(s->waiters[i].key);
    DDP_FREE(s->kv); DDP_FREE(s->waiters); DDP_FREE(s->conns);
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->wake[0] >= 0) { close(s->wake[0]); close(s->wake[1]); }
    DDP_FREE(s);
}

/* Tells the server to finish once every rank has hung up (or after 5 s), then joins it. */
static void ddp__server_stop(ddp__server *s)
{
    if (write(s->wake[1], "x", 1) < 0) {}
    pthread_join(s->thread, NULL);
    s->closing = 1;
    ddp__server_free(s);
}

static ddp_result ddp__server_start(ddp_ctx *ctx)
{
    struct ddp__state *st = ctx->st;
    struct addrinfo hints, *res = NULL, *ai;
    char port[16];
    int one = 1, fd = -1, err = 0, rc;
    ddp__server *s = DDP__CAST(ddp__server *, DDP_MALLOC(sizeof *s));
    if (!s) return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory for the store");
    memset(s, 0, sizeof *s);
    s->listen_fd = s->wake[0] = s->wake[1] = -1;
    s->world = ctx->world_size;
    snprintf(s->job_id, sizeof s->job_id, "%s", st->job_id);
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    snprintf(port, sizeof port, "%d", st->master_port);
    /* bind MASTER_ADDR itself when it is one of ours, the wildcard address otherwise */
    if ((rc = getaddrinfo(st->master_addr, port, &hints, &res)) != 0) {
        ddp__server_free(s);
        return ddp__fail(ctx, DDP_ERR_ENV, "MASTER_ADDR=%s cannot be resolved: %s", st->master_addr,
                         gai_strerror(rc));
    }
    for (ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) { err = errno; close(fd); fd = -1; }
    }
    freeaddrinfo(res);
    if (fd < 0 && err == EADDRNOTAVAIL) {
        struct sockaddr_in any;
        memset(&any, 0, sizeof any);
        any.sin_family = AF_INET;
        any.sin_port = htons((uint16_t)st->master_port);
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, (struct sockaddr *)&any, sizeof any) != 0) { err = errno; close(fd); fd = -1; }
    }
    if (fd < 0 || listen(fd, 1024) != 0) {
        if (fd >= 0) { err = errno; close(fd); }
        ddp__server_free(s);
        return ddp__fail(ctx, err == EADDRINUSE ? DDP_ERR_ENV : DDP_ERR_SYSTEM,
                         "rank 0 cannot open the store on %s:%d: %s%s", st->master_addr,
                         st->master_port, strerror(err),
                         err == EADDRINUSE ? " (another job on this port? set MASTER_PORT)" : "");
    }
    s->listen_fd = fd;
    if (pipe(s->wake) != 0 || pthread_create(&s->thread, NULL, ddp__server_main, s) != 0) {
        ddp__server_free(s);
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot start the store thread");
    }
    st->server = s;
    return DDP_OK;
}

/* ---- TCP store: client ---------------------------------------------------------------- */

/* One request, one answer. *out (if given) receives a NUL-terminated copy to free. */
static ddp_result ddp__store_req(ddp_ctx *ctx, uint32_t op, const char *key, const void *val,
                                 uint32_t vlen, char **out, uint32_t *outlen)
{
    struct ddp__state *st = ctx->st;
    uint32_t h[4], klen = (uint32_t)strlen(key), rlen, status;
    int64_t deadline = ddp__now_ms() + st->timeout_ms;
    char *buf;
    h[0] = htonl(DDP__MAGIC); h[1] = htonl(op); h[2] = htonl(klen); h[3] = htonl(vlen);
    if (ddp__write_all(st->store_fd, h, 16, deadline) != 0 ||
        ddp__write_all(st->store_fd, key, klen, deadline) != 0 ||
        (vlen && ddp__write_all(st->store_fd, val, vlen, deadline) != 0) ||
        ddp__read_all(st->store_fd, h, 16, deadline) != 0) {
        if (errno == ETIMEDOUT)
            return ddp__fail(ctx, DDP_ERR_TIMEOUT, "timed out after %.1f s waiting for '%s' from the store at %s:%d",
                             st->timeout_ms / 1000.0, key, st->master_addr, st->master_port);
        return ddp__fail(ctx, DDP_ERR_PEER, "lost the store at %s:%d (rank 0 exited?) during '%s'",
                         st->master_addr, st->master_port, key);
    }
    status = ntohl(h[1]);
    rlen = ntohl(h[3]);
    if (ntohl(h[0]) != DDP__MAGIC || rlen > DDP__MAX_VALUE)
        return ddp__fail(ctx, DDP_ERR_PROTOCOL, "the store at %s:%d sent a malformed answer",
                         st->master_addr, st->master_port);
    buf = DDP__CAST(char *, DDP_MALLOC(rlen + 1));
    if (!buf) return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory reading the store");
    if (ddp__read_all(st->store_fd, buf, rlen, deadline) != 0) {
        DDP_FREE(buf);
        return ddp__fail(ctx, DDP_ERR_PEER, "lost the store at %s:%d", st->master_addr,
                         st->master_port);
    }
    buf[rlen] = 0;
    if (status != 0) {
        ddp_result r = ddp__fail(ctx, op == DDP__HELLO ? DDP_ERR_ENV : DDP_ERR_PEER, "%s", buf);
        DDP_FREE(buf);
        return r;
    }
    if (out) { *out = buf; if (outlen) *outlen = rlen; } else { DDP_FREE(buf); }
    return DDP_OK;
}

static ddp_result ddp__store_connect(ddp_ctx *ctx)
{
    struct ddp__state *st = ctx->st;
    struct addrinfo hints, *res = NULL, *ai;
    char port[16], hello[32];
    int64_t deadline = ddp__now_ms() + st->timeout_ms;
    int backoff = 10, fd = -1, err = 0, one = 1, rc;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof port, "%d", st->master_port);
    for (;;) { /* rank 0 may not be listening yet: retry with backoff until the timeout */
        if ((rc = getaddrinfo(st->master_addr, port, &hints, &res)) != 0)
            return ddp__fail(ctx, DDP_ERR_ENV, "MASTER_ADDR=%s cannot be resolved: %s",
                             st->master_addr, gai_strerror(rc));
        for (ai = res; ai && fd < 0; ai = ai->ai_next) {
            struct timeval tv;
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
            if (fd < 0) continue;
            tv.tv_sec = 5; tv.tv_usec = 0; /* bounds connect() to an unreachable host */
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) { err = errno; close(fd); fd = -1; }
        }
        freeaddrinfo(res);
        if (fd >= 0) break;
        if (ddp__now_ms() + backoff > deadline)
            return ddp__fail(ctx, DDP_ERR_TIMEOUT, "cannot reach rank 0's store at %s:%d within %.1f s: %s",
                             st->master_addr, st->master_port, st->timeout_ms / 1000.0, strerror(err));
        ddp__sleep_ms(backoff);
        backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    st->store_fd = fd;
    snprintf(hello, sizeof hello, "%d %d", ctx->rank, ctx->world_size);
    return ddp__store_req(ctx, DDP__HELLO, st->job_id, hello, (uint32_t)strlen(hello), NULL, NULL);
}

static ddp_result ddp__store_set(ddp_ctx *ctx, const char *key, const void *val, uint32_t len)
{
    return ddp__store_req(ctx, DDP__SET, key, val, len, NULL, NULL);
}

/* Waits (on the server) until key exists. */
static ddp_result ddp__store_get(ddp_ctx *ctx, const char *key, char **val, uint32_t *len)
{
    return ddp__store_req(ctx, DDP__GET, key, NULL, 0, val, len);
}

static ddp_result ddp__store_add(ddp_ctx *ctx, const char *key, long long delta, long long *now)
{
    char text[32], *out = NULL;
    ddp_result r;
    snprintf(text, sizeof text, "%lld", delta);
    r = ddp__store_req(ctx, DDP__ADD, key, text, (uint32_t)strlen(text), &out, NULL);
    if (r == DDP_OK) { *now = strtoll(out, NULL, 10); DDP_FREE(out); }
    return r;
}

/* Everyone arrives, the last one opens the gate, everyone waits for the gate. */
static ddp_result ddp__store_barrier(ddp_ctx *ctx, const char *name)
{
    char key[96];
    long long n = 0;
    ddp_result r;
    snprintf(key, sizeof key, "barrier/%s", name);
    if ((r = ddp__store_add(ctx, key, 1, &n)) != DDP_OK) return r;
    strcat(key, "/open");
    if (n == ctx->world_size && (r = ddp__store_set(ctx, key, "1", 1)) != DDP_OK) return r;
    return ddp__store_get(ctx, key, NULL, NULL);
}

/* ---- environment -------------------------------------------------------------------------- */

/* 1 if the variable is set (value in *out), 0 if unset, -1 if it is not an integer. */
static int ddp__env_int(ddp_ctx *ctx, const char *name, int *out)
{
    const char *v = name ? getenv(name) : NULL;
    char *end;
    long x;
    if (!v || !*v) return 0;
    errno = 0;
    x = strtol(v, &end, 10);
    if (errno || *end || x < INT_MIN || x > INT_MAX) {
        ddp__fail(ctx, DDP_ERR_ENV, "%s='%s' is not an integer", name, v);
        return -1;
    }
    *out = (int)x;
    return 1;
}

/* Finds --local_rank N, --local_rank=N (or --local-rank) in argv, removes it, -1 if absent. */
static ddp_result ddp__argv_local_rank(ddp_ctx *ctx, int *argc, char **argv, int *local_rank)
{
    int i, used = 0;
    *local_rank = -1;
    if (!argc || !argv) return DDP_OK;
    for (i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = NULL;
        char *end;
        long x;
        if (strncmp(a, "--local_rank", 12) != 0 && strncmp(a, "--local-rank", 12) != 0) continue;
        if (a[12] == '=') { v = a + 13; used = 1; }
        else if (a[12] == 0 && i + 1 < *argc) { v = argv[i + 1]; used = 2; }
        else if (a[12] == 0) return ddp__fail(ctx, DDP_ERR_ENV, "--local_rank needs a value");
        else continue;
        errno = 0;
        x = strtol(v, &end, 10);
        if (errno || *end || !*v || x < 0 || x > INT_MAX)
            return ddp__fail(ctx, DDP_ERR_ENV, "--local_rank='%s' is not a non-negative integer", v);
        *local_rank = (int)x;
        memmove(&argv[i], &argv[i + used], sizeof *argv * (size_t)(*argc - i - used + 1));
        *argc -= used;
        return DDP_OK;
    }
    return DDP_OK;
}

/* Rank, world size and local topology: from the desc, else from the first launcher
   whose variables are set, else a world of one. -1 marks "derive later". */
static ddp_result ddp__topology(ddp_ctx *ctx, const ddp_desc *d)
{
    static const struct {
        const char *who, *rank, *world, *local_rank, *local_world, *node;
    } launchers[] = {
        {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"},
        {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, "SLURM_NODEID"},
        {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE", NULL},
        {"MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", NULL, NULL},
    };
    const char *who = "defaults", *rank_name = "rank", *world_name = "world_size";
    int argv_local = -1;
    size_t i;
    ddp_result r = ddp__argv_local_rank(ctx, d->argc, d->argv, &argv_local);
    if (r != DDP_OK) return r;
    ctx->rank = 0; ctx->world_size = 1;
    ctx->local_rank = ctx->local_world_size = ctx->node_rank = -1;
    if (d->world_size > 0) {
        who = "ddp_desc";
        ctx->rank = d->rank;
        ctx->world_size = d->world_size;
        ctx->local_rank = d->local_rank ? d->local_rank : argv_local >= 0 ? argv_local : d->rank;
        ctx->local_world_size = d->local_world_size ? d->local_world_size : d->world_size;
    } else {
        for (i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
            int hr = ddp__env_int(ctx, launchers[i].rank, &ctx->rank);
            int hw = ddp__env_int(ctx, launchers[i].world, &ctx->world_size);
            if (hr < 0 || hw < 0) return DDP_ERR_ENV;
            if (!hr && !hw) continue;
            if (hr != hw)
                return ddp__fail(ctx, DDP_ERR_ENV, "%s is set but %s is not (%s)",
                                 hr ? launchers[i].rank : launchers[i].world,
                                 hr ? launchers[i].world : launchers[i].rank, launchers[i].who);
            who = launchers[i].who;
            rank_name = launchers[i].rank;
            world_name = launchers[i].world;
            if (ddp__env_int(ctx, launchers[i].local_rank, &ctx->local_rank) < 0 ||
                ddp__env_int(ctx, launchers[i].local_world, &ctx->local_world_size) < 0 ||
                ddp__env_int(ctx, launchers[i].node, &ctx->node_rank) < 0)
                return DDP_ERR_ENV;
            break;
        }
        if (argv_local >= 0) ctx->local_rank = argv_local; /* torch.distributed.launch */
    }
    if (ctx->world_size < 1)
        return ddp__fail(ctx, DDP_ERR_ENV, "%s=%d must be at least 1 (%s)", world_name,
                         ctx->world_size, who);
    if (ctx->rank < 0 || ctx->rank >= ctx->world_size)
        return ddp__fail(ctx, DDP_ERR_ENV, "%s=%d is outside 0..%d (%s=%d, %s)", rank_name, ctx->rank,
                         ctx->world_size - 1, world_name, ctx->world_size, who);
    if (ctx->local_world_size > ctx->world_size ||
        (ctx->local_world_size > 0 && ctx->local_rank >= ctx->local_world_size))
        return ddp__fail(ctx, DDP_ERR_ENV, "local rank %d / local world size %d do not fit a world of %d (%s)",
                         ctx->local_rank, ctx->local_world_size, ctx->world_size, who);
    if (ctx->world_size == 1) {
        if (ctx->local_rank < 0) ctx->local_rank = 0;
        ctx->local_world_size = 1;
        ctx->node_rank = 0;
        ctx->num_nodes = 1;
    }
    ddp__info(ctx, "topology from %s", who);
    return DDP_OK;
}

/* Rendezvous settings: address, port, job id, timeout. */
static ddp_result ddp__settings(ddp_ctx *ctx, const ddp_desc *d)
{
    struct ddp__state *st = ctx->st;
    const char *addr = d->master_addr ? d->master_addr : getenv("MASTER_ADDR");
    const char *job = d->job_id ? d->job_id : getenv("DDP_JOB_ID");
    const char *timeout = getenv("DDP_TIMEOUT");
    int port = d->master_port;
    if (!job) job = getenv("TORCHELASTIC_RUN_ID");
    if (!job) job = getenv("SLURM_JOB_ID");
    snprintf(st->job_id, sizeof st->job_id, "%s", job ? job : "ddp");
    st->timeout_ms = d->timeout_ms;
    if (st->timeout_ms <= 0 && timeout) {
        char *end;
        double sec = strtod(timeout, &end);
        if (*end || !(sec > 0) || sec > 1e6)
            return ddp__fail(ctx, DDP_ERR_ENV, "DDP_TIMEOUT='%s' is not a positive number of seconds", timeout);
        st->timeout_ms = (int)(sec * 1000 + 0.5);
    }
    if (st->timeout_ms <= 0) st->timeout_ms = DDP__DEFAULT_TIMEOUT_MS;
    if (ctx->world_size == 1) return DDP_OK;
    if (!addr || !*addr)
        return ddp__fail(ctx, DDP_ERR_ENV,
                         "MASTER_ADDR is not set: a world of %d needs the address of rank 0's host",
                         ctx->world_size);
    if (!port) {
        int set = ddp__env_int(ctx, "MASTER_PORT", &port);
        if (set < 0) return DDP_ERR_ENV;
        if (!set) port = 29500;
        /* torchrun's agent already serves its own store on MASTER_PORT */
        if (getenv("TORCHELASTIC_RUN_ID")) port++;
    }
    if (port < 1 || port > 65535)
        return ddp__fail(ctx, DDP_ERR_ENV, "MASTER_PORT=%d is not a TCP port", port);
    snprintf(st->master_addr, sizeof st->master_addr, "%s", addr);
    st->master_port = port;
    return DDP_OK;
}

/* Through the store: refuse duplicate ranks, derive local ranks and nodes from host names. */
static ddp_result ddp__meet(ddp_ctx *ctx)
{
    char key[64], host[256], *other = NULL, (*hosts)[256];
    long long n = 0;
    int r, lr = 0, lw = 0, node = 0, nodes = 0;
    ddp_result res;
    snprintf(key, sizeof key, "rank/%d", ctx->rank);
    if ((res = ddp__store_add(ctx, key, 1, &n)) != DDP_OK) return res;
    if (n != 1)
        return ddp__fail(ctx, DDP_ERR_ENV, "two processes claim rank %d of job '%s'", ctx->rank,
                         ctx->st->job_id);
    if (gethostname(host, sizeof host) != 0) strcpy(host, "?");
    host[sizeof host - 1] = 0;
    snprintf(key, sizeof key, "host/%d", ctx->rank);
    if ((res = ddp__store_set(ctx, key, host, (uint32_t)strlen(host))) != DDP_OK) return res;
    hosts = (char(*)[256])DDP_MALLOC(sizeof *hosts * (size_t)ctx->world_size);
    if (!hosts) return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory");
    for (r = 0; r < ctx->world_size; r++) {
        int j, seen = 0;
        snprintf(key, sizeof key, "host/%d", r);
        if ((res = ddp__store_get(ctx, key, &other, NULL)) != DDP_OK) { DDP_FREE(hosts); return res; }
        snprintf(hosts[r], sizeof hosts[r], "%s", other);
        DDP_FREE(other);
        for (j = 0; j < r; j++) seen |= strcmp(hosts[j], hosts[r]) == 0;
        if (strcmp(hosts[r], host) == 0) {
            if (!seen) node = nodes; /* nodes are numbered in order of their first rank */
            lw++;
            lr += r < ctx->rank;
        }
        nodes += !seen;
    }
    DDP_FREE(hosts);
    if (ctx->local_rank < 0) ctx->local_rank = lr;
    if (ctx->local_world_size < 0) ctx->local_world_size = lw;
    if (ctx->node_rank < 0) ctx->node_rank = node;
    ctx->num_nodes = nodes;
    return DDP_OK;
}

/* ---- CPU backend: one shared-memory arena per host ----------------------------------------
   Layout: header (barrier words, pids, per-rank progress and abort reasons), then one
   staging slot of `chunk` bytes per rank, then one result slot. A collective moves
   any size through the slots chunk by chunk: copy in, barrier, each rank reduces its
   1/W share of the chunk, barrier, copy out. Waiting ranks sleep on a futex (they
   spin briefly first only when there are at least as many cores as ranks), and
   every sleep is short enough to notice a dead peer, an abort or the timeout. */

struct ddp__shm {
    int32_t pids[DDP__MAX_CPU_RANKS];
    uint64_t arrived[DDP__MAX_CPU_RANKS]; /* barriers each rank has entered */
    char why[DDP__MAX_CPU_RANKS][160];    /* a failing rank's reason, for the others */
    uint32_t aborted;                     /* 1 + rank of the first rank that failed, or 0 */
    char pad0[60];
    uint32_t count; /* ranks inside the current barrier */
    char pad1[60];
    uint32_t gen;   /* barrier generation: futex word */
    char pad2[60];
    uint32_t sleepers;
};

#define DDP__SHM_HEADER (((sizeof(ddp__shm) + 4095) / 4096) * 4096)

static char *ddp__slot(ddp_ctx *ctx, int r) /* r == world_size: the result slot */
{
    return (char *)ctx->st->shm + DDP__SHM_HEADER + (size_t)r * ctx->st->chunk;
}

#if defined(__x86_64__) || defined(__i386__)
#define DDP__RELAX() __builtin_ia32_pause()
#else
#define DDP__RELAX() ((void)0)
#endif

static int ddp__pid_alive(int pid)
{
    char path[64], buf[512], *p;
    ssize_t n;
    int fd;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) return errno != ENOENT;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = 0;
    p = strrchr(buf, ')'); /* state follows the command name, which may hold spaces */
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* Marks the arena aborted (first failure wins) and wakes every sleeper. */
static ddp_result ddp__shm_abort(ddp_ctx *ctx, ddp_result code)
{
    ddp__shm *h = ctx->st->shm;
    uint32_t none = 0;
    ddp__copy(h->why[ctx->rank], sizeof h->why[0], ctx->st->err);
    __atomic_compare_exchange_n(&h->aborted, &none, (uint32_t)ctx->rank + 1, 0, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &h->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    return code;
}

static ddp_result ddp__shm_barrier(ddp_ctx *ctx, const ddp__coll *c)
{
    struct ddp__state *st = ctx->st;
    ddp__shm *h = st->shm;
    uint32_t gen = __atomic_load_n(&h->gen, __ATOMIC_ACQUIRE), who;
    uint64_t mine = __atomic_add_fetch(&h->arrived[ctx->rank], 1, __ATOMIC_RELAXED);
    int64_t start, deadline, next_check;
    int i;
    if (__atomic_add_fetch(&h->count, 1, __ATOMIC_ACQ_REL) == (uint32_t)ctx->world_size) {
        __atomic_store_n(&h->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&h->gen, gen + 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&h->sleepers, __ATOMIC_SEQ_CST))
            syscall(SYS_futex, &h->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        return DDP_OK;
    }
    if (st->spin) { /* a few microseconds: a peer that is nearly there costs no sleep */
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do {
            for (i = 0; i < 32; i++) {
                if (__atomic_load_n(&h->gen, __ATOMIC_ACQUIRE) != gen) return DDP_OK;
                DDP__RELAX();
            }
            clock_gettime(CLOCK_MONOTONIC, &t);
        } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < DDP__SPIN_NS);
    }
    start = ddp__now_ms();
    deadline = start + st->timeout_ms;
    next_check = start + 100;
    while (__atomic_load_n(&h->gen, __ATOMIC_ACQUIRE) == gen) {
        struct timespec ts;
        int64_t now;
        ts.tv_sec = 0;
        ts.tv_nsec = 20 * 1000000L;
        __atomic_add_fetch(&h->sleepers, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, &h->gen, FUTEX_WAIT, gen, &ts, NULL, 0);
        __atomic_sub_fetch(&h->sleepers, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&h->gen, __ATOMIC_ACQUIRE) != gen) break;
        if ((who = __atomic_load_n(&h->aborted, __ATOMIC_SEQ_CST)) != 0)
            return ddp__fail(ctx, DDP_ERR_ABORTED, "%s #%llu stopped: rank %u failed: %s",
                             ddp__coll_names[c->kind], (unsigned long long)c->seq, who - 1,
                             h->why[who - 1]);
        now = ddp__now_ms();
        if (now >= next_check || now >= deadline) {
            char late[128] = "";
            int dead = -1;
            size_t n = 0;
            for (i = 0; i < ctx->world_size; i++) {
                if (__atomic_load_n(&h->arrived[i], __ATOMIC_RELAXED) >= mine) continue;
                if (dead < 0 && !ddp__pid_alive(h->pids[i])) dead = i;
                if (n + 12 < sizeof late) n += (size_t)snprintf(late + n, sizeof late - n, "%s%d", n ? ", " : "", i);
            }
            if (dead >= 0) {
                ddp__fail(ctx, DDP_ERR_PEER, "rank %d (pid %d) exited during %s #%llu",
                          dead, h->pids[dead], ddp__coll_names[c->kind], (unsigned long long)c->seq);
                return ddp__shm_abort(ctx, DDP_ERR_PEER);
            }
            if (now >= deadline) {
                ddp__fail(ctx, DDP_ERR_TIMEOUT, "%s #%llu timed out after %.1f s waiting for rank%s %s",
                          ddp__coll_names[c->kind], (unsigned long long)c->seq,
                          st->timeout_ms / 1000.0, strchr(late, ',') ? "s" : "", late);
                return ddp__shm_abort(ctx, DDP_ERR_TIMEOUT);
            }
            next_check = now + 100;
        }
    }
    return DDP_OK;
}

/* memcpy for data another core just wrote. Mid-size copies go in small pieces: for
   them glibc picks `rep movsb`, which on some CPUs (AMD Zen, measured here) pulls
   lines from another core's cache one at a time, at a fifth of a vector loop's
   speed. Large copies keep glibc's own large-copy path, which is faster still. */
static void ddp__copy_shared(void *dst, const void *src, size_t n)
{
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t k;
    if (n >= ((size_t)512 << 10)) {
        memcpy(dst, src, n);
        return;
    }
    for (; n > 0; d += k, s += k, n -= k) {
        k = n < 2048 ? n : 2048;
        memcpy(d, s, k);
    }
}

/* dst = dst (op) src, n elements. */
static void ddp__combine(void *dst, const void *src, size_t n, ddp_dtype t, ddp_op op)
{
    size_t i;
#define DDP__COMBINE(T)                                                                          \
    {                                                                                            \
        T *d = (T *)dst;                                                                         \
        const T *s = (const T *)src;                                                             \
        if (op == DDP_MIN) for (i = 0; i < n; i++) d[i] = s[i] < d[i] ? s[i] : d[i];             \
        else if (op == DDP_MAX) for (i = 0; i < n; i++) d[i] = s[i] > d[i] ? s[i] : d[i];        \
        else for (i = 0; i < n; i++) d[i] += s[i];                                               \
    }
    switch (t) {
    case DDP_F32: DDP__COMBINE(float) break;
    case DDP_F64: DDP__COMBINE(double) break;
    case DDP_I32: DDP__COMBINE(int32_t) break;
    case DDP_I64: DDP__COMBINE(int64_t) break;
    default: break;
    }
#undef DDP__COMBINE
}

static float ddp__half_get(const uint16_t *p, size_t i, int bf) { return bf ? ddp_bf16_to_f32(p[i]) : ddp_f16_to_f32(p[i]); }

/* out[0..n) = reduction over ranks of src[r][0..n), src[r] = base + r * stride bytes.
   Ranks are combined in order 0..W-1, so every rank computes bitwise the same. */
static void ddp__reduce(void *out, const char *base, size_t stride, int world, size_t n,
                        ddp_dtype t, ddp_op op)
{
    size_t i, es = ddp_dtype_size(t);
    int r;
    if (t == DDP_BF16 || t == DDP_F16) { /* accumulate in f32, a block at a time */
        int bf = t == DDP_BF16;
        size_t b0, bn;
        float acc[256];
        for (b0 = 0; b0 < n; b0 += bn) {
            bn = n - b0 < 256 ? n - b0 : 256;
            for (i = 0; i < bn; i++) acc[i] = ddp__half_get((const uint16_t *)base, b0 + i, bf);
            for (r = 1; r < world; r++) {
                const uint16_t *s = (const uint16_t *)(base + (size_t)r * stride);
                for (i = 0; i < bn; i++) {
                    float v = ddp__half_get(s, b0 + i, bf);
                    acc[i] = op == DDP_MIN ? (v < acc[i] ? v : acc[i])
                           : op == DDP_MAX ? (v > acc[i] ? v : acc[i]) : acc[i] + v;
                }
            }
            for (i = 0; i < bn; i++) {
                float v = op == DDP_AVG ? acc[i] / (float)world : acc[i];
                ((uint16_t *)out)[b0 + i] = bf ? ddp_f32_to_bf16(v) : ddp_f32_to_f16(v);
            }
        }
        return;
    }
    ddp__copy_shared(out, base, n * es);
    for (r = 1; r < world; r++) ddp__combine(out, base + (size_t)r * stride, n, t, op);
    if (op != DDP_AVG) return;
    switch (t) {
    case DDP_F32: for (i = 0; i < n; i++) ((float *)out)[i] /= (float)world; break;
    case DDP_F64: for (i = 0; i < n; i++) ((double *)out)[i] /= world; break;
    case DDP_I32: for (i = 0; i < n; i++) ((int32_t *)out)[i] /= world; break;
    case DDP_I64: for (i = 0; i < n; i++) ((int64_t *)out)[i] /= world; break;
    default: break;
    }
}

/* Runs one collective through the arena (world > 1). */
static ddp_result ddp__cpu_run(ddp_ctx *ctx, const ddp__coll *c)
{
    int W = ctx->world_size, me = ctx->rank, r;
    size_t es = ddp_dtype_size(c->dtype), per = ctx->st->chunk / es, off, n;
    const char *send = (const char *)c->send;
    char *recv = (char *)c->recv, *mine = ddp__slot(ctx, me), *result = ddp__slot(ctx, W);
    ddp_result res = DDP_OK;
    switch (c->kind) {
    case DDP__BARRIER:
        return ddp__shm_barrier(ctx, c);
    case DDP__ALL_REDUCE:
        for (off = 0; off < c->count && res == DDP_OK; off += n) {
            size_t lo, hi;
            n = c->count - off < per ? c->count - off : per;
            lo = n * (size_t)me / (size_t)W;
            hi = n * (size_t)(me + 1) / (size_t)W;
            ddp__copy_shared(mine, send + off * es, n * es);
            if ((res = ddp__shm_barrier(ctx, c)) != DDP_OK) break;
            ddp__reduce(result + lo * es, ddp__slot(ctx, 0) + lo * es, ctx->st->chunk, W, hi - lo,
                        c->dtype, c->op);
            if ((res = ddp__shm_barrier(ctx, c)) != DDP_OK) break;
            ddp__copy_shared(recv + off * es, result, n * es);
        }
        return res;
    case DDP__BROADCAST:
        for (off = 0; off < c->count && res == DDP_OK; off += n) {
            n = c->count - off < per ? c->count - off : per;
            /* through the root's own slot: the result slot may still be read by
               ranks finishing the previous collective */
            if (me == c->root) ddp__copy_shared(mine, recv + off * es, n * es);
            if ((res = ddp__shm_barrier(ctx, c)) != DDP_OK) break;
            if (me != c->root) ddp__copy_shared(recv + off * es, ddp__slot(ctx, c->root), n * es);
            res = ddp__shm_barrier(ctx, c);
        }
        return res;
    case DDP__ALL_GATHER:
        for (off = 0; off < c->count && res == DDP_OK; off += n) {
            n = c->count - off < per ? c->count - off : per;
            ddp__copy_shared(mine, send + off * es, n * es);
            if ((res = ddp__shm_barrier(ctx, c)) != DDP_OK) break;
            for (r = 0; r < W; r++)
                ddp__copy_shared(recv + ((size_t)r * c->count + off) * es, ddp__slot(ctx, r), n * es);
            res = ddp__shm_barrier(ctx, c);
        }
        return res;
    case DDP__REDUCE_SCATTER:
        per /= (size_t)W; /* a slot holds one piece of every rank's block */
        for (off = 0; off < c->count && res == DDP_OK; off += n) {
            n = c->count - off < per ? c->count - off : per;
            for (r = 0; r < W; r++)
                ddp__copy_shared(mine + (size_t)r * n * es, send + ((size_t)r * c->count + off) * es, n * es);
            if ((res = ddp__shm_barrier(ctx, c)) != DDP_OK) break;
            ddp__reduce(recv + off * es, ddp__slot(ctx, 0) + (size_t)me * n * es, ctx->st->chunk, W,
                        n, c->dtype, c->op);
            res = ddp__shm_barrier(ctx, c);
        }
        return res;
    }
    return ddp__fail(ctx, DDP_ERR_ARG, "unknown collective");
}

/* A world of one: every collective is a copy (or nothing). */
static void ddp__solo_run(const ddp__coll *c)
{
    size_t bytes = c->count * ddp_dtype_size(c->dtype);
    if (c->kind == DDP__BROADCAST || c->kind == DDP__BARRIER || c->send == c->recv || !bytes) return;
    memmove(c->recv, c->send, bytes);
}

static ddp_result ddp__shm_open(ddp_ctx *ctx)
{
    struct ddp__state *st = ctx->st;
    char name[128], *got = NULL;
    const char *chunk_env = getenv("DDP_SHM_CHUNK");
    size_t j;
    int fd = -1;
    ddp_result r;
    void *p;
    if (ctx->num_nodes > 1)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the CPU backend runs on one host, but this job spans %d hosts",
                         ctx->num_nodes);
    if (ctx->world_size > DDP__MAX_CPU_RANKS)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the CPU backend takes at most %d ranks, not %d",
                         DDP__MAX_CPU_RANKS, ctx->world_size);
    if (!st->chunk && chunk_env) {
        char *end;
        unsigned long long v = strtoull(chunk_env, &end, 10);
        if (*end || v < 64 || v > (1ull << 30))
            return ddp__fail(ctx, DDP_ERR_ENV, "DDP_SHM_CHUNK='%s' must be a byte count from 64 to 2^30", chunk_env);
        st->chunk = (size_t)v;
    }
    if (!st->chunk) st->chunk = DDP__DEFAULT_CHUNK;
    /* room for one element of every rank's block (reduce_scatter), 64-byte aligned */
    if (st->chunk < (size_t)ctx->world_size * 8) st->chunk = (size_t)ctx->world_size * 8;
    st->chunk = (st->chunk + 63) & ~(size_t)63;
    st->shm_size = DDP__SHM_HEADER + (size_t)(ctx->world_size + 1) * st->chunk;
    if (ctx->local_rank == 0) {
        snprintf(name, sizeof name, "/ddp-%d-%s-%d", (int)getpid(), st->job_id, st->master_port);
        for (j = 1; name[j]; j++)
            if (name[j] == '/') name[j] = '_';
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0 && ftruncate(fd, (off_t)st->shm_size) != 0) {
            close(fd);
            shm_unlink(name);
            return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot size shared memory %s to %zu bytes: %s (is /dev/shm full?)",
                             name, st->shm_size, strerror(errno));
        }
        if (fd >= 0 && (r = ddp__store_set(ctx, "shm/name", name, (uint32_t)strlen(name))) != DDP_OK) {
            close(fd);
            shm_unlink(name);
            return r;
        }
    } else {
        if ((r = ddp__store_get(ctx, "shm/name", &got, NULL)) != DDP_OK) return r;
        snprintf(name, sizeof name, "%s", got);
        DDP_FREE(got);
        fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    }
    if (fd < 0)
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot open shared memory %s: %s", name, strerror(errno));
    p = mmap(NULL, st->shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        if (ctx->local_rank == 0) shm_unlink(name);
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot map %zu bytes of shared memory: %s", st->shm_size,
                         strerror(errno));
    }
    st->shm = (ddp__shm *)p;
    st->shm->pids[ctx->rank] = (int32_t)getpid();
    /* once everyone has it mapped the name goes: a crash can leave nothing behind */
    r = ddp__store_barrier(ctx, "shm");
    if (ctx->local_rank == 0) shm_unlink(name);
    if (r != DDP_OK) return r;
    st->spin = sysconf(_SC_NPROCESSORS_ONLN) >= ctx->local_world_size;
    return DDP_OK;
}

/* ---- NCCL backend ----------------------------------------------------------------------------
   One communicator per process on device local_rank, created non-blocking so that a
   stuck peer turns into a timeout and an abort instead of a hang. Collectives run on
   the context's own stream, ordered after the caller's stream by an event, and the
   caller's stream is ordered after them (async ones: in ddp_wait, so they overlap). */
#ifdef DDP_NCCL
static ddp_result ddp__cuda(ddp_ctx *ctx, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return DDP_OK;
    return ddp__fail(ctx, DDP_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(e));
}

/* Non-blocking NCCL calls may answer "in progress": wait for the verdict, within the timeout. */
static ddp_result ddp__nccl_settle(ddp_ctx *ctx, ncclResult_t r, const char *what, uint64_t seq)
{
    struct ddp__state *st = ctx->st;
    int64_t deadline = ddp__now_ms() + st->timeout_ms;
    while (r == ncclInProgress) {
        if (ddp__now_ms() > deadline) {
            ncclCommAbort(st->comm);
            st->comm = NULL;
            return ddp__fail(ctx, DDP_ERR_TIMEOUT, "%s #%llu timed out after %.1f s (NCCL aborted)", what,
                             (unsigned long long)seq, st->timeout_ms / 1000.0);
        }
        sched_yield();
        if (ncclCommGetAsyncError(st->comm, &r) != ncclSuccess) break;
    }
    if (r == ncclSuccess) return DDP_OK;
    return ddp__fail(ctx, DDP_ERR_BACKEND, "%s #%llu: %s (%s)", what, (unsigned long long)seq,
                     ncclGetErrorString(r), st->comm ? ncclGetLastError(st->comm) : "");
}

/* Waits on the host for an event, polling NCCL for errors, within the timeout. */
static ddp_result ddp__nccl_wait_event(ddp_ctx *ctx, cudaEvent_t ev, const char *what, uint64_t seq)
{
    struct ddp__state *st = ctx->st;
    int64_t deadline = ddp__now_ms() + st->timeout_ms;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        ncclResult_t async = ncclSuccess;
        struct timespec ts;
        if (e == cudaSuccess) return DDP_OK;
        if (e != cudaErrorNotReady) return ddp__cuda(ctx, e, what);
        ncclCommGetAsyncError(st->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) return ddp__nccl_settle(ctx, async, what, seq);
        if (ddp__now_ms() > deadline) {
            ncclCommAbort(st->comm);
            st->comm = NULL;
            return ddp__fail(ctx, DDP_ERR_TIMEOUT, "%s #%llu did not finish within %.1f s (NCCL aborted)",
                             what, (unsigned long long)seq, st->timeout_ms / 1000.0);
        }
        ts.tv_sec = 0;
        ts.tv_nsec = 50000; /* the GPU is working; check again in 50 us */
        nanosleep(&ts, NULL);
    }
}

static ddp_result ddp__nccl_init(ddp_ctx *ctx)
{
    struct ddp__state *st = ctx->st;
    ncclUniqueId id;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    int n = 0;
    ddp_result r;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the NCCL backend needs a GPU, and none is visible");
    if (ctx->local_rank >= n)
        return ddp__fail(ctx, DDP_ERR_ENV, "local rank %d needs GPU %d, but only %d are visible",
                         ctx->local_rank, ctx->local_rank, n);
    if ((r = ddp__cuda(ctx, cudaSetDevice(ctx->local_rank), "cudaSetDevice")) != DDP_OK) return r;
    ctx->device = ctx->local_rank;
    if (ctx->rank == 0) {
        if ((r = ddp__nccl_settle(ctx, ncclGetUniqueId(&id), "ncclGetUniqueId", 0)) != DDP_OK) return r;
        if (ctx->world_size > 1 && (r = ddp__store_set(ctx, "nccl/id", &id, sizeof id)) != DDP_OK) return r;
    } else {
        char *got = NULL;
        uint32_t len = 0;
        if ((r = ddp__store_get(ctx, "nccl/id", &got, &len)) != DDP_OK) return r;
        if (len != sizeof id) {
            DDP_FREE(got);
            return ddp__fail(ctx, DDP_ERR_PROTOCOL, "rank 0 sent an NCCL id of %u bytes", len);
        }
        memcpy(&id, got, sizeof id);
        DDP_FREE(got);
    }
    cfg.blocking = 0;
    r = ddp__nccl_settle(ctx, ncclCommInitRankConfig(&st->comm, ctx->world_size, id, ctx->rank, &cfg),
                         "ncclCommInitRank", 0);
    if (r != DDP_OK) return r;
    if ((r = ddp__cuda(ctx, cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate")) != DDP_OK)
        return r;
    return ddp__cuda(ctx, cudaEventCreateWithFlags(&st->ready, cudaEventDisableTiming), "cudaEventCreate");
}

/* Queues c on the NCCL stream after `user`'s work; *done is recorded after it, and
   `user` waits for it unless async (then ddp_wait orders it). */
static ddp_result ddp__nccl_run(ddp_ctx *ctx, const ddp__coll *c, void *user_stream, cudaEvent_t done, int async)
{
    struct ddp__state *st = ctx->st;
    cudaStream_t user = (cudaStream_t)user_stream;
    static const ncclDataType_t types[DDP_DTYPE_COUNT] = {ncclFloat32, ncclFloat64, ncclBfloat16,
                                                          ncclFloat16, ncclInt32, ncclInt64};
    static const ncclRedOp_t ops[DDP_OP_COUNT] = {ncclSum, ncclAvg, ncclMin, ncclMax};
    ncclDataType_t t = types[c->dtype];
    ncclResult_t nr = ncclSuccess;
    ddp_result r;
    if ((r = ddp__cuda(ctx, cudaEventRecord(st->ready, user), "cudaEventRecord")) != DDP_OK ||
        (r = ddp__cuda(ctx, cudaStreamWaitEvent(st->stream, st->ready, 0), "cudaStreamWaitEvent")) != DDP_OK)
        return r;
    switch (c->kind) {
    case DDP__ALL_REDUCE:
        nr = ncclAllReduce(c->send, c->recv, c->count, t, ops[c->op], st->comm, st->stream);
        break;
    case DDP__BROADCAST:
        nr = ncclBroadcast(c->recv, c->recv, c->count, t, c->root, st->comm, st->stream);
        break;
    case DDP__ALL_GATHER:
        nr = ncclAllGather(c->send, c->recv, c->count, t, st->comm, st->stream);
        break;
    case DDP__REDUCE_SCATTER:
        nr = ncclReduceScatter(c->send, c->recv, c->count, t, ops[c->op], st->comm, st->stream);
        break;
    }
    if ((r = ddp__nccl_settle(ctx, nr, ddp__coll_names[c->kind], c->seq)) != DDP_OK) return r;
    if ((r = ddp__cuda(ctx, cudaEventRecord(done, st->stream), "cudaEventRecord")) != DDP_OK || async) return r;
    return ddp__cuda(ctx, cudaStreamWaitEvent(user, done, 0), "cudaStreamWaitEvent");
}
#endif

/* ---- collectives ------------------------------------------------------------------------------ */

static void *ddp__worker_main(void *arg)
{
    ddp_ctx *ctx = (ddp_ctx *)arg;
    struct ddp__state *st = ctx->st;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        ddp__coll c;
        ddp_result r;
        while (st->done == st->queued && !st->worker_stop) pthread_cond_wait(&st->cv, &st->mu);
        if (st->done == st->queued) break;
        c = st->queue[st->done % DDP__QUEUE];
        pthread_mutex_unlock(&st->mu);
        r = st->async_err ? DDP_ERR_ABORTED : ddp__cpu_run(ctx, &c);
        pthread_mutex_lock(&st->mu);
        if (r != DDP_OK && !st->async_err) st->async_err = r;
        st->done++;
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* Waits until the worker has run everything queued up to seq; its first error if any. */
static ddp_result ddp__drain(ddp_ctx *ctx, uint64_t seq)
{
    struct ddp__state *st = ctx->st;
    ddp_result r;
    if (!st->worker_started) return DDP_OK;
    pthread_mutex_lock(&st->mu);
    while (st->done < seq) pthread_cond_wait(&st->cv, &st->mu);
    r = st->async_err;
    pthread_mutex_unlock(&st->mu);
    return r;
}

static ddp_result ddp__check(ddp_ctx *ctx, const ddp__coll *c, const char *name)
{
    int needs_data = c->kind != DDP__BARRIER && c->count > 0;
    if (!ctx || !ctx->st) return DDP_ERR_ARG;
    if (ctx->st->broken)
        return ddp__fail(ctx, DDP_ERR_ABORTED, "%s refused: the process group failed earlier", name);
    if ((unsigned)c->dtype >= DDP_DTYPE_COUNT || (unsigned)c->op >= DDP_OP_COUNT)
        return ddp__fail(ctx, DDP_ERR_ARG, "%s: unknown dtype %d or op %d", name, (int)c->dtype, (int)c->op);
    if (needs_data && (!c->recv || (!c->send && c->kind != DDP__BROADCAST)))
        return ddp__fail(ctx, DDP_ERR_ARG, "%s: NULL buffer for %zu elements", name, c->count);
    if (c->root < 0 || c->root >= ctx->world_size)
        return ddp__fail(ctx, DDP_ERR_ARG, "%s: root %d is not a rank of a world of %d", name, c->root,
                         ctx->world_size);
    return DDP_OK;
}

/* Every collective goes through here: validate, number it, run it (or queue it). */
static ddp_result ddp__issue(ddp_ctx *ctx, ddp__coll *c, void *stream, ddp_work *work)
{
    struct ddp__state *st;
    ddp_result r = ddp__check(ctx, c, ddp__coll_names[c->kind]);
    if (r != DDP_OK) return r;
    st = ctx->st;
    c->seq = ++st->seq;
    if (work) { work->seq = 0; work->event = NULL; }
#ifdef DDP_NCCL
    if (ctx->backend == DDP_BACKEND_NCCL) {
        cudaEvent_t done = NULL;
        if (c->kind == DDP__BARRIER) { /* a host barrier: the store serves */
            char name[32];
            snprintf(name, sizeof name, "%llu", (unsigned long long)c->seq);
            r = ctx->world_size > 1 ? ddp__store_barrier(ctx, name) : DDP_OK;
        } else if ((r = ddp__cuda(ctx, cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate")) == DDP_OK &&
                   (r = ddp__nccl_run(ctx, c, stream, done, work != NULL)) == DDP_OK && work) {
            work->seq = c->seq;
            work->event = done;
            return DDP_OK;
        }
        if (done) cudaEventDestroy(done);
        if (r != DDP_OK) st->broken = r;
        return r;
    }
#endif
    (void)stream;
    if (ctx->world_size == 1) {
        ddp__solo_run(c);
        if (work) work->seq = c->seq;
        return DDP_OK;
    }
    if (work) { /* CPU async: the worker thread runs it in issue order */
        pthread_mutex_lock(&st->mu);
        if (!st->worker_started) {
            if (pthread_create(&st->worker, NULL, ddp__worker_main, ctx) != 0) {
                pthread_mutex_unlock(&st->mu);
                return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot start the collective thread");
            }
            st->worker_started = 1;
        }
        while (st->queued - st->done >= DDP__QUEUE) pthread_cond_wait(&st->cv, &st->mu);
        st->queue[st->queued % DDP__QUEUE] = *c;
        work->seq = ++st->queued;
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
        return DDP_OK;
    }
    if ((r = ddp__drain(ctx, st->queued)) == DDP_OK) r = ddp__cpu_run(ctx, c);
    if (r != DDP_OK) st->broken = r;
    return r;
}

/* Fills in a collective and issues it. */
static ddp_result ddp__post(ddp_ctx *ctx, int kind, const void *send, void *recv, size_t count, ddp_dtype dtype,
                            ddp_op op, int root, void *stream, ddp_work *work)
{
    ddp__coll c;
    c.kind = kind;
    c.send = send;
    c.recv = recv;
    c.count = count;
    c.dtype = dtype;
    c.op = op;
    c.root = root;
    c.seq = 0;
    return ddp__issue(ctx, &c, stream, work);
}

ddp_result ddp_all_reduce(ddp_ctx *ctx, const void *send, void *recv, size_t count, ddp_dtype dtype,
                          ddp_op op, void *stream)
{
    return ddp__post(ctx, DDP__ALL_REDUCE, send, recv, count, dtype, op, 0, stream, NULL);
}

ddp_result ddp_all_reduce_async(ddp_ctx *ctx, const void *send, void *recv, size_t count,
                                ddp_dtype dtype, ddp_op op, void *stream, ddp_work *work)
{
    if (!work) return ddp__fail(ctx, DDP_ERR_ARG, "all_reduce_async needs a ddp_work to fill");
    return ddp__post(ctx, DDP__ALL_REDUCE, send, recv, count, dtype, op, 0, stream, work);
}

ddp_result ddp_wait(ddp_ctx *ctx, ddp_work *work, void *stream)
{
    ddp_result r = DDP_OK;
    (void)stream;
    if (!ctx || !ctx->st || !work) return DDP_ERR_ARG;
#ifdef DDP_NCCL
    if (work->event) {
        cudaEvent_t ev = (cudaEvent_t)work->event;
        r = ctx->st->broken ? ddp__fail(ctx, DDP_ERR_ABORTED, "wait for all_reduce #%llu refused: the process group "
                                        "failed earlier", (unsigned long long)work->seq)
                            : ddp__nccl_wait_event(ctx, ev, "all_reduce", work->seq);
        if (r == DDP_OK && stream) r = ddp__cuda(ctx, cudaStreamWaitEvent((cudaStream_t)stream, ev, 0), "cudaStreamWaitEvent");
        cudaEventDestroy(ev);
        work->event = NULL;
        if (r != DDP_OK) ctx->st->broken = r;
        return r;
    }
#endif
    if (ctx->backend == DDP_BACKEND_CPU && ctx->world_size > 1) r = ddp__drain(ctx, work->seq);
    if (r != DDP_OK) ctx->st->broken = r;
    return r;
}

ddp_result ddp_broadcast(ddp_ctx *ctx, void *buf, size_t count, ddp_dtype dtype, int root, void *stream)
{
    return ddp__post(ctx, DDP__BROADCAST, buf, buf, count, dtype, DDP_SUM, root, stream, NULL);
}

ddp_result ddp_all_gather(ddp_ctx *ctx, const void *send, void *recv, size_t count, ddp_dtype dtype,
                          void *stream)
{
    /* in a world of one it is a copy, which all_reduce does on every backend */
    int kind = ctx && ctx->world_size == 1 ? DDP__ALL_REDUCE : DDP__ALL_GATHER;
    return ddp__post(ctx, kind, send, recv, count, dtype, DDP_SUM, 0, stream, NULL);
}

ddp_result ddp_reduce_scatter(ddp_ctx *ctx, const void *send, void *recv, size_t count, ddp_dtype dtype,
                              ddp_op op, void *stream)
{
    return ddp__post(ctx, DDP__REDUCE_SCATTER, send, recv, count, dtype, op, 0, stream, NULL);
}

ddp_result ddp_barrier(ddp_ctx *ctx)
{
    return ddp__post(ctx, DDP__BARRIER, NULL, NULL, 0, DDP_F32, DDP_SUM, 0, NULL, NULL);
}

/* ---- process group ------------------------------------------------------------------------------ */

static ddp_result ddp__choose_backend(ddp_ctx *ctx, const ddp_desc *d)
{
    const char *env = getenv("DDP_BACKEND");
    ddp_backend b = d->backend;
    if (!b && env && *env) {
        if (strcmp(env, "cpu") == 0) b = DDP_BACKEND_CPU;
        else if (strcmp(env, "nccl") == 0) b = DDP_BACKEND_NCCL;
        else return ddp__fail(ctx, DDP_ERR_ENV, "DDP_BACKEND='%s' is neither 'cpu' nor 'nccl'", env);
    }
#ifdef DDP_NCCL
    if (!b) {
        int n = 0;
        b = cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? DDP_BACKEND_NCCL : DDP_BACKEND_CPU;
    }
#else
    if (b == DDP_BACKEND_NCCL)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "NCCL was asked for, but ddp.h was built without it "
                                               "(build with nvcc, or -DDDP_NCCL and -lcudart -lnccl)");
    if (!b) b = DDP_BACKEND_CPU;
#endif
    if (b != DDP_BACKEND_CPU && b != DDP_BACKEND_NCCL)
        return ddp__fail(ctx, DDP_ERR_ARG, "unknown backend %d", (int)b);
    ctx->backend = b;
    return DDP_OK;
}

/* Releases whatever init acquired; the state itself stays for ddp_error(). */
static void ddp__release(ddp_ctx *ctx)
{
    struct ddp__state *st = ctx->st;
    if (st->worker_started) {
        pthread_mutex_lock(&st->mu);
        st->worker_stop = 1;
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->worker, NULL);
        st->worker_started = 0;
    }
#ifdef DDP_NCCL
    if (st->comm) {
        if (st->broken) {
            ncclCommAbort(st->comm);
        } else {
            ddp__nccl_settle(ctx, ncclCommFinalize(st->comm), "ncclCommFinalize", 0);
            if (st->comm) ncclCommDestroy(st->comm);
        }
        st->comm = NULL;
    }
    if (st->stream) cudaStreamDestroy(st->stream);
    if (st->ready) cudaEventDestroy(st->ready);
    st->stream = NULL;
    st->ready = NULL;
#endif
    if (st->shm) munmap(st->shm, st->shm_size);
    st->shm = NULL;
    if (st->store_fd >= 0) close(st->store_fd);
    st->store_fd = -1;
    if (st->server) ddp__server_stop(st->server);
    st->server = NULL;
}

ddp_result ddp_init(ddp_ctx *ctx, const ddp_desc *desc)
{
    struct ddp__state *st;
    ddp_desc none;
    const char *debug = getenv("DDP_DEBUG");
    ddp_result r;
    if (!ctx) return DDP_ERR_ARG;
    memset(&none, 0, sizeof none);
    if (!desc) desc = &none;
    memset(ctx, 0, sizeof *ctx);
    ctx->device = -1;
    st = DDP__CAST(struct ddp__state *, DDP_MALLOC(sizeof *st));
    if (!st) return DDP_ERR_NOMEM;
    memset(st, 0, sizeof *st);
    ctx->st = st;
    st->log = desc->log ? desc->log : ddp__default_log;
    st->log_user = desc->log_user;
    st->debug = debug && *debug && strcmp(debug, "0") != 0;
    st->store_fd = -1;
    st->chunk = desc->shm_chunk_bytes;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    if ((r = ddp__topology(ctx, desc)) != DDP_OK || (r = ddp__settings(ctx, desc)) != DDP_OK ||
        (r = ddp__choose_backend(ctx, desc)) != DDP_OK)
        return r;
    if (ctx->world_size > 1) {
        if ((ctx->rank == 0 && (r = ddp__server_start(ctx)) != DDP_OK) ||
            (r = ddp__store_connect(ctx)) != DDP_OK || (r = ddp__meet(ctx)) != DDP_OK ||
            (ctx->backend == DDP_BACKEND_CPU && (r = ddp__shm_open(ctx)) != DDP_OK)) {
            ddp__release(ctx);
            return r;
        }
    }
#ifdef DDP_NCCL
    if (ctx->backend == DDP_BACKEND_NCCL && (r = ddp__nccl_init(ctx)) != DDP_OK) {
        st->broken = r;
        ddp__release(ctx);
        return r;
    }
#endif
    ddp__info(ctx, "backend %s, local rank %d/%d, node %d/%d, device %d, store %s:%d, job '%s', timeout %.1f s",
              ddp_backend_name(ctx->backend), ctx->local_rank, ctx->local_world_size, ctx->node_rank,
              ctx->num_nodes, ctx->device, ctx->world_size > 1 ? st->master_addr : "-", st->master_port,
              st->job_id, st->timeout_ms / 1000.0);
    return DDP_OK;
}

void ddp_destroy(ddp_ctx *ctx)
{
    struct ddp__state *st;
    if (!ctx || !ctx->st) return;
    st = ctx->st;
    if (ddp__drain(ctx, st->queued) != DDP_OK && !st->broken) st->broken = DDP_ERR_ABORTED;
    /* rank 0 serves the store: nobody leaves until everyone is done with it */
    if (st->store_fd >= 0 && !st->broken && ddp__store_barrier(ctx, "destroy") != DDP_OK)
        st->broken = DDP_ERR_ABORTED;
    ddp__release(ctx);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    DDP_FREE(st);
    ctx->st = NULL;
}

/* ---- launcher ------------------------------------------------------------------------------------ */

static int ddp__free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void ddp__signal_all(const pid_t *pids, int n, int sig)
{
    int i;
    for (i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], sig);
}

int ddp_run(int nproc, char *const argv[])
{
    sigset_t block, old;
    pid_t *pids;
    char port[16], job[32], num[16];
    int i, live = 0, failed = -1, status = 0, p;
    int64_t kill_at = 0;
    unsigned seed;
    if (nproc < 1 || !argv || !argv[0]) {
        fprintf(stderr, "ddp: nothing to run (nproc %d)\n", nproc);
        return 2;
    }
    if ((p = ddp__free_port()) < 0) {
        fprintf(stderr, "ddp: cannot find a free TCP port on 127.0.0.1: %s\n", strerror(errno));
        return 1;
    }
    pids = DDP__CAST(pid_t *, DDP_MALLOC(sizeof *pids * (size_t)nproc));
    if (!pids) return 1;
    seed = (unsigned)getpid() ^ (unsigned)ddp__now_ms() ^ (unsigned)p << 16;
    snprintf(port, sizeof port, "%d", p);
    snprintf(job, sizeof job, "run-%08x", seed * 2654435761u);
    snprintf(num, sizeof num, "%d", nproc);
    /* signals arrive through sigtimedwait below, never asynchronously */
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old);
    fflush(NULL);
    for (i = 0; i < nproc; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            char r[16];
            snprintf(r, sizeof r, "%d", i);
            setenv("RANK", r, 1);
            setenv("LOCAL_RANK", r, 1);
            setenv("WORLD_SIZE", num, 1);
            setenv("LOCAL_WORLD_SIZE", num, 1);
            setenv("GROUP_RANK", "0", 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", port, 1);
            setenv("DDP_JOB_ID", job, 1);
            unsetenv("TORCHELASTIC_RUN_ID");
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* no orphans if the launcher is killed */
            sigprocmask(SIG_SETMASK, &old, NULL);
            execvp(argv[0], argv);
            fprintf(stderr, "ddp: cannot run '%s': %s\n", argv[0], strerror(errno));
            _exit(127);
        }
        if (pid < 0) {
            fprintf(stderr, "ddp: fork failed for rank %d: %s\n", i, strerror(errno));
            failed = i;
            status = 1;
            kill_at = ddp__now_ms();
            ddp__signal_all(pids, i, SIGTERM);
            nproc = i;
            break;
        }
        pids[i] = pid;
        live++;
    }
    while (live > 0) {
        siginfo_t info;
        struct timespec ts;
        int sig, st;
        pid_t pid;
        ts.tv_sec = 0;
        ts.tv_nsec = 200 * 1000000L;
        sig = sigtimedwait(&block, &info, &ts);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            /* a terminal's Ctrl-C already reached the whole process group */
            if (info.si_code != SI_KERNEL) ddp__signal_all(pids, nproc, sig);
            if (!kill_at) kill_at = ddp__now_ms() + 3000;
        }
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            for (i = 0; i < nproc && pids[i] != pid; i++) {}
            if (i == nproc) continue;
            pids[i] = 0;
            live--;
            if (code != 0 && failed < 0) {
                failed = i;
                status = code;
                if (WIFEXITED(st))
                    fprintf(stderr, "ddp: rank %d (pid %d) exited with status %d", i, (int)pid, code);
                else
                    fprintf(stderr, "ddp: rank %d (pid %d) was killed by signal %d (%s)", i, (int)pid,
                            WTERMSIG(st), strsignal(WTERMSIG(st)));
                fprintf(stderr, live ? "; stopping the other %d\n" : "\n", live);
                ddp__signal_all(pids, nproc, SIGTERM);
                kill_at = ddp__now_ms() + 3000; /* then SIGKILL: the job ends within seconds */
            }
        }
        if (kill_at && ddp__now_ms() >= kill_at) {
            ddp__signal_all(pids, nproc, SIGKILL);
            kill_at = INT64_MAX;
        }
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    DDP_FREE(pids);
    return status;
}

int ddp_launch(int *argc, char **argv)
{
    int i, n;
    char *end;
    long v;
    if (!argc || !argv) return DDP_WORKER;
    for (i = 1; i < *argc; i++) {
        const char *a = argv[i], *val;
        if (strcmp(a, "--") == 0) break;
        if (strncmp(a, "--nproc", 7) != 0 || (a[7] != 0 && a[7] != '=')) continue;
        n = a[7] == '=' ? 1 : 2;
        val = a[7] == '=' ? a + 8 : i + 1 < *argc ? argv[i + 1] : "";
        errno = 0;
        v = strtol(val, &end, 10);
        if (errno || *end || !*val || v < 1 || v > 4096) {
            fprintf(stderr, "ddp: --nproc needs a process count from 1 to 4096, not '%s'\n", val);
            return 2;
        }
        memmove(&argv[i], &argv[i + n], sizeof *argv * (size_t)(*argc - i - n + 1));
        *argc -= n;
        return ddp_run((int)v, argv);
    }
    return DDP_WORKER;
}

/* ---- sampler ------------------------------------------------------------------------ */
/* MT19937, seeded like torch.Generator.manual_seed (init_genrand on the low 32 bits). */
typedef struct ddp__mt {
    uint32_t s[624];
    int i;
} ddp__mt;

static void ddp__mt_seed(ddp__mt *m, uint64_t seed)
{
    int i;
    m->s[0] = (uint32_t)seed;
    for (i = 1; i < 624; i++)
        m->s[i] = 1812433253u * (m->s[i - 1] ^ (m->s[i - 1] >> 30)) + (uint32_t)i;
    m->i = 624;
}

static uint32_t ddp__mt_next(ddp__mt *m)
{
    uint32_t y;
    if (m->i >= 624) {
        int k;
        for (k = 0; k < 624; k++) {
            y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
            m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        m->i = 0;
    }
    y = m->s[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* torch.randperm(n, generator) on the CPU: a Fisher-Yates walk from the front, with
   32-bit draws below UINT32_MAX / 20 elements and 64-bit draws (high word first) above. */
static void ddp__randperm(size_t *perm, size_t n, uint64_t seed)
{
    ddp__mt mt;
    size_t i;
    ddp__mt_seed(&mt, seed);
    for (i = 0; i < n; i++) perm[i] = i;
    for (i = 0; i + 1 < n; i++) {
        uint64_t r = ddp__mt_next(&mt);
        size_t z, t;
        if ((uint64_t)n >= 0xffffffffu / 20) r = (r << 32) | ddp__mt_next(&mt);
        z = (size_t)(r % (uint64_t)(n - i));
        t = perm[i];
        perm[i] = perm[i + z];
        perm[i + z] = t;
    }
}

ddp_result ddp_sampler_init(ddp_sampler *s, const ddp_ctx *ctx, const ddp_sampler_desc *desc)
{
    size_t n, w;
    if (!s) return DDP_ERR_ARG;
    memset(s, 0, sizeof *s);
    if (!desc) return DDP_ERR_ARG;
    if (desc->world_size > 0) {
        s->world_size = desc->world_size;
        s->rank = desc->rank;
    } else if (ctx) {
        s->world_size = ctx->world_size;
        s->rank = ctx->rank;
    } else {
        s->world_size = 1;
    }
    if (s->world_size < 1 || s->rank < 0 || s->rank >= s->world_size) return DDP_ERR_ARG;
    n = s->dataset_size = desc->dataset_size;
    w = (size_t)s->world_size;
    s->shuffle = !desc->no_shuffle;
    s->drop_last = desc->drop_last != 0;
    s->drop_last_batch = desc->drop_last_batch != 0;
    s->seed = desc->seed;
    s->num_samples = (s->drop_last && n % w) ? n / w : (n + w - 1) / w;
    s->total_size = s->num_samples * w;
    /* position r + k w is real while it is below n: padding is a suffix per rank */
    if (n > (size_t)s->rank) {
        s->num_real = (n - (size_t)s->rank + w - 1) / w;
        if (s->num_real > s->num_samples) s->num_real = s->num_samples;
    }
    s->batch_size = desc->batch_size ? desc->batch_size : 1;
    s->num_batches = s->drop_last_batch ? s->num_samples / s->batch_size
                                        : (s->num_samples + s->batch_size - 1) / s->batch_size;
    s->indices = (size_t *)DDP_MALLOC((s->num_samples ? s->num_samples : 1) * sizeof(size_t));
    if (s->shuffle) s->perm_ = (size_t *)DDP_MALLOC((n ? n : 1) * sizeof(size_t));
    if (!s->indices || (s->shuffle && !s->perm_)) {
        ddp_sampler_destroy(s);
        return DDP_ERR_NOMEM;
    }
    return DDP_OK;
}

void ddp_sampler_destroy(ddp_sampler *s)
{
    if (!s) return;
    if (s->indices) DDP_FREE(s->indices);
    if (s->perm_) DDP_FREE(s->perm_);
    memset(s, 0, sizeof *s);
}

const size_t *ddp_sampler_epoch(ddp_sampler *s, uint64_t epoch)
{
    size_t k, n, w;
    if (!s || !s->indices) return NULL;
    if (s->has_epoch && s->epoch == epoch) return s->indices;
    n = s->dataset_size;
    w = (size_t)s->world_size;
    if (s->shuffle) ddp__randperm(s->perm_, n, s->seed + epoch);
    for (k = 0; k < s->num_samples; k++) {
        size_t p = ((size_t)s->rank + k * w) % n; /* past n: padding repeats the list */
        s->indices[k] = s->shuffle ? s->perm_[p] : p;
    }
    s->epoch = epoch;
    s->has_epoch = 1;
    return s->indices;
}

ddp_batch ddp_sampler_batch(ddp_sampler *s, uint64_t epoch, size_t b)
{
    ddp_batch bt;
    size_t first, w, start, covered;
    memset(&bt, 0, sizeof bt);
    if (!s || b >= s->num_batches || !ddp_sampler_epoch(s, epoch)) return bt;
    w = (size_t)s->world_size;
    first = b * s->batch_size;
    bt.indices = s->indices + first;
    bt.count = s->num_samples - first < s->batch_size ? s->num_samples - first : s->batch_size;
    if (s->num_real > first)
        bt.num_real = s->num_real - first < bt.count ? s->num_real - first : bt.count;
    /* over all ranks, this batch covers positions [first w, (first + count) w) */
    start = first * w;
    covered = bt.count * w;
    if (s->dataset_size > start)
        bt.global_count = s->dataset_size - start < covered ? s->dataset_size - start : covered;
    return bt;
}

/* ---- metrics ------------------------------------------------------------------------ */
void ddp_metric_add(ddp_metric *m, double value, double weight)
{
    if (!m || weight == 0) return;
    if (m->count == 0) {
        m->min = m->max = value;
    } else {
        if (value < m->min) m->min = value;
        if (value > m->max) m->max = value;
    }
    m->sum += value * weight;
    m->count += weight;
}

void ddp_metric_merge(ddp_metric *into, const ddp_metric *from, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        ddp_metric *a = &into[i];
        const ddp_metric *b = &from[i];
        if (b->count != 0) {
            if (a->count == 0) {
                a->min = b->min;
                a->max = b->max;
            } else {
                if (b->min < a->min) a->min = b->min;
                if (b->max > a->max) a->max = b->max;
            }
        }
        a->sum += b->sum;
        a->count += b->count;
    }
}

ddp_result ddp_metric_reduce(ddp_ctx *ctx, ddp_metric *m, size_t n)
{
    /* all_gather rather than all_reduce: sums, mins and maxes in one collective, and
       every rank adds the ranks up in the same order */
    size_t per = n * sizeof(ddp_metric) / sizeof(double), w, r;
    double *all;
    ddp_result res;
    if (!ctx || (!m && n)) return DDP_ERR_ARG;
    if (n == 0) return DDP_OK;
    w = (size_t)ctx->world_size;
    all = (double *)DDP_MALLOC((w + 1) * per * sizeof(double));
    if (!all) return DDP_ERR_NOMEM;
    memcpy(all + w * per, m, n * sizeof(ddp_metric));
#ifdef DDP_NCCL
    if (ctx->backend == DDP_BACKEND_NCCL) { /* NCCL wants device memory: stage it */
        double *dev = NULL;
        res = DDP_ERR_BACKEND;
        if (cudaMalloc((void **)&dev, (w + 1) * per * sizeof(double)) == cudaSuccess) {
            res = DDP_OK;
            if (cudaMemcpy(dev + w * per, m, n * sizeof(ddp_metric), cudaMemcpyHostToDevice) != cudaSuccess)
                res = DDP_ERR_BACKEND;
            if (res == DDP_OK) res = ddp_all_gather(ctx, dev + w * per, dev, per, DDP_F64, NULL);
            if (res == DDP_OK && cudaMemcpy(all, dev, w * per * sizeof(double), cudaMemcpyDeviceToHost) != cudaSuccess)
                res = DDP_ERR_BACKEND;
            cudaFree(dev);
        }
    } else
#endif
    res = ddp_all_gather(ctx, all + w * per, all, per, DDP_F64, NULL);
    if (res == DDP_OK) {
        memset(m, 0, n * sizeof(ddp_metric));
        for (r = 0; r < w; r++) ddp_metric_merge(m, (const ddp_metric *)(all + r * per), n);
    }
    DDP_FREE(all);
    return res;
}

double ddp_metric_mean(const ddp_metric *m)
{
    return m && m->count != 0 ? m->sum / m->count : 0.0;
}

double ddp_metric_percent(const ddp_metric *m)
{
    return 100.0 * ddp_metric_mean(m);
}

/* ---- gradient synchronisation ---------------------------------------------------- */
#define DDP__GRAD_IN_FLIGHT 16

typedef struct ddp__grad_bucket {
    size_t begin, count, pending; /* pending: elements not yet marked this step */
    ddp_work work;
} ddp__grad_bucket;

struct ddp__grad_state {
    ddp__grad_bucket *buckets;
    size_t launched, waited;   /* buckets started / finished this step, from the last one down */
    size_t marked;             /* elements marked this step */
    size_t *regions;           /* (offset, count) pairs marked this step */
    size_t num_regions, cap_regions;
};

static void ddp__grad_reset(ddp_grad *g)
{
    size_t i;
    for (i = 0; i < g->num_buckets; i++) g->st->buckets[i].pending = g->st->buckets[i].count;
    g->st->launched = g->st->waited = g->st->marked = g->st->num_regions = 0;
}

ddp_result ddp_grad_init(ddp_grad *g, ddp_ctx *ctx, const ddp_grad_desc *desc)
{
    size_t bytes, i;
    ddp_result r;
    if (!g) return DDP_ERR_ARG;
    memset(g, 0, sizeof *g);
    if (!ctx || !ctx->st) return DDP_ERR_ARG;
    if (!desc || (desc->count && !desc->grads) || (unsigned)desc->dtype >= DDP_DTYPE_COUNT)
        return ddp__fail(ctx, DDP_ERR_ARG, "ddp_grad_init: needs a desc with grads, count and a valid dtype");
    g->ctx = ctx;
    g->grads = desc->grads;
    g->count = desc->count;
    g->dtype = desc->dtype;
    g->stream = desc->stream;
    g->sum = desc->sum != 0;
    bytes = desc->bucket_bytes ? desc->bucket_bytes : (size_t)25 << 20;
    g->bucket_count = bytes / ddp_dtype_size(g->dtype);
    if (g->bucket_count == 0) g->bucket_count = 1;
    g->num_buckets = (g->count + g->bucket_count - 1) / g->bucket_count;
    g->st = (struct ddp__grad_state *)DDP_MALLOC(sizeof *g->st);
    if (!g->st) return DDP_ERR_NOMEM;
    memset(g->st, 0, sizeof *g->st);
    g->st->buckets = (ddp__grad_bucket *)DDP_MALLOC((g->num_buckets ? g->num_buckets : 1) * sizeof(ddp__grad_bucket));
    if (!g->st->buckets) {
        ddp_grad_destroy(g);
        return DDP_ERR_NOMEM;
    }
    for (i = 0; i < g->num_buckets; i++) {
        ddp__grad_bucket *b = &g->st->buckets[i];
        memset(b, 0, sizeof *b);
        b->begin = i * g->bucket_count;
        b->count = g->count - b->begin < g->bucket_count ? g->count - b->begin : g->bucket_count;
    }
    ddp__grad_reset(g);
    if (desc->params) {
        r = ddp_broadcast(ctx, desc->params, desc->param_count ? desc->param_count : desc->count,
                          desc->param_dtype, 0, g->stream);
        if (r != DDP_OK) {
            ddp_grad_destroy(g);
            return r;
        }
    }
    return DDP_OK;
}

/* Waits for the buckets started this step until at most `keep` are in flight,
   oldest first. */
static ddp_result ddp__grad_wait(ddp_grad *g, size_t keep)
{
    struct ddp__grad_state *st = g->st;
    ddp_result first = DDP_OK;
    while (st->launched - st->waited > keep) {
        ddp_result r = ddp_wait(g->ctx, &st->buckets[g->num_buckets - 1 - st->waited].work, g->stream);
        if (r != DDP_OK && first == DDP_OK) first = r;
        st->waited++;
    }
    return first;
}

void ddp_grad_destroy(ddp_grad *g)
{
    if (!g) return;
    if (g->st) {
        if (g->st->buckets) (void)ddp__grad_wait(g, 0);
        if (g->st->buckets) DDP_FREE(g->st->buckets);
        if (g->st->regions) DDP_FREE(g->st->regions);
        DDP_FREE(g->st);
    }
    memset(g, 0, sizeof *g);
}

/* Starts every complete bucket whose turn it is: the same order on every rank. */
static ddp_result ddp__grad_launch(ddp_grad *g)
{
    size_t esize = ddp_dtype_size(g->dtype);
    while (g->st->launched < g->num_buckets) {
        ddp__grad_bucket *b = &g->st->buckets[g->num_buckets - 1 - g->st->launched];
        void *p = (char *)g->grads + b->begin * esize;
        ddp_result r;
        if (b->pending) break;
        /* bounded: the backends queue a limited number of async collectives */
        r = ddp__grad_wait(g, DDP__GRAD_IN_FLIGHT - 1);
        if (r != DDP_OK) return r;
        r = ddp_all_reduce_async(g->ctx, p, p, b->count, g->dtype, g->sum ? DDP_SUM : DDP_AVG,
                                 g->stream, &b->work);
        if (r != DDP_OK) return r;
        g->st->launched++;
    }
    return DDP_OK;
}

ddp_result ddp_grad_ready(ddp_grad *g, size_t offset, size_t count)
{
    struct ddp__grad_state *st;
    size_t i, end = offset + count;
    if (!g || !g->st) return DDP_ERR_ARG;
    st = g->st;
    if (count == 0) return DDP_OK;
    if (end < offset || end > g->count)
        return ddp__fail(g->ctx, DDP_ERR_ARG,
                              "ddp_grad_ready: region [%zu, %zu) is outside the gradient buffer of %zu elements",
                              offset, end, g->count);
    for (i = 0; i < st->num_regions; i++) {
        size_t o = st->regions[2 * i], e = o + st->regions[2 * i + 1];
        if (offset < e && o < end)
            return ddp__fail(g->ctx, DDP_ERR_ARG,
                                  "ddp_grad_ready: region [%zu, %zu) overlaps [%zu, %zu), already marked this step",
                                  offset, end, o, e);
    }
    if (st->num_regions == st->cap_regions) {
        size_t cap = st->cap_regions ? 2 * st->cap_regions : 64;
        size_t *nr = (size_t *)DDP_MALLOC(2 * cap * sizeof(size_t));
        if (!nr) return DDP_ERR_NOMEM;
        if (st->regions) {
            memcpy(nr, st->regions, 2 * st->num_regions * sizeof(size_t));
            DDP_FREE(st->regions);
        }
        st->regions = nr;
        st->cap_regions = cap;
    }
    st->regions[2 * st->num_regions] = offset;
    st->regions[2 * st->num_regions + 1] = count;
    st->num_regions++;
    st->marked += count;
    if (g->no_sync) return DDP_OK;
    for (i = offset / g->bucket_count; i < g->num_buckets && st->buckets[i].begin < end; i++) {
        ddp__grad_bucket *b = &st->buckets[i];
        size_t lo = b->begin > offset ? b->begin : offset;
        size_t hi = b->begin + b->count < end ? b->begin + b->count : end;
        b->pending -= hi - lo;
    }
    return ddp__grad_launch(g);
}

static int ddp__grad_region_cmp(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* The first element not covered by any region marked this step (count if none). */
static size_t ddp__grad_first_gap(ddp_grad *g, size_t *gap_end)
{
    struct ddp__grad_state *st = g->st;
    size_t i, pos = 0;
    qsort(st->regions, st->num_regions, 2 * sizeof(size_t), ddp__grad_region_cmp);
    for (i = 0; i < st->num_regions && st->regions[2 * i] == pos; i++) pos += st->regions[2 * i + 1];
    *gap_end = i < st->num_regions ? st->regions[2 * i] : g->count;
    return pos;
}

ddp_result ddp_grad_finish(ddp_grad *g)
{
    ddp_result r;
    if (!g || !g->st) return DDP_ERR_ARG;
    if (g->no_sync) {
        ddp__grad_reset(g);
        return DDP_OK;
    }
    if (g->st->marked != g->count) {
        size_t end, gap = ddp__grad_first_gap(g, &end);
        (void)ddp__grad_wait(g, 0);
        ddp__grad_reset(g);
        return ddp__fail(g->ctx, DDP_ERR_ARG,
                              "ddp_grad_finish: %zu of %zu gradient elements were never marked ready, "
                              "the first at [%zu, %zu)",
                              g->count - g->st->marked, g->count, gap, end);
    }
    r = ddp__grad_launch(g);
    if (r == DDP_OK) r = ddp__grad_wait(g, 0);
    else (void)ddp__grad_wait(g, 0);
    ddp__grad_reset(g);
    return r;
}

ddp_result ddp_grad_all_reduce(ddp_grad *g)
{
    ddp_result r = DDP_OK;
    if (!g || !g->st) return DDP_ERR_ARG;
    while (r == DDP_OK && g->st->marked < g->count) {
        size_t end, gap = ddp__grad_first_gap(g, &end);
        r = ddp_grad_ready(g, gap, end - gap);
    }
    return r == DDP_OK ? ddp_grad_finish(g) : r;
}

ddp_result ddp_grad_no_sync(ddp_grad *g, int on)
{
    if (!g || !g->st) return DDP_ERR_ARG;
    if (g->st->num_regions)
        return ddp__fail(g->ctx, DDP_ERR_ARG, "ddp_grad_no_sync: called in the middle of a step");
    g->no_sync = on != 0;
    return DDP_OK;
}
#endif /* DDP__IMPLEMENTATION_DONE */
#endif /* DDP_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the ddp.h authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this
software and associated documentation files (the "Software"), to deal in the Software
without restriction, including without limitation the rights to use, copy, modify,
merge, publish, distribute, sublicense, and/or sell copies of the Software, and to
permit persons to whom the Software is furnished to do so, subject to the following
conditions:

The above copyright notice and this permission notice shall be included in all copies
or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A
PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT
HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF
CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE
OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
