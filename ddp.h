/* ddp.h - v0.2 - PyTorch-style DistributedDataParallel for C and CUDA programs

   One header. Process group, launcher, rendezvous, collectives on NCCL (GPUs), a
   built-in shared-memory CPU backend (one host) or MPI (CPUs across hosts),
   distributed sampler, gradient sync, averaged metrics, rank-0 helpers, tracing.
   The same program runs as 4 CPU processes on a laptop and as 8 GPU processes on a
   server.

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
     DDP_MPI       compile the MPI backend (build with mpicc): CPU jobs across hosts
     DDP_MALLOC/DDP_FREE  replace malloc/free (define both or neither)

   EXAMPLE (each rank adds rank+1; every rank ends with the sum)
     #define DDP_IMPLEMENTATION
     #include "ddp.h"
     int main(int argc, char **argv) {
         int status = ddp_launch(&argc, argv);    // "./prog --nproc 4" starts 4 ranks
         if (status != DDP_WORKER) return status; // the launcher: job finished
         ddp_ctx ctx;
         ddp_desc desc = {0};                     // zero means default (C++: = {})
         desc.argc = &argc;                       // lets init take --local_rank N
         desc.argv = argv;
         if (ddp_init(&ctx, &desc) != DDP_OK) return 1; // the reason went to stderr
         float x = (float)(ctx.rank + 1);
         if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
         ddp_print(&ctx, "sum %g over %d ranks\n", x, ctx.world_size); // rank 0 only
         return ddp_destroy(&ctx) == DDP_OK ? 0 : 1; // a rank missing at the end fails too
     }

   LAUNCHING (any of these; the program reads whichever environment it finds)
     ./prog --nproc 4 args                    built-in launcher (ddp_launch; also
                                              --nproc_per_node=4); a job's own secret
     ./prog --nproc 4 --max-restarts 3 args   and the job again after a failure (RESTARTS)
     ddprun -n 4 ./prog args                  examples/ddprun.c, for any program
     torchrun --no_python --nproc_per_node=4 ./prog args   (RANK, WORLD_SIZE, ...)
     mpirun -np 4 ./prog                      one host: MASTER_ADDR defaults to 127.0.0.1
     srun -n 4 ./prog                         MASTER_ADDR: the step's first host
     mpiexec -n 4 ./prog                      MPICH's (Hydra): MASTER_ADDR is rank 0's host
     mpirun -np 8 --host a:4,b:4 ./prog       CPU across hosts: build with mpicc -DDDP_MPI
     srun -N 2 -n 8 --mpi=pmix ./prog         (the same under Slurm)
   Without MASTER_PORT the port comes from the launch's own id (torchrun's run id,
   Slurm's job and step, Open MPI's namespace, Hydra's kvsname asked for over PMI_FD),
   so two jobs on a host never meet; without any id (ranks started by hand) it is
   29500, and a second launch on the port stops the job (see TWO LAUNCHES).
   --nproc inside a launched job of more than one task is refused (srun --pty bash
   is a shell to launch from). The built-in launcher reports the first rank that
   failed on its own (not those that failed because it was gone), with its status,
   and gives the others 2 s to end and say why before SIGTERM.

   ENVIRONMENT
     RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT
                    torchrun's names; read first (the innermost launcher's count)
     OMPI_COMM_WORLD_RANK _SIZE _LOCAL_RANK _LOCAL_SIZE           Open MPI
     PMI_RANK PMI_SIZE MPI_LOCALRANKID PMI_FD                     MPICH / Hydra (the
                            kvsname over PMI_FD, PMI-1; finalized in ddp_destroy
                            unless the program started MPI; across hosts without
                            MASTER_ADDR rank 0's host through Hydra's key-value space)
     SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NODEID      Slurm, in a step (and
                            SLURM_STEP_TASKS_PER_NODE for the ranks on each host);
                            mpirun / mpiexec inside an allocation go by their own
     DDP_BACKEND=cpu|nccl|mpi  force a backend (default: nccl if a GPU is visible;
                            mpi if built with -DDDP_MPI and an MPI launch spans hosts)
     CUDA_VISIBLE_DEVICES   NCCL: a rank that sees one GPU drives it (Slurm's per-task
                            binding), one that sees several drives GPU LOCAL_RANK; two
                            ranks on one GPU are an error naming both
     DDP_TIMEOUT=seconds    how long any wait may take (default 300, at least 0.001);
                            a CPU or MPI collective's wait leaves out time the job spent
                            stopped as a whole (Ctrl-Z, SIGSTOP)
     DDP_JOB_ID             this launch's id (default: the launcher's); the store
                            refuses ranks of other jobs; a process of this job that
                            cannot be one of its ranks stops it
     DDP_SECRET             peers of the store prove they know it (HMAC-SHA256
                            challenge both ways; it never crosses the wire). The
                            built-in launcher makes a random one per job.
     DDP_SHM_CHUNK=bytes    per-rank staging size of the CPU backend, and of the MPI
                            backend inside each host (default 1 MiB; the MPI
                            backend's chain 512 KiB)
     DDP_MPI_ALLREDUCE=chain|exchange  the MPI backend's all-reduce (default: the chain
                            when every host's ranks are consecutive, else the exchange)
     DDP_CHECK=1            compare every collective's arguments across ranks through
                            the store too (the CPU backend always compares, in shared
                            memory; this is how NCCL jobs get the check)
     DDP_DEBUG=1            log what init decided, on every rank (these two: 1, true,
                            yes, on; 0, false, no, off; another word is refused)
     OMP_NUM_THREADS        the built-in launcher and ddprun give each rank its share
                            of the cores (cores / ranks, at least 1) unless this holds
                            a count; an empty value counts as unset, a malformed one
                            is ignored with a warning, and more than 64 a core (and
                            256) stops the launcher and ddp_init (OpenMP would crash)
     TORCHELASTIC_RESTART_COUNT  the attempt of a restarted job (0 first), set by
                            torchrun and --max-restarts; ddp_restart_count() reads it

   RESTARTS
     With --max-restarts N (ddp_run_restarts) the launcher stops the job when a rank
     fails and starts all of it again, up to N times, one stderr line each (the cause,
     the attempt that starts). Every attempt is a new job (job id, secret, port: a
     process of an earlier attempt is refused) and starts once the one before has
     ended entirely and its shared memory is swept. A signal to the launcher is never
     restarted; after N + 1 failures the status is the last attempt's cause's. The
     program resumes from its own checkpoint (train_gpt --resume auto). Across hosts
     the outer launcher restarts (torchrun --max-restarts, Slurm's requeue), every
     host the same attempt; under torchrun the count can differ between hosts, so it
     is information, not identity: decide what to load from the files.

   RANKS MUST AGREE
     Every collective carries a fingerprint (number, kind, dtype, op, count, root).
     Ranks whose fingerprints differ get DDP_ERR_MISMATCH naming both sides
     ("all_reduce #12: rank 0 passes 100 x f32 sum, rank 1 passes 1000 x f32 sum"),
     never a result. Init compares the settings that must match (ddp.h version,
     backend, shm chunk, DDP_CHECK); ddp_grad_init compares the bucket layout. A rank
     that calls ddp_destroy while others wait in a collective is named at once. The
     program's own settings are its to name: ddp_agree_on(ctx, "--lr", text) ("ranks
     disagree on --lr: rank 1 has 0.002, rank 0 has 0.001"). A call refused on one rank
     (a NULL buffer) still takes its number: the next call is a mismatch, not a shifted sum.
     A helper refused on one rank (ddp_metric_reduce, ddp_agree_on, ddp_grad_init,
     ddp_sampler_init) still meets the others in its collective: they get DDP_ERR_PEER
     naming that rank, and the group goes on. Counts past an address space (2^56 bytes)
     are refused.
     One context, one caller at a time: the collectives of a context pair up by their
     order, so calls from two threads (which interleave differently on each rank) pair
     wrongly when they have one shape, as in NCCL; two calls at once are refused and stop
     the group. Threads that share a context order their calls themselves, alike on every
     rank. A destroy (ddp_destroy, ddp_grad_destroy) while another thread is in a call
     stops the group and frees once that call returns; a call that starts as another
     thread destroys its object is refused, as one on a destroyed object. On GPUs a call
     selects the rank's GPU (ctx.device) for its thread. A child of fork() cannot use its
     parent's context (refused; its ddp_destroy frees only its copy).

   TWO LAUNCHES (ranks started by hand, no DDP_JOB_ID, one port)
     A rank cannot tell which launch it belongs to. The signs of a second: a second
     rank 0 finds the port taken (and tells the store there), a second claim to a rank,
     a rank with another world size; each stops the job that holds the store, and a job
     without an id waits 0.3 s after its ranks meet before ddp_init returns, so two
     launches started together fail in ddp_init. A sign later stops the job at rank 0's
     next collective. Not told apart: a rank of one launch that joins the other's job
     and ends with it before any other process of either launch reaches the port.

   DOES NOT
     - tell two launches without an id apart in every order (see TWO LAUNCHES): give
       each a DDP_JOB_ID or MASTER_PORT, or use a launcher
     - run the CPU backend across hosts (one host; NCCL and the MPI backend span hosts)
     - abort an MPI collective on one rank: a timed-out rank returns the error and
       the MPI launcher ends the job when it exits; the others of an MPI job learn
       that one rank's context broke on its own (a refused call, an unmarked gradient)
       when that rank exits, or at their DDP_TIMEOUT
     - start MPI twice in one process: on the MPI backend, ddp_init after a
       ddp_destroy that finalized MPI is refused (DDP_ERR_BACKEND)
     - compare NCCL collectives unless asked (DDP_CHECK=1: one store round trip each)
     - compare the sampler's epoch across ranks (a local call: see the sampler)
     - encrypt anything: the secret authenticates who joins the store; the data of
       the collectives and NCCL's own traffic are not protected from the network
     - host the store inside torchrun's agent: under torchrun, rank 0 opens its own
       store on MASTER_PORT+1
     - restart one rank alone (elastic membership): a restart is the whole job, on
       one host by its launcher, across hosts by the outer one
     - hide failures: every call returns a ddp_result; after a failure the context
       refuses further collectives (the job is broken, like NCCL's)
     - call exit() or print anything but errors unless asked (DDP_DEBUG, ddp_print);
       the one exception: an MPI group that does not form within the timeout (a rank
       stuck before its ddp_init holds the others in MPI_Init, which nothing
       interrupts) ends the process with _exit(1) after its one-line error

   VERSION HISTORY
     0.3 (unreleased) two launches on one port stop rather than merge; Hydra's
                      kvsname as the job id; rank 0 names who never joined and why
                      the store refused; a non-ddp answer on MASTER_PORT is one line;
                      the launcher names the first cause and lets ranks say why;
                      the MPI backend names late ranks; one arena per host however
                      a launcher splits it; arenas locked before they have a name;
                      the launcher's OpenMP note once per job, an empty or malformed
                      OMP_NUM_THREADS counts as unset; #error off Linux; the MPI
                      backend's all-reduce a chain of hosts in rank order (shared
                      memory inside each host; DDP_MPI_ALLREDUCE); ddp_agree_on;
                      mpirun / mpiexec inside a Slurm allocation go by their own
                      variables, Slurm's only in a step (the batch script says to
                      use srun), SLURM_STEP_TASKS_PER_NODE (MPI under srun --mpi=pmix);
                      under mpiexec across hosts rank 0's host comes from Hydra's PMI;
                      torchrun's workers inside mpirun or srun never call MPI_Init;
                      rank 0's timeout names a store on loopback in a job of hosts;
                      launchers' local ranks and local worlds checked across ranks,
                      an empty RANK= unset, torchrun's one node inside mpirun/srun of
                      several tasks refused; ddp_desc.local_rank rank % local world;
                      counts past memory, partly overlapping buffers, waits on handles
                      never filled and ddp_desc.shm_chunk_bytes out of range refused;
                      integer sums wrap, a NaN wins MIN/MAX on any rank; a rank that
                      finishes a step with unmarked gradients stops the group;
                      ddp_error names a destroyed context; on GPUs a collective selects
                      the rank's GPU for its thread; --nproc at most 256; DDP_CHECK and
                      DDP_DEBUG take on/off words and refuse others; job ids and
                      MASTER_ADDR too long refused; closed stdin/stdout/stderr become
                      /dev/null; ulimit -f and a loopback interface that is down named;
                      ddp_init again at once after ddp_destroy; the launcher fails a
                      job whose ranks all exit 0 when one was missing from ddp_destroy;
                      a rank that dies leaving a forked child is noticed at once;
                      ddp_destroy returns the job's verdict; a rank stuck for good ends
                      the job under every launcher (a failed MPI job is left
                      unfinalized, Hydra's PMI too; the launcher stops the job when a
                      rank timed out and exited 0); NCCL's remote error is another
                      rank's failure; the log callback runs one call at a time;
                      the launcher names the rank a timeout waited for; MPI_Init
                      bounded by the timeout; ddp_destroy's verdict again from a
                      second call; a rank that dies inside a CPU barrier named; an
                      echoed request is no store's answer, a connection that meets
                      itself is retried; OMP_NUM_THREADS past 64 a core refused;
                      DDP_CHECK on the MPI backend; MPI started twice refused; an
                      averaging gradient sync's step count in its fingerprint; a job
                      stopped and continued as a whole goes on; a context never
                      initialised said; the launcher hears what broke each group,
                      and for whom a timeout waited; a ddp_grad whose context was
                      destroyed (or set up again), never set up or NULL said; ddp_wait
                      in a child of fork() refused; one call at a time per ddp_grad;
                      params given on one rank only refused; a rank's ddp_destroy in
                      the others' collective is its own failure; failures without a
                      context said on stderr; ddp_log's long lines still end;
                      a ddp_trace_save meeting another rank's ddp_trace_start named;
                      the launcher says a rank was killed before it called ddp_init;
                      ddp_init twice (on a live ddp_ctx, or for a rank held) refused;
                      ddp_trace_save says when events were dropped; ddp_grad_init on
                      a live ddp_grad refused; the launcher warns when no rank
                      called ddp_destroy; ddp_sampler_init on a live ddp_sampler
                      refused; ddp_metric_reduce of reduced metrics refused (a
                      ddp_metric holds `reduced`); a call on a destroyed ddp_grad
                      named in ddp_error; a launcher killed by SIGKILL leaves a
                      watchdog that ends what the ranks started; ddp_destroy and
                      ddp_grad_destroy while another thread is in a call stop the
                      group and free once it returns; the launcher names a rank run
                      by a wrapper or that closed its descriptors; a connect()
                      interrupted by a signal waited through; nested launchers said
     0.2 (2026-12-02) fingerprints on every collective, settings compared at init,
                      store admission (job id, duplicate ranks, DDP_SECRET), bounded
                      store, per-launch job ids, arenas swept after crashes, host
                      memory on NCCL, an NCCL watchdog, one list per concept, the
                      MPI backend, tracing (ddp_trace_*), ddp_thread_share,
                      restarts (--max-restarts, ddp_run_restarts, ddp_restart_count)
     0.1 (2026-12-02) process group, launcher, TCP store, CPU + NCCL collectives,
                      sampler, gradient sync, metrics
*/
#ifndef DDP_H_INCLUDED
#define DDP_H_INCLUDED
#ifndef __linux__
#error "ddp.h runs on Linux only (futexes, POSIX shared memory): on macOS or Windows use a Linux machine, VM or container"
#endif

#if defined(DDP_IMPLEMENTATION) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* before the first system header: futex, CLOCK_*, getaddrinfo */
#endif
#include <stddef.h>
#include <stdint.h>

/* Linkage of every public function: extern, or static under DDP_STATIC (a private
   copy per file; unused ones do not warn). Define DDPDEF yourself to export. */
#ifndef DDPDEF
#ifdef DDP_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define DDPDEF __attribute__((unused)) static
#else
#define DDPDEF static
#endif
#else
#define DDPDEF extern
#endif
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
    X(DDP_ERR_ABORTED, "the process group was aborted by an earlier error")           \
    X(DDP_ERR_MISMATCH, "ranks disagree (a collective's arguments or a setting)")     \
    X(DDP_ERR_REFUSED, "the store refused this process (other job, duplicate rank or wrong secret)")
typedef enum ddp_result {
#define DDP__ENUM(name, text) name,
    DDP__RESULTS(DDP__ENUM)
#undef DDP__ENUM
    DDP_RESULT_COUNT
} ddp_result;

/* Backends: name as DDP_BACKEND=name takes it. */
#define DDP__BACKENDS(X) X(DDP_BACKEND_CPU, "cpu") X(DDP_BACKEND_NCCL, "nccl") X(DDP_BACKEND_MPI, "mpi")
typedef enum ddp_backend {
    DDP_BACKEND_DEFAULT = 0,
#define DDP__ENUM(name, text) name,
    DDP__BACKENDS(DDP__ENUM)
    DDP_BACKEND_COUNT
} ddp_backend;

/* Element types, one row each: enum, name, C storage type, the type a reduction
   accumulates in, NCCL's type, conversions storage -> accumulator -> storage.
   16-bit floats are stored as uint16_t bits and reduced in f32. */
#define DDP__DTYPES(X)                                                                      \
    X(DDP_F32, "f32", float, float, ncclFloat32, DDP__SAME, DDP__SAME)                     \
    X(DDP_F64, "f64", double, double, ncclFloat64, DDP__SAME, DDP__SAME)                   \
    X(DDP_BF16, "bf16", uint16_t, float, ncclBfloat16, ddp_bf16_to_f32, ddp_f32_to_bf16)   \
    X(DDP_F16, "f16", uint16_t, float, ncclFloat16, ddp_f16_to_f32, ddp_f32_to_f16)        \
    X(DDP_I32, "i32", int32_t, int32_t, ncclInt32, DDP__SAME, DDP__SAME)                   \
    X(DDP_I64, "i64", int64_t, int64_t, ncclInt64, DDP__SAME, DDP__SAME)
#define DDP__SAME(x) (x)
typedef enum ddp_dtype {
#define DDP__DTYPE_ENUM(name, text, T, A, nccl, load, store) name,
    DDP__DTYPES(DDP__DTYPE_ENUM)
#undef DDP__DTYPE_ENUM
    DDP_DTYPE_COUNT
} ddp_dtype;

/* Reductions: enum, name, NCCL's op. AVG of integers truncates toward zero. */
#define DDP__OPS(X) X(DDP_SUM, "sum", ncclSum) X(DDP_AVG, "avg", ncclAvg) X(DDP_MIN, "min", ncclMin) X(DDP_MAX, "max", ncclMax)
typedef enum ddp_op {
#define DDP__OP_ENUM(name, text, nccl) name,
    DDP__OPS(DDP__OP_ENUM)
#undef DDP__OP_ENUM
    DDP_OP_COUNT
} ddp_op;
#undef DDP__ENUM
enum { DDP_LOG_ERROR = 0, DDP_LOG_INFO = 1 };

/* Zero means default for every field. */
typedef struct ddp_desc {
    int *argc;            /* optional: lets init read and remove --local_rank N */
    char **argv;
    int world_size;       /* >0: take rank/world_size/local_* from here, not the env */
    int rank;
    int local_rank;       /* with world_size > 0: default rank % local_world_size when that is
                             given, else rank; -1: numbered in rank order on each host */
    int local_world_size; /* with world_size > 0: default = world_size */
    ddp_backend backend;  /* default: DDP_BACKEND env, then nccl if a GPU is visible */
    int timeout_ms;       /* default: DDP_TIMEOUT seconds, then 300 s */
    const char *master_addr; /* default: MASTER_ADDR */
    int master_port;         /* default: MASTER_PORT */
    const char *job_id;      /* default: DDP_JOB_ID, then the launcher's own run id */
    const char *secret;      /* default: DDP_SECRET; peers of the store prove they know it */
    size_t shm_chunk_bytes;  /* CPU (and MPI) backend staging per rank; default DDP_SHM_CHUNK, 1 MiB */
    int check;               /* 1: compare every collective's arguments across ranks on
                                the NCCL backend too (the CPU and MPI backends always do); DDP_CHECK */
    void (*log)(void *user, int level, const char *msg); /* default: errors to stderr; called from
                                the thread that failed (async work: ddp.h's own), one call at a time */
    void *log_user;
} ddp_desc;

/* Filled by ddp_init; keep it at one address until ddp_destroy (a CPU worker thread
   refers to it). ddp_init on a context still live, or for a rank of a job of several
   ranks that another live context of this process holds, is refused (ddp_destroy that one
   first); worlds of one share nothing, and any number of them may live side by side. */
typedef struct ddp_ctx {
    int rank, world_size;
    int local_rank, local_world_size;
    int node_rank, num_nodes; /* the launcher's node number (torchrun's GROUP_RANK, Slurm's node
                              id), else this host's in order of its first rank; the hosts the
                              job spans (torchrun --nnodes 2 twice on one host: node_rank 1 of
                              num_nodes 1, one host, one arena) */
    int device;            /* the CUDA device this rank drives with NCCL, -1 on the CPU:
                              the only one it sees, else the one numbered local_rank */
    ddp_backend backend;   /* what init chose */
    struct ddp__state *st; /* private */
    ddp_result ended;      /* private: ddp_destroy's verdict, which a second call returns again */
} ddp_ctx;

/* Asynchronous work: filled by *_async, finished by ddp_wait. */
typedef struct ddp_work {
    uint64_t seq;
    void *event;       /* NCCL: completion event */
    uint64_t owner;    /* the context whose collective filled it (its id in this process) */
} ddp_work;

/* ---- launcher ------------------------------------------------------------------
   Call first in main. Without --nproc (or inside a launched job) it returns
   DDP_WORKER and the program goes on as one rank. With "--nproc N" in argv this
   process becomes the launcher: it runs N copies of the program (argv without
   --nproc; N at most 256, what one host's CPU backend takes), forwards SIGINT,
   SIGTERM and SIGHUP (the ranks get 30 s to end, then the status is 128 + the
   signal; signals ignored at its start stay ignored), stops
   everything when one rank fails, and returns the exit status for main to return.
   "--max-restarts N" (torchrun's flag, also --max_restarts) starts the job again
   after a failure, up to N times. A near miss of --nproc (-np 4, --nprocs 4, --NPROC)
   outside a launched job is said on stderr before the one rank runs. */
#define DDP_WORKER (-1)
DDPDEF int ddp_launch(int *argc, char **argv);
/* Runs nproc copies of argv (argv[0] looked up in PATH) as ranks 0..nproc-1 of one
   job on this host; returns 0 if all succeeded, else the status of the rank whose
   failure stopped the job (128+signal for a signal). Prints one line naming it. A
   program that cannot run is one line and 127 (not found) or 126 (not runnable).
   Waits for its ranks only: other children of the caller are left to the caller. */
DDPDEF int ddp_run(int nproc, char *const argv[]);
/* ddp_run, and after a failed attempt the whole job again, up to max_restarts times
   (a signal to the launcher is never restarted). Each attempt is a new job (job id,
   secret, port: no rank of an earlier attempt can join it) and starts once every
   process of the one before has ended; its ranks see TORCHELASTIC_RESTART_COUNT. */
DDPDEF int ddp_run_restarts(int nproc, int max_restarts, char *const argv[]);
/* Which attempt of the job this process belongs to: 0 for the first, n after n
   restarts (TORCHELASTIC_RESTART_COUNT, set by torchrun and by ddp's launcher);
   -1 if that variable is not a count (ddp_init then refuses to start). */
DDPDEF int ddp_restart_count(void);

/* ---- process group ------------------------------------------------------------ */
/* ddp_init (and ddp_launch, ddp_run) open /dev/null on stdin, stdout or stderr where the
   process was started with it closed (prog >&-): else the store's sockets or the arena
   take those numbers, and the program's prints land in them. */
DDPDEF ddp_result ddp_init(ddp_ctx *ctx, const ddp_desc *desc); /* failed: ddp_error(ctx) says why until
                                                                  ddp_destroy(ctx) frees the rest */
DDPDEF ddp_result ddp_destroy(ddp_ctx *ctx); /* waits for the others to arrive, then frees; DDP_OK if the
                                              job ended well (else its failure: exit non-zero), and
                                              the same again from a second call; while another
                                              thread is in a call of ctx, the group stops and
                                              ctx is freed once that call returns */
DDPDEF const char *ddp_strerror(ddp_result r);
DDPDEF const char *ddp_error(const ddp_ctx *ctx); /* detail of the last failure, or "" (a NULL or
                                                      destroyed context: says so) */
DDPDEF size_t ddp_dtype_size(ddp_dtype t);    /* bytes per element, 0 if unknown */
DDPDEF const char *ddp_dtype_name(ddp_dtype t); /* "f32", ... */
DDPDEF const char *ddp_backend_name(ddp_backend b);

/* ---- collectives -----------------------------------------------------------------
   Every rank calls the same collectives in the same order. Counts are elements.
   NCCL: device pointers, `stream` a cudaStream_t (NULL: the legacy default stream);
   the call returns once the work is queued after `stream`'s earlier work, and
   `stream`'s later work sees the result. A watchdog thread aborts NCCL when a
   collective has not finished within the timeout of its start (when the work queued
   before it is done): NCCL's kernels end, the streams run on with garbage in the
   collectives' outputs (CUDA reports no error), and the next ddp.h call returns
   DDP_ERR_TIMEOUT saying which collective. Host memory works too: it is staged
   through device memory and the call returns when the result is there.
   CPU: host pointers, `stream` ignored; the call returns when the result is there.
   Ranks that pass different arguments get DDP_ERR_MISMATCH (see RANKS MUST AGREE).
   send == recv is in place; buffers that overlap otherwise are refused. Integer sums
   wrap (as NCCL's and PyTorch's); AVG of integers truncates toward zero. MIN and MAX
   give NaN where any rank has one (on the CPU and MPI backends). 16-bit floats
   accumulate in f32 on the CPU. A collective that failed once it started (a timeout, a
   rank gone, ranks that disagree; not an argument refused) leaves recv without a
   result (MPI may even write part of it later: a nonblocking collective in flight
   cannot be cancelled), and the context refuses every later one: end the job. */
DDPDEF ddp_result ddp_all_reduce(ddp_ctx *ctx, const void *send, void *recv, size_t count,
                                 ddp_dtype dtype, ddp_op op, void *stream);
DDPDEF ddp_result ddp_all_reduce_async(ddp_ctx *ctx, const void *send, void *recv, size_t count,
                                       ddp_dtype dtype, ddp_op op, void *stream, ddp_work *work);
/* Waits for async work: returns when the result is in place (NCCL: the host waits
   for the GPU, within the timeout, and `stream` is ordered after the work). A handle
   that no collective filled (its call was refused) is DDP_ERR_ARG. */
DDPDEF ddp_result ddp_wait(ddp_ctx *ctx, ddp_work *work, void *stream);
DDPDEF ddp_result ddp_broadcast(ddp_ctx *ctx, void *buf, size_t count, ddp_dtype dtype,
                                int root, void *stream);
/* recv holds world_size * count elements, rank r's at r * count. In place (NCCL's form):
   send = recv + rank * count; buffers that overlap otherwise are refused. */
DDPDEF ddp_result ddp_all_gather(ddp_ctx *ctx, const void *send, void *recv, size_t count,
                                 ddp_dtype dtype, void *stream);
/* send holds world_size * count elements; rank r receives the reduction of block r.
   In place: recv = send + rank * count; buffers that overlap otherwise are refused. */
DDPDEF ddp_result ddp_reduce_scatter(ddp_ctx *ctx, const void *send, void *recv, size_t count,
                                     ddp_dtype dtype, ddp_op op, void *stream);
DDPDEF ddp_result ddp_barrier(ddp_ctx *ctx); /* host barrier, every backend */

/* ---- rank-0 helpers --------------------------------------------------------------- */
DDPDEF int ddp_is_main(const ddp_ctx *ctx); /* rank 0 (NULL: a world of one) */
/* This rank's share of the host's cores, for omp_set_num_threads or a thread pool:
   OMP_NUM_THREADS when set (the built-in launcher and ddprun set it), else the cores
   this process may run on, divided by the ranks on this host unless the launcher
   already bound each rank to its own cores (mpirun, srun); at least 1. */
DDPDEF int ddp_thread_share(const ddp_ctx *ctx);
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
   torch.randperm(N) of a generator seeded with seed + e: the same order as PyTorch
   (from 214,748,364 samples on, that of torch 2.7 and later, which changed it there).
   There is no set_epoch to forget: every call that returns indices takes the epoch.
   The epoch is not compared across ranks (ranks that pass different ones draw orders
   that overlap): drawing is local, with no meeting point to compare it at, and the
   next collective's fingerprint would refuse a healthy rank whose loader drew ahead.
   Where ranks compute it apart (each from its own checkpoint), check it once per epoch
   with ddp_agree_on(ctx, "epoch", text).
   With a context (and desc.world_size 0) init is collective: every rank calls it, and
   ranks whose size, seed, shuffle, drop_last or batch settings differ (which would
   train on overlapping samples or step a different number of times) get
   DDP_ERR_MISMATCH naming the field. */
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

/* Filled by ddp_sampler_init. ddp_sampler_destroy it before another init: an init on a
   live one is refused (DDP_ERR_ARG), and that one goes on. */
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
    struct ddp__held *held_; /* private: says that this ddp_sampler is live */
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
DDPDEF ddp_result ddp_sampler_init(ddp_sampler *s, ddp_ctx *ctx, const ddp_sampler_desc *desc);
DDPDEF void ddp_sampler_destroy(ddp_sampler *s);
/* set_epoch and iter() in one: this rank's num_samples indices for `epoch`. */
DDPDEF const size_t *ddp_sampler_epoch(ddp_sampler *s, uint64_t epoch);
/* Batch b (0 <= b < num_batches) of this rank for `epoch`. With per-rank batch size
   B, global batch b is positions [b B W, (b+1) B W) of the shuffled list: the same
   samples as batch b of one rank with batch size B W. Its indices point into the
   sampler's own list, which another epoch overwrites: copy them to keep them. The
   shuffle's seed is seed + epoch (as torch's), wrapping past 2^64 - 1. */
DDPDEF ddp_batch ddp_sampler_batch(ddp_sampler *s, uint64_t epoch, size_t b);

/* ---- metrics ---------------------------------------------------------------------
   A metric is a sum and a count, so the global mean is exact: sum over all ranks
   divided by count over all ranks (not the template's mean of per-rank means, which
   counts padding and weights ranks equally). Zero-initialise, add real samples only,
   reduce once per epoch. min/max are those of the added values. A reduced metric holds
   every rank's part already: reducing it again (which counted each part world_size
   times) is refused, so is one that has been added to or merged with since; zero it to
   start a new accumulation. */
typedef struct ddp_metric {
    double sum, count;
    double min, max; /* meaningful when count > 0 */
    int reduced;     /* 1: totals over all ranks (from ddp_metric_reduce, or merged with such) */
} ddp_metric;

/* Adds `value` with weight `weight` (1 for one sample): sum += value * weight. */
DDPDEF void ddp_metric_add(ddp_metric *m, double value, double weight);
/* into[i] += from[i] for n metrics (sums, counts, min, max); into[i] is reduced if
   either was. */
DDPDEF void ddp_metric_merge(ddp_metric *into, const ddp_metric *from, size_t n);
/* Replaces n metrics on every rank by their totals over all ranks, marked reduced: an
   all-reduce of 3 int64 (every rank passes as many, and none was refused), then an
   all-gather of the metrics (f64), combined in rank order so every rank gets the same
   bits. Host memory on every backend. A metric reduced already is refused, the metrics
   left as they are (DDP_ERR_ARG, naming the first; on the other ranks DDP_ERR_PEER). */
DDPDEF ddp_result ddp_metric_reduce(ddp_ctx *ctx, ddp_metric *m, size_t n);
DDPDEF double ddp_metric_mean(const ddp_metric *m);    /* sum / count; 0 when empty */
DDPDEF double ddp_metric_percent(const ddp_metric *m); /* 100 sum / count: accuracy in % */

/* ---- the program's own settings ---------------------------------------------------
   What ddp.h cannot see must agree too: ranks started by hand with another --lr, or
   reading another data file, would train apart without a word. Each rank passes its
   value as text (a flag as given, a file's hash); one small collective, which every
   rank calls in the same order. DDP_OK when every rank's value is rank 0's; else
   DDP_ERR_MISMATCH on every rank, ddp_error naming the first rank that differs and
   both values ("ranks disagree on --lr: rank 2 has 0.002, rank 0 has 0.001"; values
   compare whole; a long one is shown cut at 103 characters). Host memory on every backend. */
DDPDEF ddp_result ddp_agree_on(ddp_ctx *ctx, const char *name, const char *value);

/* ---- gradient synchronisation (DistributedDataParallel) ---------------------------
   All parameters' gradients live in one flat buffer. Init broadcasts the parameters
   from rank 0 (as DDP's constructor does; DDP's buffers, such as BatchNorm's statistics,
   are the caller's ddp_broadcast here). Each step, as the backward pass produces
   gradients (last layer first), mark those regions ready: every bucket (default
   25 MiB) whose regions are all ready starts an asynchronous all-reduce at once, so
   communication overlaps the rest of the backward pass. Buckets are reduced in the
   same order on every rank (from the end of the buffer) whatever order regions are
   marked in. ddp_grad_finish launches what is left, waits, and leaves the average
   over ranks in place; on NCCL the stream waits, not the host: work queued on
   desc.stream after it sees the average, and the host goes on at once (the watchdog
   follows the buckets, see the collectives). Every element must be marked exactly
   once per step; a region marked twice, or finish with elements never marked,
   returns DDP_ERR_ARG and ddp_error(ctx) says which elements. Elements never marked
   also stop the group (their bucket was never sent: the other ranks would wait for it,
   or pair it with this rank's next step), so every rank's next call says why. */
typedef struct ddp_grad_desc {
    void *grads;           /* flat gradient buffer of `count` elements (device memory on NCCL) */
    size_t count;
    ddp_dtype dtype;       /* default DDP_F32; DDP_BF16, DDP_F64 also work */
    size_t bucket_bytes;   /* default 25 MiB (PyTorch's bucket_cap_mb) */
    int sum;               /* 1: leave the sum over ranks instead of the average */
    void *params;          /* optional: broadcast from rank 0 by ddp_grad_init */
    size_t param_count;    /* default: count */
    ddp_dtype param_dtype; /* default DDP_F32 (fp32 master weights), whatever dtype is: bf16 params need DDP_BF16 */
    void *stream;          /* NCCL: the cudaStream_t the backward pass runs on */
} ddp_grad_desc;

/* Filled by ddp_grad_init; use it by its address, never a copy (a copy used after
   ddp_grad_destroy reads freed memory). ddp_grad_init on one still live is refused
   (ddp_grad_destroy it first), as ddp_init on a live ddp_ctx is. */
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
/* Waits for buckets still in flight. A later call on g is DDP_ERR_ARG, said in its
   context's ddp_error while that context lives. While another thread is in a call of g,
   the group stops and g is freed once that call returns. */
DDPDEF void ddp_grad_destroy(ddp_grad *g);
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
   Change it between steps only, on every rank alike: with averages (the default), a
   sync whose sums cover another number of steps than another rank's is
   DDP_ERR_MISMATCH, named; with desc.sum, ranks may accumulate unevenly (the caller
   scales the sum). */
DDPDEF ddp_result ddp_grad_no_sync(ddp_grad *g, int on);

/* ---- tracing: where the time goes, as a picture -----------------------------------
   A Chrome trace-event file (opens in ui.perfetto.dev or chrome://tracing) with a
   process per rank and two rows in each: "main" (your spans, blocking collectives,
   waits) and "collectives" (asynchronous work as it runs on the CPU and MPI backends'
   collective thread: gradient buckets show there, overlapping the backward pass; on
   NCCL the GPU runs them and the row shows only their queueing).
   ddp_trace_start is collective (every rank calls it) and clears what was recorded;
   ranks on one host share its clock, so their rows line up exactly (other hosts' at
   the start's barrier). Up to max_events are kept per rank (0: 100000, about 6 MB;
   the save holds world size + 1 times as many on every rank); later ones are counted
   as dropped (ddp_trace_save's warning says so). Spans nest; names are cut at 43
   bytes. Call begin/end from the thread that calls the collectives; they do nothing when
   tracing is off, so they can stay in the code. ddp_trace_save is collective: every
   rank's events go to rank 0, which writes `path` (every rank returns the same result)
   and recording stops. */
DDPDEF ddp_result ddp_trace_start(ddp_ctx *ctx, size_t max_events);
DDPDEF void ddp_trace_begin(ddp_ctx *ctx, const char *name);
DDPDEF void ddp_trace_end(ddp_ctx *ctx);
DDPDEF ddp_result ddp_trace_save(ddp_ctx *ctx, const char *path);

#ifdef __cplusplus
} /* extern "C" */
inline ddp_result ddp_init(ddp_ctx *ctx, const ddp_desc &desc) { return ddp_init(ctx, &desc); }
inline ddp_result ddp_sampler_init(ddp_sampler *s, ddp_ctx *ctx, const ddp_sampler_desc &desc)
{
    return ddp_sampler_init(s, ctx, &desc);
}
inline ddp_result ddp_grad_init(ddp_grad *g, ddp_ctx *ctx, const ddp_grad_desc &desc) { return ddp_grad_init(g, ctx, &desc); }
#endif
#endif /* DDP_H_INCLUDED */

/* ==================================================================================
   Implementation. Stop here if you only want the API.
   Sections, each calling only those above it (grep for the tag):
     >>config         defaults, allocator, limits
     >>platform       clocks, strings, randomness, SHA-256/HMAC, sockets
     >>tables         dtypes, ops, collective kinds, fingerprints
     >>errors         the one failure funnel, logging, rank-0 printing
     >>halfs          16-bit float conversion
     >>environment    launchers' variables, every default resolved in one place
     >>store          rank 0's TCP key-value server
     >>store client   joining, keys, gathers, the settings and fingerprint checks
     >>cpu            the shared-memory backend
     >>nccl           the NCCL backend
     >>mpi            the MPI backend (-DDDP_MPI)
     >>backends       the table that dispatches to a backend
     >>trace          spans in memory, written as Chrome trace JSON
     >>collectives    validate, fingerprint, run or queue
     >>group          ddp_init, ddp_destroy
     >>launcher       ddp_launch, ddp_run
     >>sampler >>metrics >>grad
   ================================================================================== */
#ifdef DDP_IMPLEMENTATION
#ifndef DDP__IMPLEMENTATION_DONE
#define DDP__IMPLEMENTATION_DONE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#ifndef F_OFD_GETLK /* open-file-description locks: glibc shows them only under _GNU_SOURCE */
#define F_OFD_GETLK 36
#define F_OFD_SETLK 37
#endif
#ifndef O_TMPFILE /* the same: Linux's generic value */
#define O_TMPFILE (020000000 | O_DIRECTORY)
#endif
#ifdef DDP_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif
#ifdef DDP_MPI
#define OMPI_SKIP_MPICXX 1 /* the C API only: MPI's C++ bindings do not compile warning-free */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#if defined(__GLIBC__) && !(defined(__USE_XOPEN2K8) && defined(__USE_MISC))
#error "ddp.h: the implementation needs POSIX 2008: define DDP_IMPLEMENTATION and include ddp.h before any other header, or compile with -D_GNU_SOURCE"
#endif

/* ---- >>config ------------------------------------------------------------------------ */
#if defined(DDP_MALLOC) != defined(DDP_FREE)
#error "define both DDP_MALLOC and DDP_FREE, or neither"
#endif
#ifndef DDP_MALLOC
#define DDP_MALLOC(n) malloc(n)
#define DDP_FREE(p) free(p)
#endif

#define DDP__VERSION "0.2"
#define DDP__DEFAULT_TIMEOUT_MS 300000
#define DDP__DEFAULT_PORT 29500
#define DDP__DEFAULT_CHUNK ((size_t)1 << 20)
/* the chain's chunk when DDP_SHM_CHUNK is not set: small enough that a 4 MB all-reduce
   runs in 8 rounds, so the hosts work at once (2 hosts x 2 ranks: 4 MiB chunks, one
   round at 4 MB, were 0.9-1.0x the exchange there; 512 KiB 1.2-1.65x) */
#define DDP__MPI_CHAIN_CHUNK ((size_t)512 << 10)
#define DDP__DEFAULT_BUCKET_BYTES ((size_t)25 << 20) /* PyTorch's bucket_cap_mb */
#define DDP__MAX_CPU_RANKS 256
#define DDP__MAX_BYTES (SIZE_MAX >> 8 > (size_t)0xffffffffu ? SIZE_MAX >> 8 : SIZE_MAX >> 1) /* a buffer's most */
#define DDP__QUEUE 64          /* async collectives in flight per context (host backends) */
#define DDP__SPIN_NS 20000     /* CPU barrier: spin this long, then sleep */
#define DDP__STORE_PENDING 64  /* store: connections not yet identified, at most */
#define DDP__MAX_WORLD (1 << 24) /* ranks in a job, at most: the store's tables stay in int */
#define DDP__STORE_HELLO_MS 5000 /* store: a newcomer identifies itself within this */
#define DDP__STORE_STALL_MS 10000 /* store: a message once begun arrives within this */
#define DDP__STORE_QUOTA ((size_t)4 << 20) /* store: bytes one rank may make it hold */
#define DDP__SETTLE_MS 300     /* a job with no id of its own waits this long for a second launch */

#ifdef __cplusplus
#define DDP__CAST(T, x) ((T)(x))
#else
#define DDP__CAST(T, x) (x)
#endif
/* compile-time check, for tables indexed by enum order */
#define DDP__STATIC_ASSERT(name, cond) typedef char ddp__assert_##name[(cond) ? 1 : -1]

/* ---- >>platform ------------------------------------------------------------------------ */

static int64_t ddp__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t ddp__now_ms(void) { return ddp__now_ns() / 1000000; }

/* A wait's deadline leaves out time this process did not run: a look that comes more
   than DDP__STOPPED_MS after the one before (the job stopped by Ctrl-Z or SIGSTOP and
   continued as a whole, a paused VM) moves the deadline on by the gap, so that the ranks
   go on where they were; a rank stopped on its own still times the others out. (inline:
   builds without a backend that waits so stay quiet) */
#define DDP__STOPPED_MS 1000
static inline void ddp__not_stopped(int64_t *last, int64_t now, int64_t *deadline)
{
    if (now - *last > DDP__STOPPED_MS) *deadline += now - *last;
    *last = now;
}

/* ms from now on CLOCK_REALTIME, the clock of pthread_cond_timedwait's deadline (inline:
   builds without a backend that waits so stay quiet) */
static inline struct timespec ddp__realtime_in(int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    return ts;
}
/* milliseconds as seconds for "%.*f s": "3.0", "1.25", "0.001" (a timeout of 1 ms is not "0.0 s") */
#define DDP__SECONDS(ms) ((ms) % 100 == 0 ? 1 : (ms) % 10 == 0 ? 2 : 3), (ms) / 1000.0

/* The cores this process may run on (its affinity mask; the online ones if unknown). */
static long ddp__cores_allowed(void)
{
    unsigned long mask[64]; /* 4096 CPUs */
    long online = sysconf(_SC_NPROCESSORS_ONLN), bytes = syscall(SYS_sched_getaffinity, 0, sizeof mask, mask), n = 0, i;
    if (bytes <= 0) return online > 0 ? online : 1;
    for (i = 0; i < bytes / (long)sizeof mask[0]; i++) n += __builtin_popcountl(mask[i]);
    return n > 0 ? n : 1;
}

static void ddp__sleep_us(int64_t us)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(us / 1000000);
    ts.tv_nsec = (long)(us % 1000000) * 1000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static void ddp__sleep_ms(int ms) { ddp__sleep_us((int64_t)ms * 1000); }

/* strncpy that always terminates (and truncates quietly); returns strlen(src), so that
   a result >= size says it was cut (strlcpy) */
static size_t ddp__copy(char *dst, size_t size, const char *src)
{
    size_t whole = strlen(src), n = whole < size ? whole : size - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
    return whole;
}

/* printf at the end of the string in out (size bytes), truncating quietly */
static void ddp__append(char *out, size_t size, const char *fmt, ...) DDP__PRINTF(3, 4);
static void ddp__append(char *out, size_t size, const char *fmt, ...)
{
    size_t n = strlen(out);
    va_list ap;
    if (n + 1 >= size) return;
    va_start(ap, fmt);
    vsnprintf(out + n, size - n, fmt, ap);
    va_end(ap);
}

/* n bytes from the kernel's random source (getrandom, else /dev/urandom, which a chroot
   or a process out of descriptors may lack): 1; else 0, the bytes then made from the
   clock, the pid and a counter, fit for ports and arena tokens but guessable, so the
   launcher's secret refuses them */
static int ddp__random(void *buf, size_t n)
{
    static uint64_t calls;
    unsigned char *p = (unsigned char *)buf;
    size_t got = 0;
    int fd;
#ifdef SYS_getrandom
    while (got < n) {
        const long k = syscall(SYS_getrandom, p + got, n - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
#endif
    if (got < n && (fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC)) >= 0) {
        while (got < n) {
            ssize_t k = read(fd, p + got, n - got);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            got += (size_t)k;
        }
        close(fd);
    }
    if (got == n) return 1;
    {
        uint64_t x = ((uint64_t)ddp__now_ns() ^ ++calls << 48) * 6364136223846793005ull ^ (uint64_t)getpid() << 32;
        for (; got < n; got++) { x = x * 6364136223846793005ull + 1442695040888963407ull; p[got] = (unsigned char)(x >> 56); }
    }
    return 0;
}

/* A program started with stdin, stdout or stderr closed (prog >&-) would get the store's
   sockets or the arena as those numbers, and its prints would land in them: each closed
   one becomes /dev/null first, as the C library does for setuid programs. */
static void ddp__std_fds(void)
{
    int fd, n;
    for (fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            n = open("/dev/null", fd ? O_WRONLY : O_RDONLY);
            if (n < 0) n = open("/", O_RDONLY); /* no /dev: a directory, where writes fail as on a closed one */
            if (n > 2) close(n); /* another thread took the number first */
        }
}

static void ddp__hex(char *out, const unsigned char *in, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    size_t i;
    for (i = 0; i < n; i++) { out[2 * i] = digits[in[i] >> 4]; out[2 * i + 1] = digits[in[i] & 15]; }
    out[2 * n] = 0;
}

/* FNV-1a: names derived from a job id */
static uint64_t ddp__hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s) { h ^= (unsigned char)*s++; h *= 1099511628211ull; }
    return h;
}

/* SHA-256 (FIPS 180-4) and HMAC (RFC 2104): the store's challenge-response. */
typedef struct ddp__sha { uint32_t h[8]; unsigned char buf[64]; uint64_t len; } ddp__sha;

static uint32_t ddp__ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void ddp__sha_block(ddp__sha *s, const unsigned char *p)
{
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64], a[8], t1, t2;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (i = 16; i < 64; i++)
        w[i] = w[i - 16] + (ddp__ror(w[i - 15], 7) ^ ddp__ror(w[i - 15], 18) ^ (w[i - 15] >> 3)) + w[i - 7] +
               (ddp__ror(w[i - 2], 17) ^ ddp__ror(w[i - 2], 19) ^ (w[i - 2] >> 10));
    memcpy(a, s->h, sizeof a);
    for (i = 0; i < 64; i++) {
        t1 = a[7] + (ddp__ror(a[4], 6) ^ ddp__ror(a[4], 11) ^ ddp__ror(a[4], 25)) + ((a[4] & a[5]) ^ (~a[4] & a[6])) + k[i] + w[i];
        t2 = (ddp__ror(a[0], 2) ^ ddp__ror(a[0], 13) ^ ddp__ror(a[0], 22)) + ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
        memmove(a + 1, a, 7 * sizeof a[0]);
        a[4] += t1;
        a[0] = t1 + t2;
    }
    for (i = 0; i < 8; i++) s->h[i] += a[i];
}

static void ddp__sha_init(ddp__sha *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
}

static void ddp__sha_add(ddp__sha *s, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    while (n > 0) {
        size_t used = (size_t)(s->len % 64), k = 64 - used < n ? 64 - used : n;
        memcpy(s->buf + used, p, k);
        s->len += k; p += k; n -= k;
        if (s->len % 64 == 0) ddp__sha_block(s, s->buf);
    }
}

static void ddp__sha_end(ddp__sha *s, unsigned char out[32])
{
    uint64_t bits = s->len * 8;
    unsigned char pad = 0x80, len[8];
    int i;
    ddp__sha_add(s, &pad, 1);
    pad = 0;
    while (s->len % 64 != 56) ddp__sha_add(s, &pad, 1);
    for (i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
    ddp__sha_add(s, len, 8);
    for (i = 0; i < 32; i++) out[i] = (unsigned char)(s->h[i / 4] >> (24 - 8 * (i % 4)));
}

/* HMAC-SHA256(key, a | b | c) as 64 hex digits */
static void ddp__hmac(char out[65], const char *key, const char *a, const char *b, const char *c)
{
    unsigned char k[64], pad[64], inner[32], mac[32];
    size_t n = strlen(key), i;
    ddp__sha s;
    memset(k, 0, sizeof k);
    if (n > 64) { ddp__sha_init(&s); ddp__sha_add(&s, key, n); ddp__sha_end(&s, k); }
    else memcpy(k, key, n);
    for (i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    ddp__sha_init(&s);
    ddp__sha_add(&s, pad, 64);
    ddp__sha_add(&s, a, strlen(a)); ddp__sha_add(&s, "|", 1);
    ddp__sha_add(&s, b, strlen(b)); ddp__sha_add(&s, "|", 1);
    ddp__sha_add(&s, c, strlen(c));
    ddp__sha_end(&s, inner);
    for (i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    ddp__sha_init(&s);
    ddp__sha_add(&s, pad, 64);
    ddp__sha_add(&s, inner, 32);
    ddp__sha_end(&s, mac);
    ddp__hex(out, mac, 32);
}

/* compares two MACs without an early exit: timing says nothing about where they differ */
static int ddp__same_mac(const char *a, const char *b)
{
    unsigned diff = 0;
    int i;
    if (strlen(a) != 64 || strlen(b) != 64) return 0;
    for (i = 0; i < 64; i++) diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

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

/* ---- >>tables --------------------------------------------------------------------------
   Collective kinds: enum, name, and which buffers a rank passes, in elements per
   `count`: send (0: none), recv (W: world_size blocks; 0: none, a meeting that moves
   no data whatever its count). DESTROY is ddp_destroy's meeting: every backend treats
   it as a barrier, and a rank that meets a DESTROY where it expected a collective
   knows its peer left. */
#define DDP__COLLS(X)                                  \
    X(DDP__ALL_REDUCE, "all_reduce", 1, 1)             \
    X(DDP__BROADCAST, "broadcast", 0, 1)               \
    X(DDP__ALL_GATHER, "all_gather", 1, 'W')           \
    X(DDP__REDUCE_SCATTER, "reduce_scatter", 'W', 1)   \
    X(DDP__BARRIER, "barrier", 0, 0)                   \
    X(DDP__DESTROY, "ddp_destroy", 0, 0)
enum {
#define DDP__COLL_ENUM(kind, name, send, recv) kind,
    DDP__COLLS(DDP__COLL_ENUM)
#undef DDP__COLL_ENUM
    DDP__COLL_COUNT
};
static const struct { const char *name; int send, recv; } ddp__colls[] = {
#define DDP__COLL_ROW(kind, name, send, recv) {name, send, recv},
    DDP__COLLS(DDP__COLL_ROW)
#undef DDP__COLL_ROW
};
DDP__STATIC_ASSERT(coll_table, sizeof ddp__colls / sizeof ddp__colls[0] == DDP__COLL_COUNT);
/* a collective that carries data; the others (receiving nothing) are meetings */
static int ddp__coll_moves_data(int kind) { return ddp__colls[kind].recv != 0; }

static const struct { const char *name; size_t size; } ddp__dtypes[] = {
#define DDP__DTYPE_ROW(e, name, T, A, nccl, load, store) {name, sizeof(T)},
    DDP__DTYPES(DDP__DTYPE_ROW)
#undef DDP__DTYPE_ROW
};
DDP__STATIC_ASSERT(dtype_table, sizeof ddp__dtypes / sizeof ddp__dtypes[0] == DDP_DTYPE_COUNT);

static const char *const ddp__ops[] = {
#define DDP__OP_ROW(e, name, nccl) name,
    DDP__OPS(DDP__OP_ROW)
#undef DDP__OP_ROW
};
DDP__STATIC_ASSERT(op_table, sizeof ddp__ops / sizeof ddp__ops[0] == DDP_OP_COUNT);

/* One collective as every backend sees it. Its fingerprint (what every rank must
   agree on) is the first six fields and steps. */
typedef struct ddp__coll {
    uint64_t seq;   /* 1, 2, ... per context, in issue order */
    uint64_t count;
    int32_t kind, dtype, op, root;
    int32_t bucket; /* gradient bucket + 1, 0 for others: only a name in traces */
    int32_t steps;  /* gradient buckets: the steps whose gradients it sums (ddp_grad_no_sync's
                       and the one that syncs), 0 for others */
    const void *send;
    void *recv;
} ddp__coll;
typedef struct ddp__fp { uint64_t seq, count; int32_t kind, dtype, op, root, steps, unused; } ddp__fp;

static ddp__fp ddp__fingerprint(const ddp__coll *c)
{
    ddp__fp f;
    memset(&f, 0, sizeof f); /* padding too: fingerprints are compared as bytes */
    f.seq = c->seq; f.count = c->count; f.kind = c->kind;
    /* what a kind does not use cannot disagree */
    f.dtype = ddp__coll_moves_data(c->kind) ? c->dtype : 0;
    f.op = c->kind == DDP__ALL_REDUCE || c->kind == DDP__REDUCE_SCATTER ? c->op : 0;
    f.root = c->kind == DDP__BROADCAST ? c->root : 0;
    f.steps = c->steps;
    if (!ddp__coll_moves_data(c->kind)) f.count = 0;
    return f;
}

/* "100 x f32 sum" */
static void ddp__fp_args(char *out, size_t n, const ddp__fp *f)
{
    const int has_op = f->kind == DDP__ALL_REDUCE || f->kind == DDP__REDUCE_SCATTER;
    if ((unsigned)f->kind >= DDP__COLL_COUNT || !ddp__coll_moves_data(f->kind)) { out[0] = 0; return; }
    snprintf(out, n, "%llu x %s%s%s", (unsigned long long)f->count,
             (unsigned)f->dtype < DDP_DTYPE_COUNT ? ddp__dtypes[f->dtype].name : "?", has_op ? " " : "",
             !has_op ? "" : (unsigned)f->op < DDP_OP_COUNT ? ddp__ops[f->op] : "?");
    if (f->kind == DDP__BROADCAST) snprintf(out + strlen(out), n - strlen(out), " from rank %d", f->root);
    if (f->steps > 0) /* a gradient bucket: ranks that accumulated different steps under no_sync */
        snprintf(out + strlen(out), n - strlen(out), " of gradients of %d step%s", f->steps, f->steps > 1 ? "s" : "");
}

/* Names a disagreement between this rank's fingerprint and rank `other`'s. */
static void ddp__fp_diff(char *out, size_t n, int me, const ddp__fp *mine, int other, const ddp__fp *theirs)
{
    char a[96], b[96];
    const char *mk = (unsigned)mine->kind < DDP__COLL_COUNT ? ddp__colls[mine->kind].name : "?";
    const char *tk = (unsigned)theirs->kind < DDP__COLL_COUNT ? ddp__colls[theirs->kind].name : "?";
    ddp__fp_args(a, sizeof a, mine);
    ddp__fp_args(b, sizeof b, theirs);
    if (theirs->kind == DDP__DESTROY && mine->kind != DDP__DESTROY)
        snprintf(out, n, "rank %d left the job (ddp_destroy) while rank %d waits in %s #%llu", other, me, mk,
                 (unsigned long long)mine->seq);
    else if (mine->kind == DDP__DESTROY && theirs->kind != DDP__DESTROY)
        snprintf(out, n, "rank %d called ddp_destroy while rank %d is in %s #%llu", me, other, tk,
                 (unsigned long long)theirs->seq);
    else if (mine->kind != theirs->kind || mine->seq != theirs->seq)
        snprintf(out, n, "ranks call different collectives: rank %d %s #%llu%s%s%s, rank %d %s #%llu%s%s%s", me, mk,
                 (unsigned long long)mine->seq, a[0] ? " (" : "", a, a[0] ? ")" : "", other, tk,
                 (unsigned long long)theirs->seq, b[0] ? " (" : "", b, b[0] ? ")" : "");
    else
        snprintf(out, n, "%s #%llu: rank %d passes %s, rank %d passes %s", mk, (unsigned long long)mine->seq, me,
                 a, other, b);
}

/* ---- >>errors --------------------------------------------------------------------------- */

typedef struct ddp__server ddp__server;
typedef struct ddp__backend ddp__backend;

/* Every setting, resolved once from the desc, the environment and the defaults
   (ddp__resolve). Those in `agree` must be the same on every rank. */
typedef struct ddp__settings {
    int timeout_ms;
    int debug, check;
    ddp_backend backend;
    const char *backend_why; /* what chose it, for DDP_DEBUG */
    char backend_note[200];
    int mpi_launch;          /* an MPI launcher started these ranks (MPI can form the group) */
    int said[3];             /* node, local rank, local world as a launcher gave them, else -1 */
    char job_id[128];
    const char *job_from;    /* which variable gave the job id */
    char secret[256];
    char master_addr[256];
    int master_port;
    size_t chunk;            /* CPU backend staging per rank */
    int chunk_default;       /* nobody set it: the MPI backend's chain takes its own default */
    char agree[256];
} ddp__settings;

/* The objects of this process from their init to their destroy (failed inits too): a
   ddp_ctx's state, a ddp_grad's, a ddp_sampler's node (from a successful init). An init on
   one of them, or a ddp_init for a rank of a job of several ranks that a live context
   holds, is refused by name (else the store refused it as another process claiming the
   rank, or the first object leaked silently). Each object's state starts with its node (a sampler points to
   its own), which names the object by its address (what a ddp_ctx never initialised
   holds is never read). A child of fork() has its parent's list, whose
   objects are not its own: they count only in the process that made them. */
typedef struct ddp__held {
    struct ddp__held *next;
    const void *owner; /* the ddp_ctx, the ddp_grad, the ddp_sampler */
    pid_t pid;         /* the process that made it (a child of fork() holds a copy) */
    int kind;          /* DDP__HELD_CTX, DDP__HELD_GRAD, DDP__HELD_SAMPLER */
    int ready;         /* a context: its ddp_init succeeded, and rank is its own */
    int rank;
} ddp__held;
enum { DDP__HELD_CTX = 1, DDP__HELD_GRAD, DDP__HELD_SAMPLER };

/* One call at a time per context and per ddp_grad: state 0, DDP__BUSY_CALL (by that
   thread) or DDP__BUSY_DESTROY (atomics: see ddp__claim). */
typedef struct ddp__busy {
    int state;
    pthread_t by; /* 0 where none (glibc's threads are never 0) */
} ddp__busy;

struct ddp__state {
    ddp__held held;           /* first: the list's node is the state */
    char err[400];
    void (*log)(void *user, int level, const char *msg);
    void *log_user;
    pthread_mutex_t log_mu;  /* (recursive) err and the log: the worker thread fails too, and the
                                user's log callback is called from one thread at a time */
    ddp__settings cfg;
    ddp_result broken;       /* set once a collective fails: later ones refuse */
    ddp__busy busy;          /* a collective call is in progress (from which thread: see ddp__issue) */
    int waiting;             /* pins (atomic: ddp__pin): ddp_destroy frees the state after they leave */
    char cause[300];         /* err when the first refusal came: what every refusal cites */
    int store_fd;            /* connection to rank 0's store, -1 in a world of one */
    int pmi_fd;              /* Hydra's PMI connection once asked for the kvsname, else -1 */
    char pmi_kvs[128];       /* Hydra's kvsname once asked for */
    int report_fd;           /* the built-in launcher's pipe, else -1: how this rank's first failure came about */
    int reported;            /* that first failure was told */
    int waited;              /* the rank a timeout waited for, once known (for that report), else -1 */
#define DDP__JOINING 1000    /* (a report's code: this rank started ddp_init) */
#define DDP__LEAVING 1001    /* (a report's code: this rank left with ddp_destroy) */
    ddp__server *server;     /* rank 0 only */
    uint64_t seq;            /* collectives issued */
    uint64_t id;             /* this context's number in the process: a ddp_work of one destroyed has
                                another, though the next context may sit at the same address */
    const ddp__backend *be;
    void *bs;                /* the backend's own state */
    /* host backends' async collectives: one worker thread runs them in issue order */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t worker;
    int worker_started, worker_stop;
    ddp__coll queue[DDP__QUEUE];
    uint64_t queued, done;   /* counts; queue holds seqs (done, queued] */
    ddp_result async_err;
    struct ddp__trace *trace; /* NULL unless ddp_trace_start */
};

static pthread_mutex_t ddp__held_mu = PTHREAD_MUTEX_INITIALIZER;
static ddp__held *ddp__held_list;

/* Every call takes the lock a moment: a fork() by another thread meanwhile would leave the
   child's copy locked for good (its calls and destroys then hung), so a fork waits for it. */
static pthread_once_t ddp__held_once = PTHREAD_ONCE_INIT;
static void ddp__held_lock(void) { pthread_mutex_lock(&ddp__held_mu); }
static void ddp__held_unlock(void) { pthread_mutex_unlock(&ddp__held_mu); }
static void ddp__held_at_fork(void) { pthread_atfork(ddp__held_lock, ddp__held_unlock, ddp__held_unlock); }

static void ddp__hold(ddp__held *h, int kind, const void *owner)
{
    h->owner = owner;
    h->pid = getpid();
    h->kind = kind;
    h->ready = 0;
    pthread_once(&ddp__held_once, ddp__held_at_fork);
    pthread_mutex_lock(&ddp__held_mu);
    h->next = ddp__held_list;
    ddp__held_list = h;
    pthread_mutex_unlock(&ddp__held_mu);
}

static void ddp__unhold(ddp__held *h)
{
    ddp__held **p;
    pthread_mutex_lock(&ddp__held_mu);
    for (p = &ddp__held_list; *p && *p != h; p = &(*p)->next) {}
    if (*p) *p = h->next;
    pthread_mutex_unlock(&ddp__held_mu);
}

/* A destroy takes its state out of the list first: 1 where this call took it, 0 where the
   state is a copy that fork() made (the parent's), -1 where it is not there: another
   thread's destroy took it (nothing of it is read: it may be gone). */
static int ddp__unhold_mine(ddp__held *h)
{
    ddp__held **p;
    int took = -1;
    pthread_mutex_lock(&ddp__held_mu);
    for (p = &ddp__held_list; *p && *p != h; p = &(*p)->next) {}
    if (*p) took = h->pid == getpid();
    if (took == 1) *p = h->next;
    pthread_mutex_unlock(&ddp__held_mu);
    return took;
}

/* ... and puts it back where the destroy left it allocated */
static void ddp__rehold(ddp__held *h)
{
    pthread_mutex_lock(&ddp__held_mu);
    h->next = ddp__held_list;
    ddp__held_list = h;
    pthread_mutex_unlock(&ddp__held_mu);
}

/* The live object of this process of that kind that owner is, or NULL. */
static ddp__held *ddp__held_by(const void *owner, int kind)
{
    ddp__held *h;
    const pid_t me = getpid();
    pthread_mutex_lock(&ddp__held_mu);
    for (h = ddp__held_list; h && !(h->owner == owner && h->pid == me && h->kind == kind); h = h->next) {}
    pthread_mutex_unlock(&ddp__held_mu);
    return h;
}

/* A context's ddp_init succeeded: from now on it holds its rank. */
static void ddp__held_ready(ddp__held *h, int rank)
{
    pthread_mutex_lock(&ddp__held_mu);
    h->rank = rank;
    h->ready = 1;
    pthread_mutex_unlock(&ddp__held_mu);
}

/* Whether a ready context of this process holds that rank of that job. */
static int ddp__held_rank(const char *job_id, int rank)
{
    const ddp__held *h;
    const pid_t me = getpid();
    pthread_mutex_lock(&ddp__held_mu);
    for (h = ddp__held_list; h; h = h->next)
        if (h->pid == me && h->kind == DDP__HELD_CTX && h->ready && h->rank == rank &&
            !strcmp(((const struct ddp__state *)h)->cfg.job_id, job_id))
            break;
    pthread_mutex_unlock(&ddp__held_mu);
    return h != NULL;
}

static void ddp__default_log(void *user, int level, const char *msg)
{
    (void)user;
    fprintf(stderr, "%s%s\n", level == DDP_LOG_ERROR ? "ddp: error: " : "ddp: ", msg);
}

/* msg to the log, one call at a time (the worker thread logs too) */
static void ddp__say(const ddp_ctx *ctx, int level, const char *msg)
{
    pthread_mutex_lock(&ctx->st->log_mu);
    ctx->st->log(ctx->st->log_user, level, msg);
    pthread_mutex_unlock(&ctx->st->log_mu);
}

static void ddp__info(ddp_ctx *ctx, const char *fmt, ...) DDP__PRINTF(2, 3);
static void ddp__info(ddp_ctx *ctx, const char *fmt, ...)
{
    char msg[512];
    int n;
    va_list ap;
    if (!ctx->st->cfg.debug) return;
    n = snprintf(msg, sizeof msg, "rank %d/%d: ", ctx->rank, ctx->world_size);
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    ddp__say(ctx, DDP_LOG_INFO, msg);
}

/* The one way out of a failure: records the detail for ddp_error(), reports it
   (errors go to the log even without DDP_DEBUG), returns the code. */
static ddp_result ddp__fail(const ddp_ctx *ctx, ddp_result code, const char *fmt, ...) DDP__PRINTF(3, 4);
static ddp_result ddp__fail(const ddp_ctx *ctx, ddp_result code, const char *fmt, ...)
{
    va_list ap;
    char msg[480], text[sizeof ctx->st->err];
    if (!ctx || !ctx->st) { /* no log to keep it in (a sampler without a context): said on stderr */
        va_start(ap, fmt);
        vsnprintf(text, sizeof text, fmt, ap);
        va_end(ap);
        fprintf(stderr, "ddp: error: %s\n", text);
        return code;
    }
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap); /* the arguments may include the last error */
    va_end(ap);
    if (ctx->world_size > 0) snprintf(msg, sizeof msg, "rank %d/%d: %s", ctx->rank, ctx->world_size, text);
    else snprintf(msg, sizeof msg, "%s", text); /* before the world is known ("rank 0/0") */
    pthread_mutex_lock(&ctx->st->log_mu);
    memcpy(ctx->st->err, text, sizeof text);
    ddp__say(ctx, DDP_LOG_ERROR, msg); /* (the lock is recursive) */
    if (ctx->st->report_fd >= 0 && !ctx->st->reported) { /* the launcher blames the first rank whose failure was its own */
        int n = code == DDP_ERR_TIMEOUT && ctx->st->waited >= 0 /* and for whom it waited: the launcher names it */
                    ? snprintf(msg, sizeof msg, "\n%d %d %d\n", (int)getpid(), (int)code, ctx->st->waited)
                    : snprintf(msg, sizeof msg, "\n%d %d\n", (int)getpid(), (int)code);
        if (write(ctx->st->report_fd, msg, (size_t)n) < 0) {}
        ctx->st->reported = 1; /* the first failure says how it came about */
    }
    pthread_mutex_unlock(&ctx->st->log_mu);
    return code;
}

/* A call with no context, or one destroyed or never initialised: said on stderr (there is
   no log of its own to say it to), DDP_ERR_ARG. A collective's name gets its ddp_. */
static ddp_result ddp__no_state(const ddp_ctx *ctx, const char *call)
{
    fprintf(stderr, "ddp: error: %s%s: %s\n", strncmp(call, "ddp_", 4) ? "ddp_" : "", call,
            !ctx ? "no ddp_ctx (NULL)" : "this ddp_ctx was destroyed, or never initialised (ddp_init first)");
    return DDP_ERR_ARG;
}

static const char *const ddp__result_text[] = {
#define DDP__TEXT(name, text) text,
    DDP__RESULTS(DDP__TEXT)
#undef DDP__TEXT
};
DDP__STATIC_ASSERT(result_table, sizeof ddp__result_text / sizeof ddp__result_text[0] == DDP_RESULT_COUNT);

const char *ddp_strerror(ddp_result r)
{
    return (unsigned)r < DDP_RESULT_COUNT ? ddp__result_text[r] : "unknown ddp_result";
}

const char *ddp_error(const ddp_ctx *ctx)
{
    return !ctx ? "no context (NULL)" : !ctx->st ? "this context was destroyed, or never initialised" : ctx->st->err;
}

size_t ddp_dtype_size(ddp_dtype t) { return (unsigned)t < DDP_DTYPE_COUNT ? ddp__dtypes[t].size : 0; }

const char *ddp_dtype_name(ddp_dtype t) { return (unsigned)t < DDP_DTYPE_COUNT ? ddp__dtypes[t].name : "?"; }

static const char *const ddp__backend_names[] = {
    "default",
#define DDP__BACKEND_NAME(e, name) name,
    DDP__BACKENDS(DDP__BACKEND_NAME)
#undef DDP__BACKEND_NAME
};
DDP__STATIC_ASSERT(backend_names, sizeof ddp__backend_names / sizeof ddp__backend_names[0] == DDP_BACKEND_COUNT);

const char *ddp_backend_name(ddp_backend b)
{
    return (unsigned)b < DDP_BACKEND_COUNT ? ddp__backend_names[b] : "unknown";
}

int ddp_is_main(const ddp_ctx *ctx) { return !ctx || ctx->rank == 0; }

/* OMP_NUM_THREADS as OpenMP reads it ("4", or "4,2" for nested levels): its first
   count; 0 when it is unset, empty or not a positive number (OpenMP ignores it then). */
static long ddp__omp_num_threads(void)
{
    const char *v = getenv("OMP_NUM_THREADS");
    char *end;
    long n;
    if (!v) return 0;
    n = strtol(v, &end, 10);
    while (*end == ' ' || *end == '\t') end++;
    return end != v && n > 0 && (*end == 0 || *end == ',') ? n : 0;
}

/* OMP_NUM_THREADS past 64 threads a core (and 256): a typo, not a plan. libgomp lays out
   its team on the stack of the thread that starts it and crashes (SIGSEGV) past some
   tens of thousands (99999 here, where 30000 ran); 0, or the count, to say why. */
static int ddp__omp_too_many(char *why, size_t size)
{
    const long n = ddp__omp_num_threads();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    if (n <= 256 || n <= 64 * cores) return 0;
    snprintf(why, size, "OMP_NUM_THREADS=%ld is more threads than this machine takes (%ld: 64 for each of its %ld "
             "cores, at least 256; OpenMP crashes past some tens of thousands)", n, 64 * cores > 256 ? 64 * cores : 256,
             cores);
    return 1;
}

int ddp_thread_share(const ddp_ctx *ctx)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN), allowed = ddp__cores_allowed(), n = ddp__omp_num_threads();
    int local = ctx && ctx->local_world_size > 0 ? ctx->local_world_size : 1;
    if (n > 0) return n > 1 << 16 ? 1 << 16 : (int)n;
    if (allowed < online) return (int)(allowed > 0 ? allowed : 1); /* bound by the launcher: all of it is ours */
    return online / local > 1 ? (int)(online / local) : 1;
}

void ddp_print(const ddp_ctx *ctx, const char *fmt, ...)
{
    va_list ap;
    if ((ctx && ctx->rank != 0) || !fmt) return;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void ddp_log(const ddp_ctx *ctx, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    size_t len;
    int n = snprintf(line, sizeof line, "[rank %d/%d] ", ctx ? ctx->rank : 0, ctx ? ctx->world_size : 1), k;
    if (!fmt) return;
    va_start(ap, fmt);
    k = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    len = strlen(line);
    if (k > 0 && (size_t)(n + k) >= sizeof line) { /* cut: it still ends its line, marked (the next was glued to it) */
        memcpy(line + sizeof line - 5, "...\n", 5);
        len = sizeof line - 1;
    }
    fflush(stdout); /* one write per line keeps ranks' lines whole */
    if (write(STDOUT_FILENO, line, len) < 0) {}
}

/* ---- >>halfs ------------------------------------------------------------------------------ */
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


/* ---- >>environment -------------------------------------------------------------------------- */

/* A switch like DDP_CHECK: 1 on, 0 off (also unset or empty), -1 neither. */
static int ddp__switch(const char *v)
{
    static const char *const words[] = {"0", "false", "no", "off", "1", "true", "yes", "on"};
    int i;
    if (!v || !*v) return 0;
    for (i = 0; i < 8; i++)
        if (strcasecmp(v, words[i]) == 0) return i >= 4;
    return -1;
}

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

int ddp_restart_count(void)
{
    const char *v = getenv("TORCHELASTIC_RESTART_COUNT");
    char *end;
    long x;
    if (!v || !*v) return 0;
    errno = 0;
    x = strtol(v, &end, 10);
    return errno || *end || x < 0 || x > INT_MAX ? -1 : (int)x;
}

/* Finds --local_rank N, --local_rank=N (or --local-rank) in argv, removes it, -1 if
   absent; given twice, an error (the second went on to the program as its own). */
static ddp_result ddp__argv_local_rank(ddp_ctx *ctx, int *argc, char **argv, int *local_rank)
{
    int i, used = 0;
    *local_rank = -1;
    if (!argc || !argv) return DDP_OK;
    for (i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = NULL;
        char *end;
        long x;
        if (strcmp(a, "--") == 0) break; /* what follows is the program's, as for --nproc */
        if (strncmp(a, "--local_rank", 12) != 0 && strncmp(a, "--local-rank", 12) != 0) continue;
        if (a[12] == '=') { v = a + 13; used = 1; }
        else if (a[12] == 0 && i + 1 < *argc) { v = argv[i + 1]; used = 2; }
        else if (a[12] == 0) return ddp__fail(ctx, DDP_ERR_ENV, "--local_rank needs a value");
        else continue;
        errno = 0;
        x = strtol(v, &end, 10);
        if (errno || *end || !*v || x < 0 || x > INT_MAX)
            return ddp__fail(ctx, DDP_ERR_ENV, "--local_rank='%s' is not a non-negative integer", v);
        if (*local_rank >= 0)
            return ddp__fail(ctx, DDP_ERR_ENV, "--local_rank given twice (%d and %ld): give it once", *local_rank, x);
        *local_rank = (int)x;
        memmove(&argv[i], &argv[i + used], sizeof *argv * (size_t)(*argc - i - used + 1));
        *argc -= used;
        i--; /* the next argument is at i now */
    }
    return DDP_OK;
}

/* Slurm's tasks per node of a step, "2(x3),1": how many run on node `node` (0 if the
   list is malformed, does not reach that node or does not sum to `world`). */
static int ddp__slurm_tasks_here(const char *list, int node, int world)
{
    const char *p = list;
    long total = 0, here = 0, at = 0;
    while (*p) {
        char *end;
        long n = strtol(p, &end, 10), times = 1;
        if (end == p || n < 1 || n > world) return 0;
        p = end;
        if (p[0] == '(' && p[1] == 'x') {
            times = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || times < 1 || times > world) return 0;
            p = end + 1;
        }
        if (node >= at && node < at + times) here = n;
        at += times;
        total += n * times;
        if (total > world) return 0;
        if (*p == ',' && p[1]) p++;
        else if (*p) return 0;
    }
    return total == world ? (int)here : 0;
}

/* The launchers ddp.h understands: where each puts rank, world size, local rank,
   local world size (or a list of tasks per node), node number, and its own identity for
   this launch (so that two launches on one host never merge); `only` must be set for the
   row to count, and `foreign`, set without the row's local world size, says another
   launcher used its names; `addr` is how its users give MASTER_ADDR; `mpi`: its ranks
   can form an MPI group (torchrun's workers inherit the variables of an mpirun or srun
   that started torchrun, and MPI_Init in them fails or waits forever); `pmi`: its ranks
   ask Hydra over PMI_FD (PMI-1) for the launch's name and rank 0's host. The innermost
   launcher comes first: inside a Slurm allocation, mpirun and mpiexec start their ranks
   with Slurm's variables still set (the batch script's, or those of the step srun made
   for their daemons, where every rank of a host has one SLURM_PROCID). Slurm's count only
   in a task of a step (the batch script and salloc's shell have no SLURM_STEP_ID); srun's
   PMI-2 sets PMI_RANK too, with PMI_JOBID (Hydra sets MPI_LOCALNRANKS instead), and its
   PMI_FD speaks another protocol than Hydra's. */
static const struct ddp__launcher {
    const char *who, *rank, *world, *local_rank, *local_world, *per_node, *node, *run_id, *run_id2, *only, *foreign,
        *addr;
    int mpi, pmi;
} ddp__launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", NULL, "GROUP_RANK", "TORCHELASTIC_RUN_ID", NULL,
     NULL, NULL, NULL, 0, 0},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", NULL, NULL, "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", NULL, NULL,
     "mpirun -x MASTER_ADDR=HOST", 1, 0},
    {"MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", NULL, NULL, "PMI_KVSNAME", NULL, NULL,
     "PMI_JOBID", "mpiexec -genv MASTER_ADDR HOST", 1, 1},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID",
     "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_ID", NULL, NULL, 1, 0},
};

/* A variable's value, NULL where unset or empty (an empty RANK= counts as unset, as an
   empty OMP_NUM_THREADS does, rather than hiding the launcher that started the rank). */
static const char *ddp__env(const char *name)
{
    const char *v = name ? getenv(name) : NULL;
    return v && *v ? v : NULL;
}

/* An MPI launcher's variables, set for this process or for one that started it. */
static int ddp__mpi_vars(void) { return ddp__env("OMPI_COMM_WORLD_SIZE") || ddp__env("PMI_SIZE") || ddp__env("PMIX_RANK"); }

/* The first launcher from row `from` on whose variables count here, or NULL. */
static const struct ddp__launcher *ddp__launcher_from(size_t from)
{
    size_t i;
    for (i = from; i < sizeof ddp__launchers / sizeof ddp__launchers[0]; i++) {
        const struct ddp__launcher *l = &ddp__launchers[i];
        if ((ddp__env(l->rank) || ddp__env(l->world)) && (!l->only || ddp__env(l->only)) &&
            !(ddp__env(l->foreign) && !ddp__env(l->local_world)))
            return l;
    }
    return NULL;
}

static const struct ddp__launcher *ddp__launcher_here(void) { return ddp__launcher_from(0); }

/* Another launcher's count of more than one task (mpirun, srun) beside torchrun's names,
   or NULL: ddp__around whoever set them; ddp__outer only where they were set by hand
   (left in the shell, ddp's launcher), as a real torchrun per task (its run id set) may
   be a sweep of separate jobs, each on its own port. */
static const struct ddp__launcher *ddp__around(const struct ddp__launcher *l)
{
    const struct ddp__launcher *o = l == ddp__launchers ? ddp__launcher_from(1) : NULL;
    const char *w = o ? ddp__env(o->world) : NULL;
    return w && strcmp(w, "1") != 0 ? o : NULL;
}
static const struct ddp__launcher *ddp__outer(const struct ddp__launcher *l)
{
    return ddp__env("TORCHELASTIC_RUN_ID") ? NULL : ddp__around(l);
}

/* Rank, world size and local topology: from the desc, else from the first launcher
   whose variables are set, else a world of one. -1 marks "derive later". */
static ddp_result ddp__topology(ddp_ctx *ctx, const ddp_desc *d, const struct ddp__launcher **found)
{
    const char *who = "defaults (no launcher's variables set)", *rank_name = "rank", *world_name = "world_size", *v;
    const struct ddp__launcher *l = NULL, *o;
    int argv_local = -1, here, world = 1;
    ddp_result bad, r = ddp__argv_local_rank(ctx, d->argc, d->argv, &argv_local);
    if (r != DDP_OK) return r;
    *found = NULL;
    ctx->rank = 0; /* the world stays 0 in ctx until it is known: errors about it carry no "rank r/w" */
    ctx->local_rank = ctx->local_world_size = ctx->node_rank = -1;
    if (d->world_size > 0) {
        who = "ddp_desc";
        ctx->rank = d->rank;
        world = d->world_size;
        ctx->local_world_size = d->local_world_size ? d->local_world_size : d->world_size;
        ctx->local_rank = d->local_rank ? d->local_rank : argv_local >= 0 ? argv_local
                          : d->local_world_size > 0 ? d->rank % d->local_world_size : d->rank;
    } else {
        if ((l = ddp__launcher_here()) != NULL) {
            int hr = ddp__env_int(ctx, l->rank, &ctx->rank), hw = ddp__env_int(ctx, l->world, &world);
            int hlr, hlw, hn;
            const char *bad;
            if (hr < 0 || hw < 0) return DDP_ERR_ENV;
            if (hr != hw)
                return ddp__fail(ctx, DDP_ERR_ENV, "%s is set but %s is not (%s)", hr ? l->rank : l->world,
                                 hr ? l->world : l->rank, l->who);
            who = getenv("DDP_LAUNCHER") && l == ddp__launchers ? "ddp's launcher" : l->who;
            rank_name = l->rank;
            world_name = l->world;
            if ((hlr = ddp__env_int(ctx, l->local_rank, &ctx->local_rank)) < 0 ||
                (hlw = ddp__env_int(ctx, l->local_world, &ctx->local_world_size)) < 0 ||
                (hn = ddp__env_int(ctx, l->node, &ctx->node_rank)) < 0)
                return DDP_ERR_ENV;
            bad = hlr && ctx->local_rank < 0                        ? l->local_rank
                  : hlw && ctx->local_world_size < 1                ? l->local_world
                  : hn && (ctx->node_rank < 0 || ctx->node_rank >= world) ? l->node
                                                                    : NULL;
            if (bad)
                return ddp__fail(ctx, DDP_ERR_ENV, "%s=%s does not fit a world of %d (%s)", bad, ddp__env(bad),
                                 world, who);
            /* torchrun's names for one node inside mpirun or srun of several tasks: each
               task would be a job of its own */
            if ((o = ddp__outer(l)) && (world == 1 || ctx->local_world_size == world)) {
                if (getenv("DDP_LAUNCHER")) /* ddp's launcher started mpirun or srun: each of its ranks a job */
                    return ddp__fail(ctx, DDP_ERR_ENV, "ddp's launcher started %s, whose %s tasks share one %s=%d: "
                                     "start the ranks with one launcher (--nproc N, or %s alone)", o->who,
                                     ddp__env(o->world), l->rank, ctx->rank, o->who);
                return ddp__fail(ctx, DDP_ERR_ENV, "%s=%d (one node of %s's) inside a job of %s tasks started by %s: each "
                                 "task would train alone; unset %s and %s, or start one task", l->world, world,
                                 l->who, ddp__env(o->world), o->who, l->rank, l->world);
            }
            *found = l;
        } else if (getenv("SLURM_JOB_ID") && (v = getenv("SLURM_NTASKS")) && strcmp(v, "1") != 0) {
            /* outside a step: Slurm's variables describe the allocation, not this process */
            return ddp__fail(ctx, DDP_ERR_ENV, "started by Slurm's batch script or salloc's shell (SLURM_NTASKS=%s, "
                             "no SLURM_STEP_ID), which run once: start the ranks with srun, or --nproc N on one host", v);
        }
        if (argv_local >= 0) { /* torch.distributed.launch */
            if (ctx->local_rank >= 0 && ctx->local_rank != argv_local)
                return ddp__fail(ctx, DDP_ERR_ENV, "--local_rank %d in the arguments, but %s=%d (%s): two launchers "
                                 "gave this process different local ranks", argv_local, l->local_rank, ctx->local_rank, who);
            ctx->local_rank = argv_local;
        }
        /* Slurm gives no local world size but a list per node: knowing it now lets the
           backend be chosen before the ranks meet (MPI where a step spans hosts) */
        if (l && l->per_node && ctx->node_rank >= 0 && (v = getenv(l->per_node)) &&
            (here = ddp__slurm_tasks_here(v, ctx->node_rank, world)) > 0)
            ctx->local_world_size = here; /* else derived from the hosts */
    }
    bad = d->world_size > 0 ? DDP_ERR_ARG : DDP_ERR_ENV; /* the caller's values, or a launcher's */
    if (world < 1)
        return ddp__fail(ctx, bad, "%s=%d must be at least 1 (%s)", world_name, world, who);
    if (world > DDP__MAX_WORLD)
        return ddp__fail(ctx, bad, "%s=%d is more ranks than ddp.h takes (%d at most; %s)", world_name,
                         world, DDP__MAX_WORLD, who);
    if (ctx->rank < 0 || ctx->rank >= world)
        return ddp__fail(ctx, bad, "%s=%d is outside 0..%d (%s=%d, %s)", rank_name, ctx->rank,
                         world - 1, world_name, world, who);
    { /* named as the launcher (or the desc) gave them; a value not given is not said */
        const char *lr = argv_local >= 0 ? "--local_rank" : l && l->local_rank ? l->local_rank : "local_rank",
                   *lw = l && l->local_world ? l->local_world : "local_world_size";
        if (ctx->local_world_size > world)
            return ddp__fail(ctx, bad, "%s=%d is more than %s=%d (%s)", lw, ctx->local_world_size, world_name,
                             world, who);
        if (ctx->local_rank >= world)
            return ddp__fail(ctx, bad, "%s=%d is outside 0..%d (%s=%d, %s)", lr, ctx->local_rank,
                             world - 1, world_name, world, who);
        if (ctx->local_world_size > 0 && ctx->local_rank >= ctx->local_world_size)
            return ddp__fail(ctx, bad, "%s=%d is outside 0..%d (%s=%d, %s)", lr, ctx->local_rank,
                             ctx->local_world_size - 1, lw, ctx->local_world_size, who);
    }
    /* what a launcher said, for the ranks to check against each other (the desc is the
       program's own word: it may rehearse hosts on one machine, and cannot name nodes) */
    ctx->st->cfg.said[0] = d->world_size > 0 ? -1 : ctx->node_rank;
    ctx->st->cfg.said[1] = d->world_size > 0 ? -1 : ctx->local_rank;
    ctx->st->cfg.said[2] = d->world_size > 0 ? -1 : ctx->local_world_size;
    if (world == 1) {
        if (ctx->local_rank < 0) ctx->local_rank = 0;
        ctx->local_world_size = 1;
        ctx->node_rank = 0;
        ctx->num_nodes = 1;
    }
    ctx->world_size = world;
    ddp__info(ctx, "rank %d of %d from %s", ctx->rank, world, who);
    return DDP_OK;
}

/* The first host of a Slurm host list: "node[01-04,07]" -> "node01", "a1,b[2-3]" -> "a1",
   "gpu[3-4]-ib" -> "gpu3-ib". 0 if the list is empty or malformed. */
static int ddp__slurm_first_host(const char *list, char *out, size_t size)
{
    const char *open = NULL, *p;
    size_t n = 0;
    for (p = list; *p && *p != ','; p++)
        if (*p == '[') { open = p; break; }
    if (!open) {
        n = (size_t)(p - list);
        if (n == 0 || n >= size) return 0;
        memcpy(out, list, n);
        out[n] = 0;
        return 1;
    }
    n = (size_t)(open - list);
    if (n >= size) return 0;
    memcpy(out, list, n); /* the prefix, then the first number of the first range */
    for (p = open + 1; *p >= '0' && *p <= '9'; p++) {
        if (n + 1 >= size) return 0;
        out[n++] = *p;
    }
    if (p == open + 1 || !strchr(p, ']')) return 0;
    p = strchr(p, ']') + 1;
    while (*p && *p != ',' && n + 1 < size) out[n++] = *p++; /* a suffix after the brackets */
    out[n] = 0;
    return 1;
}

/* Every setting, from the desc, else the environment, else the default, validated:
   the one place that reads DDP_* variables (sokol's desc defaults). */
static ddp_result ddp__resolve(ddp_ctx *ctx, const ddp_desc *d, const struct ddp__launcher *l)
{
    ddp__settings *s = &ctx->st->cfg;
    const char *v;
    /* the job: two launches never share an id, so their ranks never merge (nor would two
       ids that differ only past what the id holds: refused) */
    size_t whole = 0;
    s->job_from = "default";
    if (d->job_id && *d->job_id) {
        whole = ddp__copy(s->job_id, sizeof s->job_id, d->job_id);
        s->job_from = "ddp_desc";
    } else if ((v = getenv("DDP_JOB_ID")) && *v) {
        whole = ddp__copy(s->job_id, sizeof s->job_id, v);
        s->job_from = "DDP_JOB_ID";
    } else if (l && (v = getenv(l->run_id)) && *v) {
        const char *v2 = l->run_id2 ? getenv(l->run_id2) : NULL;
        whole = (size_t)snprintf(s->job_id, sizeof s->job_id, "%s%s%s", v, v2 ? "." : "", v2 ? v2 : "");
        s->job_from = l->run_id;
    } else {
        ddp__copy(s->job_id, sizeof s->job_id, "ddp");
    }
    if (whole >= sizeof s->job_id)
        return ddp__fail(ctx, strcmp(s->job_from, "ddp_desc") == 0 ? DDP_ERR_ARG : DDP_ERR_ENV,
                         "the job id from %s is longer than %d bytes", s->job_from, (int)sizeof s->job_id - 1);
    if (ddp_restart_count() < 0)
        return ddp__fail(ctx, DDP_ERR_ENV, "TORCHELASTIC_RESTART_COUNT='%s' is not a restart count",
                         getenv("TORCHELASTIC_RESTART_COUNT"));
    v = d->secret ? d->secret : getenv("DDP_SECRET");
    if (v && strlen(v) >= sizeof s->secret)
        return ddp__fail(ctx, DDP_ERR_ENV, "DDP_SECRET is longer than %d bytes", (int)sizeof s->secret - 1);
    ddp__copy(s->secret, sizeof s->secret, v ? v : "");
    if (d->timeout_ms < 0) return ddp__fail(ctx, DDP_ERR_ARG, "ddp_desc.timeout_ms=%d is negative", d->timeout_ms);
    s->timeout_ms = d->timeout_ms;
    if (!s->timeout_ms && (v = getenv("DDP_TIMEOUT")) && *v) {
        char *end;
        double sec = strtod(v, &end);
        if (*end || strpbrk(v, "xX") || !(sec >= 0.001) || sec > 1e6) /* strtod also reads hex */
            return ddp__fail(ctx, DDP_ERR_ENV, "DDP_TIMEOUT='%s' is not a number of seconds from 0.001 to 1e6", v);
        s->timeout_ms = (int)(sec * 1000 + 0.5);
    }
    if (!s->timeout_ms) s->timeout_ms = DDP__DEFAULT_TIMEOUT_MS;
    {
        char why[256];
        if (ddp__omp_too_many(why, sizeof why)) return ddp__fail(ctx, DDP_ERR_ENV, "%s", why);
    }
    s->chunk = d->shm_chunk_bytes;
    if (s->chunk && (s->chunk < 64 || s->chunk > ((size_t)1 << 30)))
        return ddp__fail(ctx, DDP_ERR_ARG, "ddp_desc.shm_chunk_bytes=%zu must be a byte count from 64 to 2^30", s->chunk);
    if (!s->chunk && (v = getenv("DDP_SHM_CHUNK")) && *v) {
        char *end;
        unsigned long long x = strtoull(v, &end, 10); /* which takes "-18446744073709551552" as 64 */
        if (*end || *v < '0' || *v > '9' || x < 64 || x > (1ull << 30))
            return ddp__fail(ctx, DDP_ERR_ENV, "DDP_SHM_CHUNK='%s' must be a byte count from 64 to 2^30", v);
        s->chunk = (size_t)x;
    }
    if ((s->chunk_default = !s->chunk)) s->chunk = DDP__DEFAULT_CHUNK;
    /* room for one element of every rank's block (reduce_scatter), 64-byte aligned */
    if (s->chunk < (size_t)ctx->world_size * 8) s->chunk = (size_t)ctx->world_size * 8;
    s->chunk = (s->chunk + 63) & ~(size_t)63;
    { /* DDP_CHECK=off must not turn the check on */
        const int check = ddp__switch(getenv("DDP_CHECK")), debug = ddp__switch(getenv("DDP_DEBUG"));
        if (check < 0 || debug < 0)
            return ddp__fail(ctx, DDP_ERR_ENV, "%s='%s' is neither on (1, true, yes, on) nor off (0, false, no, off)",
                             check < 0 ? "DDP_CHECK" : "DDP_DEBUG", getenv(check < 0 ? "DDP_CHECK" : "DDP_DEBUG"));
        s->check = d->check ? d->check != 0 : check;
        s->debug = debug;
    }
    s->backend = d->backend;
    s->backend_why = "ddp_desc.backend";
    if (!s->backend && (v = getenv("DDP_BACKEND")) && *v) {
        int b;
        for (b = 1; b < DDP_BACKEND_COUNT && strcmp(v, ddp__backend_names[b]) != 0; b++) {}
        if (b == DDP_BACKEND_COUNT)
            return ddp__fail(ctx, DDP_ERR_ENV, "DDP_BACKEND='%s' is not a backend (cpu, nccl, mpi)", v);
        s->backend = (ddp_backend)b;
        s->backend_why = "DDP_BACKEND";
    }
    if ((unsigned)s->backend >= DDP_BACKEND_COUNT)
        return ddp__fail(ctx, DDP_ERR_ARG, "ddp_desc.backend=%d is not a backend", (int)s->backend);
    return DDP_OK;
}

/* MPI started in this process (it then finalizes Hydra's PMI connection itself). Without
   -DDDP_MPI, a weak reference finds MPI_Initialized only where the program links MPI. */
#ifdef DDP_MPI
static int ddp__mpi_started(void)
{
    int flag = 0;
    return MPI_Initialized(&flag) == MPI_SUCCESS && flag;
}
#elif defined(__GNUC__)
#ifdef __cplusplus
extern "C"
#endif
int MPI_Initialized(int *flag) __attribute__((weak));
static int ddp__mpi_started(void)
{
    int flag = 0;
    return MPI_Initialized && MPI_Initialized(&flag) == 0 && flag;
}
#else
static int ddp__mpi_started(void) { return 1; } /* cannot tell: leave the connection to MPI */
#endif

/* One PMI-1 command and its one-line answer (commands and answers are "cmd=... \n"; the
   answer without its newline), waiting wait_ms at most. */
static int ddp__pmi_ask(int fd, const char *cmd, char *line, size_t n, int wait_ms)
{
    int64_t deadline = ddp__now_ms() + wait_ms;
    size_t got = 0;
    line[0] = 0;
    if (ddp__write_all(fd, cmd, strlen(cmd), deadline) != 0) return 0;
    while (got + 1 < n && ddp__read_all(fd, line + got, 1, deadline) == 0)
        if (line[got++] == '\n') break;
    line[got] = 0;
    if (!got || line[got - 1] != '\n') return 0;
    line[got - 1] = 0;
    return 1;
}

/* The value after "key=" in a PMI answer, cut at its end, or NULL. */
static char *ddp__pmi_field(char *line, const char *key)
{
    char *v = strstr(line, key);
    if (!v) return NULL;
    v += strlen(key);
    v[strcspn(v, " ")] = 0;
    return v;
}

/* Hydra's PMI connection (PMI-1 over PMI_FD) and the launch's kvsname, which Hydra puts
   in no variable though it is the same on every host. Hydra accepts a second init from
   MPI later, so the connection stays usable; ddp__pmi_done finalizes it. NULL where
   there is no Hydra to ask. */
static const char *ddp__pmi_kvsname(ddp_ctx *ctx)
{
    struct ddp__state *st = ctx->st;
    struct stat sb;
    char line[300], *name, *end = NULL;
    const char *v = getenv("PMI_FD");
    long fd = v ? strtol(v, &end, 10) : -1;
    if (st->pmi_kvs[0]) return st->pmi_kvs;
    if (!v || !*v || *end || fd < 0 || fd > INT_MAX || fstat((int)fd, &sb) != 0 || !S_ISSOCK(sb.st_mode)) return NULL;
    if (st->pmi_fd < 0) {
        if (!ddp__pmi_ask((int)fd, "cmd=init pmi_version=1 pmi_subversion=1\n", line, sizeof line, 5000) ||
            !strstr(line, "rc=0"))
            return NULL;
        st->pmi_fd = (int)fd; /* Hydra now expects a finalize from this process */
    }
    if (!ddp__pmi_ask(st->pmi_fd, "cmd=get_my_kvsname\n", line, sizeof line, 5000) ||
        !(name = ddp__pmi_field(line, "kvsname=")) || !*name || strlen(name) >= sizeof st->pmi_kvs)
        return NULL;
    ddp__copy(st->pmi_kvs, sizeof st->pmi_kvs, name);
    return st->pmi_kvs;
}

/* Hydra says nothing of where rank 0 runs: rank 0 puts its host's name in the launch's
   key-value space (Hydra's own name for the host, as mpiexec's -hosts or -iface gave it,
   else gethostname), every rank passes PMI's barrier and reads it (a second context
   puts the key again: the value after the latest barrier counts). The name in out, or
   "" without Hydra to ask (the caller then says how to set MASTER_ADDR). */
static ddp_result ddp__pmi_master(ddp_ctx *ctx, char *out, size_t n)
{
    struct ddp__state *st = ctx->st;
    const char *kvs = ddp__pmi_kvsname(ctx), *name = getenv("MPIR_CVAR_CH3_INTERFACE_HOSTNAME");
    char cmd[600], line[600], host[256] = "", *v;
    int64_t start = ddp__now_ms();
    *out = 0;
    if (!kvs) return DDP_OK;
    if (ctx->rank == 0) {
        if (!name || !*name) {
            if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
            name = host;
        }
        if (!*name || strlen(name) >= n || name[strcspn(name, " =\t\r\n")])
            return ddp__fail(ctx, DDP_ERR_ENV, "MASTER_ADDR is not set and this host's name '%s' cannot be passed on "
                             "(mpiexec -genv MASTER_ADDR HOST)", name);
        snprintf(cmd, sizeof cmd, "cmd=put kvsname=%s key=ddp-master value=%s\n", kvs, name);
        if (!ddp__pmi_ask(st->pmi_fd, cmd, line, sizeof line, 5000) || !strstr(line, "rc=0"))
            return ddp__fail(ctx, DDP_ERR_ENV, "Hydra's PMI refused rank 0's host: '%.100s'", line);
    }
    if (!ddp__pmi_ask(st->pmi_fd, "cmd=barrier_in\n", line, sizeof line, st->cfg.timeout_ms) ||
        !strstr(line, "barrier_out")) {
        if (*line || ddp__now_ms() - start < st->cfg.timeout_ms)
            return ddp__fail(ctx, DDP_ERR_ENV, "Hydra's PMI barrier, where every rank learns rank 0's host, failed: "
                             "'%.100s'", line);
        return ddp__fail(ctx, DDP_ERR_TIMEOUT, "timed out after %.*f s in Hydra's PMI barrier, where every rank learns "
                         "rank 0's host (or mpiexec -genv MASTER_ADDR HOST)", DDP__SECONDS(st->cfg.timeout_ms));
    }
    snprintf(cmd, sizeof cmd, "cmd=get kvsname=%s key=ddp-master\n", kvs);
    if (!ddp__pmi_ask(st->pmi_fd, cmd, line, sizeof line, 5000) || !strstr(line, "rc=0") ||
        !(v = ddp__pmi_field(line, "value=")) || !*v || strlen(v) >= n)
        return ddp__fail(ctx, DDP_ERR_ENV, "rank 0's host is not in Hydra's PMI: '%.100s'", line);
    ddp__copy(out, n, v);
    return DDP_OK;
}

/* Hydra stops every rank of a host when a process that spoke PMI exits without a
   finalize: send it, unless MPI owns the connection (its MPI_Finalize sends one) or the
   group failed for want of a rank (a timeout, a rank gone): then that stop is wanted, as
   a rank stuck for good kept the job forever. A failure every rank meets alike (settings,
   arguments) is finalized: Hydra lets each rank say it before the job ends. */
static void ddp__pmi_done(ddp_ctx *ctx)
{
    char line[100];
    const ddp_result b = ctx->st->broken;
    if (ctx->st->pmi_fd >= 0 && !ddp__mpi_started() && b != DDP_ERR_TIMEOUT && b != DDP_ERR_PEER && b != DDP_ERR_ABORTED)
        ddp__pmi_ask(ctx->st->pmi_fd, "cmd=finalize\n", line, sizeof line, 5000);
    ctx->st->pmi_fd = -1; /* left open: a later write fails at once instead of reaching another file */
}

/* What a job across hosts that chose the CPU backend (one host's) can do instead. */
static const char *ddp__spans_hosts(const ddp_ctx *ctx)
{
#ifdef DDP_MPI
    return ctx->st->cfg.mpi_launch ? "the MPI backend spans hosts (DDP_BACKEND=mpi)"
           : ddp__mpi_vars() ? "MPI cannot group the workers of a launcher (torchrun, --nproc) that an MPI "
                               "launcher started: start every rank with mpirun or srun --mpi=pmix itself"
                             : "start it with an MPI launcher (mpirun, srun --mpi=pmix) for the MPI backend";
#else
    (void)ctx;
    return "build it with mpicc -DDDP_MPI for the MPI backend, which spans hosts";
#endif
}

/* Where rank 0's store listens: only a job that meets through the store needs it. */
static ddp_result ddp__resolve_store(ddp_ctx *ctx, const ddp_desc *d, const struct ddp__launcher *l)
{
    ddp__settings *s = &ctx->st->cfg;
    const char *addr = d->master_addr ? d->master_addr : getenv("MASTER_ADDR");
    const char *v;
    int port = d->master_port, set;
    char first[256];
    int hydra = l && l->pmi;
    ddp_result r;
    if (!strcmp(s->job_from, "default") && hydra && (v = ddp__pmi_kvsname(ctx)) && strlen(v) < sizeof s->job_id) {
        ddp__copy(s->job_id, sizeof s->job_id, v);
        s->job_from = "Hydra's kvsname (PMI_FD)";
    }
    if ((!addr || !*addr) && ctx->local_world_size == ctx->world_size)
        addr = "127.0.0.1"; /* the launcher says every rank is on this host */
    if ((!addr || !*addr) && hydra) { /* before Slurm's hosts: mpiexec may use some of them */
        if ((r = ddp__pmi_master(ctx, first, sizeof first)) != DDP_OK) return r;
        if (*first) addr = first;
    }
    if ((!addr || !*addr) && ((v = getenv("SLURM_STEP_NODELIST")) || (v = getenv("SLURM_JOB_NODELIST")) ||
                              (v = getenv("SLURM_NODELIST"))) && ddp__slurm_first_host(v, first, sizeof first))
        addr = first; /* Slurm: the first host of the step (or of the allocation) runs rank 0 */
    if ((!addr || !*addr) && ctx->backend == DDP_BACKEND_CPU && ctx->local_world_size > 0 &&
        ctx->local_world_size < ctx->world_size) /* an address would not help: say what would */
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the CPU backend runs on one host, but this job spans hosts (%d of its %d "
                         "ranks on this one): %s", ctx->local_world_size, ctx->world_size, ddp__spans_hosts(ctx));
    if (!addr || !*addr) {
        char how[64] = "";
        if (l && l->addr) snprintf(how, sizeof how, " (%s)", l->addr);
        return ddp__fail(ctx, DDP_ERR_ENV, "MASTER_ADDR is not set: a world of %d needs the address of rank 0's host%s",
                         ctx->world_size, how);
    }
    if (!port) {
        if ((set = ddp__env_int(ctx, "MASTER_PORT", &port)) < 0) return DDP_ERR_ENV;
        if (set && (port < 1 || port > 65535)) /* as given, before torchrun's + 1 below */
            return ddp__fail(ctx, DDP_ERR_ENV, "MASTER_PORT=%d is not a TCP port", port);
        /* without a port, one from the launch's identity: two jobs on a host differ.
           20000-32767, below Linux's ephemeral ports, where a connection's own end may sit */
        if (!set) port = strcmp(s->job_from, "default") ? 20000 + (int)(ddp__hash(s->job_id) % 12768) : DDP__DEFAULT_PORT;
        /* torchrun's agent already serves its own store on MASTER_PORT */
        else if (getenv("TORCHELASTIC_RUN_ID")) {
            if (port == 65535)
                return ddp__fail(ctx, DDP_ERR_ENV, "MASTER_PORT=65535: under torchrun the store takes MASTER_PORT+1, "
                                 "which is no TCP port");
            port++;
        }
    }
    if (port < 1 || port > 65535) return ddp__fail(ctx, DDP_ERR_ENV, "MASTER_PORT=%d is not a TCP port", port);
    if (strlen(addr) >= sizeof s->master_addr)
        return ddp__fail(ctx, addr == d->master_addr ? DDP_ERR_ARG : DDP_ERR_ENV, "%s is longer than %d bytes",
                         addr == d->master_addr ? "ddp_desc.master_addr" : "MASTER_ADDR", (int)sizeof s->master_addr - 1);
    ddp__copy(s->master_addr, sizeof s->master_addr, addr);
    s->master_port = port;
    return DDP_OK;
}

/* Names the first setting two ranks disagree on, e.g. "shm_chunk=1048576" vs "=65536". */
static ddp_result ddp__agree(ddp_ctx *ctx, int other, const char *theirs)
{
    static const struct { const char *name, *hint; } hints[] = {
        {"ddp.h", "build every rank with one ddp.h"}, {"backend", "DDP_BACKEND or ddp_desc.backend"},
        {"shm_chunk", "DDP_SHM_CHUNK or ddp_desc.shm_chunk_bytes"}, {"check", "DDP_CHECK or ddp_desc.check"}};
    const char *mine = ctx->st->cfg.agree, *a = mine, *b = theirs;
    char fa[96], fb[96];
    size_t i;
    if (strcmp(mine, theirs) == 0) return DDP_OK;
    while (*a && *b) { /* space-separated name=value fields, in one order on every rank */
        size_t na = strcspn(a, " "), nb = strcspn(b, " ");
        if (na != nb || memcmp(a, b, na) != 0) break;
        a += na + (a[na] == ' ');
        b += nb + (b[nb] == ' ');
    }
    snprintf(fa, sizeof fa, "%.*s", (int)strcspn(a, " "), a);
    snprintf(fb, sizeof fb, "%.*s", (int)strcspn(b, " "), b);
    for (i = 0; i < sizeof hints / sizeof hints[0]; i++)
        if (strncmp(fa, hints[i].name, strlen(hints[i].name)) == 0) break;
    return ddp__fail(ctx, DDP_ERR_MISMATCH, "ranks disagree on a setting that must match: rank %d has %s, rank %d has %s%s%s%s",
                     ctx->rank, fa, other, fb, i < sizeof hints / sizeof hints[0] ? " (" : "",
                     i < sizeof hints / sizeof hints[0] ? hints[i].hint : "", i < sizeof hints / sizeof hints[0] ? ")" : "");
}

/* The GPU a rank drives on NCCL, of the `visible` ones (CUDA_VISIBLE_DEVICES is `cvd`):
   the only one when it sees one (Slurm's per-task binding, a CUDA_VISIBLE_DEVICES per
   rank), else GPU local_rank, as torch.cuda.set_device(local_rank) would. -1 with the
   reason in `why` when local_rank is past the visible ones. The NCCL backend's rule,
   here without CUDA so that every build can test it (inline: unused builds stay quiet). */
static inline int ddp__device_for(int local_rank, int visible, const char *cvd, char *why, size_t n)
{
    if (visible == 1) return 0;
    if (local_rank >= 0 && local_rank < visible) return local_rank;
    snprintf(why, n, "local rank %d has no GPU of its own: %d are visible (CUDA_VISIBLE_DEVICES=%s%s%s); give each "
             "rank one GPU, or make at least as many visible as there are ranks on the host", local_rank, visible,
             cvd ? "'" : "", cvd ? cvd : "unset", cvd ? "'" : "");
    return -1;
}

/* ---- >>store ---------------------------------------------------------------------------------
   A key-value server on rank 0, for rendezvous and the rare host-side meeting.
   Message: 16-byte header {magic, op or status, key length, value length} in network
   order, then key and value. A connection first says HELLO (job id, rank, world size,
   a nonce); with a secret the server answers with a challenge and both sides prove
   they know the secret (HMAC-SHA256 over both nonces) before the rank is admitted.
   Then: SET, GET (waits on the server until the key exists: nobody polls) and GATHER
   (every rank sends a value; all get all of them at once; the entry is deleted, so a
   job of a million barriers holds no more than a job of one).
   A stranger can make the server hold at most a 1 KiB buffer for at most
   DDP__STORE_HELLO_MS, and only DDP__STORE_PENDING of them at a time (the oldest
   makes room); a refused connection never affects the job, unless it proved it is of
   this job (its id, and the secret if there is one) and yet cannot be one of its
   ranks: then two launches share the port, and the job stops. An admitted rank may
   make it hold DDP__STORE_QUOTA bytes, and one request at a time. */

#define DDP__MAGIC 0x44445053u /* "DDPS" */
#define DDP__MAX_KEY 1024u
#define DDP__MAX_VALUE (256u << 10)
#define DDP__HELLO_MAX 1024u   /* a whole message before a peer is admitted */
enum { DDP__HELLO = 1, DDP__AUTH, DDP__SET, DDP__GET, DDP__GATHER };
enum { DDP__ST_OK = 0, DDP__ST_ERROR = 1, DDP__ST_CHALLENGE = 2 };

typedef struct ddp__conn {
    int fd, rank;            /* rank >= 0 once admitted */
    int claim, world;        /* the rank (and world size) a challenged connection asks for, else -1 */
    int64_t born, since;     /* accepted; first byte of the message being read (0: none) */
    char *buf;
    size_t len, cap, held;   /* held: bytes of the store this rank owns */
    char *wait_key;          /* a GET or GATHER this rank waits on */
    char nonce[2][33];       /* client's, server's */
} ddp__conn;
typedef struct ddp__kv { char *key, *val; uint32_t vlen; int owner; } ddp__kv;
typedef struct ddp__gather { char *key; char **part; uint32_t *plen; int arrived; } ddp__gather;

struct ddp__server {
    int listen_fd, wake[2], world;
    char job_id[128], secret[256];
    char own[33];            /* rank 0's own hello nonce: another claim to rank 0 is a second job */
    pthread_t thread;
    pthread_mutex_t mu;      /* held while the thread works: rank 0's thread reads who is missing */
    unsigned char *joined;   /* per rank: admitted once */
    char refused[300];       /* why processes that named a rank were refused, for rank 0's messages */
    int nrefused;
    int failed;              /* atomic: broken[] is final; rank 0's next collective fails with it */
    ddp__conn *conns; int nconns, cap;
    ddp__kv *kv; int nkv, kvcap;
    ddp__gather *gathers; int ngathers, gcap;
    int closing;             /* the job is shutting down: disconnects are expected */
    int64_t stop_deadline;   /* set once rank 0 leaves: stop when everyone is gone */
    char broken[300];        /* why the job can no longer make progress */
    char farewell[200];      /* why rank 0 leaves, when it fails */
    char loopback[300];      /* set where the store listens on loopback in a job of several hosts */
    int spare_fd;            /* given up for an instant when out of descriptors, to turn a caller away */
    int64_t listen_pause;    /* without one: the listener is not polled until then (no spinning) */
};

/* grows an array of n elements to hold n + 1; NULL when out of memory */
static void *ddp__reserve(void *p, int n, int *cap, size_t elem)
{
    void *q;
    if (n < *cap) return p;
    q = DDP_MALLOC(elem * (size_t)(*cap ? 2 * *cap : 8));
    if (!q) return NULL;
    if (n) memcpy(q, p, elem * (size_t)n);
    DDP_FREE(p);
    *cap = *cap ? 2 * *cap : 8;
    return q;
}

static char *ddp__strdup(const char *s)
{
    char *d = DDP__CAST(char *, DDP_MALLOC(strlen(s) + 1));
    if (d) strcpy(d, s);
    return d;
}

static void ddp__reply(int fd, uint32_t status, const void *val, uint32_t vlen)
{
    uint32_t h[4];
    h[0] = htonl(DDP__MAGIC); h[1] = htonl(status); h[2] = 0; h[3] = htonl(vlen);
    /* a peer that does not read within 10 s is dropped by its own timeout anyway */
    if (ddp__write_all(fd, h, sizeof h, ddp__now_ms() + 10000) == 0 && vlen)
        ddp__write_all(fd, val, vlen, ddp__now_ms() + 10000);
}

static void ddp__reply_text(int fd, uint32_t status, const char *text)
{
    ddp__reply(fd, status, text, (uint32_t)strlen(text));
}

static ddp__kv *ddp__kv_find(ddp__server *s, const char *key)
{
    int i;
    for (i = 0; i < s->nkv; i++)
        if (strcmp(s->kv[i].key, key) == 0) return &s->kv[i];
    return NULL;
}

static void ddp__gather_free(ddp__server *s, int i)
{
    ddp__gather *g = &s->gathers[i];
    int r;
    for (r = 0; r < s->world; r++) DDP_FREE(g->part[r]);
    DDP_FREE(g->part); DDP_FREE(g->plen); DDP_FREE(g->key);
    s->gathers[i] = s->gathers[--s->ngathers];
}

static void ddp__server_break(ddp__server *s, const char *why)
{
    int i;
    if (s->broken[0] || s->closing) return;
    ddp__copy(s->broken, sizeof s->broken, why);
    __atomic_store_n(&s->failed, 1, __ATOMIC_RELEASE);
    for (i = 0; i < s->nconns; i++)
        if (s->conns[i].wait_key) {
            ddp__reply_text(s->conns[i].fd, DDP__ST_ERROR, s->broken);
            DDP_FREE(s->conns[i].wait_key);
            s->conns[i].wait_key = NULL;
        }
    while (s->ngathers) ddp__gather_free(s, s->ngathers - 1);
}

/* A store that cannot allocate has lost what it was asked to keep: the job ends, and says
   why (the dropped connection read as the rank's own exit: "rank 1 left the job") */
static int ddp__server_nomem(ddp__server *s)
{
    ddp__server_break(s, "rank 0's store ran out of memory (ulimit -v, or the machine's)");
    return -1;
}

static int ddp__rank_taken(ddp__server *s, int rank)
{
    int i;
    for (i = 0; i < s->nconns; i++)
        if (s->conns[i].rank == rank) return 1;
    return 0;
}

/* Remembers, for rank 0's messages, why a process that named a rank was refused. */
static void ddp__server_note(ddp__server *s, const char *fmt, ...) DDP__PRINTF(2, 3);
static void ddp__server_note(ddp__server *s, const char *fmt, ...)
{
    char note[160];
    size_t n = strlen(s->refused);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note, sizeof note, fmt, ap);
    va_end(ap);
    if (!strstr(s->refused, note) && n + strlen(note) + 3 < sizeof s->refused)
        snprintf(s->refused + n, sizeof s->refused - n, "%s%s", n ? "; " : "", note);
    s->nrefused++;
}

/* A stranger's text, safe to print: printable ASCII, at most 40 characters. */
static const char *ddp__printable(char out[44], const char *in)
{
    int i;
    for (i = 0; in[i] && i < 40; i++) out[i] = in[i] >= 32 && in[i] < 127 ? in[i] : '?';
    strcpy(out + i, in[i] ? "..." : "");
    return out;
}

/* A claim by a process of this job (its id, and the secret if there is one): admitted,
   unless it cannot be one of this job's ranks. Then two launches share the port (with
   no id of their own, their ranks look alike) or the ranks' settings differ; either way
   the job cannot be trusted to complete with its own ranks: it stops, naming why. */
static int ddp__server_claim(ddp__server *s, ddp__conn *c, int rank, int world)
{
    /* without a secret the claim may be anyone's who reaches the port */
    const char *who = s->secret[0] ? "" : "; without DDP_SECRET, anyone who reaches the port can claim a rank";
    const struct ddp__launcher *o;
    char why[300];
    if (s->broken[0]) {
        ddp__reply_text(c->fd, DDP__ST_ERROR, s->broken);
        return -1;
    }
    if (world != s->world)
        snprintf(why, sizeof why, "a process claims rank %d of a world of %d, but job '%.40s' has %d ranks (WORLD_SIZE "
                 "differs between ranks, or two jobs share this port%s)", rank, world, s->job_id, s->world, who);
    else if ((ddp__rank_taken(s, rank) || (rank == 0 && strcmp(c->nonce[0], s->own) != 0)) &&
             (o = ddp__around(ddp__launcher_here())) != NULL) /* torchrun around mpirun, or RANK exported into it */
        snprintf(why, sizeof why, "two processes claim rank %d: torchrun's RANK meets %s's %s=%s, whose tasks share a RANK "
                 "set outside (by a launcher around it, or the shell): use one launcher, or another MASTER_PORT", rank,
                 o->who, o->world, ddp__env(o->world));
    else if (ddp__rank_taken(s, rank) || (rank == 0 && strcmp(c->nonce[0], s->own) != 0))
        snprintf(why, sizeof why, "two processes claim rank %d of job '%.40s': two launches share this port? (give "
                 "each its own MASTER_PORT or DDP_JOB_ID%s)", rank, s->job_id, who);
    else {
        c->rank = rank;
        c->claim = -1;
        s->joined[rank] = 1;
        ddp__reply(c->fd, DDP__ST_OK, NULL, 0);
        return 0;
    }
    ddp__server_break(s, why);
    ddp__reply_text(c->fd, DDP__ST_ERROR, why);
    return -1;
}

/* HELLO and AUTH: returns -1 to drop the connection (harmless: not yet a member).
   Before a claim is proven (the job id, and the secret when there is one) nothing in
   it harms the job: it is only remembered for rank 0's messages. */
static int ddp__server_hello(ddp__server *s, ddp__conn *c, uint32_t op, const char *key, const char *val)
{
    char mac[65], reply[120], shown[44];
    if (op == DDP__HELLO && c->claim < 0) {
        int rank = -1, world = -1;
        if (sscanf(val, "%d %d %32s", &rank, &world, c->nonce[0]) != 3 || strcmp(key, s->job_id) != 0 ||
            rank < 0 || rank >= world) {
            if (rank >= 0 && rank < world)
                ddp__server_note(s, "rank %d of job '%s'", rank, ddp__printable(shown, key));
            /* says nothing about the job it does serve */
            ddp__reply_text(c->fd, DDP__ST_ERROR, "this store serves another job (job id or world size differ)");
            return -1;
        }
        if (!s->secret[0]) return ddp__server_claim(s, c, rank, world);
        {
            unsigned char raw[16];
            ddp__random(raw, sizeof raw);
            ddp__hex(c->nonce[1], raw, sizeof raw);
        }
        c->claim = rank;
        c->world = world;
        ddp__hmac(mac, s->secret, "server", c->nonce[0], c->nonce[1]);
        snprintf(reply, sizeof reply, "%s %s", c->nonce[1], mac);
        ddp__reply_text(c->fd, DDP__ST_CHALLENGE, reply);
        return 0;
    }
    if (op == DDP__AUTH && c->claim >= 0) {
        ddp__hmac(mac, s->secret, "client", c->nonce[1], c->nonce[0]);
        if (!ddp__same_mac(mac, val)) {
            ddp__server_note(s, "rank %d with another DDP_SECRET", c->claim);
            ddp__reply_text(c->fd, DDP__ST_ERROR, "authentication failed: DDP_SECRET differs from rank 0's");
            c->claim = -1;
            return -1;
        }
        return ddp__server_claim(s, c, c->claim, c->world);
    }
    return -1;
}

/* Answers every rank waiting on `key` (a GET) with its value. */
static void ddp__serve_waiters(ddp__server *s, const ddp__kv *e)
{
    int i;
    for (i = 0; i < s->nconns; i++) {
        ddp__conn *c = &s->conns[i];
        if (c->wait_key && strcmp(c->wait_key, e->key) == 0) {
            ddp__reply(c->fd, DDP__ST_OK, e->val, e->vlen);
            DDP_FREE(c->wait_key);
            c->wait_key = NULL;
        }
    }
}

static int ddp__server_set(ddp__server *s, ddp__conn *c, const char *key, const char *val, uint32_t vlen)
{
    ddp__kv *e = ddp__kv_find(s, key);
    char *copy;
    if (c->held + vlen > DDP__STORE_QUOTA) {
        ddp__reply_text(c->fd, DDP__ST_ERROR, "the store holds too much for this rank");
        return 0;
    }
    if (!(copy = DDP__CAST(char *, DDP_MALLOC(vlen + 1)))) return ddp__server_nomem(s);
    memcpy(copy, val, vlen);
    copy[vlen] = 0;
    if (!e) {
        ddp__kv *grown = DDP__CAST(ddp__kv *, ddp__reserve(s->kv, s->nkv, &s->kvcap, sizeof *s->kv));
        if (!grown) { DDP_FREE(copy); return ddp__server_nomem(s); }
        s->kv = grown;
        e = &s->kv[s->nkv];
        if (!(e->key = ddp__strdup(key))) { DDP_FREE(copy); return ddp__server_nomem(s); }
        s->nkv++;
        e->val = NULL;
        e->owner = c->rank;
    } else {
        DDP_FREE(e->val);
    }
    c->held += vlen;
    e->val = copy;
    e->vlen = vlen;
    ddp__reply(c->fd, DDP__ST_OK, NULL, 0);
    ddp__serve_waiters(s, e);
    return 0;
}

static int ddp__server_gather(ddp__server *s, ddp__conn *c, const char *key, const char *val, uint32_t vlen)
{
    ddp__gather *g = NULL;
    char *all, *p;
    size_t total = 0;
    int i, r;
    for (i = 0; i < s->ngathers && !g; i++)
        if (strcmp(s->gathers[i].key, key) == 0) g = &s->gathers[i];
    if (!g) {
        ddp__gather *grown = DDP__CAST(ddp__gather *, ddp__reserve(s->gathers, s->ngathers, &s->gcap, sizeof *g));
        if (!grown) return ddp__server_nomem(s);
        s->gathers = grown;
        g = &s->gathers[s->ngathers];
        memset(g, 0, sizeof *g);
        g->key = ddp__strdup(key);
        g->part = DDP__CAST(char **, DDP_MALLOC(sizeof(char *) * (size_t)s->world));
        g->plen = DDP__CAST(uint32_t *, DDP_MALLOC(sizeof(uint32_t) * (size_t)s->world));
        if (!g->key || !g->part || !g->plen) {
            DDP_FREE(g->key); DDP_FREE(g->part); DDP_FREE(g->plen);
            return ddp__server_nomem(s);
        }
        memset(g->part, 0, sizeof(char *) * (size_t)s->world);
        s->ngathers++;
    }
    if (g->part[c->rank]) return -1; /* twice from one rank */
    if (!(g->part[c->rank] = DDP__CAST(char *, DDP_MALLOC(vlen + 1)))) return ddp__server_nomem(s);
    memcpy(g->part[c->rank], val, vlen);
    g->plen[c->rank] = vlen;
    if (!(c->wait_key = ddp__strdup(key))) return ddp__server_nomem(s);
    if (++g->arrived < s->world) return 0;
    /* everyone is here: each gets every part, as (length, bytes) in rank order */
    for (r = 0; r < s->world; r++) total += 4 + g->plen[r];
    if (total > 0xffffffffu) return -1;
    if (!(all = DDP__CAST(char *, DDP_MALLOC(total)))) return ddp__server_nomem(s);
    for (p = all, r = 0; r < s->world; r++) {
        uint32_t n = htonl(g->plen[r]);
        memcpy(p, &n, 4);
        memcpy(p + 4, g->part[r], g->plen[r]);
        p += 4 + g->plen[r];
    }
    for (i = 0; i < s->nconns; i++) {
        ddp__conn *w = &s->conns[i];
        if (w->wait_key && strcmp(w->wait_key, key) == 0) {
            ddp__reply(w->fd, DDP__ST_OK, all, (uint32_t)total);
            DDP_FREE(w->wait_key);
            w->wait_key = NULL;
        }
    }
    DDP_FREE(all);
    ddp__gather_free(s, (int)(g - s->gathers));
    return 0;
}

/* Handles one complete message; returns 0 to keep the connection, -1 to drop it. */
static int ddp__server_handle(ddp__server *s, ddp__conn *c, uint32_t op, const char *key, const char *val,
                              uint32_t vlen)
{
    ddp__kv *e;
    if (c->rank < 0) return ddp__server_hello(s, c, op, key, val);
    if (c->wait_key) return -1; /* one request at a time */
    if (s->broken[0] && op != DDP__SET) {
        ddp__reply_text(c->fd, DDP__ST_ERROR, s->broken);
        return 0;
    }
    switch (op) {
    case DDP__SET:
        return ddp__server_set(s, c, key, val, vlen);
    case DDP__GET:
        if ((e = ddp__kv_find(s, key)) != NULL) ddp__reply(c->fd, DDP__ST_OK, e->val, e->vlen);
        else if (!(c->wait_key = ddp__strdup(key))) return ddp__server_nomem(s);
        return 0;
    case DDP__GATHER:
        if (c->held + vlen > DDP__STORE_QUOTA) {
            ddp__reply_text(c->fd, DDP__ST_ERROR, "the store holds too much for this rank");
            return 0;
        }
        return ddp__server_gather(s, c, key, val, vlen);
    }
    return -1;
}

static void ddp__server_drop(ddp__server *s, int i, const char *why)
{
    ddp__conn *c = &s->conns[i];
    if (c->claim >= 0 && !s->closing)
        ddp__server_note(s, "rank %d did not answer the challenge of DDP_SECRET (it has none, or another)", c->claim);
    if (c->rank >= 0 && !s->closing) {
        char text[200];
        snprintf(text, sizeof text, "rank %d left the job (%s)", c->rank, why);
        ddp__server_break(s, text);
    }
    close(c->fd);
    DDP_FREE(c->buf);
    DDP_FREE(c->wait_key);
    s->conns[i] = s->conns[--s->nconns];
}

/* Reads what a connection has and handles every complete message in its buffer;
   -1 drops it. A newcomer's buffer never grows past DDP__HELLO_MAX. */
static int ddp__server_read(ddp__server *s, ddp__conn *c)
{
    ssize_t k;
    size_t limit = c->rank >= 0 ? 16 + DDP__MAX_KEY + DDP__MAX_VALUE + 1 : DDP__HELLO_MAX;
    if (c->cap - c->len < 4096 && c->cap < limit) {
        size_t cap = c->cap ? c->cap * 2 : (c->rank >= 0 ? 8192 : DDP__HELLO_MAX);
        char *b;
        if (cap > limit) cap = limit;
        if (!(b = DDP__CAST(char *, DDP_MALLOC(cap)))) return ddp__server_nomem(s);
        if (c->len) memcpy(b, c->buf, c->len);
        DDP_FREE(c->buf);
        c->buf = b; c->cap = cap;
    }
    if (c->len + 1 >= c->cap) return -1; /* a message larger than this peer may send */
    k = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
    if (k <= 0) return (k < 0 && (errno == EINTR || errno == EAGAIN)) ? 0 : -1;
    if (!c->len) c->since = ddp__now_ms();
    c->len += (size_t)k;
    while (c->len >= 16) {
        uint32_t h[4], klen, vlen;
        size_t total;
        char *key, *val, saved;
        int rc;
        memcpy(h, c->buf, 16);
        klen = ntohl(h[2]); vlen = ntohl(h[3]);
        if (ntohl(h[0]) != DDP__MAGIC || klen > DDP__MAX_KEY || vlen > DDP__MAX_VALUE) return -1;
        total = 16 + (size_t)klen + vlen;
        if (total + 1 > limit) return -1;
        if (c->len < total) break; /* the rest is on its way (within DDP__STORE_STALL_MS) */
        if (!(key = DDP__CAST(char *, DDP_MALLOC(klen + 1)))) return ddp__server_nomem(s);
        memcpy(key, c->buf + 16, klen);
        key[klen] = 0;
        val = c->buf + 16 + klen; /* a C string in place: the byte after it is saved */
        saved = val[vlen];
        val[vlen] = 0;
        rc = ddp__server_handle(s, c, ntohl(h[1]), key, val, vlen);
        val[vlen] = saved;
        DDP_FREE(key);
        if (rc < 0) return -1;
        memmove(c->buf, c->buf + total, c->len - total);
        c->len -= total;
        c->since = c->len ? ddp__now_ms() : 0;
    }
    return 0;
}

/* Out of descriptors: while ranks are still to join, the job cannot form (say so now,
   not as a timeout); after that, a caller waiting in the backlog is turned away (it
   kept poll answering at once: a spinning store). */
static void ddp__server_no_fd(ddp__server *s, int err)
{
    struct rlimit rl;
    char why[200];
    int r, joined = 0;
    for (r = 0; r < s->world; r++) joined += s->joined[r];
    if (joined < s->world) {
        if (err == EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0)
            snprintf(why, sizeof why, "rank 0 ran out of file descriptors with %d of %d ranks joined (ulimit -n is "
                     "%llu, and the store holds one per rank): raise it", joined, s->world, (unsigned long long)rl.rlim_cur);
        else
            snprintf(why, sizeof why, "rank 0 cannot accept connections with %d of %d ranks joined: %s", joined, s->world,
                     strerror(err));
        ddp__server_break(s, why);
    }
    if (s->spare_fd >= 0) {
        int fd;
        close(s->spare_fd);
        if ((fd = accept(s->listen_fd, NULL, NULL)) >= 0) close(fd);
        s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (s->spare_fd < 0 && s->listen_pause != INT64_MAX) /* (another thread took it; not once unlistened) */
        __atomic_store_n(&s->listen_pause, ddp__now_ms() + 100, __ATOMIC_RELAXED);
}

static void ddp__server_accept(ddp__server *s)
{
    int fd = accept(s->listen_fd, NULL, NULL), one = 1, i, oldest = -1;
    ddp__conn *c;
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) ddp__server_no_fd(s, errno);
        return;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC); /* accept4 would need _GNU_SOURCE before the user's first header */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (s->nconns == s->cap) { /* full of newcomers: the oldest one makes room */
        for (i = 0; i < s->nconns; i++)
            if (s->conns[i].rank < 0 && (oldest < 0 || s->conns[i].born < s->conns[oldest].born)) oldest = i;
        if (oldest < 0) { close(fd); return; }
        ddp__server_drop(s, oldest, "");
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c = &s->conns[s->nconns++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->rank = c->claim = -1;
    c->born = ddp__now_ms();
}

static void *ddp__server_main(void *arg)
{
    ddp__server *s = (ddp__server *)arg;
    struct pollfd *pf = DDP__CAST(struct pollfd *, DDP_MALLOC(sizeof *pf * (size_t)(s->cap + 2)));
    if (!pf) {
        pthread_mutex_lock(&s->mu);
        ddp__server_nomem(s);
        pthread_mutex_unlock(&s->mu);
        return NULL;
    }
    for (;;) {
        int i, n = 0, nc = s->nconns, members = 0;
        int64_t now;
        for (i = 0; i < nc; i++) members += s->conns[i].rank >= 0;
        /* strangers (an idle connection, a port scan) do not keep a finished job waiting */
        if (s->stop_deadline && (members == 0 || ddp__now_ms() > s->stop_deadline)) break;
        pf[n].fd = s->wake[0]; pf[n++].events = POLLIN;
        /* poll skips a negative fd (listen_pause: ddp_destroy's thread may set it) */
        pf[n].fd = __atomic_load_n(&s->listen_pause, __ATOMIC_RELAXED) > ddp__now_ms() ? -1 : s->listen_fd;
        pf[n++].events = POLLIN;
        for (i = 0; i < nc; i++) { pf[n].fd = s->conns[i].fd; pf[n++].events = POLLIN; }
        for (i = 0; i < n; i++) pf[i].revents = 0;
        if (poll(pf, (nfds_t)n, 200) < 0 && errno != EINTR) break;
        pthread_mutex_lock(&s->mu);
        if (pf[0].revents) {
            char b[64];
            ssize_t k = read(s->wake[0], b, sizeof b);
            if (k > 0 && b[0] == 'f') { /* rank 0 failed: tell whoever waits, and go */
                ddp__server_break(s, s->farewell);
                s->stop_deadline = ddp__now_ms();
            } else {
                s->stop_deadline = ddp__now_ms() + 5000; /* wait briefly for the others to hang up */
            }
            s->closing = 1;
        }
        now = ddp__now_ms();
        for (i = nc - 1; i >= 0; i--) { /* backwards: dropping moves the last one into i */
            ddp__conn *c = &s->conns[i];
            if (pf[2 + i].revents && ddp__server_read(s, c) < 0) ddp__server_drop(s, i, "its process exited or its connection dropped");
            else if (c->rank < 0 && now - c->born > DDP__STORE_HELLO_MS) ddp__server_drop(s, i, "");
            else if (c->since && now - c->since > DDP__STORE_STALL_MS) ddp__server_drop(s, i, "it stalled in the middle of a message");
        }
        if (pf[1].revents) ddp__server_accept(s);
        pthread_mutex_unlock(&s->mu);
    }
    DDP_FREE(pf);
    return NULL;
}

static void ddp__server_free(ddp__server *s)
{
    int i;
    s->closing = 1;
    while (s->nconns) ddp__server_drop(s, s->nconns - 1, "");
    for (i = 0; i < s->nkv; i++) { DDP_FREE(s->kv[i].key); DDP_FREE(s->kv[i].val); }
    while (s->ngathers) ddp__gather_free(s, s->ngathers - 1);
    DDP_FREE(s->kv); DDP_FREE(s->gathers); DDP_FREE(s->conns); DDP_FREE(s->joined);
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->spare_fd >= 0) close(s->spare_fd);
    if (s->wake[0] >= 0) { close(s->wake[0]); close(s->wake[1]); }
    pthread_mutex_destroy(&s->mu);
    DDP_FREE(s);
}

/* Appends " 2, 5, 7": the ranks that never joined (never), or that joined but have not
   brought their part of g; the first 8 of them. Returns how many there are; the first
   goes to *first if that is still -1. */
static int ddp__server_ranks(ddp__server *s, const ddp__gather *g, int never, char *out, size_t size, int *first)
{
    int r, k = 0;
    for (r = 0; r < s->world; r++)
        if (never ? !s->joined[r] : s->joined[r] && g && !g->part[r]) {
            if (!k && *first < 0) *first = r;
            if (k < 8) ddp__append(out, size, "%s%d", k ? ", " : " ", r);
            k++;
        }
    if (k > 8) ddp__append(out, size, " (%d in all)", k);
    return k;
}

/* For rank 0's messages, from its own thread: which ranks never joined, which joined
   but have not reached the meeting `key`, and why the store refused others; the first
   rank missing to *first if that is still -1. */
static void ddp__server_missing(ddp__server *s, const char *key, char *out, size_t size, int *first)
{
    const ddp__gather *g = NULL;
    char never[120] = "", late[120] = "";
    int i, n_never, n_late;
    pthread_mutex_lock(&s->mu);
    for (i = 0; i < s->ngathers && !g; i++)
        if (strcmp(s->gathers[i].key, key) == 0) g = &s->gathers[i];
    n_never = ddp__server_ranks(s, g, 1, never, sizeof never, first);
    n_late = ddp__server_ranks(s, g, 0, late, sizeof late, first);
    out[0] = 0;
    if (n_never) ddp__append(out, size, "rank%s%s never joined%s%s", n_never > 1 ? "s" : "", never,
                             s->loopback[0] ? ": " : "", s->loopback);
    if (n_late)
        ddp__append(out, size, "%srank%s%s joined but did not reach this point", out[0] ? "; " : "", n_late > 1 ? "s" : "",
                    late);
    if (s->nrefused)
        ddp__append(out, size, "%sthe store refused %d process%s: %s", out[0] ? "; " : "", s->nrefused,
                    s->nrefused > 1 ? "es" : "", s->refused);
    pthread_mutex_unlock(&s->mu);
}

/* Rank 0 once every rank met in ddp_destroy: nobody joins a job that ends, and a next
   job of this process (ddp_init again) finds the port free. The listener stops taking
   connections (refused: a next job's ranks retry) and is no longer polled. */
static void ddp__server_unlisten(ddp__server *s)
{
    pthread_mutex_lock(&s->mu);
    if (s->listen_fd >= 0) shutdown(s->listen_fd, SHUT_RDWR);
    __atomic_store_n(&s->listen_pause, INT64_MAX, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&s->mu);
}

/* Rank 0 before each collective: the reason the store's job failed (a second launch on
   its port, a rank that left), or NULL. */
static const char *ddp__server_failed(ddp__server *s)
{
    return s && __atomic_load_n(&s->failed, __ATOMIC_ACQUIRE) ? s->broken : NULL;
}

/* Tells the server to finish once every rank has hung up (or after 5 s), then joins
   it; with `why` (rank 0 failed) it tells every waiting rank why and stops at once. */
static void ddp__server_stop(ddp__server *s, const char *why)
{
    if (why) snprintf(s->farewell, sizeof s->farewell, "rank 0 failed: %.180s", why);
    if (write(s->wake[1], why ? "f" : "x", 1) < 0) {}
    pthread_join(s->thread, NULL);
    ddp__server_free(s);
}

/* 127.0.0.0/8, ::1, or 127.x mapped into IPv6 */
static int ddp__is_loopback(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)(const void *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(x) || (IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127);
    }
    return 0;
}

/* Binds MASTER_ADDR itself: the store listens only where ranks will look for it. A
   port in use is left to the caller (*in_use, nothing logged): it asks who holds it.
   In a job of several hosts, a store on loopback is named in rank 0's timeout. */
static ddp_result ddp__server_start(ddp_ctx *ctx, int *in_use)
{
    ddp__settings *cfg = &ctx->st->cfg;
    struct addrinfo hints, *res = NULL, *ai;
    char port[16], host[64];
    unsigned char raw[16];
    int one = 1, fd = -1, err = 0, rc, lo_down = 0;
    ddp__server *s = DDP__CAST(ddp__server *, DDP_MALLOC(sizeof *s));
    *in_use = 0;
    if (!s) return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory for the store");
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->listen_fd = s->wake[0] = s->wake[1] = -1;
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->world = ctx->world_size;
    s->cap = ctx->world_size + DDP__STORE_PENDING;
    ddp__copy(s->job_id, sizeof s->job_id, cfg->job_id);
    ddp__copy(s->secret, sizeof s->secret, cfg->secret);
    ddp__random(raw, sizeof raw);
    ddp__hex(s->own, raw, sizeof raw);
    if (!(s->conns = DDP__CAST(ddp__conn *, DDP_MALLOC(sizeof *s->conns * (size_t)s->cap))) ||
        !(s->joined = DDP__CAST(unsigned char *, DDP_MALLOC((size_t)s->world)))) {
        ddp__server_free(s);
        return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory for the store");
    }
    memset(s->joined, 0, (size_t)s->world);
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof port, "%d", cfg->master_port);
    if ((rc = getaddrinfo(cfg->master_addr, port, &hints, &res)) != 0) {
        ddp__server_free(s);
        return ddp__fail(ctx, DDP_ERR_ENV, "MASTER_ADDR=%s cannot be resolved: %s", cfg->master_addr, gai_strerror(rc));
    }
    for (ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) { err = errno; continue; } /* ulimit -n: "Too many open files", not "Success" */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
            err = errno;
            lo_down |= err == EADDRNOTAVAIL && ddp__is_loopback(ai->ai_addr); /* ::1 with lo down */
            close(fd);
            fd = -1;
        }
        else if (ctx->local_world_size > 0 && ctx->local_world_size < ctx->world_size && ddp__is_loopback(ai->ai_addr) &&
                 getnameinfo(ai->ai_addr, ai->ai_addrlen, host, sizeof host, NULL, 0, NI_NUMERICHOST) == 0)
            /* a host name that its own host resolves to 127.0.1.1 (Debian's /etc/hosts) */
            snprintf(s->loopback, sizeof s->loopback, "the store listens on %s (MASTER_ADDR=%.100s), a loopback "
                     "address that ranks on other hosts cannot reach", host, cfg->master_addr);
    }
    freeaddrinfo(res);
    if (fd < 0) {
        ddp__server_free(s);
        if (err == EADDRNOTAVAIL)
            return ddp__fail(ctx, DDP_ERR_ENV, lo_down ? "MASTER_ADDR=%s: the loopback interface is down (ip link set lo up)"
                                                       : "MASTER_ADDR=%s is not an address of rank 0's host (rank 0 hosts "
                                                         "the store there)", cfg->master_addr);
        if (err == EADDRINUSE) {
            *in_use = 1;
            return DDP_ERR_ENV;
        }
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "rank 0 cannot open the store on %s:%d: %s", cfg->master_addr,
                         cfg->master_port, strerror(err));
    }
    s->listen_fd = fd;
    if (pipe(s->wake) != 0 || (rc = pthread_create(&s->thread, NULL, ddp__server_main, s)) != 0) {
        rc = s->wake[0] < 0 ? errno : rc;
        ddp__server_free(s);
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot start the store thread: %s", strerror(rc));
    }
    ctx->st->server = s;
    return DDP_OK;
}

/* ---- >>store client ------------------------------------------------------------------- */

/* Sends one request and reads its answer: *status and a NUL-terminated copy of the
   value to free (or NULL). -1 with errno on a broken connection or the deadline. A
   hello's rank says so where the answer has not come in DDP__HELLO_WARN_MS. */
#define DDP__HELLO_WARN_MS 5000
static int ddp__store_io(int fd, uint32_t op, const char *key, const void *val, uint32_t vlen, int64_t deadline,
                         uint32_t *status, char **out, uint32_t *outlen, ddp_ctx *hello)
{
    uint32_t h[4], klen = (uint32_t)strlen(key), rlen;
    char *buf, small[1024];
    h[0] = htonl(DDP__MAGIC); h[1] = htonl(op); h[2] = htonl(klen); h[3] = htonl(vlen);
    if (16 + (size_t)klen + vlen <= sizeof small) { /* one send: a peer that answers the first bytes gets them all */
        memcpy(small, h, 16);
        memcpy(small + 16, key, klen);
        if (vlen) memcpy(small + 16 + klen, val, vlen);
        if (ddp__write_all(fd, small, 16 + (size_t)klen + vlen, deadline) != 0) return -1;
    } else if (ddp__write_all(fd, h, 16, deadline) != 0 || ddp__write_all(fd, key, klen, deadline) != 0 ||
               (vlen && ddp__write_all(fd, val, vlen, deadline) != 0)) {
        return -1;
    }
    if (hello) { /* a store answers a hello at once: silence for long is worth a line before the timeout */
        const int64_t warn_at = ddp__now_ms() + DDP__HELLO_WARN_MS;
        struct pollfd pf;
        int k = 0;
        pf.fd = fd; pf.events = POLLIN; pf.revents = 0;
        while (warn_at < deadline && ddp__now_ms() < warn_at &&
               ((k = poll(&pf, 1, (int)(warn_at - ddp__now_ms()))) == 0 || (k < 0 && errno == EINTR))) {}
        if (warn_at < deadline && k == 0) {
            char msg[400];
            snprintf(msg, sizeof msg, "rank %d/%d: warning: what listens on %.100s:%d took the connection and has not "
                     "answered the hello in %d s (another program on MASTER_PORT, or rank 0 stopped?): waiting until "
                     "DDP_TIMEOUT", hello->rank, hello->world_size, hello->st->cfg.master_addr,
                     hello->st->cfg.master_port, DDP__HELLO_WARN_MS / 1000);
            ddp__say(hello, DDP_LOG_INFO, msg);
        }
    }
    if (ddp__read_all(fd, h, 16, deadline) != 0) return -1;
    rlen = ntohl(h[3]);
    /* an answer has no key and a status the store sends: a request echoed back (an echo
       service on the port) is none, its op read as a status was "refused" */
    if (ntohl(h[0]) != DDP__MAGIC || h[2] != 0 || ntohl(h[1]) > DDP__ST_CHALLENGE || rlen > 0x7fffffffu) {
        errno = EPROTO;
        return -1;
    }
    if (!(buf = DDP__CAST(char *, DDP_MALLOC((size_t)rlen + 1)))) { errno = ENOMEM; return -1; }
    if (ddp__read_all(fd, buf, rlen, deadline) != 0) { DDP_FREE(buf); return -1; }
    buf[rlen] = 0;
    *status = ntohl(h[1]);
    *out = buf;
    if (outlen) *outlen = rlen;
    return 0;
}

/* One request, one answer. *out (if given) receives a NUL-terminated copy to free;
   `what` says in the user's words what the rank was doing. */
static ddp_result ddp__store_req(ddp_ctx *ctx, uint32_t op, const char *key, const void *val, uint32_t vlen,
                                 char **out, uint32_t *outlen, const char *what)
{
    ddp__settings *cfg = &ctx->st->cfg;
    uint32_t status = 0;
    char *buf = NULL;
    ddp_result r;
    if (ddp__store_io(ctx->st->store_fd, op, key, val, vlen, ddp__now_ms() + cfg->timeout_ms, &status, &buf, outlen,
                      NULL) != 0) {
        if (errno == ETIMEDOUT) {
            char who[400] = ""; /* rank 0 hosts the store: it can say who is missing */
            if (ctx->st->server) ddp__server_missing(ctx->st->server, key, who, sizeof who, &ctx->st->waited);
            return ddp__fail(ctx, DDP_ERR_TIMEOUT, "timed out after %.*f s %s (store at %s:%d)%s%s", DDP__SECONDS(cfg->timeout_ms),
                             what, cfg->master_addr, cfg->master_port, who[0] ? ": " : "", who);
        }
        if (errno == EPROTO)
            return ddp__fail(ctx, DDP_ERR_PROTOCOL, "the store at %s:%d sent a malformed answer", cfg->master_addr,
                             cfg->master_port);
        if (ctx->st->server && __atomic_load_n(&ctx->st->server->failed, __ATOMIC_ACQUIRE)) /* rank 0: its own store said why */
            return ddp__fail(ctx, DDP_ERR_PEER, "%s", ctx->st->server->broken);
        return ddp__fail(ctx, DDP_ERR_PEER, "lost the store at %s:%d (rank 0 exited?) %s", cfg->master_addr,
                         cfg->master_port, what);
    }
    if (status != DDP__ST_OK) {
        r = ddp__fail(ctx, DDP_ERR_PEER, "%s", buf);
        DDP_FREE(buf);
        return r;
    }
    if (out) *out = buf;
    else DDP_FREE(buf);
    return DDP_OK;
}

/* HELLO (and with a secret, the challenge both ways) on a fresh connection.
   1: admitted; 0: the connection broke (try again); -1: refused, -2: the answer is not
   a ddp store's, -3: no answer before the deadline (why in `why`). Rank 0 says hello
   with its store's own nonce. */
static int ddp__store_hello(ddp_ctx *ctx, int fd, int64_t deadline, char *why, size_t whysize)
{
    ddp__settings *cfg = &ctx->st->cfg;
    unsigned char raw[16];
    char nonce[33], hello[80], mac[65], snonce[33] = "", smac[65] = "", *reply = NULL;
    uint32_t status = 0;
    int ok;
    ddp__random(raw, sizeof raw);
    ddp__hex(nonce, raw, sizeof raw);
    if (ctx->st->server) ddp__copy(nonce, sizeof nonce, ctx->st->server->own);
    snprintf(hello, sizeof hello, "%d %d %s", ctx->rank, ctx->world_size, nonce);
    if (ddp__store_io(fd, DDP__HELLO, cfg->job_id, hello, (uint32_t)strlen(hello), deadline, &status, &reply, NULL,
                      ctx) != 0) {
        if (errno == ETIMEDOUT) { /* it took the connection and never answered (an HTTP server waits for a line) */
            snprintf(why, whysize, "cannot reach rank 0's store at %.100s:%d within %.*f s: what listens there took the "
                     "connection but never answered the hello (another program on MASTER_PORT, or rank 0 stopped?)",
                     cfg->master_addr, cfg->master_port, DDP__SECONDS(cfg->timeout_ms));
            return -3;
        }
        if (errno != EPROTO) return 0;
        snprintf(why, whysize, "%.100s:%d answers, but not as a ddp store (another program listens on MASTER_PORT?)",
                 cfg->master_addr, cfg->master_port);
        return -2;
    }
    if (status == DDP__ST_ERROR) {
        snprintf(why, whysize, "the store at %.100s:%d refused rank %d of job '%.60s': %.240s", cfg->master_addr, cfg->master_port,
                 ctx->rank, cfg->job_id, reply);
        DDP_FREE(reply);
        return -1;
    }
    if (status == DDP__ST_OK && !cfg->secret[0]) { DDP_FREE(reply); return 1; }
    if (status != DDP__ST_CHALLENGE || !cfg->secret[0]) {
        DDP_FREE(reply);
        snprintf(why, whysize, status == DDP__ST_CHALLENGE
                 ? "the store at %.100s:%d asks for a secret: set DDP_SECRET as rank 0 has it"
                 : "the store at %.100s:%d did not ask for the secret: it is not this job's, or rank 0 has no DDP_SECRET",
                 cfg->master_addr, cfg->master_port);
        return -1;
    }
    ok = sscanf(reply, "%32s %64s", snonce, smac) == 2;
    DDP_FREE(reply);
    ddp__hmac(mac, cfg->secret, "server", nonce, snonce);
    if (!ok || !ddp__same_mac(mac, smac)) {
        snprintf(why, whysize, "the store at %.100s:%d could not prove it knows this rank's DDP_SECRET (rank 0 has another "
                 "secret, or this is not the job's store)", cfg->master_addr, cfg->master_port);
        return -1;
    }
    ddp__hmac(mac, cfg->secret, "client", snonce, nonce);
    if (ddp__store_io(fd, DDP__AUTH, "", mac, 64, deadline, &status, &reply, NULL, NULL) != 0) return 0;
    if (status != DDP__ST_OK) {
        snprintf(why, whysize, "the store at %.100s:%d refused rank %d: %.240s", cfg->master_addr, cfg->master_port, ctx->rank,
                 reply);
        DDP_FREE(reply);
        return -1;
    }
    DDP_FREE(reply);
    return 1;
}

/* connect(), seen through where a signal interrupts it: the kernel goes on connecting (a
   second connect() says EALREADY), so the socket is waited on for up to 5 s. A signal
   every 100 us (a profiler's timer without SA_RESTART) failed every attempt. */
static int ddp__connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    struct pollfd p;
    int64_t deadline = ddp__now_ms() + 5000, left;
    int err = 0, n;
    socklen_t el = sizeof err;
    if (connect(fd, addr, len) == 0) return 0;
    if (errno != EINTR) return -1;
    p.fd = fd;
    p.events = POLLOUT;
    for (;;) {
        if ((left = deadline - ddp__now_ms()) <= 0 || (n = poll(&p, 1, (int)left)) == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (n > 0) break;
        if (errno != EINTR) return -1;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) return -1;
    errno = err;
    return err ? -1 : 0;
}

/* One connection to MASTER_ADDR:MASTER_PORT, non-blocking once made; -1 with errno. */
static int ddp__dial(ddp_ctx *ctx, ddp_result *r)
{
    ddp__settings *cfg = &ctx->st->cfg;
    struct addrinfo hints, *res = NULL, *ai;
    char port[16];
    int fd = -1, err = ECONNREFUSED, one = 1, rc;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof port, "%d", cfg->master_port);
    *r = DDP_OK;
    if ((rc = getaddrinfo(cfg->master_addr, port, &hints, &res)) != 0) {
        *r = ddp__fail(ctx, DDP_ERR_ENV, "MASTER_ADDR=%s cannot be resolved: %s", cfg->master_addr, gai_strerror(rc));
        return -1;
    }
    for (ai = res; ai && fd < 0; ai = ai->ai_next) {
        struct timeval tv;
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) { err = errno; continue; }
        tv.tv_sec = 5; tv.tv_usec = 0; /* bounds connect() to an unreachable host */
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (ddp__connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            /* connected to itself: a port in the range the kernel picks local ports from, with
               nothing listening yet, can be its own peer (TCP's simultaneous open); nobody is there */
            struct sockaddr_storage me, peer;
            socklen_t ml = sizeof me, pl = sizeof peer;
            if (getsockname(fd, (struct sockaddr *)&me, &ml) == 0 && getpeername(fd, (struct sockaddr *)&peer, &pl) == 0 &&
                ml == pl && memcmp(&me, &peer, ml) == 0) {
                close(fd);
                fd = -1;
                err = ECONNREFUSED;
            }
        } else {
            err = errno;
            close(fd);
            fd = -1;
            /* no retry mends that (a down loopback is ENETUNREACH for 127.x, EADDRNOTAVAIL for ::1;
               for 127.x EADDRNOTAVAIL is a lack of free local ports, which passes) */
            if ((err == ENETUNREACH || (err == EADDRNOTAVAIL && ai->ai_family == AF_INET6)) &&
                ddp__is_loopback(ai->ai_addr)) {
                *r = ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot reach rank 0's store at %s:%d: %s (the loopback interface "
                               "is down: ip link set lo up)", cfg->master_addr, cfg->master_port, strerror(err));
                break;
            }
        }
    }
    freeaddrinfo(res);
    if (*r != DDP_OK) return -1;
    if (fd < 0) { errno = err; return -1; }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

/* Connects and is admitted, retrying until the timeout: rank 0 may not listen yet,
   and a crowd of strangers may push a newcomer out. A refusal, or a port where
   something else answers, ends it at once. */
static ddp_result ddp__store_connect(ddp_ctx *ctx)
{
    ddp__settings *cfg = &ctx->st->cfg;
    int64_t deadline = ddp__now_ms() + cfg->timeout_ms;
    int backoff = 10, err = ECONNREFUSED;
    char why[512];
    ddp_result r;
    for (;;) {
        int fd = ddp__dial(ctx, &r), admitted;
        if (r != DDP_OK) return r;
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) { /* no retry mends that */
            struct rlimit rl;
            err = errno;
            return ddp__fail(ctx, DDP_ERR_SYSTEM, "rank %d cannot open a socket to the store: %s (ulimit -n is %llu)",
                             ctx->rank, strerror(err), getrlimit(RLIMIT_NOFILE, &rl) == 0 ?
                             (unsigned long long)rl.rlim_cur : 0ULL);
        }
        if (fd < 0) err = errno;
        else {
            admitted = ddp__store_hello(ctx, fd, deadline, why, sizeof why);
            if (admitted > 0) { ctx->st->store_fd = fd; return DDP_OK; }
            close(fd);
            if (admitted == -3) ctx->st->waited = 0; /* rank 0 hosts the store */
            if (admitted < 0)
                return ddp__fail(ctx, admitted == -3 ? DDP_ERR_TIMEOUT : admitted == -2 ? DDP_ERR_PROTOCOL : DDP_ERR_REFUSED,
                                 "%s", why);
            err = ECONNRESET;
        }
        if (ddp__now_ms() + backoff > deadline) {
            ctx->st->waited = 0; /* rank 0 hosts the store */
            return ddp__fail(ctx, DDP_ERR_TIMEOUT, "cannot reach rank 0's store at %s:%d within %.*f s: %s",
                             cfg->master_addr, cfg->master_port, DDP__SECONDS(cfg->timeout_ms), strerror(err));
        }
        ddp__sleep_ms(backoff);
        /* at most 0.1 s: a rank that waits for rank 0 joins as soon as it listens */
        backoff = backoff * 2 > 100 ? 100 : backoff * 2;
    }
}

/* Rank 0 found MASTER_PORT taken: asks the holder who it is. A store of this job id
   takes the question as a second claim to rank 0 and stops its job too (a rank of
   this launch may already have joined it). */
static ddp_result ddp__port_taken(ddp_ctx *ctx)
{
    ddp__settings *cfg = &ctx->st->cfg;
    char why[512] = "what listens there did not answer as a ddp store";
    ddp_result r;
    int fd = ddp__dial(ctx, &r), said;
    if (r != DDP_OK) return r;
    if (fd >= 0) {
        said = ddp__store_hello(ctx, fd, ddp__now_ms() + 2000, why, sizeof why);
        if (said == 1) snprintf(why, sizeof why, "a ddp store of another version holds it");
        if (said == -3) /* (asked for 2 s, not the timeout it names) */
            snprintf(why, sizeof why, "what listens there took the connection but did not answer a ddp store's hello "
                     "within 2 s");
        close(fd);
    }
    return ddp__fail(ctx, DDP_ERR_ENV, "rank 0 cannot open the store on %s:%d, the port is in use: %s%s",
                     cfg->master_addr, cfg->master_port, why,
                     strstr(why, "MASTER_PORT") ? "" : " (give each job its own MASTER_PORT or DDP_JOB_ID)");
}

static ddp_result ddp__store_set(ddp_ctx *ctx, const char *key, const void *val, uint32_t len, const char *what)
{
    return ddp__store_req(ctx, DDP__SET, key, val, len, NULL, NULL, what);
}

/* Waits (on the server) until key exists. */
static ddp_result ddp__store_get(ddp_ctx *ctx, const char *key, char **val, uint32_t *len, const char *what)
{
    return ddp__store_req(ctx, DDP__GET, key, NULL, 0, val, len, what);
}

/* Every rank sends `val`; parts[r] (length lens[r]) receives rank r's, pointing into
   *all (one allocation for the caller to free). */
static ddp_result ddp__store_gather(ddp_ctx *ctx, const char *key, const void *val, uint32_t len, char **all,
                                    const char **parts, uint32_t *lens, const char *what)
{
    uint32_t total = 0, n;
    char *p;
    int r;
    ddp_result res = ddp__store_req(ctx, DDP__GATHER, key, val, len, all, &total, what);
    if (res != DDP_OK) return res;
    for (p = *all, r = 0; r < ctx->world_size; r++) {
        if ((size_t)(p - *all) + 4 > total) break;
        memcpy(&n, p, 4);
        n = ntohl(n);
        if ((size_t)(p - *all) + 4 + n > total) break;
        if (parts) parts[r] = p + 4;
        if (lens) lens[r] = n;
        p += 4 + n;
    }
    if (r < ctx->world_size) {
        DDP_FREE(*all);
        *all = NULL;
        return ddp__fail(ctx, DDP_ERR_PROTOCOL, "the store sent a malformed answer %s", what);
    }
    return DDP_OK;
}

static ddp_result ddp__store_barrier(ddp_ctx *ctx, const char *key, const char *what)
{
    char *all = NULL;
    ddp_result r = ddp__store_gather(ctx, key, "", 0, &all, NULL, NULL, what);
    DDP_FREE(all);
    return r;
}

/* ---- >>cpu -----------------------------------------------------------------------------------
   One POSIX shared-memory arena per host. Layout: header (barrier words, each rank's
   fingerprints, pids, abort reasons), then one staging slot of `chunk` bytes per rank,
   then one result slot. A collective moves any size through the slots chunk by chunk:
   copy in, barrier, each rank reduces its 1/W share of the chunk, barrier, copy out.
   At the first barrier of every collective each rank compares every rank's
   fingerprint with its own, so ranks that disagree stop before any data is combined.
   Waiting ranks sleep on a futex (they spin briefly first only when there are at
   least as many cores as ranks), and every sleep is short enough to notice a dead
   peer, an abort or the timeout. A rank holds a lock on its own byte of the arena
   file while it lives: the kernel drops it when the process dies, which tells the
   others across PID namespaces, and tells a later job that an arena left behind by
   a crash is nobody's. */

typedef struct ddp__shm {
    uint64_t token;                        /* random: proves ranks mapped the same arena */
    int32_t pids[DDP__MAX_CPU_RANKS];      /* for messages, and ddp__shm_alive */
    uint64_t pidns[DDP__MAX_CPU_RANKS];    /* each rank's PID namespace (its inode), 0 unknown */
    uint64_t arrived[DDP__MAX_CPU_RANKS];  /* barriers each rank has entered */
    ddp__fp fp[2][DDP__MAX_CPU_RANKS];     /* by the parity of ddp__cpu's meets: compared at the first barrier */
    ddp__fp now[DDP__MAX_CPU_RANKS];       /* the collective each rank entered last */
    char why[DDP__MAX_CPU_RANKS][160];     /* a failing rank's reason, for the others */
    uint32_t aborted;                      /* 1 + rank of the first rank that failed, or 0 */
    char pad0[60];
    uint32_t count; /* ranks inside the current barrier */
    char pad1[60];
    uint32_t gen;   /* barrier generation: futex word */
    char pad2[60];
    uint32_t sleepers;
} ddp__shm;

typedef struct ddp__cpu {
    ddp__shm *shm;
    size_t size, chunk;
    int fd;    /* kept open: its lock says this rank is alive */
    int spin;  /* spin DDP__SPIN_NS before sleeping (only when ranks <= cores) */
    uint64_t meets; /* collectives this rank has met the others in: a refused call takes a number but no
                       meeting, so its number's parity could name the slot a slower rank still reads */
} ddp__cpu;

#define DDP__SHM_HEADER (((sizeof(ddp__shm) + 4095) / 4096) * 4096)

static ddp__cpu *ddp__cpu_of(ddp_ctx *ctx) { return (ddp__cpu *)ctx->st->bs; }

static char *ddp__slot(ddp_ctx *ctx, int r) /* r == world_size: the result slot */
{
    ddp__cpu *cpu = ddp__cpu_of(ctx);
    return (char *)cpu->shm + DDP__SHM_HEADER + (size_t)r * cpu->chunk;
}

#if defined(__x86_64__) || defined(__i386__)
#define DDP__RELAX() __builtin_ia32_pause()
#else
#define DDP__RELAX() ((void)0)
#endif

/* 1 while some process holds a lock on bytes [first, first + n) of the arena file */
static int ddp__locked(int fd, int first, int n)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = first;
    fl.l_len = n;
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return 1; /* cannot tell: assume alive */
    return fl.l_type != F_UNLCK;
}

/* This process's PID namespace (the inode of /proc/self/ns/pid), 0 where /proc cannot say. */
static uint64_t ddp__pidns(void)
{
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

/* Rank i lives: its lock on its byte is held, and where it shares this rank's PID
   namespace, its pid exists. The lock alone is not enough: a child it forked (a data
   loader's worker, no exec) shares the lock's open file, and holds it after the rank died. */
static int ddp__shm_alive(ddp_ctx *ctx, int i)
{
    ddp__cpu *cpu = ddp__cpu_of(ctx);
    const ddp__shm *h = cpu->shm;
    char path[64], buf[256], *end;
    ssize_t n;
    int fd;
    if (!ddp__locked(cpu->fd, i, 1)) return 0;
    if (!h->pidns[i] || h->pidns[i] != h->pidns[ctx->rank]) return 1; /* its pid means nothing here */
    if (kill(h->pids[i], 0) != 0 && errno == ESRCH) return 0;
    /* a zombie (its parent has not waited yet) is gone too, where /proc is this namespace's */
    n = readlink("/proc/self", buf, sizeof buf - 1);
    if (n <= 0 || (buf[n] = 0, strtol(buf, &end, 10) != (long)getpid()) || *end) return 1;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)h->pids[i]);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) return 1;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = 0;
    return !((end = strrchr(buf, ')')) != NULL && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X'));
}

/* Marks the arena aborted (first failure wins) and wakes every sleeper. */
static ddp_result ddp__shm_abort(ddp_ctx *ctx, ddp_result code)
{
    ddp__shm *h = ddp__cpu_of(ctx)->shm;
    uint32_t none = 0;
    char *why = h->why[ctx->rank], *cut;
    pthread_mutex_lock(&ctx->st->log_mu);
    if (ddp__copy(why, sizeof h->why[0], ctx->st->err) >= sizeof h->why[0]) { /* cut at a word: "...every ran" */
        why[sizeof h->why[0] - 4] = 0;
        cut = strrchr(why, ' ');
        strcpy(cut && cut > why + sizeof h->why[0] / 2 ? cut : why + sizeof h->why[0] - 4, "...");
    }
    pthread_mutex_unlock(&ctx->st->log_mu);
    __atomic_compare_exchange_n(&h->aborted, &none, (uint32_t)ctx->rank + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &h->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    return code;
}

/* "ranks 1 (all_reduce #11), 3 (not started)": where the ranks this one waits for are;
   the first of them goes to st->waited, for this rank's report to the launcher */
static void ddp__shm_late(ddp_ctx *ctx, uint64_t mine, char *out, size_t size)
{
    ddp__shm *h = ddp__cpu_of(ctx)->shm;
    size_t n = 0;
    int i, late = 0;
    out[0] = 0;
    for (i = 0; i < ctx->world_size && n + 48 < size; i++) {
        const ddp__fp *f = &h->now[i];
        if (__atomic_load_n(&h->arrived[i], __ATOMIC_RELAXED) >= mine) continue;
        if (!late) ctx->st->waited = i;
        if (f->seq)
            n += (size_t)snprintf(out + n, size - n, "%s%d (last in %s #%llu)", late ? ", " : "", i,
                                  (unsigned)f->kind < DDP__COLL_COUNT ? ddp__colls[f->kind].name : "?",
                                  (unsigned long long)f->seq);
        else
            n += (size_t)snprintf(out + n, size - n, "%s%d (no collective yet)", late ? ", " : "", i);
        late++;
    }
}

static ddp_result ddp__shm_barrier(ddp_ctx *ctx, const ddp__coll *c)
{
    struct ddp__state *st = ctx->st;
    ddp__cpu *cpu = ddp__cpu_of(ctx);
    ddp__shm *h = cpu->shm;
    uint32_t gen = __atomic_load_n(&h->gen, __ATOMIC_ACQUIRE), who;
    const uint64_t mine = __atomic_load_n(&h->arrived[ctx->rank], __ATOMIC_RELAXED) + 1; /* only this rank writes it */
    int64_t start, deadline, next_check, looked;
    int i;
    /* counted first, then arrived: a rank that dies between the two is one that has not
       arrived, which the others check for (the other order hid it: its count was missing
       for good while its arrival said it was there, and the wait ran out naming nobody) */
    const int last = __atomic_add_fetch(&h->count, 1, __ATOMIC_ACQ_REL) == (uint32_t)ctx->world_size;
    __atomic_store_n(&h->arrived[ctx->rank], mine, __ATOMIC_RELAXED);
    if (last) {
        __atomic_store_n(&h->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&h->gen, gen + 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&h->sleepers, __ATOMIC_SEQ_CST))
            syscall(SYS_futex, &h->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        return DDP_OK;
    }
    if (cpu->spin) { /* a few microseconds: a peer that is nearly there costs no sleep */
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
    start = looked = ddp__now_ms();
    deadline = start + st->cfg.timeout_ms;
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
            return ddp__fail(ctx, DDP_ERR_ABORTED, "%s #%llu stopped: rank %u failed: %s", ddp__colls[c->kind].name,
                             (unsigned long long)c->seq, who - 1, h->why[who - 1]);
        ddp__not_stopped(&looked, now = ddp__now_ms(), &deadline);
        if (now >= next_check || now >= deadline) {
            char late[200];
            /* a rank gone, whether it had arrived or not: while the barrier is not complete
               none could have left it, so one that arrived and died (while another is late)
               is named now, not once the late one comes; complete by now, it left it */
            for (i = 0; i < ctx->world_size; i++) {
                if (i == ctx->rank || ddp__shm_alive(ctx, i)) continue;
                if (__atomic_load_n(&h->gen, __ATOMIC_ACQUIRE) != gen) return DDP_OK;
                ddp__fail(ctx, DDP_ERR_PEER, "rank %d (pid %d) exited during %s #%llu", i, h->pids[i],
                          ddp__colls[c->kind].name, (unsigned long long)c->seq);
                return ddp__shm_abort(ctx, DDP_ERR_PEER);
            }
            if (now >= deadline) {
                ddp__shm_late(ctx, mine, late, sizeof late);
                ddp__fail(ctx, DDP_ERR_TIMEOUT, "%s #%llu timed out after %.*f s waiting for rank%s %s",
                          ddp__colls[c->kind].name, (unsigned long long)c->seq, DDP__SECONDS(st->cfg.timeout_ms),
                          strchr(late, ',') ? "s" : "", late);
                return ddp__shm_abort(ctx, DDP_ERR_TIMEOUT);
            }
            next_check = now + 100;
        }
    }
    return DDP_OK;
}

/* What two fingerprints that differ are to this rank: its own ddp_destroy while another
   is in a collective is its failure (the launcher names it), another's is a peer that
   left, anything else a mismatch on every rank. */
static ddp_result ddp__fp_code(const ddp__fp *mine, const ddp__fp *theirs)
{
    if (mine->kind == DDP__DESTROY && theirs->kind != DDP__DESTROY) return DDP_ERR_ARG;
    return theirs->kind == DDP__DESTROY && mine->kind != DDP__DESTROY ? DDP_ERR_PEER : DDP_ERR_MISMATCH;
}

/* The first barrier of a collective: everyone has published its fingerprint, and
   each rank checks all of them before any data is combined. */
static ddp_result ddp__shm_meet(ddp_ctx *ctx, const ddp__coll *c)
{
    ddp__cpu *cpu = ddp__cpu_of(ctx);
    ddp__shm *h = cpu->shm;
    ddp__fp mine = ddp__fingerprint(c);
    const int slot = (int)(++cpu->meets & 1); /* a rank can be one meeting ahead, never two */
    ddp_result r;
    int i;
    h->fp[slot][ctx->rank] = mine;
    if ((r = ddp__shm_barrier(ctx, c)) != DDP_OK) return r;
    for (i = 0; i < ctx->world_size; i++) {
        const ddp__fp *f = &h->fp[slot][i];
        if (memcmp(f, &mine, sizeof mine) != 0) {
            char why[300];
            /* a rank a call behind or ahead wrote the other slot: name the call it is in */
            ddp__fp theirs = f->seq == mine.seq ? *f : h->now[i];
            ddp__fp_diff(why, sizeof why, ctx->rank, &mine, i, &theirs);
            ddp__fail(ctx, ddp__fp_code(&mine, &theirs), "%s", why);
            return ddp__shm_abort(ctx, ddp__fp_code(&mine, &theirs));
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

/* Sums in each dtype's accumulator; integers wrap as NCCL's and PyTorch's do (in
   unsigned arithmetic, where signed overflow would be undefined). And NaN tests. */
static float ddp__add_DDP_F32(float a, float b) { return a + b; }
static double ddp__add_DDP_F64(double a, double b) { return a + b; }
static float ddp__add_DDP_BF16(float a, float b) { return a + b; }
static float ddp__add_DDP_F16(float a, float b) { return a + b; }
static int32_t ddp__add_DDP_I32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
static int64_t ddp__add_DDP_I64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int ddp__nan_DDP_F32(float v) { return v != v; }
static int ddp__nan_DDP_F64(double v) { return v != v; }
static int ddp__nan_DDP_BF16(float v) { return v != v; }
static int ddp__nan_DDP_F16(float v) { return v != v; }
static int ddp__nan_DDP_I32(int32_t v) { (void)v; return 0; }
static int ddp__nan_DDP_I64(int64_t v) { (void)v; return 0; }

/* out[0..n) = reduction over ranks of src[r][0..n), src[r] = base + r * stride bytes,
   one function per dtype from its row. Ranks are combined in order 0..ranks-1 in the
   accumulator type, a block at a time, so every rank computes bitwise the same. With
   `from` (n accumulators, a previous host's partial result) the ranks are combined
   into it; with world = 0 the accumulators themselves are stored (a partial result for
   the next host), else the values (AVG divides by world). So a chain of hosts, each
   adding its ranks in order, gets the bits of one host adding them all. */
#define DDP__REDUCER(e, name, T, A, nccl, load, store)                                                \
    static void ddp__reduce_##e(void *out, const void *from, const char *base, size_t stride, int ranks, \
                                size_t n, ddp_op op, int world)                                       \
    {                                                                                                 \
        A acc[256];                                                                                   \
        size_t b0, bn, i;                                                                             \
        int r;                                                                                        \
        for (b0 = 0; b0 < n; b0 += bn) {                                                              \
            const T *s = (const T *)base + b0;                                                        \
            bn = n - b0 < 256 ? n - b0 : 256;                                                         \
            if (from) memcpy(acc, (const A *)from + b0, bn * sizeof(A));                              \
            else for (i = 0; i < bn; i++) acc[i] = load(s[i]);                                        \
            for (r = from ? 0 : 1; r < ranks; r++) {                                                  \
                s = (const T *)(base + (size_t)r * stride) + b0;                                      \
                if (op == DDP_MIN) /* a NaN wins, on whichever rank it is */                          \
                    for (i = 0; i < bn; i++) { A v = load(s[i]); acc[i] = v < acc[i] || ddp__nan_##e(v) ? v : acc[i]; } \
                else if (op == DDP_MAX)                                                               \
                    for (i = 0; i < bn; i++) { A v = load(s[i]); acc[i] = v > acc[i] || ddp__nan_##e(v) ? v : acc[i]; } \
                else                                                                                  \
                    for (i = 0; i < bn; i++) acc[i] = ddp__add_##e(acc[i], load(s[i]));                \
            }                                                                                         \
            if (!world) {                                                                             \
                memcpy((A *)out + b0, acc, bn * sizeof(A));                                           \
                continue;                                                                             \
            }                                                                                         \
            if (op == DDP_AVG)                                                                        \
                for (i = 0; i < bn; i++) acc[i] /= (A)world;                                          \
            for (i = 0; i < bn; i++) ((T *)out)[b0 + i] = store(acc[i]);                              \
        }                                                                                             \
    }
DDP__DTYPES(DDP__REDUCER)
#undef DDP__REDUCER
static void (*const ddp__reducers[])(void *, const void *, const char *, size_t, int, size_t, ddp_op, int) = {
#define DDP__REDUCER_PTR(e, name, T, A, nccl, load, store) ddp__reduce_##e,
    DDP__DTYPES(DDP__REDUCER_PTR)
#undef DDP__REDUCER_PTR
};
DDP__STATIC_ASSERT(reducer_table, sizeof ddp__reducers / sizeof ddp__reducers[0] == DDP_DTYPE_COUNT);

/* A world of one: every collective is a copy (or nothing). */
static ddp_result ddp__solo_run(const ddp__coll *c)
{
    size_t bytes = c->count * ddp_dtype_size((ddp_dtype)c->dtype);
    if (ddp__colls[c->kind].send && c->send != c->recv && bytes) memmove(c->recv, c->send, bytes);
    return DDP_OK;
}

/* Runs one collective through the arena. */
static ddp_result ddp__cpu_run(ddp_ctx *ctx, const ddp__coll *c, void *stream, ddp_work *work)
{
    ddp__cpu *cpu = ddp__cpu_of(ctx);
    int W = ctx->world_size, me = ctx->rank, r;
    size_t es = ddp_dtype_size((ddp_dtype)c->dtype), per, off = 0, n;
    const char *send = (const char *)c->send;
    char *recv = (char *)c->recv, *mine, *result;
    ddp_result res = DDP_OK;
    (void)stream;
    (void)work;
    if (W == 1) return ddp__solo_run(c);
    per = cpu->chunk / es;
    mine = ddp__slot(ctx, me);
    result = ddp__slot(ctx, W);
    cpu->shm->now[me] = ddp__fingerprint(c);
    if (!ddp__coll_moves_data(c->kind) || c->count == 0) return ddp__shm_meet(ctx, c);
    switch (c->kind) {
    case DDP__ALL_REDUCE:
        for (off = 0; off < c->count && res == DDP_OK; off += n) {
            size_t lo, hi;
            n = c->count - off < per ? c->count - off : per;
            lo = n * (size_t)me / (size_t)W;
            hi = n * (size_t)(me + 1) / (size_t)W;
            ddp__copy_shared(mine, send + off * es, n * es);
            if ((res = off ? ddp__shm_barrier(ctx, c) : ddp__shm_meet(ctx, c)) != DDP_OK) break;
            ddp__reducers[c->dtype](result + lo * es, NULL, ddp__slot(ctx, 0) + lo * es, cpu->chunk, W, hi - lo,
                                    (ddp_op)c->op, W);
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
            if ((res = off ? ddp__shm_barrier(ctx, c) : ddp__shm_meet(ctx, c)) != DDP_OK) break;
            if (me != c->root) ddp__copy_shared(recv + off * es, ddp__slot(ctx, c->root), n * es);
            res = ddp__shm_barrier(ctx, c);
        }
        return res;
    case DDP__ALL_GATHER:
        for (off = 0; off < c->count && res == DDP_OK; off += n) {
            n = c->count - off < per ? c->count - off : per;
            ddp__copy_shared(mine, send + off * es, n * es);
            if ((res = off ? ddp__shm_barrier(ctx, c) : ddp__shm_meet(ctx, c)) != DDP_OK) break;
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
            if ((res = off ? ddp__shm_barrier(ctx, c) : ddp__shm_meet(ctx, c)) != DDP_OK) break;
            ddp__reducers[c->dtype](recv + off * es, NULL, ddp__slot(ctx, 0) + (size_t)me * n * es, cpu->chunk, W, n,
                                    (ddp_op)c->op, W);
            res = ddp__shm_barrier(ctx, c);
        }
        return res;
    }
    return ddp__fail(ctx, DDP_ERR_ARG, "unknown collective %d", c->kind);
}

/* Arenas are named /dev/shm/ddp.<job hash>.<creator pid>: the launcher removes its
   job's (min_age < 0: all of them), and a new job, or a rank of a job that failed,
   removes those nobody holds a lock on (their ranks are all gone) and that are at
   least min_age seconds old. An arena has its creator's lock before it has a name
   (ddp__shm_create), except where /dev/shm cannot make it unnamed first: a few
   seconds of age cover that instant. */
static int ddp__arena_name(const char *s) /* ddp.<16 hex digits>.<pid>, nothing else */
{
    int i;
    if (strncmp(s, "ddp.", 4) != 0) return 0;
    for (i = 4; i < 20; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    if (s[20] != '.' || s[21] < '0' || s[21] > '9') return 0;
    for (i = 21; s[i] >= '0' && s[i] <= '9'; i++) {}
    return s[i] == 0;
}

/* Only arenas are swept: a name of that form, a regular file (a FIFO another user made
   there would block the open; other ddp.* files are not ours to remove). */
static void ddp__shm_sweep(const char *prefix, int min_age)
{
    DIR *dir = opendir("/dev/shm");
    struct dirent *e;
    if (!dir) return;
    while ((e = readdir(dir)) != NULL) {
        char name[300];
        struct stat sb;
        int fd, orphan;
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || !ddp__arena_name(e->d_name)) continue;
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (min_age < 0) { shm_unlink(name); continue; }
        if ((fd = shm_open(name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW, 0)) < 0) continue;
        if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            close(fd);
            continue;
        }
        /* time(NULL) lags the clock that stamps files by up to a tick: no age asked, none read */
        orphan = (!min_age || time(NULL) - sb.st_mtime >= min_age) && !ddp__locked(fd, 0, DDP__MAX_CPU_RANKS);
        close(fd);
        if (orphan) shm_unlink(name);
    }
    closedir(dir);
}

/* This rank's lock on its byte of the arena, held until the process ends. */
static ddp_result ddp__cpu_lock(ddp_ctx *ctx, int fd, const char *name)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = ctx->rank;
    fl.l_len = 1;
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return DDP_OK;
    return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot lock byte %d of shared memory %s: %s", ctx->rank, name, strerror(errno));
}

/* Rank 0's arena, locked and its pages reserved (a full /dev/shm is an error here,
   not a SIGBUS later) before it has a name: made unnamed (O_TMPFILE) and linked as
   `name` only then, so a named arena always has a holder while its ranks live, and a
   crash before leaves nothing. Where /dev/shm cannot, by name and locked at once. */
static int ddp__shm_create(ddp_ctx *ctx, const char *name, size_t size, ddp_result *r)
{
    char path[300], proc[64];
    int named, fd = -1;
    struct rlimit fsize;
    /* a file past the limit of `ulimit -f` is SIGXFSZ, which kills the process */
    if (getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY && (rlim_t)size > fsize.rlim_cur) {
        /* the smallest chunk (64 bytes) shrinks the arena to its header and 64 bytes a slot */
        const size_t least = DDP__SHM_HEADER + (size_t)(ctx->world_size + 1) * 64;
        *r = ddp__fail(ctx, DDP_ERR_SYSTEM, "the CPU backend's shared memory needs %.0f KiB, over this process's file "
                       "size limit of %.0f KiB (ulimit -f): raise it%s", size / 1024.0, (double)fsize.rlim_cur / 1024.0,
                       (rlim_t)least <= fsize.rlim_cur ? ", or lower DDP_SHM_CHUNK" : "");
        return -1;
    }
    snprintf(path, sizeof path, "/dev/shm%s", name);
    for (named = 0; named < 2; named++) {
        fd = named ? shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)
                   : open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) continue;
        if ((*r = ddp__cpu_lock(ctx, fd, name)) != DDP_OK) break;
        if (ftruncate(fd, (off_t)size) != 0 || posix_fallocate(fd, 0, (off_t)size) != 0) {
            struct statvfs vs;
            double free_mb = statvfs("/dev/shm", &vs) == 0 ? (double)vs.f_bavail * vs.f_frsize / 1048576.0 : -1;
            *r = ddp__fail(ctx, DDP_ERR_SYSTEM, "/dev/shm has %.1f MiB free, the CPU backend needs %.1f MiB (%d ranks "
                           "+ 1 x %zu bytes): enlarge /dev/shm (docker --shm-size) or lower DDP_SHM_CHUNK", free_mb,
                           size / 1048576.0, ctx->world_size, ddp__cpu_of(ctx)->chunk);
            break;
        }
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
        if (named || linkat(AT_FDCWD, proc, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0) return fd;
        close(fd); /* no /proc to name it by: by name, then */
        fd = -1;
    }
    if (fd < 0) {
        *r = ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot create shared memory %s: %s", path, strerror(errno));
        return -1;
    }
    close(fd);
    if (named) shm_unlink(name);
    return -1;
}

static ddp_result ddp__cpu_init(ddp_ctx *ctx)
{
    struct ddp__state *st = ctx->st;
    ddp__cpu *cpu;
    char name[128], *got = NULL;
    unsigned long long token = 0;
    int fd = -1;
    ddp_result r;
    void *p;

    /* what the CPU backend can run: one host, up to DDP__MAX_CPU_RANKS ranks */
    if (ctx->world_size == 1) return DDP_OK; /* every collective is a copy */
    if (ctx->num_nodes > 1)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the CPU backend runs on one host, but this job spans %d hosts: %s",
                         ctx->num_nodes, ddp__spans_hosts(ctx));
    if (ctx->world_size > DDP__MAX_CPU_RANKS)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the CPU backend takes at most %d ranks, not %d", DDP__MAX_CPU_RANKS,
                         ctx->world_size);
    if (!(cpu = DDP__CAST(ddp__cpu *, DDP_MALLOC(sizeof *cpu)))) return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory");
    memset(cpu, 0, sizeof *cpu);
    cpu->fd = -1;
    st->bs = cpu;
    cpu->chunk = st->cfg.chunk;
    cpu->size = DDP__SHM_HEADER + (size_t)(ctx->world_size + 1) * cpu->chunk;

    /* one host (by host name and boot id), so one arena, made by rank 0: launchers that
       split one machine into "nodes" (two torchrun --nnodes=2 to rehearse) share it */
    if (ctx->rank == 0) {
        ddp__shm_sweep("ddp.", 5);
        snprintf(name, sizeof name, "/ddp.%016llx.%d", (unsigned long long)ddp__hash(st->cfg.job_id), (int)getpid());
        if ((fd = ddp__shm_create(ctx, name, cpu->size, &r)) < 0) return r;
        ddp__random(&token, sizeof token);
    } else {
        if ((r = ddp__store_get(ctx, "shm", &got, NULL, "waiting for rank 0's shared memory")) != DDP_OK) return r;
        if (sscanf(got, "%127s %llx", name, &token) != 2) {
            DDP_FREE(got);
            return ddp__fail(ctx, DDP_ERR_PROTOCOL, "rank 0 sent a malformed arena name");
        }
        DDP_FREE(got);
        fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0)
            return ddp__fail(ctx, DDP_ERR_BACKEND, "cannot open rank 0's shared memory %s: %s (ranks with one host name "
                             "and boot id but separate /dev/shm? give them distinct host names)", name, strerror(errno));
        if ((r = ddp__cpu_lock(ctx, fd, name)) != DDP_OK) { close(fd); return r; }
    }

    /* mapped: rank 0 writes its token there and publishes the name, the others check it */
    cpu->fd = fd;
    p = mmap(NULL, cpu->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        if (ctx->rank == 0) shm_unlink(name);
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot map %zu bytes of shared memory: %s", cpu->size, strerror(errno));
    }
    cpu->shm = (ddp__shm *)p;
    if (ctx->rank == 0) {
        char text[160];
        cpu->shm->token = token;
        snprintf(text, sizeof text, "%s %llx", name, token);
        if ((r = ddp__store_set(ctx, "shm", text, (uint32_t)strlen(text), "publishing the shared memory")) != DDP_OK) {
            shm_unlink(name);
            return r;
        }
    } else if (cpu->shm->token != token) {
        return ddp__fail(ctx, DDP_ERR_BACKEND, "shared memory %s is not rank 0's (ranks with one host name and boot "
                         "id but separate /dev/shm? give them distinct host names)", name);
    }
    cpu->shm->pids[ctx->rank] = (int32_t)getpid();
    cpu->shm->pidns[ctx->rank] = ddp__pidns();

    /* once everyone has it mapped the name goes, removed by whoever gets there first (rank
       0 may die right after the barrier, and a failing program may skip ddp_destroy); if
       rank 0 dies before, the last rank to let go of it removes it (ddp__cpu_release) */
    r = ddp__store_barrier(ctx, "mapped", "waiting for every rank to map the shared memory");
    if (ctx->rank == 0 || r == DDP_OK) shm_unlink(name);
    if (r != DDP_OK) return r;
    cpu->spin = ddp__cores_allowed() >= ctx->world_size; /* the cores it may use (taskset, a cpuset), not the machine's */
    return DDP_OK;
}

static void ddp__cpu_release(ddp_ctx *ctx)
{
    ddp__cpu *cpu = ddp__cpu_of(ctx);
    char prefix[40];
    if (cpu) {
        if (cpu->shm) munmap(cpu->shm, cpu->size);
        if (cpu->fd >= 0) close(cpu->fd);
        DDP_FREE(cpu);
        ctx->st->bs = NULL;
    }
    /* a job that failed in its first moments (rank 0 killed before it removed the name,
       maybe while this rank was still joining): the last rank to let go removes the
       arena nobody holds any more */
    snprintf(prefix, sizeof prefix, "ddp.%016llx.", (unsigned long long)ddp__hash(ctx->st->cfg.job_id));
    if (ctx->st->broken && ctx->world_size > 1) ddp__shm_sweep(prefix, 0);
}

/* A failure on one rank stops the others at once. */
static void ddp__cpu_abort(ddp_ctx *ctx, ddp_result code)
{
    ddp__cpu *cpu = ddp__cpu_of(ctx);
    if (cpu && cpu->shm && !__atomic_load_n(&cpu->shm->aborted, __ATOMIC_SEQ_CST)) ddp__shm_abort(ctx, code);
}

/* ---- >>nccl ----------------------------------------------------------------------------------
   One communicator per process, on the GPU ddp__device_for picks, created non-blocking
   so that a stuck peer turns into a timeout and an abort instead of a hang. Collectives
   run on the context's own stream, ordered after the caller's stream by an event, and
   the caller's stream is ordered after them (async ones: in ddp_wait, so they overlap).
   Host memory (a stack variable, as on the CPU backend) is staged through device
   memory, and such a call returns when its result is in place.

   A watchdog thread follows every collective. Two events bracket it on the NCCL
   stream, and its time starts when the first has completed: when everything queued
   before it (the caller's kernels, earlier collectives) is done and it can run, so a
   long backward pass ahead of a bucket does not count against the bucket. One still
   running DDP_TIMEOUT after its start, or an error NCCL reports, aborts the
   communicator. What follows an abort:
   - NCCL's kernels end, so the NCCL stream, and the caller's streams ordered after
     it, run on: a cudaStreamSynchronize returns cudaSuccess, and the collectives in
     flight leave garbage in their outputs (CUDA reports nothing);
   - a host wait in progress (ddp_wait, a collective on host memory) returns at once,
     else the next ddp.h call on the context that uses NCCL (a collective, ddp_wait,
     ddp_grad_ready or _finish, ddp_metric_reduce, ddp_barrier) returns DDP_ERR_TIMEOUT
     (DDP_ERR_BACKEND for an NCCL error) with the reason, and later ones DDP_ERR_ABORTED.
   Threads: the communicator and the ring of followed collectives belong to b->mu.
   Every NCCL call on the communicator is made under it (NCCL serves one thread at a
   time), and none of them waits long (the communicator is non-blocking); waits for the
   GPU poll with the lock released. The first failure takes the communicator out
   under the lock and records why, and whoever took it aborts it after releasing the
   lock: it is aborted once, and nobody uses it after. The watchdog selects this
   rank's GPU before anything else, as every thread that makes CUDA calls must (else
   CUDA opens a context on GPU 0 for it, on every rank of the host). */
#ifdef DDP_NCCL
#define DDP__RING 256 /* collectives followed at once; the next waits for the oldest */

typedef struct ddp__followed {
    cudaEvent_t start, done; /* around the collective on the NCCL stream; made once, reused */
    uint64_t seq;
    int kind;
    int64_t began_ms;        /* when the watchdog saw `start` complete; 0 until then */
} ddp__followed;

typedef struct ddp__nccl {
    ncclComm_t comm;         /* NULL once taken out by a failure */
    cudaStream_t stream;
    cudaEvent_t ready;       /* the caller's stream, before a collective */
    void *dev, *host;        /* staging for host memory: device and pinned buffers */
    size_t staged;           /* their size */
    int device;
    int64_t timeout_ms;
    pthread_t watchdog;
    int watching;            /* the thread was started */
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* the watchdog's tick and start */
    int up, stop;            /* up: 1 the watchdog runs on `device`, -1 it could not select it */
    cudaError_t up_error;
    ddp_result failed;       /* why comm was taken out; DDP_OK while it serves */
    char why[300];           /* written once, before `failed` is set */
    ddp__followed ring[DDP__RING];
    uint64_t head, tail;     /* ring[head .. tail) mod DDP__RING: in flight, oldest first */
} ddp__nccl;

static ddp__nccl *ddp__nccl_of(ddp_ctx *ctx) { return (ddp__nccl *)ctx->st->bs; }

static ddp_result ddp__cuda(ddp_ctx *ctx, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return DDP_OK;
    return ddp__fail(ctx, DDP_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(e));
}

/* Every thread that calls into the backend works on this rank's GPU: a thread that
   never selected one works on GPU 0, where this rank's stream and events are not
   (cudaEventRecord: invalid resource handle on every rank but the first). The GPU
   stays selected for the thread, as ddp_init leaves it for its own. */
static ddp_result ddp__nccl_here(ddp_ctx *ctx)
{
    int d = -1;
    if (cudaGetDevice(&d) == cudaSuccess && d == ddp__nccl_of(ctx)->device) return DDP_OK;
    return ddp__cuda(ctx, cudaSetDevice(ddp__nccl_of(ctx)->device), "cudaSetDevice (the rank's GPU, on this thread)");
}

/* "cudaGetDeviceCount: CUDA driver version is insufficient (driver 12.2, runtime 13.0)" */
static void ddp__cuda_why(char *out, size_t n, cudaError_t e)
{
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    snprintf(out, n, "cudaGetDeviceCount: %s (driver %d.%d, runtime %d.%d)", cudaGetErrorString(e), drv / 1000,
             drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
}

/* NCCL's error as ddp.h's: a remote one (a peer that exited, a network that failed) is
   another rank's failure, so the launcher names that rank rather than this one */
#define DDP__NCCL_CODE(r) ((r) == ncclRemoteError ? DDP_ERR_PEER : DDP_ERR_BACKEND)

/* Under b->mu: the first failure takes the communicator out and says why. Returns it
   for the caller to abort once the lock is released; NULL if an earlier failure did. */
static ncclComm_t ddp__nccl_take(ddp__nccl *b, ddp_result code, const char *fmt, ...) DDP__PRINTF(3, 4);
static ncclComm_t ddp__nccl_take(ddp__nccl *b, ddp_result code, const char *fmt, ...)
{
    ncclComm_t comm = b->comm;
    va_list ap;
    if (b->failed) return NULL;
    va_start(ap, fmt);
    vsnprintf(b->why, sizeof b->why, fmt, ap);
    va_end(ap);
    b->failed = code;
    b->comm = NULL;
    return comm;
}

/* DDP_OK while the communicator serves, else the failure that took it out, reported
   for `what`. */
static ddp_result ddp__nccl_alive(ddp_ctx *ctx, const char *what, uint64_t seq)
{
    ddp__nccl *b = ddp__nccl_of(ctx);
    ddp_result code;
    char prefix[64];
    pthread_mutex_lock(&b->mu);
    code = b->failed;
    pthread_mutex_unlock(&b->mu);
    if (code == DDP_OK) return DDP_OK;
    snprintf(prefix, sizeof prefix, "%s #%llu", what, (unsigned long long)seq);
    if (!strncmp(b->why, prefix, strlen(prefix))) return ddp__fail(ctx, code, "%s", b->why); /* its own failure */
    return ddp__fail(ctx, code, "%s: %s", prefix, b->why);
}

/* Non-blocking NCCL calls may answer "in progress": polls for the verdict (the lock
   released between looks), within the timeout. */
static ddp_result ddp__nccl_settle(ddp_ctx *ctx, ncclResult_t r, const char *what, uint64_t seq)
{
    ddp__nccl *b = ddp__nccl_of(ctx);
    const int64_t deadline = ddp__now_ms() + ctx->st->cfg.timeout_ms;
    char last[200] = "";
    for (;;) {
        ncclComm_t gone = NULL;
        ddp_result failed;
        int pollable;
        pthread_mutex_lock(&b->mu);
        if (r == ncclInProgress && b->comm) {
            ncclResult_t q;
            if (ddp__now_ms() > deadline)
                gone = ddp__nccl_take(b, DDP_ERR_TIMEOUT, "%s #%llu was still in progress after %.*f s (NCCL aborted)",
                                      what, (unsigned long long)seq, DDP__SECONDS(ctx->st->cfg.timeout_ms));
            else if ((q = ncclCommGetAsyncError(b->comm, &r)) != ncclSuccess)
                r = q;
        }
        if (r != ncclSuccess && r != ncclInProgress && b->comm) snprintf(last, sizeof last, "%s", ncclGetLastError(b->comm));
        failed = b->failed;
        pollable = b->comm != NULL;
        pthread_mutex_unlock(&b->mu);
        if (gone) ncclCommAbort(gone);
        if (failed) return ddp__nccl_alive(ctx, what, seq);
        if (r == ncclSuccess) return DDP_OK;
        if (r != ncclInProgress || !pollable)
            return ddp__fail(ctx, DDP__NCCL_CODE(r), "%s #%llu: %s (%s)", what, (unsigned long long)seq,
                             ncclGetErrorString(r), last);
        sched_yield();
    }
}

/* Under b->mu: forgets the finished collectives at the front of the ring. Returns
   cudaErrorNotReady while the oldest runs, cudaSuccess when none is left, or the error
   its event reports. */
static cudaError_t ddp__nccl_retire(ddp__nccl *b)
{
    while (b->head < b->tail) {
        cudaError_t e = cudaEventQuery(b->ring[b->head % DDP__RING].done);
        if (e != cudaSuccess) return e;
        b->head++;
    }
    return cudaSuccess;
}

/* Waits on the host for ev, the end of a followed collective: polls it and NCCL's
   errors; the watchdog keeps the time. A collective that ends because the watchdog
   aborted NCCL reports that, not its garbage. */
static ddp_result ddp__nccl_wait_event(ddp_ctx *ctx, cudaEvent_t ev, const char *what, uint64_t seq)
{
    ddp__nccl *b = ddp__nccl_of(ctx);
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        ncclResult_t async = ncclSuccess;
        ncclComm_t gone = NULL;
        ddp_result failed;
        if (e == cudaSuccess) return ddp__nccl_alive(ctx, what, seq);
        if (e != cudaErrorNotReady) return ddp__cuda(ctx, e, what);
        pthread_mutex_lock(&b->mu);
        if (b->comm && ncclCommGetAsyncError(b->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
            gone = ddp__nccl_take(b, DDP__NCCL_CODE(async), "%s #%llu: %s (%s)", what, (unsigned long long)seq,
                                  ncclGetErrorString(async), ncclGetLastError(b->comm));
        failed = b->failed;
        pthread_mutex_unlock(&b->mu);
        if (gone) ncclCommAbort(gone);
        if (failed) return ddp__nccl_alive(ctx, what, seq);
        ddp__sleep_us(50); /* the GPU is working; look again soon */
    }
}

/* Follows the oldest collective in flight (those behind it cannot start before it
   ends): past DDP_TIMEOUT from its start, or on an NCCL or CUDA error, it aborts the
   communicator. Looks every tenth of the timeout, at most every 100 ms. */
static void *ddp__nccl_watchdog(void *arg)
{
    ddp__nccl *b = (ddp__nccl *)arg;
    const int64_t timeout = b->timeout_ms, tick = timeout / 10 < 1 ? 1 : timeout / 10 > 100 ? 100 : timeout / 10;
    const cudaError_t e = cudaSetDevice(b->device);
    pthread_mutex_lock(&b->mu);
    b->up = e == cudaSuccess ? 1 : -1;
    b->up_error = e;
    pthread_cond_broadcast(&b->cv);
    while (!b->stop && e == cudaSuccess) {
        const struct timespec ts = ddp__realtime_in(tick);
        ncclComm_t gone = NULL;
        ncclResult_t async = ncclSuccess;
        ddp__followed *f;
        cudaError_t q;
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
        if (b->stop || !b->comm) continue; /* after a failure there is nothing left to follow */
        q = ddp__nccl_retire(b);
        f = b->head < b->tail ? &b->ring[b->head % DDP__RING] : NULL;
        if (f && q != cudaErrorNotReady) {
            gone = ddp__nccl_take(b, DDP_ERR_BACKEND, "%s #%llu: %s (the watchdog aborted NCCL)",
                                  ddp__colls[f->kind].name, (unsigned long long)f->seq, cudaGetErrorString(q));
        } else if (f) {
            if (!f->began_ms && cudaEventQuery(f->start) == cudaSuccess) f->began_ms = ddp__now_ms();
            if (f->began_ms && ddp__now_ms() - f->began_ms > timeout)
                gone = ddp__nccl_take(b, DDP_ERR_TIMEOUT, "%s #%llu did not finish within %.*f s of its start "
                                      "(the watchdog aborted NCCL)", ddp__colls[f->kind].name,
                                      (unsigned long long)f->seq, DDP__SECONDS(timeout));
        }
        if (!gone && ncclCommGetAsyncError(b->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
            gone = ddp__nccl_take(b, DDP__NCCL_CODE(async), "NCCL failed: %s (%s; the watchdog aborted NCCL)",
                                  ncclGetErrorString(async), ncclGetLastError(b->comm));
        if (gone) {
            pthread_mutex_unlock(&b->mu);
            ncclCommAbort(gone);
            pthread_mutex_lock(&b->mu);
        }
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* Ranks on one host must drive different GPUs (NCCL refuses two on one, and a GPU
   that one rank sees alone may be the one another sees alone): every rank's node and
   GPU PCI address through the store, so that every rank names the same pair. */
static ddp_result ddp__nccl_own_gpu(ddp_ctx *ctx, int visible)
{
    const int w = ctx->world_size;
    int dom = 0, bus = 0, slot = 0, i, j;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES"), **parts;
    char mine[48], *all = NULL;
    uint32_t *lens;
    ddp_result r;
    cudaDeviceGetAttribute(&dom, cudaDevAttrPciDomainId, ctx->device);
    cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, ctx->device);
    cudaDeviceGetAttribute(&slot, cudaDevAttrPciDeviceId, ctx->device);
    snprintf(mine, sizeof mine, "%04x:%02x:%02x.0 of node %d", dom, bus, slot, ctx->node_rank);
    parts = DDP__CAST(const char **, DDP_MALLOC(sizeof(char *) * (size_t)w));
    lens = DDP__CAST(uint32_t *, DDP_MALLOC(sizeof(uint32_t) * (size_t)w));
    r = parts && lens ? ddp__store_gather(ctx, "gpu", mine, (uint32_t)strlen(mine), &all, parts, lens,
                                          "comparing the ranks' GPUs")
                      : ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory");
    for (i = 0; r == DDP_OK && i < w; i++)
        for (j = i + 1; r == DDP_OK && j < w; j++)
            if (lens[i] == lens[j] && memcmp(parts[i], parts[j], lens[i]) == 0)
                r = ddp__fail(ctx, DDP_ERR_ENV, "ranks %d and %d would share GPU %.*s (this rank sees %d, "
                              "CUDA_VISIBLE_DEVICES=%s%s%s): NCCL needs a GPU per rank; start at most one rank per GPU, "
                              "or use DDP_BACKEND=cpu", i, j, (int)lens[i], parts[i], visible, cvd ? "'" : "",
                              cvd ? cvd : "unset", cvd ? "'" : "");
    DDP_FREE(all);
    DDP_FREE(parts);
    DDP_FREE(lens);
    return r;
}

static ddp_result ddp__nccl_init(ddp_ctx *ctx)
{
    ddp__nccl *b;
    ncclUniqueId id;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    int n = 0, device;
    char why[300] = "no GPU is visible";
    cudaError_t e = cudaGetDeviceCount(&n);
    ddp_result r;
    if (e != cudaSuccess || n == 0) {
        if (e != cudaSuccess) ddp__cuda_why(why, sizeof why, e);
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the NCCL backend needs a GPU: %s", why);
    }
    if ((device = ddp__device_for(ctx->local_rank, n, getenv("CUDA_VISIBLE_DEVICES"), why, sizeof why)) < 0)
        return ddp__fail(ctx, DDP_ERR_ENV, "%s", why);
    if ((r = ddp__cuda(ctx, cudaSetDevice(device), "cudaSetDevice")) != DDP_OK) return r;
    ctx->device = device;
    if (!(b = DDP__CAST(ddp__nccl *, DDP_MALLOC(sizeof *b)))) return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory");
    memset(b, 0, sizeof *b);
    ctx->st->bs = b;
    b->device = device;
    b->timeout_ms = ctx->st->cfg.timeout_ms;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    if (ctx->world_size > 1 && (r = ddp__nccl_own_gpu(ctx, n)) != DDP_OK) return r;
    if (ctx->rank == 0) {
        if ((r = ddp__nccl_settle(ctx, ncclGetUniqueId(&id), "ncclGetUniqueId", 0)) != DDP_OK) return r;
        if (ctx->world_size > 1 &&
            (r = ddp__store_set(ctx, "nccl/id", &id, sizeof id, "publishing the NCCL id")) != DDP_OK)
            return r;
    } else {
        char *got = NULL;
        uint32_t len = 0;
        if ((r = ddp__store_get(ctx, "nccl/id", &got, &len, "waiting for rank 0's NCCL id")) != DDP_OK) return r;
        if (len != sizeof id) {
            DDP_FREE(got);
            return ddp__fail(ctx, DDP_ERR_PROTOCOL, "rank 0 sent an NCCL id of %u bytes", len);
        }
        memcpy(&id, got, sizeof id);
        DDP_FREE(got);
    }
    cfg.blocking = 0;
    r = ddp__nccl_settle(ctx, ncclCommInitRankConfig(&b->comm, ctx->world_size, id, ctx->rank, &cfg),
                         "ncclCommInitRank", 0);
    if (r != DDP_OK) return r;
    if ((r = ddp__cuda(ctx, cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), "cudaStreamCreate")) != DDP_OK ||
        (r = ddp__cuda(ctx, cudaEventCreateWithFlags(&b->ready, cudaEventDisableTiming), "cudaEventCreate")) != DDP_OK)
        return r;
    if ((n = pthread_create(&b->watchdog, NULL, ddp__nccl_watchdog, b)) != 0)
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot start the NCCL watchdog thread: %s", strerror(n));
    b->watching = 1;
    pthread_mutex_lock(&b->mu);
    while (!b->up) pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    if (b->up < 0)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the NCCL watchdog thread cannot select GPU %d: %s", device,
                         cudaGetErrorString(b->up_error));
    return DDP_OK;
}

/* 1 if p is host memory NCCL cannot read (pageable, or pinned but not mapped) */
static int ddp__is_host(const void *p)
{
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* older drivers report unregistered memory as an error */
        return p != NULL;
    }
    return a.type == cudaMemoryTypeUnregistered || (a.type == cudaMemoryTypeHost && !a.devicePointer);
}

static ddp_result ddp__nccl_stage(ddp_ctx *ctx, size_t bytes)
{
    ddp__nccl *b = ddp__nccl_of(ctx);
    ddp_result r;
    if (bytes <= b->staged) return DDP_OK;
    if (b->dev) cudaFree(b->dev);
    if (b->host) cudaFreeHost(b->host);
    b->dev = b->host = NULL;
    b->staged = 0;
    if ((r = ddp__cuda(ctx, cudaMalloc(&b->dev, bytes), "cudaMalloc (staging host memory)")) != DDP_OK ||
        (r = ddp__cuda(ctx, cudaMallocHost(&b->host, bytes), "cudaMallocHost (staging host memory)")) != DDP_OK)
        return r;
    b->staged = bytes;
    return DDP_OK;
}

/* The ring's next slot, its events made: when every slot is in flight, waits (polling,
   the lock released) for the oldest collective to finish; the watchdog keeps the time. */
static ddp_result ddp__nccl_slot(ddp_ctx *ctx, const ddp__coll *c, ddp__followed **slot)
{
    ddp__nccl *b = ddp__nccl_of(ctx);
    ddp__followed *f;
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&b->mu);
    while (!b->failed && b->tail - b->head == DDP__RING) {
        if ((e = ddp__nccl_retire(b)) != cudaSuccess && e != cudaErrorNotReady) break;
        e = cudaSuccess;
        if (b->tail - b->head < DDP__RING) break;
        pthread_mutex_unlock(&b->mu);
        ddp__sleep_us(50);
        pthread_mutex_lock(&b->mu);
    }
    f = &b->ring[b->tail % DDP__RING];
    if (!b->failed && e == cudaSuccess && !f->start) e = cudaEventCreateWithFlags(&f->start, cudaEventDisableTiming);
    if (!b->failed && e == cudaSuccess && !f->done) e = cudaEventCreateWithFlags(&f->done, cudaEventDisableTiming);
    pthread_mutex_unlock(&b->mu);
    *slot = f;
    if (e != cudaSuccess) return ddp__cuda(ctx, e, ddp__colls[c->kind].name);
    return ddp__nccl_alive(ctx, ddp__colls[c->kind].name, c->seq);
}

/* Queues c on the NCCL stream after `user`'s work, bracketed by its slot's events,
   and hands it to the watchdog. Async: work->event marks its end and ddp_wait orders
   the caller after it; blocking: the caller's stream waits for it; host memory: the
   host waits for it. */
static ddp_result ddp__nccl_run(ddp_ctx *ctx, const ddp__coll *c, void *user_stream, ddp_work *work)
{
    static const ncclDataType_t types[] = {
#define DDP__NCCL_TYPE(e, name, T, A, nccl, load, store) nccl,
        DDP__DTYPES(DDP__NCCL_TYPE)
#undef DDP__NCCL_TYPE
    };
    static const ncclRedOp_t ops[] = {
#define DDP__NCCL_OP(e, name, nccl) nccl,
        DDP__OPS(DDP__NCCL_OP)
#undef DDP__NCCL_OP
    };
    ddp__nccl *b = ddp__nccl_of(ctx);
    const char *name = ddp__colls[c->kind].name;
    cudaStream_t user = (cudaStream_t)user_stream;
    ncclDataType_t t = types[c->dtype];
    /* An average over one rank is the sum (a copy). NCCL before 2.29.7 leaves the last
       few elements of a one-rank float average unwritten out of place (its issue 1950:
       f64, 1000003 elements, the last 3 stayed as they were), seen on an H200. */
    ncclRedOp_t op = c->op == DDP_AVG && ctx->world_size == 1 ? ncclSum : ops[c->op];
    size_t es = ddp_dtype_size((ddp_dtype)c->dtype), W = (size_t)ctx->world_size;
    size_t sbytes = c->count * es * (ddp__colls[c->kind].send == 'W' ? W : 1);
    size_t rbytes = c->count * es * (ddp__colls[c->kind].recv == 'W' ? W : 1);
    int host_send, host_recv;
    const void *send = c->send;
    void *recv = c->recv;
    ddp__followed *f;
    cudaEvent_t mine = NULL;
    ncclComm_t comm;
    ncclResult_t nr = ncclSuccess;
    ddp_result r;

    /* a meeting without data goes through the store; the rest takes a watchdog slot and,
       for host memory, the staging buffers */
    if ((r = ddp__nccl_alive(ctx, name, c->seq)) != DDP_OK) return r;
    if (!ddp__coll_moves_data(c->kind)) /* a host meeting: the store serves */
        return ctx->world_size > 1 ? ddp__store_barrier(ctx, c->kind == DDP__BARRIER ? "barrier" : "destroy",
                                                        c->kind == DDP__BARRIER ? "in ddp_barrier" : "in ddp_destroy")
                                   : DDP_OK;
    if ((r = ddp__nccl_here(ctx)) != DDP_OK) return r;
    host_send = ddp__colls[c->kind].send && c->count && ddp__is_host(c->send);
    host_recv = ddp__colls[c->kind].recv && c->count && ddp__is_host(c->recv);
    if ((r = ddp__nccl_slot(ctx, c, &f)) != DDP_OK) return r;
    if (host_send || host_recv) { /* staged: send at the start, recv after it, one buffer each way */
        size_t off = host_send ? sbytes : 0;
        if ((r = ddp__nccl_stage(ctx, off + rbytes)) != DDP_OK) return r;
        if (host_send) {
            memcpy(b->host, c->send, sbytes);
            send = b->dev;
            if (c->send == c->recv && host_recv) off = 0; /* in place stays in place */
        }
        if (host_recv) recv = (char *)b->dev + off;
        if (c->kind == DDP__BROADCAST) { memcpy(b->host, c->recv, rbytes); send = recv = b->dev; host_send = 1; sbytes = rbytes; }
    }

    /* on the NCCL stream after the caller's work: staging in, the start event, the
       collective (unless the watchdog took the communicator), staging out, the end event */
    if ((r = ddp__cuda(ctx, cudaEventRecord(b->ready, user), "cudaEventRecord")) != DDP_OK ||
        (r = ddp__cuda(ctx, cudaStreamWaitEvent(b->stream, b->ready, 0), "cudaStreamWaitEvent")) != DDP_OK ||
        (host_send && (r = ddp__cuda(ctx, cudaMemcpyAsync(b->dev, b->host, sbytes, cudaMemcpyHostToDevice, b->stream),
                                     "cudaMemcpyAsync (staging)")) != DDP_OK) ||
        (r = ddp__cuda(ctx, cudaEventRecord(f->start, b->stream), "cudaEventRecord")) != DDP_OK)
        return r;
    pthread_mutex_lock(&b->mu);
    if ((comm = b->comm)) switch (c->kind) {
        case DDP__ALL_REDUCE: nr = ncclAllReduce(send, recv, c->count, t, op, comm, b->stream); break;
        case DDP__BROADCAST: nr = ncclBroadcast(recv, recv, c->count, t, c->root, comm, b->stream); break;
        case DDP__ALL_GATHER: nr = ncclAllGather(send, recv, c->count, t, comm, b->stream); break;
        case DDP__REDUCE_SCATTER: nr = ncclReduceScatter(send, recv, c->count, t, op, comm, b->stream); break;
        }
    pthread_mutex_unlock(&b->mu);
    if (!comm) return ddp__nccl_alive(ctx, name, c->seq);
    if ((r = ddp__nccl_settle(ctx, nr, name, c->seq)) != DDP_OK) return r;
    if ((host_recv &&
         (r = ddp__cuda(ctx, cudaMemcpyAsync((char *)b->host + ((char *)recv - (char *)b->dev), recv, rbytes,
                                             cudaMemcpyDeviceToHost, b->stream), "cudaMemcpyAsync (staging)")) != DDP_OK) ||
        (r = ddp__cuda(ctx, cudaEventRecord(f->done, b->stream), "cudaEventRecord")) != DDP_OK)
        return r;
    if (work && !host_send && !host_recv && /* the work's own end: the slot's events are reused */
        ((r = ddp__cuda(ctx, cudaEventCreateWithFlags(&mine, cudaEventDisableTiming), "cudaEventCreate")) != DDP_OK ||
         (r = ddp__cuda(ctx, cudaEventRecord(mine, b->stream), "cudaEventRecord")) != DDP_OK)) {
        if (mine) cudaEventDestroy(mine);
        return r;
    }

    pthread_mutex_lock(&b->mu); /* from here the watchdog follows it */
    f->seq = c->seq;
    f->kind = c->kind;
    f->began_ms = 0;
    b->tail++;
    pthread_mutex_unlock(&b->mu);

    /* how the caller waits: the host now (host memory), the work's event, or its stream */
    if (host_send || host_recv) { /* the host needs the result now */
        r = ddp__nccl_wait_event(ctx, f->done, name, c->seq);
        if (r == DDP_OK && host_recv) memcpy(c->recv, (char *)b->host + ((char *)recv - (char *)b->dev), rbytes);
        return r;
    }
    if (work) {
        work->event = mine;
        return DDP_OK;
    }
    return ddp__cuda(ctx, cudaStreamWaitEvent(user, f->done, 0), "cudaStreamWaitEvent");
}

/* Async work: `host` waits on the host too (ddp_wait); without it (gradient buckets)
   only `stream` is ordered after the work, and the watchdog keeps following it. */
static ddp_result ddp__nccl_wait(ddp_ctx *ctx, ddp_work *work, void *stream, int host)
{
    cudaEvent_t ev = (cudaEvent_t)work->event;
    ddp_result r;
    if (!ev) return DDP_OK; /* it finished when issued (host memory) */
    if ((r = ddp__nccl_here(ctx)) != DDP_OK) return r;
    r = host ? ddp__nccl_wait_event(ctx, ev, "all_reduce", work->seq) : ddp__nccl_alive(ctx, "all_reduce", work->seq);
    if (r == DDP_OK && (stream || !host))
        r = ddp__cuda(ctx, cudaStreamWaitEvent((cudaStream_t)stream, ev, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ev);
    work->event = NULL;
    return r;
}

static void ddp__nccl_release(ddp_ctx *ctx)
{
    ddp__nccl *b = ddp__nccl_of(ctx);
    int i;
    if (!b) return;
    if (b->watching) {
        pthread_mutex_lock(&b->mu);
        b->stop = 1;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->watchdog, NULL);
    }
    /* this thread alone from here, on the rank's GPU (ddp_destroy from another thread; a
       failure here shows in the calls below, which wait for nobody) */
    cudaSetDevice(b->device);
    if (b->comm && !ctx->st->broken &&
        ddp__nccl_settle(ctx, ncclCommFinalize(b->comm), "ncclCommFinalize", 0) == DDP_OK) {
        ncclCommDestroy(b->comm); /* finalized: frees without waiting */
        b->comm = NULL;
    }
    if (b->comm) ncclCommAbort(b->comm); /* broken (or finalize failed): wait for nobody */
    for (i = 0; i < DDP__RING; i++) {
        if (b->ring[i].start) cudaEventDestroy(b->ring[i].start);
        if (b->ring[i].done) cudaEventDestroy(b->ring[i].done);
    }
    if (b->stream) cudaStreamDestroy(b->stream);
    if (b->ready) cudaEventDestroy(b->ready);
    if (b->dev) cudaFree(b->dev);
    if (b->host) cudaFreeHost(b->host);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    DDP_FREE(b);
    ctx->st->bs = NULL;
}

/* The auto choice: NCCL when a GPU is usable; *why says why not. */
static int ddp__nccl_usable(char *why, size_t n)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && count > 0) return 1;
    if (e != cudaSuccess) ddp__cuda_why(why, n, e);
    else snprintf(why, n, "no GPU is visible");
    return 0;
}
#endif

/* ---- >>mpi -----------------------------------------------------------------------------------
   For CPU jobs across hosts, on the MPI the cluster already has (compile with
   -DDDP_MPI, build with mpicc). MPI forms the group: rank and size from
   MPI_COMM_WORLD, local ranks from a shared-memory split, so mpirun needs no
   MASTER_ADDR. MPI is only a transport here, and the CPU backend's own reducers add
   the ranks in rank order (16-bit floats in f32), so every rank, every run and the
   one-host CPU backend get the same bits. An all-reduce runs as a chain when the ranks
   of every host are consecutive (mpirun's default --map-by slot, srun's block): inside
   a host its ranks meet in an MPI shared-memory window, each adding a share of every
   rank's chunk, in rank order, onto the partial sum that came from the host before;
   the host's leader (its local rank 0) sends the result on to the next host's leader,
   and the last host's result goes back to every leader by broadcast and from each to
   its host's ranks, chunk by chunk, so all hosts work at once. Each host moves the
   data across the network about twice, not once per rank. Otherwise (ranks dealt
   round-robin over hosts) an all-reduce is an all-to-all that gives rank r block r of
   everyone's data, a reduction of those blocks in rank order, and an all-gather.
   Every collective starts with a small all-reduce of its fingerprint (ranks that
   disagree learn it before any data moves). Waits poll non-blocking requests within
   the timeout; MPI cannot abort one, so a timed-out rank returns the error and the
   launcher ends the job when it exits. */
#ifdef DDP_MPI
#define DDP__MPI_PIECE ((size_t)4 << 20) /* bytes of one rank's data moved per step */

typedef struct ddp__mpi {
    MPI_Comm comm, ctl;    /* collectives; "where are you?" after a timeout */
    int has_comm;
    char *stage;           /* W blocks of a piece */
    size_t staged;
    int *counts, *displs;  /* per rank, in bytes */
    int owns_mpi;          /* this context initialised MPI and finalises it */
    /* the chain (when every host's ranks are consecutive) */
    int chain;
    MPI_Comm local;        /* this host's ranks in rank order */
    MPI_Comm results;      /* the same ranks: the results' broadcasts, in an order of their own */
    MPI_Comm leaders;      /* local rank 0 of every host, in host order; MPI_COMM_NULL elsewhere */
    MPI_Win win;           /* the host's slots: one input per local rank, 2 partials in, 2 out */
    char *slots;
    size_t slot;           /* bytes of one */
} ddp__mpi;

#define DDP__MPI_TAG 11
/* bytes of the accumulator of each dtype: the partial sums that pass between hosts */
static const size_t ddp__acc_sizes[] = {
#define DDP__ACC_SIZE(e, name, T, A, nccl, load, store) sizeof(A),
    DDP__DTYPES(DDP__ACC_SIZE)
#undef DDP__ACC_SIZE
};

static ddp__mpi *ddp__mpi_of(ddp_ctx *ctx) { return (ddp__mpi *)ctx->st->bs; }

static ddp_result ddp__mpi_error(ddp_ctx *ctx, int rc, const char *what, const ddp__coll *c)
{
    char text[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, text, &n);
    if (c) return ddp__fail(ctx, DDP_ERR_BACKEND, "%s #%llu: %s: %s", ddp__colls[c->kind].name, (unsigned long long)c->seq,
                            what, text);
    return ddp__fail(ctx, DDP_ERR_BACKEND, "%s: %s", what, text);
}

/* A rank that timed out asks the others where they are (tag ASK on ctl); every rank
   that waits answers with the collective it waits in (tag ANSWER). */
enum { DDP__MPI_ASK = 1, DDP__MPI_ANSWER = 2 };

static void ddp__mpi_answer(ddp__mpi *b, const ddp__coll *c)
{
    MPI_Status s;
    int64_t ask, here[2];
    int asked = 0;
    here[0] = (int64_t)c->seq;
    here[1] = c->kind;
    while (MPI_Iprobe(MPI_ANY_SOURCE, DDP__MPI_ASK, b->ctl, &asked, &s) == MPI_SUCCESS && asked) {
        MPI_Recv(&ask, 1, MPI_INT64_T, s.MPI_SOURCE, DDP__MPI_ASK, b->ctl, MPI_STATUS_IGNORE);
        MPI_Send(here, 2, MPI_INT64_T, s.MPI_SOURCE, DDP__MPI_ANSWER, b->ctl); /* 16 bytes: sent eagerly */
        asked = 0;
    }
}

/* After a timeout: where the others are, as the CPU backend says it ("1 (no answer:
   busy outside ddp.h, stopped or gone), 3 (in all_reduce #11)"); those that answer
   from this collective are not named. Asks once and listens for up to a second;
   returns how many it names. */
static int ddp__mpi_late(ddp_ctx *ctx, const ddp__coll *c, char *out, size_t size)
{
    static const int64_t question = 0;
    ddp__mpi *b = ddp__mpi_of(ctx);
    int64_t deadline = ddp__now_ms() + 1000, *where;
    MPI_Request *sent;
    int r, answered = 0, late = 0;
    out[0] = 0;
    where = DDP__CAST(int64_t *, DDP_MALLOC(sizeof *where * 2 * (size_t)ctx->world_size));
    sent = DDP__CAST(MPI_Request *, DDP_MALLOC(sizeof *sent * (size_t)ctx->world_size));
    if (!where || !sent) {
        DDP_FREE(where); DDP_FREE(sent);
        return 0;
    }
    /* not MPI_Send: to a host that is gone it waits for TCP's connect (minutes), past the
       timeout; the question's buffer outlives the sends left on their way (its value unread) */
    for (r = 0; r < ctx->world_size; r++) {
        where[2 * r] = -1;
        sent[r] = MPI_REQUEST_NULL;
        if (r != ctx->rank) MPI_Isend(&question, 1, MPI_INT64_T, r, DDP__MPI_ASK, b->ctl, &sent[r]);
    }
    while (answered < ctx->world_size - 1 && ddp__now_ms() < deadline) {
        MPI_Status s;
        int got = 0;
        for (r = 0; r < ctx->world_size; r++) /* the questions on their way (a done one becomes NULL) */
            if (sent[r] != MPI_REQUEST_NULL) MPI_Test(&sent[r], &got, MPI_STATUS_IGNORE);
        got = 0;
        ddp__mpi_answer(b, c); /* the others ask too */
        if (MPI_Iprobe(MPI_ANY_SOURCE, DDP__MPI_ANSWER, b->ctl, &got, &s) == MPI_SUCCESS && got) {
            MPI_Recv(&where[2 * s.MPI_SOURCE], 2, MPI_INT64_T, s.MPI_SOURCE, DDP__MPI_ANSWER, b->ctl, MPI_STATUS_IGNORE);
            answered++;
        } else {
            ddp__sleep_us(500);
        }
    }
    for (r = 0; r < ctx->world_size; r++) /* a question still on its way goes on without us */
        if (sent[r] != MPI_REQUEST_NULL) MPI_Request_free(&sent[r]);
    DDP_FREE(sent);
    for (r = 0; r < ctx->world_size; r++) {
        if (r == ctx->rank || (where[2 * r] == (int64_t)c->seq && where[2 * r + 1] == c->kind)) continue;
        if (where[2 * r] < 0)
            ddp__append(out, size, "%s%d (no answer: busy outside ddp.h, stopped or gone)", late++ ? ", " : "", r);
        else
            ddp__append(out, size, "%s%d (in %s #%lld)", late++ ? ", " : "", r,
                        (unsigned)where[2 * r + 1] < DDP__COLL_COUNT ? ddp__colls[where[2 * r + 1]].name : "?",
                        (long long)where[2 * r]);
    }
    DDP_FREE(where);
    return late;
}

/* Waits for a request within the timeout: a few polls that yield the core, then naps
   between polls (1 us growing to 50 us), answering ranks that ask where this one is.
   It does not spin: an MPI_Test over TCP is a system call, and a rank polling for
   milliseconds takes the core from the rank (or the compute thread) that the message
   waits for. Spinning 2000 polls first made a 64 KB all-reduce across 2 simulated
   hosts x 2 ranks on 2 cores take 9 ms; without, 0.5 ms. */
static ddp_result ddp__mpi_wait_req(ddp_ctx *ctx, MPI_Request *req, const ddp__coll *c, int rc)
{
    int64_t last = ddp__now_ms(), deadline = last + ctx->st->cfg.timeout_ms, now;
    int64_t nap = 1; /* us */
    int done = 0, polls = 0, n;
    char late[300];
    if (rc != MPI_SUCCESS) return ddp__mpi_error(ctx, rc, "MPI", c);
    for (;;) {
        if ((rc = MPI_Test(req, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return ddp__mpi_error(ctx, rc, "MPI_Test", c);
        if (done) return DDP_OK;
        if (++polls < 16) {
            sched_yield();
            continue;
        }
        ddp__not_stopped(&last, now = ddp__now_ms(), &deadline);
        if (now > deadline) {
            n = ddp__mpi_late(ctx, c, late, sizeof late);
            return ddp__fail(ctx, DDP_ERR_TIMEOUT, "%s #%llu timed out after %.*f s in MPI %s%s%s (the launcher ends "
                             "the job when this rank exits)", ddp__colls[c->kind].name, (unsigned long long)c->seq,
                             DDP__SECONDS(ctx->st->cfg.timeout_ms), n ? "waiting for rank" : "with every rank in it",
                             n > 1 ? "s " : n ? " " : "", late);
        }
        {
            ddp__sleep_us(nap);
            if (nap < 50) nap *= 2;
            ddp__mpi_answer(ddp__mpi_of(ctx), c);
        }
    }
}

/* Everyone's fingerprint: a max over (f, -f) shows whether all agree in one small
   all-reduce; only when they do not, all of them are gathered to name the sides. */
static ddp_result ddp__mpi_agree(ddp_ctx *ctx, const ddp__coll *c)
{
    ddp__mpi *b = ddp__mpi_of(ctx);
    ddp__fp mine = ddp__fingerprint(c), *all;
    int64_t v[14], m[14];
    MPI_Request req;
    ddp_result r;
    int i;
    v[0] = (int64_t)mine.seq; v[1] = (int64_t)mine.count; v[2] = mine.kind; v[3] = mine.dtype; v[4] = mine.op; v[5] = mine.root;
    v[6] = mine.steps;
    for (i = 0; i < 7; i++) v[7 + i] = -v[i];
    if ((r = ddp__mpi_wait_req(ctx, &req, c, MPI_Iallreduce(v, m, 14, MPI_INT64_T, MPI_MAX, b->comm, &req))) != DDP_OK)
        return r;
    for (i = 0; i < 7 && m[i] == -m[7 + i]; i++) {}
    if (i == 7) return DDP_OK;
    if (!(all = DDP__CAST(ddp__fp *, DDP_MALLOC(sizeof *all * (size_t)ctx->world_size))))
        return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory");
    r = ddp__mpi_wait_req(ctx, &req, c, MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                                                       b->comm, &req));
    for (i = 0; r == DDP_OK && i < ctx->world_size; i++)
        if (memcmp(&all[i], &mine, sizeof mine) != 0) {
            char why[300];
            ddp__fp theirs = all[i];
            ddp__fp_diff(why, sizeof why, ctx->rank, &mine, i, &theirs);
            r = ddp__fail(ctx, ddp__fp_code(&mine, &theirs), "%s", why);
        }
    if (r == DDP_OK) /* another pair disagrees: name them from here too */
        for (i = 1; i < ctx->world_size; i++)
            if (memcmp(&all[i], &all[0], sizeof mine) != 0) {
                char why[300];
                ddp__fp_diff(why, sizeof why, 0, &all[0], i, &all[i]);
                r = ddp__fail(ctx, DDP_ERR_MISMATCH, "%s", why);
                break;
            }
    DDP_FREE(all);
    return r;
}

static ddp_result ddp__mpi_stage(ddp_ctx *ctx, size_t bytes)
{
    ddp__mpi *b = ddp__mpi_of(ctx);
    if (bytes <= b->staged) return DDP_OK;
    DDP_FREE(b->stage);
    b->staged = 0;
    if (!(b->stage = DDP__CAST(char *, DDP_MALLOC(bytes))))
        return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory for %zu bytes of MPI staging", bytes);
    b->staged = bytes;
    return DDP_OK;
}

/* The host's ranks all past this point, their writes to the window seen by all. */
static ddp_result ddp__mpi_host_barrier(ddp_ctx *ctx, const ddp__coll *c)
{
    ddp__mpi *b = ddp__mpi_of(ctx);
    MPI_Request req;
    ddp_result r;
    MPI_Win_sync(b->win);
    r = ddp__mpi_wait_req(ctx, &req, c, MPI_Ibarrier(b->local, &req));
    MPI_Win_sync(b->win);
    return r;
}

/* The leader of a host before the last: each chunk's result that has arrived from the
   last host (got[k], in order) goes on to the host's other ranks (fin[k]); with wait,
   every one up to `upto`, else only those already there. */
static ddp_result ddp__mpi_pass_on(ddp_ctx *ctx, const ddp__coll *c, MPI_Request *got, MPI_Request *fin, size_t per,
                                   size_t *next, size_t upto, int wait)
{
    ddp__mpi *b = ddp__mpi_of(ctx);
    const size_t es = ddp_dtype_size((ddp_dtype)c->dtype);
    ddp_result r;
    int rc, done = 1;
    for (; *next < upto; ++*next) {
        const size_t off = *next * per, n = c->count - off < per ? c->count - off : per;
        if (wait && (r = ddp__mpi_wait_req(ctx, &got[*next], c, MPI_SUCCESS)) != DDP_OK) return r;
        if (!wait && ((rc = MPI_Test(&got[*next], &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS || !done))
            return rc == MPI_SUCCESS ? DDP_OK : ddp__mpi_error(ctx, rc, "MPI_Test", c);
        if (ctx->local_world_size > 1 && (rc = MPI_Ibcast((char *)c->recv + off * es, (int)(n * es), MPI_BYTE, 0,
                                                          b->results, &fin[*next])) != MPI_SUCCESS)
            return ddp__mpi_error(ctx, rc, "MPI_Ibcast", c);
    }
    return DDP_OK;
}

/* All-reduce as a chain of hosts (see the top of this section), in rounds of one chunk:
   every rank copies its chunk into its slot; the leader has the previous host's partial
   sum (received ahead, two chunks deep); each rank adds its share of all slots onto it;
   the leader sends the sum on, or, on the last host, broadcasts the result to the
   leaders while each rank copies it out. The other hosts receive the result straight
   into recv (the leader from the last host, the rest from their leader). */
static ddp_result ddp__mpi_chain(ddp_ctx *ctx, const ddp__coll *c)
{
    ddp__mpi *b = ddp__mpi_of(ctx);
    const int H = ctx->num_nodes, h = ctx->node_rank, L = ctx->local_world_size, l = ctx->local_rank;
    const int lead = l == 0, last = h == H - 1;
    const size_t es = ddp_dtype_size((ddp_dtype)c->dtype), as = ddp__acc_sizes[c->dtype], slot = b->slot;
    const size_t per = slot / (as > es ? as : es), rounds = (c->count + per - 1) / per;
    char *ahead_at = b->slots + (size_t)L * slot, *out_at = ahead_at + 2 * slot, *recv = (char *)c->recv;
    MPI_Request ahead[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL}, away[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    MPI_Request *got, *fin; /* per chunk: the result from the last host (leaders), from the leader (the others) */
    size_t j, next = 0;
    ddp_result r;
    int rc = MPI_SUCCESS;
    if ((r = ddp__mpi_stage(ctx, 2 * rounds * sizeof(MPI_Request))) != DDP_OK) return r;
    got = (MPI_Request *)(void *)b->stage;
    fin = got + rounds;
    for (j = 0; j < 2 * rounds; j++) got[j] = MPI_REQUEST_NULL;
    for (j = 0; lead && h > 0 && j < 2 && j < rounds; j++) { /* the previous host's first two partial sums */
        const size_t n = c->count - j * per < per ? c->count - j * per : per;
        if ((rc = MPI_Irecv(ahead_at + j * slot, (int)(n * as), MPI_BYTE, h - 1, DDP__MPI_TAG, b->leaders,
                            &ahead[j])) != MPI_SUCCESS)
            return ddp__mpi_error(ctx, rc, "MPI_Irecv", c);
    }
    for (j = 0; j < rounds; j++) {
        const size_t off = j * per, n = c->count - off < per ? c->count - off : per, s = j & 1;
        const size_t lo = n * (size_t)l / (size_t)L, hi = n * (size_t)(l + 1) / (size_t)L;
        memcpy(b->slots + (size_t)l * slot, (const char *)c->send + off * es, n * es);
        if (lead) {
            if ((r = ddp__mpi_wait_req(ctx, &ahead[s], c, MPI_SUCCESS)) != DDP_OK ||
                (r = ddp__mpi_wait_req(ctx, &away[s], c, MPI_SUCCESS)) != DDP_OK ||
                (!last && (r = ddp__mpi_pass_on(ctx, c, got, fin, per, &next, j, 0)) != DDP_OK))
                return r;
        }
        if ((r = ddp__mpi_host_barrier(ctx, c)) != DDP_OK) return r;
        ddp__reducers[c->dtype](out_at + s * slot + lo * (last ? es : as), h > 0 ? ahead_at + s * slot + lo * as : NULL,
                                b->slots + lo * es, slot, L, hi - lo, (ddp_op)c->op, last ? ctx->world_size : 0);
        if ((r = ddp__mpi_host_barrier(ctx, c)) != DDP_OK) return r;
        if (last) {
            ddp__copy_shared(recv + off * es, out_at + s * slot, n * es);
            if (lead && H > 1)
                rc = MPI_Ibcast(out_at + s * slot, (int)(n * es), MPI_BYTE, H - 1, b->leaders, &away[s]);
        } else if (lead) {
            if ((rc = MPI_Isend(out_at + s * slot, (int)(n * as), MPI_BYTE, h + 1, DDP__MPI_TAG, b->leaders,
                                &away[s])) == MPI_SUCCESS)
                rc = MPI_Ibcast(recv + off * es, (int)(n * es), MPI_BYTE, H - 1, b->leaders, &got[j]);
        } else {
            rc = MPI_Ibcast(recv + off * es, (int)(n * es), MPI_BYTE, 0, b->results, &fin[j]);
        }
        if (rc == MPI_SUCCESS && lead && h > 0 && j + 2 < rounds) { /* the slot it read is free again */
            const size_t n2 = c->count - off - 2 * per < per ? c->count - off - 2 * per : per;
            rc = MPI_Irecv(ahead_at + s * slot, (int)(n2 * as), MPI_BYTE, h - 1, DDP__MPI_TAG, b->leaders, &ahead[s]);
        }
        if (rc != MPI_SUCCESS) return ddp__mpi_error(ctx, rc, "MPI", c);
    }
    if (lead && !last && (r = ddp__mpi_pass_on(ctx, c, got, fin, per, &next, rounds, 1)) != DDP_OK) return r;
    for (j = 0; j < rounds; j++)
        if ((r = ddp__mpi_wait_req(ctx, &fin[j], c, MPI_SUCCESS)) != DDP_OK) return r;
    if ((r = ddp__mpi_wait_req(ctx, &away[0], c, MPI_SUCCESS)) != DDP_OK) return r;
    return ddp__mpi_wait_req(ctx, &away[1], c, MPI_SUCCESS);
}

/* One collective through MPI (world > 1), in pieces of at most DDP__MPI_PIECE bytes
   per rank so that memory stays bounded and counts fit an int. */
static ddp_result ddp__mpi_run(ddp_ctx *ctx, const ddp__coll *c, void *stream, ddp_work *work)
{
    ddp__mpi *b = ddp__mpi_of(ctx);
    int W = ctx->world_size, me = ctx->rank, r;
    size_t es = ddp_dtype_size((ddp_dtype)c->dtype), per, off, n;
    const char *send = (const char *)c->send;
    char *recv = (char *)c->recv;
    MPI_Request req;
    ddp_result res;
    (void)stream;
    (void)work;
    if ((res = ddp__mpi_agree(ctx, c)) != DDP_OK || !ddp__coll_moves_data(c->kind))
        return res; /* that was the meeting */
    per = DDP__MPI_PIECE / es;
    switch (c->kind) {
    case DDP__BROADCAST:
        for (off = 0; off < c->count && res == DDP_OK; off += n) {
            n = c->count - off < per ? c->count - off : per;
            res = ddp__mpi_wait_req(ctx, &req, c, MPI_Ibcast(recv + off * es, (int)(n * es), MPI_BYTE, c->root, b->comm, &req));
        }
        return res;
    case DDP__ALL_GATHER:
        per /= (size_t)W;
        if (!per) per = 1;
        if ((res = ddp__mpi_stage(ctx, per * es * (size_t)W)) != DDP_OK) return res;
        for (off = 0; off < c->count && res == DDP_OK; off += n) {
            n = c->count - off < per ? c->count - off : per;
            res = ddp__mpi_wait_req(ctx, &req, c, MPI_Iallgather(send + off * es, (int)(n * es), MPI_BYTE, b->stage,
                                                                 (int)(n * es), MPI_BYTE, b->comm, &req));
            for (r = 0; res == DDP_OK && r < W; r++)
                memcpy(recv + ((size_t)r * c->count + off) * es, b->stage + (size_t)r * n * es, n * es);
        }
        return res;
    case DDP__ALL_REDUCE:
        if (b->chain) return ddp__mpi_chain(ctx, c);
        if ((res = ddp__mpi_stage(ctx, (per + (size_t)W) * es)) != DDP_OK) return res;
        for (off = 0; off < c->count && res == DDP_OK; off += n) {
            size_t lo, mine;
            n = c->count - off < per ? c->count - off : per;
            /* rank r owns elements [n r / W, n (r+1) / W) of the piece */
            lo = n * (size_t)me / (size_t)W;
            mine = n * (size_t)(me + 1) / (size_t)W - lo;
            for (r = 0; r < W; r++) {
                b->counts[r] = (int)((n * (size_t)(r + 1) / (size_t)W - n * (size_t)r / (size_t)W) * es);
                b->displs[r] = (int)(n * (size_t)r / (size_t)W * es);
            }
            {   /* send block r to rank r; receive everyone's block `me`, in rank order */
                int *rc = b->counts + W, *rd = b->displs + W;
                for (r = 0; r < W; r++) { rc[r] = (int)(mine * es); rd[r] = (int)((size_t)r * mine * es); }
                res = ddp__mpi_wait_req(ctx, &req, c, MPI_Ialltoallv(send + off * es, b->counts, b->displs, MPI_BYTE,
                                                                     b->stage, rc, rd, MPI_BYTE, b->comm, &req));
            }
            if (res != DDP_OK) break;
            ddp__reducers[c->dtype](recv + (off + lo) * es, NULL, b->stage, mine * es, W, mine, (ddp_op)c->op, W);
            res = ddp__mpi_wait_req(ctx, &req, c, MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, recv + off * es, b->counts,
                                                                  b->displs, MPI_BYTE, b->comm, &req));
        }
        return res;
    case DDP__REDUCE_SCATTER:
        per /= (size_t)W;
        if (!per) per = 1;
        if ((res = ddp__mpi_stage(ctx, 2 * per * es * (size_t)W)) != DDP_OK) return res;
        for (off = 0; off < c->count && res == DDP_OK; off += n) {
            char *out = b->stage + per * es * (size_t)W;
            n = c->count - off < per ? c->count - off : per;
            for (r = 0; r < W; r++) /* piece `off` of block r goes to rank r */
                memcpy(b->stage + (size_t)r * n * es, send + ((size_t)r * c->count + off) * es, n * es);
            res = ddp__mpi_wait_req(ctx, &req, c, MPI_Ialltoall(b->stage, (int)(n * es), MPI_BYTE, out, (int)(n * es),
                                                                MPI_BYTE, b->comm, &req));
            if (res == DDP_OK) ddp__reducers[c->dtype](recv + off * es, NULL, out, n * es, W, n, (ddp_op)c->op, W);
        }
        return res;
    }
    return ddp__fail(ctx, DDP_ERR_ARG, "unknown collective %d", c->kind);
}

/* The chain's communicators and its window on each host (ddp__mpi_chain), when the
   ranks of every host are consecutive; otherwise all-reduce stays the exchange. */
static ddp_result ddp__mpi_chain_init(ddp_ctx *ctx)
{
    ddp__mpi *b = ddp__mpi_of(ctx);
    const size_t slot = ctx->st->cfg.chunk_default ? DDP__MPI_CHAIN_CHUNK : ctx->st->cfg.chunk;
    const size_t bytes = ((size_t)ctx->local_world_size + 4) * slot;
    const char *v = getenv("DDP_MPI_ALLREDUCE");
    const int say = !v || !*v || !strcmp(v, "chain") ? 2 : !strcmp(v, "exchange") ? 0 : -1;
    int first = ctx->rank, together, ok, unit, rc;
    MPI_Aint size;
    void *base;
    MPI_Bcast(&first, 1, MPI_INT, 0, b->local);
    together = say == 2 && ctx->rank != first + ctx->local_rank ? 1 : say;
    MPI_Allreduce(MPI_IN_PLACE, &together, 1, MPI_INT, MPI_MIN, b->comm); /* 2: chain; any rank can say no */
    if (together < 0)
        return ddp__fail(ctx, DDP_ERR_ENV, say < 0 ? "DDP_MPI_ALLREDUCE='%s' must be chain or exchange" :
                         "another rank's DDP_MPI_ALLREDUCE is neither chain nor exchange (this one's: '%s')", v ? v : "");
    if (together < 2) {
        ddp__info(ctx, "MPI all-reduce: an exchange among all ranks (%s)", together ? "the ranks of a host are not "
                  "consecutive" : "DDP_MPI_ALLREDUCE=exchange");
        return DDP_OK;
    }
    MPI_Comm_dup(b->local, &b->results);
    MPI_Comm_split(b->comm, ctx->local_rank == 0 ? 0 : MPI_UNDEFINED, ctx->rank, &b->leaders);
    rc = MPI_Win_allocate_shared(ctx->local_rank == 0 ? (MPI_Aint)bytes : 0, 1, MPI_INFO_NULL, b->local, &base, &b->win);
    ok = rc == MPI_SUCCESS;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, b->comm); /* every host, or none */
    if (rc != MPI_SUCCESS) return ddp__mpi_error(ctx, rc, "MPI_Win_allocate_shared (lower DDP_SHM_CHUNK?)", NULL);
    if (!ok)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "another host could not allocate the MPI backend's %zu bytes of shared "
                         "memory (DDP_SHM_CHUNK x (its ranks + 4))", bytes);
    MPI_Win_shared_query(b->win, 0, &size, &unit, &b->slots);
    b->slot = slot;
    MPI_Win_lock_all(MPI_MODE_NOCHECK, b->win); /* one passive epoch; MPI_Win_sync at each meeting */
    b->chain = 1;
    ddp__info(ctx, "MPI all-reduce: a chain of %d host%s, %zu bytes of shared memory on each", ctx->num_nodes,
              ctx->num_nodes == 1 ? "" : "s", bytes);
    return DDP_OK;
}

static void ddp__mpi_chain_release(ddp__mpi *b)
{
    if (!b) return;
    if (b->chain) MPI_Win_unlock_all(b->win);
    if (b->win != MPI_WIN_NULL) MPI_Win_free(&b->win);
    if (b->leaders != MPI_COMM_NULL) MPI_Comm_free(&b->leaders);
    if (b->results != MPI_COMM_NULL) MPI_Comm_free(&b->results);
    if (b->local != MPI_COMM_NULL) MPI_Comm_free(&b->local);
}

/* The group from MPI itself: rank, size, local ranks, nodes, and the settings that
   must match, all without the store. */
static ddp_result ddp__mpi_form(ddp_ctx *ctx)
{
    ddp__mpi *b;
    int inited = 0, finalized = 0, provided = 0, rank = 0, size = 1, lr = 0, lw = 1, lead, nodes = 0, node = 0, rc, i;
    char *agree;
    ddp_result r = DDP_OK;
    if (!(b = DDP__CAST(ddp__mpi *, DDP_MALLOC(sizeof *b)))) return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory");
    memset(b, 0, sizeof *b);
    b->local = b->results = b->leaders = MPI_COMM_NULL;
    b->win = MPI_WIN_NULL;
    ctx->st->bs = b;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) /* MPI_Initialized stays true after MPI_Finalize, and any other call aborts the job */
        return ddp__fail(ctx, DDP_ERR_BACKEND, "MPI was finalized (by an earlier ddp_destroy, or by the program), and it "
                         "cannot start twice in one process: keep one ddp_ctx for the whole run on the MPI backend");
    if (!inited && ctx->world_size > 1 && !ctx->st->cfg.mpi_launch) /* MPI_Init would abort, or be a world of one */
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the MPI backend was asked for (%s), but %s", ctx->st->cfg.backend_why,
                         ddp__mpi_vars() ? "MPI cannot group the workers of a launcher (torchrun, --nproc) that an MPI "
                                           "launcher started: start every rank with mpirun or srun --mpi=pmix itself"
                                         : "no MPI launcher started these ranks: start them with mpirun, mpiexec or srun "
                                           "--mpi=pmix (on one host, the CPU backend needs none)");
    if (!inited) {
        if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided)) != MPI_SUCCESS)
            return ddp__mpi_error(ctx, rc, "MPI_Init_thread", NULL);
        b->owns_mpi = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    /* async collectives run on the worker thread, never two MPI calls at once */
    if (provided < MPI_THREAD_SERIALIZED)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "MPI was initialised without MPI_THREAD_SERIALIZED, which the MPI backend needs");
    MPI_Comm_dup(MPI_COMM_WORLD, &b->comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &b->ctl);
    b->has_comm = 1;
    MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(b->ctl, MPI_ERRORS_RETURN);
    MPI_Comm_rank(b->comm, &rank);
    MPI_Comm_size(b->comm, &size);
    if (ctx->world_size > 1 && (ctx->world_size != size || ctx->rank != rank))
        return ddp__fail(ctx, DDP_ERR_ENV, "the launcher says rank %d of %d, MPI says rank %d of %d", ctx->rank,
                         ctx->world_size, rank, size);
    ctx->rank = rank;
    ctx->world_size = size;
    MPI_Comm_split_type(b->comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &b->local);
    MPI_Comm_rank(b->local, &lr);
    MPI_Comm_size(b->local, &lw);
    lead = lr == 0; /* nodes are numbered in order of their first rank */
    MPI_Allreduce(&lead, &nodes, 1, MPI_INT, MPI_SUM, b->comm);
    MPI_Exscan(&lead, &node, 1, MPI_INT, MPI_SUM, b->comm);
    if (rank == 0) node = 0;
    MPI_Bcast(&node, 1, MPI_INT, 0, b->local);
    ctx->local_rank = lr;
    ctx->local_world_size = lw;
    ctx->node_rank = node;
    ctx->num_nodes = nodes;
    b->counts = DDP__CAST(int *, DDP_MALLOC(sizeof(int) * 2 * (size_t)size));
    b->displs = DDP__CAST(int *, DDP_MALLOC(sizeof(int) * 2 * (size_t)size));
    agree = DDP__CAST(char *, DDP_MALLOC(sizeof ctx->st->cfg.agree * (size_t)size));
    if (!b->counts || !b->displs || !agree) { DDP_FREE(agree); return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory"); }
    MPI_Allgather(ctx->st->cfg.agree, (int)sizeof ctx->st->cfg.agree, MPI_CHAR, agree, (int)sizeof ctx->st->cfg.agree,
                  MPI_CHAR, b->comm);
    for (i = 0; i < size && r == DDP_OK; i++) r = ddp__agree(ctx, i, agree + (size_t)i * sizeof ctx->st->cfg.agree);
    DDP_FREE(agree);
    return r == DDP_OK ? ddp__mpi_chain_init(ctx) : r;
}

/* MPI_Init and the collectives that form the group wait with no timeout and cannot be
   interrupted: a rank stuck or stopped before its ddp_init held every other in MPI_Init
   for good. This thread watches them: past the timeout it says so and ends the process
   (_exit(1): the one place ddp.h does; a process can return from no MPI call), which
   makes mpirun, Hydra and srun end the job. */
typedef struct ddp__mpi_watch {
    ddp_ctx *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} ddp__mpi_watch;

static void *ddp__mpi_watchdog(void *arg)
{
    ddp__mpi_watch *w = (ddp__mpi_watch *)arg;
    const int ms = w->ctx->st->cfg.timeout_ms;
    const struct timespec until = ddp__realtime_in(ms);
    int done;
    pthread_mutex_lock(&w->mu);
    while (!w->done && pthread_cond_timedwait(&w->cv, &w->mu, &until) != ETIMEDOUT) {}
    done = w->done;
    pthread_mutex_unlock(&w->mu);
    if (done) return NULL;
    ddp__fail(w->ctx, DDP_ERR_TIMEOUT, "the MPI group did not form within %.*f s (MPI_Init and the calls after it wait "
              "with no timeout: a rank stuck, stopped or gone before its ddp_init?); ending this process, which no MPI "
              "call returns to", DDP__SECONDS(ms));
    _exit(1);
}

static ddp_result ddp__mpi_group(ddp_ctx *ctx)
{
    ddp__mpi_watch w;
    pthread_t t;
    ddp_result r;
    int watching;
    memset(&w, 0, sizeof w);
    w.ctx = ctx;
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    watching = pthread_create(&t, NULL, ddp__mpi_watchdog, &w) == 0;
    r = ddp__mpi_form(ctx);
    pthread_mutex_lock(&w.mu);
    w.done = 1;
    pthread_cond_signal(&w.cv);
    pthread_mutex_unlock(&w.mu);
    if (watching) pthread_join(t, NULL);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return r;
}

static ddp_result ddp__mpi_init(ddp_ctx *ctx)
{
    (void)ctx; /* the group already did everything */
    return DDP_OK;
}

static void ddp__mpi_release(ddp_ctx *ctx)
{
    ddp__mpi *b = ddp__mpi_of(ctx);
    if (b && b->has_comm && ctx->st->broken) {
        /* after a failure MPI is left as it is: its teardown (MPI_Win_free, MPI_Finalize)
           waits for every rank with no timeout, and one may be stuck, stopped or cut off
           for good; a process that exits without MPI_Finalize makes mpirun, Hydra and
           srun end the job (one that finalized and exited 1 kept a Hydra job waiting) */
        if (ctx->rank == 0 && b->owns_mpi) { /* once per job: mpirun's report of it follows */
            char msg[200];
            snprintf(msg, sizeof msg, "rank 0/%d: after the failure above MPI is left unfinalized, so that the ranks' "
                     "exits end the job (mpirun then reports them as exiting improperly)", ctx->world_size);
            ddp__say(ctx, DDP_LOG_INFO, msg);
        }
        b->chain = 0;
        b->win = MPI_WIN_NULL;
        b->leaders = b->results = b->local = MPI_COMM_NULL;
        b->has_comm = b->owns_mpi = 0;
    }
    ddp__mpi_chain_release(b);
    if (!b) return;
    if (b->has_comm) { MPI_Comm_free(&b->comm); MPI_Comm_free(&b->ctl); }
    if (b->owns_mpi) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
    }
    DDP_FREE(b->stage);
    DDP_FREE(b->counts);
    DDP_FREE(b->displs);
    DDP_FREE(b);
    ctx->st->bs = NULL;
}

#endif

/* ---- >>backends ------------------------------------------------------------------------------
   What a backend provides. init runs after the store is up (world > 1) and sets
   ctx->st->bs; run does one collective (host backends: to completion; `work` is NULL
   for them, the worker thread gives them overlap); wait finishes async work, on the
   host too or only on `stream` (NULL: the worker thread's queue is the async
   mechanism); release undoes init. A backend
   compiled out has a row of NULLs and a reason. */
struct ddp__backend {
    ddp_result (*group)(ddp_ctx *ctx); /* forms the group itself (MPI); NULL: the store does */
    ddp_result (*init)(ddp_ctx *ctx);
    ddp_result (*run)(ddp_ctx *ctx, const ddp__coll *c, void *stream, ddp_work *work);
    ddp_result (*wait)(ddp_ctx *ctx, ddp_work *work, void *stream, int host);
    void (*release)(ddp_ctx *ctx);
    void (*abort)(ddp_ctx *ctx, ddp_result code); /* tell the peers at once, if it can */
    const char *missing; /* why it is not compiled in */
};

static const ddp__backend ddp__backends[DDP_BACKEND_COUNT] = {
    {NULL, NULL, NULL, NULL, NULL, NULL, "no backend"},
    {NULL, ddp__cpu_init, ddp__cpu_run, NULL, ddp__cpu_release, ddp__cpu_abort, NULL},
#ifdef DDP_NCCL
    {NULL, ddp__nccl_init, ddp__nccl_run, ddp__nccl_wait, ddp__nccl_release, NULL, NULL},
#else
    {NULL, NULL, NULL, NULL, NULL, NULL, "ddp.h was built without it (build with nvcc, or -DDDP_NCCL and -lcudart -lnccl)"},
#endif
#ifdef DDP_MPI
    {ddp__mpi_group, ddp__mpi_init, ddp__mpi_run, NULL, ddp__mpi_release, NULL, NULL},
#else
    {NULL, NULL, NULL, NULL, NULL, NULL, "ddp.h was built without it (define DDP_MPI and build with mpicc)"},
#endif
};

/* The desc's or DDP_BACKEND's choice, else NCCL where a GPU is usable, else MPI for
   a job an MPI launcher spread over hosts (when built with it), else CPU. */
static ddp_result ddp__choose_backend(ddp_ctx *ctx, const struct ddp__launcher *l)
{
    ddp__settings *cfg = &ctx->st->cfg;
    cfg->mpi_launch = (!l || l->mpi) && ddp__mpi_vars();
    if (!cfg->backend) {
        cfg->backend = DDP_BACKEND_CPU;
        cfg->backend_why = cfg->backend_note;
#ifdef DDP_NCCL
        if (ddp__nccl_usable(cfg->backend_note, sizeof cfg->backend_note)) {
            cfg->backend = DDP_BACKEND_NCCL;
            snprintf(cfg->backend_note, sizeof cfg->backend_note, "a GPU is visible");
        }
#else
        snprintf(cfg->backend_note, sizeof cfg->backend_note, "built without NCCL");
#endif
#ifdef DDP_MPI
        if (cfg->backend == DDP_BACKEND_CPU && cfg->mpi_launch && ctx->local_world_size > 0 &&
            ctx->local_world_size < ctx->world_size) {
            cfg->backend = DDP_BACKEND_MPI;
            snprintf(cfg->backend_note, sizeof cfg->backend_note, "an MPI launcher put %d of %d ranks on this host",
                     ctx->local_world_size, ctx->world_size);
        }
#endif
    }
    if (ddp__backends[cfg->backend].missing)
        return ddp__fail(ctx, DDP_ERR_BACKEND, "the %s backend was asked for (%s), but %s", ddp_backend_name(cfg->backend),
                         cfg->backend_why, ddp__backends[cfg->backend].missing);
    ctx->backend = cfg->backend;
    ctx->st->be = &ddp__backends[cfg->backend];
    return DDP_OK;
}

/* ---- >>trace ------------------------------------------------------------------------------
   Events in memory per rank, in nanoseconds since ddp_trace_start; gathered to rank 0
   and written as Chrome trace JSON by ddp_trace_save. */
#define DDP__TRACE_DEPTH 64
typedef struct ddp__event { int64_t t0, t1; int32_t row; char name[44]; } ddp__event; /* 64 bytes */
DDP__STATIC_ASSERT(event_size, sizeof(ddp__event) == 64);
struct ddp__trace {
    pthread_mutex_t mu;           /* the collective thread records too */
    ddp__event *ev;
    size_t n, cap, dropped;
    int64_t zero;
    size_t open[DDP__TRACE_DEPTH]; /* begin's events still waiting for their end */
    int depth, saving;
};

/* A name cut short must not end inside a UTF-8 character (the file would not load). */
static void ddp__utf8_cut(char *s)
{
    size_t n = strlen(s), k = n;
    unsigned char lead;
    while (k > 0 && ((unsigned char)s[k - 1] & 0xc0) == 0x80) k--; /* back to the last lead byte */
    if (k == 0) return;
    lead = (unsigned char)s[k - 1];
    if (lead >= 0xc0 && n - (k - 1) < (size_t)(lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2)) s[k - 1] = 0;
}

/* Records a span (t1 < 0: still open); its index, or (size_t)-1 when dropped or off. */
static size_t ddp__trace_add(ddp_ctx *ctx, int row, const char *name, int64_t t0, int64_t t1)
{
    struct ddp__trace *t = ctx && ctx->st ? ctx->st->trace : NULL;
    size_t i = (size_t)-1;
    if (!t) return i;
    pthread_mutex_lock(&t->mu);
    if (t->saving) { /* (set under the lock: the collectives' thread records too) */
    } else if (t->n < t->cap) {
        ddp__event *e = &t->ev[i = t->n++];
        e->t0 = t0 - t->zero;
        e->t1 = t1 < 0 ? -1 : t1 - t->zero;
        e->row = row;
        ddp__copy(e->name, sizeof e->name, name ? name : "?");
        ddp__utf8_cut(e->name);
    } else {
        t->dropped++;
    }
    pthread_mutex_unlock(&t->mu);
    return i;
}

/* "all_reduce 1.5 MB" or "bucket 3 all_reduce 1.5 MB" */
static void ddp__trace_name(char *out, size_t n, const char *prefix, const ddp__coll *c)
{
    double bytes = (double)c->count * (double)ddp_dtype_size((ddp_dtype)c->dtype);
    char size[24] = "";
    if (ddp__coll_moves_data(c->kind))
        snprintf(size, sizeof size, bytes >= 1e6 ? " %.1f MB" : bytes >= 1e3 ? " %.1f KB" : " %.0f B",
                 bytes >= 1e6 ? bytes / 1e6 : bytes >= 1e3 ? bytes / 1e3 : bytes);
    if (c->bucket) snprintf(out, n, "%sbucket %d %s%s", prefix, (int)c->bucket - 1, ddp__colls[c->kind].name, size);
    else snprintf(out, n, "%s%s%s", prefix, ddp__colls[c->kind].name, size);
}

static void ddp__trace_free(struct ddp__state *st)
{
    if (!st->trace) return;
    pthread_mutex_destroy(&st->trace->mu);
    DDP_FREE(st->trace->ev);
    DDP_FREE(st->trace);
    st->trace = NULL;
}

/* Every rank's worst problem (0 none, 1 this one, 2 that one, ...): the same on every
   rank, so that all of them take the same path through a start or a save; and whether
   some rank is in the other call: ddp_trace_start (call 0) and ddp_trace_save (call 1)
   each send 1 + problem in their own field and 0 in the other's. */
static ddp_result ddp__trace_worst(ddp_ctx *ctx, int64_t *problem, int call, int *other)
{
    int64_t v[2] = {0, 0};
    ddp_result r;
    v[call] = 1 + *problem;
    if ((r = ddp_all_reduce(ctx, v, v, 2, DDP_I64, DDP_MAX, NULL)) != DDP_OK) return r;
    *problem = v[call] - 1;
    *other = v[!call] > 0;
    return DDP_OK;
}

ddp_result ddp_trace_start(ddp_ctx *ctx, size_t max_events)
{
    struct ddp__trace *t = NULL;
    int64_t problem = 0, own, mine[2], *all = NULL;
    ddp_result r;
    int i, other = 0;
    if (!ctx || !ctx->st) return ddp__no_state(ctx, "ddp_trace_start");
    if (!max_events) max_events = 100000;
    if (max_events > ((size_t)1 << 40) / sizeof(ddp__event)) problem = 1;
    else if ((t = DDP__CAST(struct ddp__trace *, DDP_MALLOC(sizeof *t)))) {
        memset(t, 0, sizeof *t);
        t->ev = DDP__CAST(ddp__event *, DDP_MALLOC(max_events * sizeof(ddp__event)));
    }
    all = DDP__CAST(int64_t *, DDP_MALLOC(sizeof(int64_t) * 2 * (size_t)ctx->world_size));
    if (!problem && (!t || !t->ev || !all)) problem = 2;
    own = problem;
    /* also the barrier the rows line up at, and the end of every async collective */
    if ((r = ddp__trace_worst(ctx, &problem, 0, &other)) == DDP_OK && (problem || other))
        r = other ? ddp__fail(ctx, DDP_ERR_ARG, "ddp_trace_start: another rank is in ddp_trace_save (every rank "
                                                "starts tracing, then every rank saves)")
            : problem == 2 ? ddp__fail(ctx, own ? DDP_ERR_NOMEM : DDP_ERR_PEER,
                                       "ddp_trace_start: no memory for the events on %s", own ? "this rank" : "another rank")
            : own == 1   ? ddp__fail(ctx, DDP_ERR_ARG, "ddp_trace_start: %zu events is too many", max_events)
                         : ddp__fail(ctx, DDP_ERR_PEER, "ddp_trace_start: another rank asked for too many events");
    mine[0] = ctx->node_rank;
    mine[1] = ddp__now_ns();
    /* ranks on one host read one clock: all of them start at its first rank's zero */
    if (r == DDP_OK && (r = ddp_all_gather(ctx, mine, all, 2, DDP_I64, NULL)) == DDP_OK) {
        for (i = 0; i < ctx->world_size && all[2 * i] != mine[0]; i++) {}
        t->zero = i < ctx->world_size ? all[2 * i + 1] : mine[1];
        t->cap = max_events;
        pthread_mutex_init(&t->mu, NULL);
        ddp__trace_free(ctx->st); /* a restart: nothing records into the old one any more */
        ctx->st->trace = t;
        t = NULL;
    }
    if (t) {
        DDP_FREE(t->ev);
        DDP_FREE(t);
    }
    DDP_FREE(all);
    return r;
}

void ddp_trace_begin(ddp_ctx *ctx, const char *name)
{
    struct ddp__trace *t = ctx && ctx->st ? ctx->st->trace : NULL;
    size_t i;
    if (!t || t->saving) return;
    i = ddp__trace_add(ctx, 0, name, ddp__now_ns(), -1);
    if (t->depth < DDP__TRACE_DEPTH) t->open[t->depth] = i;
    t->depth++; /* past the limit: counted, so that ends still pair with their begins */
}

void ddp_trace_end(ddp_ctx *ctx)
{
    struct ddp__trace *t = ctx && ctx->st ? ctx->st->trace : NULL;
    size_t i;
    if (!t || t->saving || t->depth == 0) return;
    t->depth--;
    if (t->depth >= DDP__TRACE_DEPTH || (i = t->open[t->depth]) == (size_t)-1) return;
    pthread_mutex_lock(&t->mu);
    t->ev[i].t1 = ddp__now_ns() - t->zero;
    pthread_mutex_unlock(&t->mu);
}

static void ddp__json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* Rank 0 writes every rank's events; all[r * max .. + counts[r]] are rank r's. */
static int ddp__trace_write(FILE *f, const ddp__event *all, const int64_t *counts, size_t max, int world)
{
    static const char *rows[2] = {"main", "collectives"};
    int r, k;
    size_t i;
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    for (r = 0; r < world; r++) {
        fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}},\n", r, r);
        fprintf(f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}},\n", r, r);
        for (k = 0; k < 2; k++)
            fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n", r, k,
                    rows[k]);
        for (i = 0; i < (size_t)counts[2 * r]; i++) {
            const ddp__event *e = &all[(size_t)r * max + i];
            char name[sizeof e->name];
            memcpy(name, e->name, sizeof name);
            name[sizeof name - 1] = 0; /* from another rank: trust nothing */
            fprintf(f, "{\"name\":");
            ddp__json_string(f, name);
            fprintf(f, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f},\n", r, e->row == 1,
                    (double)e->t0 / 1e3, (double)(e->t1 > e->t0 ? e->t1 - e->t0 : 0) / 1e3);
        }
    }
    /* the last entry carries what was dropped: JSON allows no trailing comma */
    fprintf(f, "{\"name\":\"dropped\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"events\":[");
    for (r = 0; r < world; r++) fprintf(f, "%s%lld", r ? "," : "", (long long)counts[2 * r + 1]);
    fprintf(f, "]}}\n]}\n");
    return ferror(f) ? -1 : 0;
}

/* A new file beside path for a save to rename into place (its name in tmp): PATH.tmp, or
   where that name is taken PATH.tmp.XXXXXX. O_EXCL: a file this call made, never one
   that was there (a killed save's, a link, the program's own data), which is not ours to
   remove or to write through. The descriptor, or -1 with errno set. */
static int ddp__temp_file(const char *path, char *tmp, size_t cap)
{
    int k, fd = -1;
    for (k = 0; k < 100; k++) {
        const uint64_t x = ((uint64_t)getpid() * 2654435761u) ^ (uint64_t)ddp__now_ns() ^ ((uint64_t)k * 40503u);
        if (k == 0) snprintf(tmp, cap, "%s.tmp", path);
        else snprintf(tmp, cap, "%s.tmp.%06x", path, (unsigned)(x & 0xffffffu));
        if ((fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666)) >= 0 || errno != EEXIST)
            return fd;
    }
    return -1;
}

ddp_result ddp_trace_save(ddp_ctx *ctx, const char *path)
{
    struct ddp__trace none, *t;
    int64_t mine[2], *counts = NULL, problem = 0, own, max = 0;
    ddp__event *all = NULL;
    char tmp[4096 + 16];
    FILE *f = NULL;
    ddp_result r;
    size_t i;
    int k, err = 0, made = 0, other = 0;
    if (!ctx || !ctx->st) return ddp__no_state(ctx, "ddp_trace_save");
    /* a rank that never started still takes part, so that nobody waits for it */
    memset(&none, 0, sizeof none);
    t = ctx->st->trace ? ctx->st->trace : &none;
    if (t != &none) pthread_mutex_lock(&t->mu); /* the collectives' thread, or a ddp_wait's, may be recording */
    t->saving = 1; /* the save's own collectives are not recorded, nor anything from here on */
    for (i = 0; i < t->n; i++)
        if (t->ev[i].t1 < 0) t->ev[i].t1 = ddp__now_ns() - t->zero; /* still open: ends here */
    mine[0] = (int64_t)t->n;
    mine[1] = (int64_t)t->dropped;
    if (t != &none) pthread_mutex_unlock(&t->mu);
    counts = DDP__CAST(int64_t *, DDP_MALLOC(sizeof(int64_t) * 2 * (size_t)ctx->world_size));
    if (!ctx->st->trace) problem = 3;
    else if (!counts) problem = 2;
    else if (ctx->rank == 0) { /* whether rank 0 can write the file, before anything is sent */
        if (!path || !*path || strlen(path) > 4096) problem = 1;
        else {
            const int fd = ddp__temp_file(path, tmp, sizeof tmp);
            err = errno;
            if (fd >= 0 && !(f = fdopen(fd, "w"))) err = errno, close(fd);
            if (!f) problem = 1;
            made = f != NULL;
        }
    }
    /* a rank whose own part was fine says DDP_ERR_PEER: the launcher then names the rank that failed */
    own = problem;
    if ((r = ddp__trace_worst(ctx, &problem, 1, &other)) == DDP_OK && (problem || other)) {
        if (other) r = ddp__fail(ctx, DDP_ERR_ARG, "ddp_trace_save: another rank is in ddp_trace_start (every rank "
                                                   "starts tracing, then every rank saves)");
        else if (problem == 3) r = ddp__fail(ctx, own ? DDP_ERR_ARG : DDP_ERR_PEER, "ddp_trace_save: tracing was not "
                                             "started on %s (ddp_trace_start, a collective)", own ? "this rank" : "every rank");
        else if (problem == 2) r = ddp__fail(ctx, own ? DDP_ERR_NOMEM : DDP_ERR_PEER, "ddp_trace_save: out of memory on %s",
                                             own ? "this rank" : "another rank");
        else if (ctx->rank == 0)
            r = ddp__fail(ctx, DDP_ERR_ARG, "ddp_trace_save: cannot write '%s': %s", path ? path : "(null)",
                          path && *path ? strerror(err) : "no path");
        else r = ddp__fail(ctx, DDP_ERR_PEER, "ddp_trace_save: rank 0 cannot write the trace file");
    }
    if (r == DDP_OK) r = ddp_all_gather(ctx, mine, counts, 2, DDP_I64, NULL);
    if (r == DDP_OK) {
        for (k = 0; k < ctx->world_size; k++)
            if (counts[2 * k] > max) max = counts[2 * k];
        /* every rank sends max events (the same count everywhere), its own first */
        all = DDP__CAST(ddp__event *, DDP_MALLOC(((size_t)ctx->world_size + 1) * (size_t)(max ? max : 1) * sizeof *all));
        problem = own = !all;
        if ((r = ddp__trace_worst(ctx, &problem, 1, &other)) == DDP_OK && problem)
            r = ddp__fail(ctx, own ? DDP_ERR_NOMEM : DDP_ERR_PEER, "ddp_trace_save: out of memory for %lld events on %s",
                          (long long)max, own ? "this rank" : "another rank");
    }
    if (r == DDP_OK) {
        ddp__event *send = all + (size_t)ctx->world_size * (size_t)max;
        memset(send, 0, (size_t)max * sizeof *send);
        if (t->n) memcpy(send, t->ev, t->n * sizeof *send);
        r = ddp_all_gather(ctx, send, all, (size_t)max * sizeof *send / 8, DDP_I64, NULL);
    }
    if (r == DDP_OK) { /* and whether it worked */
        if (ctx->rank == 0) { /* the file takes the name only once it is whole: a failed save keeps the old one */
            problem = ddp__trace_write(f, all, counts, (size_t)max, ctx->world_size) != 0;
            err = errno;
            if (fclose(f) != 0 && !problem) problem = 1, err = errno;
            f = NULL;
            if (!problem && rename(tmp, path) != 0) problem = 1, err = errno;
        }
        r = ddp__trace_worst(ctx, &problem, 1, &other);
        if (r == DDP_OK && problem)
            r = ctx->rank == 0 ? ddp__fail(ctx, DDP_ERR_SYSTEM, "ddp_trace_save: writing '%s' failed: %s", path, strerror(err))
                               : ddp__fail(ctx, DDP_ERR_PEER, "ddp_trace_save: rank 0 could not write the trace file");
    }
    if (r == DDP_OK && ctx->rank == 0) { /* a trace that ends before the run did is said (its metadata holds it too) */
        int most = 0;
        for (k = 1; k < ctx->world_size; k++)
            if (counts[2 * k + 1] > counts[2 * most + 1]) most = k;
        if (counts[2 * most + 1] > 0) {
            char msg[400];
            snprintf(msg, sizeof msg, "warning: ddp_trace_save: '%.200s' ends early: rank %d dropped %lld events past "
                     "ddp_trace_start's max_events", path, most, (long long)counts[2 * most + 1]);
            ddp__say(ctx, DDP_LOG_INFO, msg);
        }
    }
    if (f) fclose(f);
    if (made && r != DDP_OK) remove(tmp);
    DDP_FREE(all);
    DDP_FREE(counts);
    ddp__trace_free(ctx->st); /* recording stops, whatever happened */
    return r;
}

/* ---- >>collectives --------------------------------------------------------------------------- */

static void *ddp__worker_main(void *arg)
{
    ddp_ctx *ctx = (ddp_ctx *)arg;
    struct ddp__state *st = ctx->st;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        ddp__coll c;
        ddp_result r;
        int64_t t0;
        char name[48];
        while (st->done == st->queued && !st->worker_stop) pthread_cond_wait(&st->cv, &st->mu);
        if (st->done == st->queued) break;
        c = st->queue[st->done % DDP__QUEUE];
        pthread_mutex_unlock(&st->mu);
        t0 = st->trace ? ddp__now_ns() : 0;
        r = st->async_err ? DDP_ERR_ABORTED : st->be->run(ctx, &c, NULL, NULL);
        if (st->trace) {
            ddp__trace_name(name, sizeof name, "", &c);
            ddp__trace_add(ctx, 1, name, t0, ddp__now_ns());
        }
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

static ddp_result ddp__queue(ddp_ctx *ctx, const ddp__coll *c, ddp_work *work)
{
    struct ddp__state *st = ctx->st;
    pthread_mutex_lock(&st->mu);
    if (!st->worker_started) {
        int e = pthread_create(&st->worker, NULL, ddp__worker_main, ctx);
        if (e != 0) {
            pthread_mutex_unlock(&st->mu);
            return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot start the collective thread: %s", strerror(e));
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

/* The group cannot go on: later calls are refused citing r, and the backend lets the
   other ranks know (the CPU arena's abort word, NCCL's communicator abort). */
/* broken and the error text are written by a thread refused beside the one in a collective
   (ddp__issue), so broken is read and written atomically, and the text under log_mu */
static ddp_result ddp__broken(const struct ddp__state *st) { return __atomic_load_n(&st->broken, __ATOMIC_ACQUIRE); }
/* The group is broken, by r: the launcher hears what broke it (the first failure this
   rank said may have been a refused call that broke nothing). */
static void ddp__broke(ddp_ctx *ctx, ddp_result r)
{
    const ddp_result was = (ddp_result)__atomic_exchange_n(&ctx->st->broken, r, __ATOMIC_ACQ_REL);
    if (!was && ctx->st->report_fd >= 0) { /* with the rank a timeout waited for: the launcher names it */
        char line[64];
        const int n = r == DDP_ERR_TIMEOUT && ctx->st->waited >= 0
                          ? snprintf(line, sizeof line, "\n%d %d -2 %d\n", (int)getpid(), (int)r, ctx->st->waited)
                          : snprintf(line, sizeof line, "\n%d %d -2\n", (int)getpid(), (int)r);
        pthread_mutex_lock(&ctx->st->log_mu);
        if (write(ctx->st->report_fd, line, (size_t)n) < 0) {}
        pthread_mutex_unlock(&ctx->st->log_mu);
    }
}

static ddp_result ddp__break(ddp_ctx *ctx, ddp_result r)
{
    ddp__broke(ctx, r);
    if (ctx->st->be && ctx->st->be->abort) ctx->st->be->abort(ctx, r);
    return r;
}

/* A refused call still takes its number: refused on one rank only, its next call meets
   the others' refused one's by number, a named mismatch, not a wrong result. */
static ddp_result ddp__numbered(ddp_ctx *ctx, ddp_result r)
{
    if (ctx && ctx->st && ctx->st->held.pid == getpid() && !ddp__broken(ctx->st)) ctx->st->seq++;
    return r;
}

/* A call on a broken group: the first refusal is logged, later ones only set the error
   (a loop that ignores results would print a line per bucket); all cite the first cause. */
static ddp_result ddp__refuse(ddp_ctx *ctx, const char *what)
{
    struct ddp__state *st = ctx->st;
    if (!st->cause[0]) {
        ddp__copy(st->cause, sizeof st->cause, st->err);
        return ddp__fail(ctx, DDP_ERR_ABORTED, "%s refused: the process group failed earlier: %s", what, st->cause);
    }
    pthread_mutex_lock(&st->log_mu);
    snprintf(st->err, sizeof st->err, "%s refused: the process group failed earlier: %s", what, st->cause);
    pthread_mutex_unlock(&st->log_mu);
    return DDP_ERR_ABORTED;
}

static ddp_result ddp__check(ddp_ctx *ctx, const ddp__coll *c)
{
    const char *name = ddp__colls[c->kind].name;
    int needs_data = ddp__coll_moves_data(c->kind) && c->count > 0;
    if (ctx->st->held.pid != getpid()) /* it would join the parent's collectives as the parent */
        return ddp__fail(ctx, DDP_ERR_ARG, "%s: this ddp_ctx belongs to process %d, not to this child of it "
                         "(fork() copies the context; only ddp_init's process can use it)", name, (int)ctx->st->held.pid);
    if (ddp__broken(ctx->st))
        return ddp__refuse(ctx, name);
    if ((unsigned)c->dtype >= DDP_DTYPE_COUNT || (unsigned)c->op >= DDP_OP_COUNT)
        return ddp__fail(ctx, DDP_ERR_ARG, "%s: unknown dtype %d or op %d", name, (int)c->dtype, (int)c->op);
    if (needs_data && (!c->recv || (!c->send && ddp__colls[c->kind].send)))
        return ddp__fail(ctx, DDP_ERR_ARG, "%s: NULL buffer for %llu elements", name, (unsigned long long)c->count);
    /* the bytes of the largest buffer, all ranks' blocks of all_gather or reduce_scatter, within
       what an address space holds (2^56 bytes: x86-64's and ARM's largest; a count past it
       was read as a buffer and crashed) */
    if (c->count > DDP__MAX_BYTES / ddp_dtype_size((ddp_dtype)c->dtype) / (size_t)ctx->world_size)
        return ddp__fail(ctx, DDP_ERR_ARG, "%s: %llu elements of %s%s are more bytes than memory holds", name,
                         (unsigned long long)c->count, ddp_dtype_name((ddp_dtype)c->dtype),
                         ddp__colls[c->kind].send == 'W' || ddp__colls[c->kind].recv == 'W' ? " from every rank" : "");
    if (needs_data && ddp__colls[c->kind].send) { /* read in chunks while written: wrong results */
        const uintptr_t a = (uintptr_t)c->send, b = (uintptr_t)c->recv; /* (as numbers: no pointer past its object) */
        const size_t one = c->count * ddp_dtype_size((ddp_dtype)c->dtype), mine = (size_t)ctx->rank * one;
        const size_t sbytes = ddp__colls[c->kind].send == 'W' ? one * (size_t)ctx->world_size : one;
        const size_t rbytes = ddp__colls[c->kind].recv == 'W' ? one * (size_t)ctx->world_size : one;
        /* in place: the same buffer, or (as NCCL's) this rank's block of the larger one */
        const int in_place = c->kind == DDP__ALL_GATHER       ? a == b + mine
                             : c->kind == DDP__REDUCE_SCATTER ? b == a + mine
                                                              : a == b;
        if (!in_place && a < b + rbytes && b < a + sbytes)
            return ddp__fail(ctx, DDP_ERR_ARG, "%s: send and recv overlap without being in place (%s), or %llu "
                             "elements are more than they hold", name, c->kind == DDP__ALL_REDUCE ? "the same buffer"
                             : c->kind == DDP__ALL_GATHER ? "send at recv + rank x count" : "recv at send + rank x count",
                             (unsigned long long)c->count);
    }
    if (c->root < 0 || c->root >= ctx->world_size)
        return ddp__fail(ctx, DDP_ERR_ARG, "%s: root %d is not a rank of a world of %d", name, c->root, ctx->world_size);
    return DDP_OK;
}

/* DDP_CHECK: every rank's fingerprint through the store before the collective runs
   (one round trip to rank 0: for debugging, and for backends without a cheaper way). */
static ddp_result ddp__store_check(ddp_ctx *ctx, const ddp__coll *c)
{
    ddp__fp mine = ddp__fingerprint(c), theirs;
    const char **all_parts;
    uint32_t *lens;
    char *all = NULL, why[300], what[96];
    ddp_result r;
    int i;
    if (ctx->world_size == 1) return DDP_OK;
    all_parts = DDP__CAST(const char **, DDP_MALLOC(sizeof(char *) * (size_t)ctx->world_size));
    lens = DDP__CAST(uint32_t *, DDP_MALLOC(sizeof(uint32_t) * (size_t)ctx->world_size));
    if (!all_parts || !lens) { DDP_FREE(all_parts); DDP_FREE(lens); return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory"); }
    snprintf(what, sizeof what, "comparing %s #%llu across ranks (DDP_CHECK)", ddp__colls[c->kind].name,
             (unsigned long long)c->seq);
    r = ddp__store_gather(ctx, "fp", &mine, sizeof mine, &all, all_parts, lens, what);
    for (i = 0; r == DDP_OK && i < ctx->world_size; i++) {
        if (lens[i] != sizeof theirs) { r = ddp__fail(ctx, DDP_ERR_PROTOCOL, "rank %d sent a malformed fingerprint", i); break; }
        memcpy(&theirs, all_parts[i], sizeof theirs);
        if (memcmp(&theirs, &mine, sizeof mine) != 0) {
            ddp__fp_diff(why, sizeof why, ctx->rank, &mine, i, &theirs);
            r = ddp__fail(ctx, ddp__fp_code(&mine, &theirs), "%s", why);
        }
    }
    DDP_FREE(all);
    DDP_FREE(all_parts);
    DDP_FREE(lens);
    return r;
}

/* Every collective goes through here: validate, number, compare, run (or queue). */
static ddp_result ddp__issue_one(ddp_ctx *ctx, ddp__coll *c, void *stream, ddp_work *work)
{
    struct ddp__state *st;
    ddp_result r;
    uint32_t who;
    int64_t t0 = 0;
    char name[48];
    if ((r = ddp__check(ctx, c)) != DDP_OK) return ddp__numbered(ctx, r);
    st = ctx->st;
    if (st->trace) t0 = ddp__now_ns();
    c->seq = ++st->seq;
    if (work) { work->seq = c->seq; work->event = NULL; work->owner = st->id; }
    /* rank 0: the store learnt that the job cannot be trusted; the arena may hold the
       failure before what the store saw (a rank that left after it) */
    if (ddp__server_failed(st->server)) {
        who = ctx->backend == DDP_BACKEND_CPU && ddp__cpu_of(ctx) && ddp__cpu_of(ctx)->shm
                  ? __atomic_load_n(&ddp__cpu_of(ctx)->shm->aborted, __ATOMIC_SEQ_CST) : 0;
        r = who ? ddp__fail(ctx, DDP_ERR_ABORTED, "%s #%llu stopped: rank %u failed: %s", ddp__colls[c->kind].name,
                            (unsigned long long)c->seq, who - 1, ddp__cpu_of(ctx)->shm->why[who - 1])
                : ddp__fail(ctx, DDP_ERR_PEER, "%s #%llu stopped: %s", ddp__colls[c->kind].name,
                            (unsigned long long)c->seq, ddp__server_failed(st->server));
    }
    /* DDP_CHECK through the store, for NCCL: the CPU and MPI backends compare every call themselves
       (the MPI backend forms its group without a store: a store check there failed every call) */
    if (r == DDP_OK && st->cfg.check && ctx->backend == DDP_BACKEND_NCCL && (r = ddp__drain(ctx, st->queued)) == DDP_OK)
        r = ddp__store_check(ctx, c);
    if (r == DDP_OK && work && !st->be->wait && ctx->world_size > 1) return ddp__queue(ctx, c, work);
    if (r == DDP_OK && (r = ddp__drain(ctx, st->queued)) == DDP_OK) r = st->be->run(ctx, c, stream, work);
    if (r != DDP_OK) ddp__break(ctx, r);
    if (st->trace) { /* blocking, or queued on the GPU: the caller's time */
        ddp__trace_name(name, sizeof name, work && st->be->wait ? "queue " : "", c);
        ddp__trace_add(ctx, 0, name, t0, ddp__now_ns());
    }
    return r;
}

/* ddp__claim takes the call where it is free (0), else says who holds it. */
enum { DDP__BUSY_CALL = 1, DDP__BUSY_DESTROY = 2 };
static int ddp__claim(ddp__busy *b, int as)
{
    int held = 0;
    if (!__atomic_compare_exchange_n(&b->state, &held, as, 0, __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE)) return held;
    __atomic_store_n(&b->by, pthread_self(), __ATOMIC_RELAXED);
    return 0;
}
static void ddp__unclaim(ddp__busy *b)
{
    __atomic_store_n(&b->by, (pthread_t)0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->state, 0, __ATOMIC_RELEASE);
}

/* A call enters an object's state only while the state is held as that owner's: a destroy
   takes it out of the list, under the same lock, before it frees it, so a call that starts
   as another thread destroys the object finds it gone (-1) and reads nothing of it (node,
   read before the free, is only compared). Else it claims the call (b: ddp__claim's
   answer) or adds itself to *count (ddp_wait's waiting: 0), which the destroy waits out. */
static int ddp__in_list(const ddp__held *node, const void *owner, int kind) /* (under ddp__held_mu) */
{
    const ddp__held *h;
    for (h = ddp__held_list; node && h && h != node; h = h->next) {}
    return node && h && h->owner == owner && h->kind == kind;
}
static int ddp__enter_held(const ddp__held *node, const void *owner, int kind, ddp__busy *b, int *count)
{
    int r = -1;
    pthread_mutex_lock(&ddp__held_mu);
    if (ddp__in_list(node, owner, kind)) {
        if (b) {
            r = ddp__claim(b, DDP__BUSY_CALL);
        } else {
            __atomic_add_fetch(count, 1, __ATOMIC_ACQ_REL);
            r = 0;
        }
    }
    pthread_mutex_unlock(&ddp__held_mu);
    return r;
}

/* The states this thread holds pinned (nested at most a few deep: a ddp_grad call, its
   ddp_wait), so that a ddp_destroy of one of them from this thread (a log callback) is
   refused at once rather than wait the timeout out for its own caller. */
typedef struct ddp__pins {
    const struct ddp__state *st[8];
    int n, refusing; /* (refusing: a destroy's refusal is being said, through a log callback that may destroy again) */
} ddp__pins;
static pthread_key_t ddp__pins_key;
static pthread_once_t ddp__pins_once = PTHREAD_ONCE_INIT;
static void ddp__pins_free(void *p) { DDP_FREE(p); }
static void ddp__pins_key_make(void) { pthread_key_create(&ddp__pins_key, ddp__pins_free); }
static ddp__pins *ddp__my_pins(int make)
{
    ddp__pins *p;
    pthread_once(&ddp__pins_once, ddp__pins_key_make);
    if (!(p = (ddp__pins *)pthread_getspecific(ddp__pins_key)) && make && (p = (ddp__pins *)DDP_MALLOC(sizeof *p))) {
        p->n = p->refusing = 0;
        if (pthread_setspecific(ddp__pins_key, p) != 0) {
            DDP_FREE(p);
            p = NULL;
        }
    }
    return p; /* (NULL without memory: then only the same-thread check is lost) */
}
static int ddp__pinned_here(const struct ddp__state *st)
{
    const ddp__pins *p = ddp__my_pins(0);
    int i;
    for (i = 0; p && i < p->n; i++)
        if (p->st[i] == st) return 1;
    return 0;
}
static void ddp__pinned(const struct ddp__state *st)
{
    ddp__pins *p = ddp__my_pins(1);
    if (p && p->n < 8) p->st[p->n++] = st;
}

/* Pins a live context: its state stays until unpinned (ddp_destroy waits out the pins,
   ddp_wait's and a ddp_grad's calls'). NULL where it is destroyed or being destroyed. */
static struct ddp__state *ddp__pin(ddp_ctx *ctx)
{
    struct ddp__state *st = ctx ? __atomic_load_n(&ctx->st, __ATOMIC_ACQUIRE) : NULL;
    if (!st || ddp__enter_held(&st->held, ctx, DDP__HELD_CTX, NULL, &st->waiting) != 0) return NULL;
    ddp__pinned(st);
    return st;
}
static void ddp__unpin(struct ddp__state *st)
{
    ddp__pins *p = ddp__my_pins(0);
    int i;
    for (i = p ? p->n - 1 : -1; i >= 0 && p->st[i] != st; i--) {}
    if (i >= 0) p->st[i] = p->st[--p->n];
    __atomic_sub_fetch(&st->waiting, 1, __ATOMIC_ACQ_REL);
}

/* A destroy (the one that took the state out of the list) while another thread is in a
   call: the group stops (so that call returns), and the state is freed only once the call
   has left it (it was freed under the call: a crash). Past the timeout, or from inside the
   call itself (a log callback), nothing is freed. */
static ddp_result ddp__claim_for_destroy(ddp_ctx *ctx, ddp__busy *b, const char *call, const char *what)
{
    int64_t deadline = ddp__now_ms() + (ctx && ctx->st ? ctx->st->cfg.timeout_ms : 0) + 1000;
    int said = 0;
    while (ddp__claim(b, DDP__BUSY_DESTROY)) {
        if (pthread_equal(__atomic_load_n(&b->by, __ATOMIC_RELAXED), pthread_self()))
            return ddp__fail(ctx, DDP_ERR_ARG, "%s inside %s on the same thread (a log callback?): refused", call, what);
        if (!said++ && ctx && ctx->st)
            ddp__break(ctx, ddp__fail(ctx, DDP_ERR_ARG, "%s while another thread is in %s: the group stops, and it is "
                                      "freed once that call returns", call, what));
        if (ddp__now_ms() > deadline)
            return ddp__fail(ctx, DDP_ERR_TIMEOUT, "%s: another thread stayed in %s past the timeout: left allocated",
                             call, what);
        ddp__sleep_ms(1);
    }
    return DDP_OK;
}

/* One call at a time per context: a second thread's collective while one is in progress
   would take another's number and staging slot (wrong sums with DDP_OK). It is refused,
   and the group stops: the threads' order could differ from rank to rank anyway. */
static ddp_result ddp__issue(ddp_ctx *ctx, ddp__coll *c, void *stream, ddp_work *work)
{
    struct ddp__state *st = ctx ? __atomic_load_n(&ctx->st, __ATOMIC_ACQUIRE) : NULL;
    ddp_result r;
    if (work) { work->seq = 0; work->event = NULL; work->owner = 0; } /* a refused call leaves a handle ddp_wait refuses */
    switch (st ? ddp__enter_held(&st->held, ctx, DDP__HELD_CTX, &st->busy, NULL) : -1) {
    case -1: /* (destroyed, maybe by another thread just now) */
        return ddp__no_state(ctx, ddp__colls[c->kind].name);
    case DDP__BUSY_DESTROY: /* (a destroy that timed out left it: nothing of it is written) */
        return ddp__fail(NULL, DDP_ERR_ARG, "%s: another thread destroys this ddp_ctx", ddp__colls[c->kind].name);
    case DDP__BUSY_CALL:
        return ddp__break(ctx, ddp__fail(ctx, DDP_ERR_ARG, "%s: another thread is in a collective of this ddp_ctx: a "
                                         "context takes one call at a time (threads that share it order their calls, "
                                         "alike on every rank)", ddp__colls[c->kind].name));
    }
    r = ddp__issue_one(ctx, c, stream, work);
    ddp__unclaim(&ctx->st->busy);
    return r;
}

/* Fills in a collective and issues it. */
static ddp_result ddp__post(ddp_ctx *ctx, int kind, const void *send, void *recv, size_t count, ddp_dtype dtype,
                            ddp_op op, int root, void *stream, ddp_work *work)
{
    ddp__coll c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.send = send;
    c.recv = recv;
    c.count = count;
    c.dtype = dtype;
    c.op = op;
    c.root = root;
    return ddp__issue(ctx, &c, stream, work);
}

ddp_result ddp_all_reduce(ddp_ctx *ctx, const void *send, void *recv, size_t count, ddp_dtype dtype, ddp_op op,
                          void *stream)
{
    return ddp__post(ctx, DDP__ALL_REDUCE, send, recv, count, dtype, op, 0, stream, NULL);
}

ddp_result ddp_all_reduce_async(ddp_ctx *ctx, const void *send, void *recv, size_t count, ddp_dtype dtype, ddp_op op,
                                void *stream, ddp_work *work)
{
    if (!ctx || !ctx->st) return ddp__no_state(ctx, "ddp_all_reduce_async"); /* (under its own name) */
    if (!work) return ddp__numbered(ctx, ddp__fail(ctx, DDP_ERR_ARG, "all_reduce_async needs a ddp_work to fill"));
    return ddp__post(ctx, DDP__ALL_REDUCE, send, recv, count, dtype, op, 0, stream, work);
}

/* ddp_wait; without `host` (gradient buckets) a GPU backend only orders `stream` after
   the work, and the host goes on. */
static ddp_result ddp__wait(ddp_ctx *ctx, ddp_work *work, void *stream, int host)
{
    struct ddp__state *st = ddp__pin(ctx); /* first: a destroy by another thread frees the state after it */
    ddp_result r;
    int64_t t0;
    if (!st) return ddp__no_state(ctx, "ddp_wait");
    if (!work)
        r = ddp__fail(ctx, DDP_ERR_ARG, "ddp_wait: no ddp_work (NULL)");
    else if (st->held.pid != getpid()) /* the worker thread that runs the parent's queue is not in a child: it waited for good */
        r = ddp__fail(ctx, DDP_ERR_ARG, "ddp_wait: this ddp_ctx belongs to process %d, not to this child of it "
                      "(fork() copies the context; only ddp_init's process can use it)", (int)st->held.pid);
    else if (!ddp__broken(st) &&
             (!work->seq || work->owner != st->id || (!st->be->wait && st->worker_started && work->seq > st->queued)))
        r = ddp__fail(ctx, DDP_ERR_ARG, "ddp_wait: this ddp_work was not filled by a collective of this context "
                      "(its call failed, it was never made, or it was another context's)");
    else
        r = DDP_OK;
    if (r != DDP_OK) {
        ddp__unpin(st);
        return r;
    }
    t0 = st->trace ? ddp__now_ns() : -1;
    if (ddp__broken(st)) {
        char what[40];
        snprintf(what, sizeof what, "wait for #%llu", (unsigned long long)work->seq);
        r = ddp__refuse(ctx, what);
    } else if (st->be->wait)
        r = st->be->wait(ctx, work, stream, host);
    else
        r = ddp__drain(ctx, work->seq);
    if (r != DDP_OK) ddp__broke(ctx, r);
    /* one closed span: any thread may wait, and begin/end nest on the collectives' thread */
    if (t0 >= 0) ddp__trace_add(ctx, 0, "wait", t0, ddp__now_ns());
    ddp__unpin(st);
    return r;
}

ddp_result ddp_wait(ddp_ctx *ctx, ddp_work *work, void *stream) { return ddp__wait(ctx, work, stream, 1); }

ddp_result ddp_broadcast(ddp_ctx *ctx, void *buf, size_t count, ddp_dtype dtype, int root, void *stream)
{
    return ddp__post(ctx, DDP__BROADCAST, NULL, buf, count, dtype, DDP_SUM, root, stream, NULL);
}

ddp_result ddp_all_gather(ddp_ctx *ctx, const void *send, void *recv, size_t count, ddp_dtype dtype, void *stream)
{
    return ddp__post(ctx, DDP__ALL_GATHER, send, recv, count, dtype, DDP_SUM, 0, stream, NULL);
}

ddp_result ddp_reduce_scatter(ddp_ctx *ctx, const void *send, void *recv, size_t count, ddp_dtype dtype, ddp_op op,
                              void *stream)
{
    return ddp__post(ctx, DDP__REDUCE_SCATTER, send, recv, count, dtype, op, 0, stream, NULL);
}

ddp_result ddp_barrier(ddp_ctx *ctx)
{
    return ddp__post(ctx, DDP__BARRIER, NULL, NULL, 0, DDP_F32, DDP_SUM, 0, NULL, NULL);
}

/* ---- >>group ---------------------------------------------------------------------------------- */

/* "one host": the same host name and the same boot (cloned VMs and containers with one
   name but different kernels differ). 0, or the errno where the boot could not be read
   for a reason another rank of the host may not share (no descriptor left) */
static int ddp__host_id(char *out, size_t n)
{
    char host[256] = "?", boot[64] = "";
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t k = read(fd, boot, sizeof boot - 1);
        boot[k > 0 ? k : 0] = 0;
        boot[strcspn(boot, "\n")] = 0;
        close(fd);
    } else if (errno != ENOENT && errno != EACCES) /* out of descriptors: this rank alone would seem another host */
        return errno;
    if (gethostname(host, sizeof host) != 0) strcpy(host, "?");
    host[sizeof host - 1] = 0;
    snprintf(out, n, "%s %s", host, boot);
    return 0;
}

/* Through the store, once: every rank's host, what its launcher said of its node, and
   its settings. Settings that must match are compared; local ranks and node numbers
   not given are derived from the hosts. What launchers said must fit together: within
   a node (the launcher's, else a host) local ranks differ and count the local world. */
static ddp_result ddp__meet(ddp_ctx *ctx)
{
    char mine[760], host[400], *all = NULL;
    const char **parts;
    uint32_t *lens;
    int *given, r, j, lr = 0, lw = 0, node = 0, nodes = 0;
    ddp_result res;
    const int W = ctx->world_size;
    if ((r = ddp__host_id(host, sizeof host)) != 0) {
        struct rlimit rl;
        if (r == EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0)
            return ddp__fail(ctx, DDP_ERR_SYSTEM, "ran out of file descriptors (ulimit -n is %llu): raise it",
                             (unsigned long long)rl.rlim_cur);
        return ddp__fail(ctx, DDP_ERR_SYSTEM, "cannot read /proc/sys/kernel/random/boot_id (it tells hosts apart): %s",
                         strerror(r));
    }
    snprintf(mine, sizeof mine, "%s\n%d %d %d\n%s", host, ctx->st->cfg.said[0], ctx->st->cfg.said[1],
             ctx->st->cfg.said[2], ctx->st->cfg.agree);
    parts = DDP__CAST(const char **, DDP_MALLOC(sizeof(char *) * (size_t)W));
    lens = DDP__CAST(uint32_t *, DDP_MALLOC(sizeof(uint32_t) * (size_t)W));
    given = DDP__CAST(int *, DDP_MALLOC(sizeof(int) * 4 * (size_t)W)); /* per rank: node (or -2 - host), lr, lw, host */
    if (!parts || !lens || !given) {
        DDP_FREE(parts); DDP_FREE(lens); DDP_FREE(given);
        return ddp__fail(ctx, DDP_ERR_NOMEM, "out of memory");
    }
    res = ddp__store_gather(ctx, "meet", mine, (uint32_t)strlen(mine), &all, parts, lens,
                            "waiting for every rank to join");
    for (r = 0; res == DDP_OK && r < W; r++) { /* each part: "host boot\nnode lr lw\nsettings" */
        const char *p = parts[r], *nl = (const char *)memchr(p, '\n', lens[r]), *nl2;
        char theirs[600], nums[64];
        size_t hl;
        int *g = given + 4 * r, seen = -1;
        if (!nl || !(nl2 = (const char *)memchr(nl + 1, '\n', lens[r] - (size_t)(nl + 1 - p))) || nl2 - nl > 60) {
            res = ddp__fail(ctx, DDP_ERR_PROTOCOL, "rank %d sent a malformed hello", r);
            break;
        }
        hl = (size_t)(nl - p);
        snprintf(nums, sizeof nums, "%.*s", (int)(nl2 - nl - 1), nl + 1);
        snprintf(theirs, sizeof theirs, "%.*s", (int)(lens[r] - (size_t)(nl2 + 1 - p)), nl2 + 1);
        if (sscanf(nums, "%d %d %d", &g[0], &g[1], &g[2]) != 3) {
            res = ddp__fail(ctx, DDP_ERR_PROTOCOL, "rank %d sent a malformed hello", r);
            break;
        }
        if ((res = ddp__agree(ctx, r, theirs)) != DDP_OK) break;
        for (j = 0; j < r && seen < 0; j++)
            if ((const char *)memchr(parts[j], '\n', lens[j]) == parts[j] + hl && memcmp(parts[j], p, hl) == 0) seen = j;
        g[3] = seen < 0 ? nodes : given[4 * seen + 3];
        if (g[0] < 0) g[0] = -2 - g[3];
        if (hl == strlen(host) && memcmp(p, host, hl) == 0) {
            if (seen < 0) node = nodes; /* nodes are numbered in order of their first rank */
            lw++;
            lr += r < ctx->rank;
        }
        nodes += seen < 0;
    }
    for (r = 0; res == DDP_OK && r < W; r++) { /* what the launchers said, against each other */
        const int *g = given + 4 * r;
        int count = 0;
        for (j = 0; j < W; j++) {
            const int *h = given + 4 * j;
            if (h[0] != g[0]) continue;
            count++;
            if (j > r && g[1] >= 0 && h[1] == g[1])
                res = ddp__fail(ctx, DDP_ERR_ENV, "ranks %d and %d both have local rank %d on %s %d: the launcher's "
                                "variables do not fit together", r, j, g[1], g[0] >= 0 ? "node" : "host",
                                g[0] >= 0 ? g[0] : g[3]);
            if (res != DDP_OK) break;
        }
        if (res == DDP_OK && g[2] > 0 && count != g[2])
            res = ddp__fail(ctx, DDP_ERR_ENV, "rank %d has a local world of %d, but %d rank%s on its %s %d: the "
                            "launcher's variables do not fit together", r, g[2], count, count > 1 ? "s are" : " is",
                            g[0] >= 0 ? "node" : "host", g[0] >= 0 ? g[0] : g[3]);
    }
    DDP_FREE(all);
    DDP_FREE(parts);
    DDP_FREE(lens);
    DDP_FREE(given);
    if (res != DDP_OK) return res;
    if (ctx->local_rank < 0) ctx->local_rank = lr;
    if (ctx->local_world_size < 0) ctx->local_world_size = lw;
    if (ctx->node_rank < 0) ctx->node_rank = node;
    ctx->num_nodes = nodes;
    return DDP_OK;
}

/* Through rank 0's store: rank 0 opens it, everyone is admitted and meets. */
static ddp_result ddp__join(ddp_ctx *ctx)
{
    ddp_result r;
    int in_use;
    if (ctx->rank == 0 && (r = ddp__server_start(ctx, &in_use)) != DDP_OK) return in_use ? ddp__port_taken(ctx) : r;
    if ((r = ddp__store_connect(ctx)) != DDP_OK || (r = ddp__meet(ctx)) != DDP_OK) return r;
    /* Without an id of its own (a hand launch) a second launch's ranks look like this
       job's. A moment for one that started with it to show itself (a second rank 0 that
       finds the port taken, a second claim to a rank) stops both before any collective. */
    if (strcmp(ctx->st->cfg.job_from, "default") != 0) return DDP_OK;
    if (ctx->rank == 0) ddp__sleep_ms(DDP__SETTLE_MS);
    return ddp__store_barrier(ctx, "settled", "waiting for rank 0 to see that no second launch shares its port");
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
    if (st->be && st->be->release) st->be->release(ctx);
    if (st->store_fd >= 0) close(st->store_fd);
    st->store_fd = -1;
    if (st->server) ddp__server_stop(st->server, st->broken ? st->err : NULL);
    st->server = NULL;
    ddp__pmi_done(ctx);
}

/* A program that never calls ddp_launch ignores --nproc: say so rather than run one process. */
/* The flags ddp_launch takes: "--nproc N" (or --nproc=N, torchrun's --nproc_per_node
   and --nproc-per-node) and torchrun's "--max-restarts N" (or --max_restarts). */
static const char *const ddp__nproc_names[] = {"--nproc_per_node", "--nproc-per-node", "--nproc", NULL};
static const char *const ddp__restart_names[] = {"--max-restarts", "--max_restarts", NULL};

/* Whether a flag looks meant as --nproc but is not it: one or two dashes, then, in any case,
   "np" (mpirun's -np), "nproc..." (mp.spawn's nprocs, -nproc, --NPROC), or "nproc" with one
   letter left out, added or changed, or two neighbours swapped (--nroc, --mproc, --nporc). */
static int ddp__like_nproc(const char *arg)
{
    static const char w[] = "nproc";
    char a[8];
    size_t n, i = 0, k, diff = 0;
    if (arg[0] != '-') return 0;
    arg += arg[1] == '-' ? 2 : 1;
    for (n = 0; arg[n] && arg[n] != '='; n++) /* the name, its first 7 letters in lower case */
        if (n < sizeof a - 1) a[n] = arg[n] >= 'A' && arg[n] <= 'Z' ? (char)(arg[n] - 'A' + 'a') : arg[n];
    a[n < sizeof a - 1 ? n : sizeof a - 1] = 0;
    if (!strcmp(a, "np") || !strncmp(a, w, 5)) return 1;
    while (i < n && i < 5 && a[i] == w[i]) i++; /* the first letter that differs */
    if (n == 4) return strcmp(a + i, w + i + 1) == 0;
    if (n == 6) return strcmp(a + i + 1, w + i) == 0;
    if (n != 5) return 0;
    for (k = 0; k < 5; k++) diff += a[k] != w[k];
    return diff == 1 || (diff == 2 && i < 4 && a[i] == w[i + 1] && a[i + 1] == w[i]);
}

/* The length of the flag name at a when it is one of names (alone or with "="), else 0. */
static size_t ddp__flag(const char *a, const char *const *names)
{
    size_t i, n;
    for (i = 0; names[i]; i++) {
        n = strlen(names[i]);
        if (strncmp(a, names[i], n) == 0 && (a[n] == 0 || a[n] == '=')) return n;
    }
    return 0;
}

static void ddp__warn_nproc(ddp_ctx *ctx, const ddp_desc *d)
{
    int i;
    if (!d->argc || !d->argv || ctx->world_size > 1) return;
    for (i = 1; i < *d->argc && strcmp(d->argv[i], "--") != 0; i++) /* after "--": the program's own */
        if (ddp__flag(d->argv[i], ddp__nproc_names)) {
            ddp__say(ctx, DDP_LOG_INFO, "warning: argv has --nproc, but this program does not call ddp_launch: running as "
                     "one process");
            return;
        }
}

/* The built-in launcher's report pipe, "fd:inode:pid:rfd" (checked: an inherited name may
   mean another file), first thing in ddp_init: a rank that dies from here on is one that
   called it, and its failures are told. A rank whose inherited descriptors were closed
   (Python's subprocess closes them, as do programs that daemonize) opens the pipe again
   through the launcher's read end in /proc: without it, the launcher blamed the wrong rank
   or said that one died before ddp_init. */
static int ddp__is_report_pipe(int fd, unsigned long ino)
{
    struct stat sb;
    return fd >= 0 && fstat(fd, &sb) == 0 && S_ISFIFO(sb.st_mode) && (unsigned long)sb.st_ino == ino;
}

/* How many parents up the launcher is (1: it started this process; 2: it started a wrapper,
   `timeout` or a shell, that runs this program), or 0 where /proc does not say. */
static int ddp__launcher_depth(int launcher)
{
    int d, p = (int)getppid();
    for (d = 1; d <= 64 && p > 0; d++) {
        char path[40], stat[512], *after;
        FILE *f;
        size_t k;
        if (p == launcher) return d;
        if (p == 1) return 0; /* (its parent went: the launcher is no ancestor now) */
        snprintf(path, sizeof path, "/proc/%d/stat", p);
        if (!(f = fopen(path, "r"))) return 0;
        k = fread(stat, 1, sizeof stat - 1, f);
        fclose(f);
        stat[k] = 0; /* "pid (comm) state ppid ...": comm may hold spaces and parentheses */
        if (!(after = strrchr(stat, ')')) || sscanf(after + 1, " %*c %d", &p) != 1) return 0;
    }
    return 0;
}

static void ddp__launcher_pipe(ddp_ctx *ctx)
{
    unsigned long ino = 0;
    int fd = -1, pid = 0, rfd = -1, n;
    char msg[64];
    const char *v = getenv("DDP_LAUNCHER"), *rank = getenv("RANK"); /* the launcher's: which rank a wrapped program is */
    if (!v || (n = sscanf(v, "%d:%lu:%d:%d", &fd, &ino, &pid, &rfd)) < 2) return;
    if (!ddp__is_report_pipe(fd, ino)) { /* closed, or another file by now */
        snprintf(msg, sizeof msg, "/proc/%d/fd/%d", pid, rfd);
        fd = n == 4 && pid > 0 ? open(msg, O_WRONLY | O_NONBLOCK | O_CLOEXEC) : -1; /* (nonblocking as the original) */
        if (!ddp__is_report_pipe(fd, ino)) {
            if (fd >= 0) close(fd);
            return;
        }
    }
    /* and how far below the launcher: the rank is the process nearest it, not one that the rank forked */
    n = snprintf(msg, sizeof msg, "\n%d %d %d %d %d\n", (int)getpid(), DDP__JOINING, rank ? atoi(rank) : -1,
                 pid > 0 ? ddp__launcher_depth(pid) : 0, (int)getppid());
    fcntl(fd, F_SETFD, FD_CLOEXEC); /* the rank's own children are not ranks */
    ctx->st->report_fd = fd;
    if (write(fd, msg, (size_t)n) < 0) {} /* this rank uses ddp.h: it ending before the others is a failure */
}

ddp_result ddp_init(ddp_ctx *ctx, const ddp_desc *desc)
{
    struct ddp__state *st;
    ddp_desc none;
    const struct ddp__launcher *launcher = NULL;
    ddp__settings *cfg;
    ddp_result r;
    if (!ctx) return ddp__no_state(ctx, "ddp_init");
    {
        ddp__held *old = ddp__held_by(ctx, DDP__HELD_CTX);
        if (old && old->ready) { /* (its state is left as it is) */
            ctx->st = (struct ddp__state *)old;
            return ddp__fail(ctx, DDP_ERR_ARG, "ddp_init on a ddp_ctx that ddp_init set up before: ddp_destroy it first");
        }
        if (old) { /* a failed ddp_init's state (a retry waiting for rank 0, say): freed, as ddp_destroy would */
            ctx->st = (struct ddp__state *)old;
            (void)ddp_destroy(ctx);
        }
    }
    ddp__std_fds();
    memset(&none, 0, sizeof none);
    if (!desc) desc = &none;
    memset(ctx, 0, sizeof *ctx);
    ctx->device = -1;
    st = DDP__CAST(struct ddp__state *, DDP_MALLOC(sizeof *st));
    if (!st) return DDP_ERR_NOMEM;
    memset(st, 0, sizeof *st);
    ctx->st = st;
    cfg = &st->cfg;
    st->log = desc->log ? desc->log : ddp__default_log;
    st->log_user = desc->log_user;
    st->store_fd = st->pmi_fd = st->report_fd = st->waited = -1;
    ddp__hold(&st->held, DDP__HELD_CTX, ctx);
    ddp__launcher_pipe(ctx);
    {
        static uint64_t contexts;
        st->id = __atomic_add_fetch(&contexts, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_init(&st->mu, NULL);
    {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
        pthread_mutex_init(&st->log_mu, &a);
        pthread_mutexattr_destroy(&a);
    }
    pthread_cond_init(&st->cv, NULL);
    cfg->debug = ddp__switch(getenv("DDP_DEBUG")) == 1;
    if ((r = ddp__topology(ctx, desc, &launcher)) != DDP_OK || (r = ddp__resolve(ctx, desc, launcher)) != DDP_OK ||
        (r = ddp__choose_backend(ctx, launcher)) != DDP_OK)
        return st->broken = r;
    ddp__warn_nproc(ctx, desc);
    /* (the MPI chain's chunk is its own default where DDP_SHM_CHUNK is unset: 1048576 set on
       some ranks only would give them other rounds than the rest) */
    snprintf(cfg->agree, sizeof cfg->agree, "ddp.h=%s backend=%s shm_chunk=%zu mpi_chunk=%zu check=%d", DDP__VERSION,
             ddp_backend_name(ctx->backend), ctx->backend != DDP_BACKEND_NCCL ? cfg->chunk : 0,
             ctx->backend == DDP_BACKEND_MPI ? (cfg->chunk_default ? DDP__MPI_CHAIN_CHUNK : cfg->chunk) : 0, cfg->check);
    if (ctx->world_size > 1 && ddp__held_rank(cfg->job_id, ctx->rank))
        r = strcmp(cfg->job_from, "default") == 0
                ? ddp__fail(ctx, DDP_ERR_ARG, "ddp_init: this process holds rank %d of job '%s' already, in another "
                            "ddp_ctx: two jobs in one process need a job id each (ddp_desc.job_id or DDP_JOB_ID)",
                            ctx->rank, cfg->job_id)
                : ddp__fail(ctx, DDP_ERR_ARG, "ddp_init: this process holds rank %d of job '%s' already, in another "
                            "ddp_ctx (ddp_destroy that one first)", ctx->rank, cfg->job_id);
    else if (st->be->group) r = st->be->group(ctx); /* the backend forms the group itself (MPI) */
    else if (ctx->world_size > 1 && (r = ddp__resolve_store(ctx, desc, launcher)) == DDP_OK) r = ddp__join(ctx);
    if (r != DDP_OK) {
        st->broken = r;
        ddp__release(ctx);
        return r;
    }
    if ((r = st->be->init(ctx)) != DDP_OK) {
        st->broken = r;
        ddp__release(ctx);
        return r;
    }
    ddp__held_ready(&st->held, ctx->rank);
    ddp__info(ctx, "backend %s (%s), local rank %d/%d, node %d/%d, device %d, store %s:%d, job '%s' (from %s), "
              "restart %d%s, timeout %.*f s%s", ddp_backend_name(ctx->backend), cfg->backend_why, ctx->local_rank,
              ctx->local_world_size, ctx->node_rank, ctx->num_nodes, ctx->device,
              cfg->master_port ? cfg->master_addr : "-", cfg->master_port, cfg->job_id, cfg->job_from,
              ddp_restart_count(), cfg->secret[0] ? ", secret set" : "", DDP__SECONDS(cfg->timeout_ms),
              cfg->check ? ", DDP_CHECK on" : "");
    return DDP_OK;
}

ddp_result ddp_destroy(ddp_ctx *ctx)
{
    struct ddp__state *st;
    ddp_result r = DDP_OK;
    ddp__coll last;
    if (!ctx) return ddp__no_state(ctx, "ddp_destroy");
    if (!ctx->st) return ctx->ended; /* destroyed already (or never initialised: DDP_OK) */
    st = ctx->st;
    if (ddp__pinned_here(st) && st->held.pid == getpid()) { /* (pinned here, so live; a child of fork() drops its copy) */
        ddp__pins *p = ddp__my_pins(0);
        if (p->refusing) return DDP_ERR_ARG; /* said once: the callback that says it destroys again */
        p->refusing = 1;
        r = ddp__fail(ctx, DDP_ERR_ARG, "ddp_destroy inside ddp_wait or a ddp_grad call of this ddp_ctx on the same "
                      "thread (a log callback?): refused");
        p->refusing = 0;
        return r;
    }
    switch (ddp__unhold_mine(&st->held)) {
    case 0: /* a child of fork(): its copy goes with it, the parent's group is not its own */
        ctx->st = NULL;
        return DDP_OK;
    case -1: /* (nothing of it is read: it may be gone) */
        return ddp__fail(NULL, DDP_ERR_ARG, "ddp_destroy: another thread destroys this ddp_ctx already");
    }
    if ((r = ddp__claim_for_destroy(ctx, &st->busy, "ddp_destroy", "a collective of this ddp_ctx")) != DDP_OK) {
        ddp__rehold(&st->held);
        return r;
    }
    /* the last meeting: nobody leaves while others still expect it in a collective,
       and those that do expect it learn at once that it left */
    memset(&last, 0, sizeof last);
    last.kind = DDP__DESTROY;
    last.dtype = DDP_F32;
    last.op = DDP_SUM;
    if (!st->broken && st->be && ctx->world_size > 1) r = ddp__issue_one(ctx, &last, NULL, NULL);
    /* then rank 0's store stops listening before any rank returns: a rank that calls
       ddp_init again at once was let into the old store, which was ending (refused, or
       lost when it closed) */
    if (r == DDP_OK && !st->broken && ctx->world_size > 1 && st->store_fd >= 0) {
        if (st->server) ddp__server_unlisten(st->server);
        r = ddp__store_barrier(ctx, "left", "in ddp_destroy");
    }
    if (st->report_fd >= 0 && r == DDP_OK && !st->broken) { /* left cleanly: its exit stops nobody */
        char msg[32];
        int n = snprintf(msg, sizeof msg, "\n%d %d\n", (int)getpid(), DDP__LEAVING);
        if (write(st->report_fd, msg, (size_t)n) < 0) {}
    }
    if (r == DDP_OK) r = st->broken; /* the job failed before: a program that returns this exits non-zero */
    { /* another thread's ddp_wait or ddp_grad call: its work is done (or the group broken), so it leaves soon */
        const int64_t deadline = ddp__now_ms() + st->cfg.timeout_ms + 1000;
        while (__atomic_load_n(&st->waiting, __ATOMIC_ACQUIRE))
            if (ddp__now_ms() > deadline) {
                ddp__rehold(&st->held);
                return ddp__fail(ctx, DDP_ERR_TIMEOUT, "ddp_destroy: another thread stayed in ddp_wait or a ddp_grad "
                                 "call past the timeout: the context is left allocated");
            } else
                ddp__sleep_ms(1);
    }
    ddp__release(ctx);
    ddp__trace_free(st);
    pthread_mutex_destroy(&st->mu);
    pthread_mutex_destroy(&st->log_mu);
    pthread_cond_destroy(&st->cv);
    DDP_FREE(st);
    __atomic_store_n(&ctx->st, NULL, __ATOMIC_RELEASE); /* (a call starting now may read it: see ddp__enter_held) */
    return ctx->ended = r;
}

/* ---- >>launcher ------------------------------------------------------------------------------ */

/* A port of 127.0.0.1 that nothing holds now, for the launcher's job, or -1. */
static int ddp__free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int lo = 32768, tries, port = -1; /* the first of Linux's local ports */
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &lo) != 1) lo = 32768;
        fclose(f);
    }
    /* below the ports Linux gives connections' own ends (bind to port 0 picks one of those):
       a rank's connection could hold the port when rank 0 binds it, or meet itself there */
    for (tries = 0; tries < 64 && port < 0; tries++) {
        uint32_t r;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        ddp__random(&r, sizeof r);
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)(tries < 63 && lo > 11024 ? 10000 + (int)(r % (uint32_t)(lo - 11024)) : 0));
        if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
            port = ntohs(a.sin_port); /* the last try (or a range starting low): any port the kernel gives */
        close(fd);
    }
    return port;
}

/* Every other process of the attempt beyond its ranks (a wrapper script's program, what
   a rank started, a daemon that left the session) carries the attempt's job id in its
   environment: sig to each of them (a rank's parent may be gone, so the launcher cannot
   find them by parentage), not to the ranks in `ranks`. Returns how many there were. */
static int ddp__signal_job(const char *job, const pid_t *ranks, int nranks, int sig)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    char want[64], path[64], buf[4096];
    int n = 0, wl = snprintf(want, sizeof want, "DDP_JOB_ID=%s", job);
    const pid_t self = getpid();
    if (!d) return 0;
    while ((e = readdir(d)) != NULL) {
        const pid_t pid = (pid_t)atoi(e->d_name);
        int fd, pos = 0, same = 1, found = 0, r;
        ssize_t k, i;
        for (r = 0; r < nranks && ranks[r] != pid; r++) {}
        if (pid <= 0 || pid == self || r < nranks) continue; /* the ranks are signalled once, by the caller */
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) continue; /* another user's, or gone */
        while (!found && (k = read(fd, buf, sizeof buf)) > 0) /* NUL-ended entries, matched as they stream */
            for (i = 0; i < k && !found; i++) {
                if (buf[i]) {
                    same = same && pos < wl && buf[i] == want[pos];
                    pos++;
                } else {
                    found = same && pos == wl;
                    pos = 0;
                    same = 1;
                }
            }
        close(fd);
        if (found && kill(pid, sig) == 0) n++;
    }
    closedir(d);
    return n;
}

/* sig to the ranks and the rest of the attempt; a rank held stopped (SIGSTOP, SIGTSTP)
   is continued after it, so that it can act on the signal (sig 0: only that) */
static void ddp__signal_all(const pid_t *pids, const int *halted, int n, const char *job, int sig)
{
    int i;
    for (i = 0; i < n; i++)
        if (pids[i] > 0 && sig) kill(pids[i], sig);
    if (sig) ddp__signal_job(job, pids, n, sig);
    for (i = 0; i < n; i++)
        if (pids[i] > 0 && halted[i] && sig != SIGKILL) kill(pids[i], SIGCONT);
}

/* Every process left of the job: SIGTERM, SIGKILL 3 s later; returns once none is left
   (or only what cannot die). */
static void ddp__end_job(const char *job)
{
    int64_t until = ddp__now_ms() + 3000;
    int sig = SIGTERM;
    while (ddp__signal_job(job, NULL, 0, sig) > 0 && sig != 0) {
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
        if (ddp__now_ms() >= until) {
            sig = sig == SIGTERM ? SIGKILL : 0; /* past SIGKILL, only what cannot die is left */
            until = ddp__now_ms() + 2000;
        }
    }
}

/* A launcher killed by SIGKILL cleans up nothing: its ranks end (PR_SET_PDEATHSIG), but
   what they started (a wrapper script's program, a data loader's worker) would run on as
   orphans. So each attempt has a watchdog, a child blocked on a socket whose other end
   only the launcher holds: a byte is the attempt's own end; end of file, the launcher's death,
   and then the watchdog ends the job's processes and removes its shared memory (prefix).
   close_fds (n of them) are the launcher's that it must not hold. Returns its pid and in
   *fd the end to write, or -1 (the job runs without one). A socket pair, not a pipe: the
   byte goes with MSG_NOSIGNAL, so a watchdog killed by someone (kill -9 to the
   launcher's children) costs the launcher nothing; through a pipe it was SIGPIPE. */
static pid_t ddp__watchdog(const char *job, const char *prefix, const int *close_fds, int n, int *fd)
{
    int p[2], i;
    pid_t pid;
    *fd = -1;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0) return -1;
    pid = fork();
    if (pid == 0) {
        char c;
        ssize_t k;
        int null = open("/dev/null", O_RDWR);
        close(p[1]);
        for (i = 0; i < n; i++)
            if (close_fds[i] >= 0) close(close_fds[i]);
        if (null >= 0) dup2(null, 0), dup2(null, 1), dup2(null, 2); /* who reads the job's output sees it end with the job */
        prctl(PR_SET_NAME, "ddp-watchdog");
        while ((k = read(p[0], &c, 1)) < 0 && errno == EINTR) {}
        if (k == 0) {
            ddp__end_job(job);
            ddp__shm_sweep(prefix, -1);
        }
        _exit(0);
    }
    close(p[0]);
    if (pid < 0) {
        close(p[1]);
        return -1;
    }
    *fd = p[1];
    return pid;
}

/* The launcher a rank of an already launched job was started by, or NULL. A job of one
   task (srun --pty bash, srun -n 1) is a place to launch from, as a shell is. */
static const char *ddp__launched_by(void)
{
    const struct ddp__launcher *l = ddp__launcher_here(), *o = ddp__outer(l);
    const char *world = l ? ddp__env(l->world) : NULL;
    if (getenv("DDP_LAUNCHER")) return "ddp's launcher";
    if (o) return o->who; /* torchrun's names inside mpirun or srun of several tasks */
    return l && ddp__env(l->rank) && world && strcmp(world, "1") != 0 ? l->who : NULL;
}

/* The job's environment for rank i, in the child. Every rank gets its share of the
   cores for OpenMP (threads > 0: the user did not choose), so N ranks do not run
   N x cores threads. */
static void ddp__child_env(int i, const char *num, const char *port, const char *job, const char *secret, int threads,
                           int attempt, const char *report)
{
    char r[16], t[16], a[16];
    snprintf(r, sizeof r, "%d", i);
    snprintf(t, sizeof t, "%d", threads);
    snprintf(a, sizeof a, "%d", attempt);
    setenv("RANK", r, 1);
    setenv("LOCAL_RANK", r, 1);
    setenv("WORLD_SIZE", num, 1);
    setenv("LOCAL_WORLD_SIZE", num, 1);
    setenv("GROUP_RANK", "0", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    setenv("DDP_JOB_ID", job, 1);
    setenv("DDP_SECRET", secret, 1);
    setenv("DDP_LAUNCHER", report, 1);
    setenv("TORCHELASTIC_RESTART_COUNT", a, 1);
    if (threads > 0) setenv("OMP_NUM_THREADS", t, 1);
    unsetenv("TORCHELASTIC_RUN_ID");
}

/* How a rank ended, in the order the launcher saw them end. */
typedef struct ddp__end {
    int rank, pid;
    int status; /* its exit status, or 128 + the signal that killed it */
    int signal; /* that signal, or 0 */
    int caused; /* its first failure was another rank's (it said DDP_ERR_PEER or DDP_ERR_ABORTED) */
    int early;  /* status 0 before it started ddp_init, while ranks that did wait for it */
    int left;   /* status 0 after ddp_init, not through a ddp_destroy that all met: the others may have needed it */
    int quiet;  /* it said no failure of its own */
    int timed_out; /* its own failure was a timeout (waiting for a rank that may never come) */
} ddp__end;

/* The failure to report: the first that no other rank caused (a signal, an exit for a
   reason of the rank's own, or an exit 0 after it timed out: in ddp_destroy, its verdict
   ignored, waiting for a rank that lives on, stuck); else, where
   the others only failed because a rank was gone, the first that exited 0 without a
   ddp_destroy they all met (they lost it); else the first; -1 if no rank failed so far.
   The ranks that a killed rank takes down end first as often as not. Where every rank
   exited 0 but some said they lost a rank, the first that left without a word. */
static int ddp__first_cause(const ddp__end *ends, int n)
{
    int i, first = -1, left = -1, silent = -1, lost = 0;
    for (i = 0; i < n; i++) {
        lost |= ends[i].caused;
        if (ends[i].status == 0 && !ends[i].early) {
            if (ends[i].left && left < 0) left = i;
            if (ends[i].left && ends[i].quiet && silent < 0) silent = i;
            if (!ends[i].left || !ends[i].timed_out) continue;
        }
        if (!ends[i].caused) return i;
        if (first < 0) first = i;
    }
    return first >= 0 && left >= 0 ? left : first >= 0 ? first : lost ? silent : -1;
}

/* Reads what ranks said about their first failure ("pid code" lines, "pid code rank" for
   a timeout waiting for that rank; "pid code -2": the failure that broke its group, which
   replaces the first): said[rank] = code, waited[rank] = that rank;
   joined[rank] 1 once it said it started ddp_init ("pid 1000 RANK DEPTH PARENT"). The
   rank is the process that says so nearest the launcher (DEPTH parents below it; 0:
   unknown, then 2 where PARENT is the process it started, else as deep as can be): the one it started (alias[RANK] -1), else the program a wrapper of it
   runs, alias[RANK], as under `timeout` or a Python script, at depth[RANK]; never a
   process the rank forked (a worker, a stale copy of the rank refused in its ddp_init),
   which may say so first: what it said is then dropped. 2 once it left with ddp_destroy. Each
   line is one write below PIPE_BUF, but a read may end inside one: its start waits in
   part (size 64) for the next read. Ranks start each line with a newline too, so that
   bytes a program wrote to the pipe end before it; a NUL among them hides nothing. */
static void ddp__read_reports(int fd, const pid_t *pids, pid_t *alias, int *depth, int n, int *said, int *waited,
                              unsigned char *joined, char *part)
{
    char buf[4096 + 64], *line, *end;
    size_t have;
    ssize_t k;
    for (;;) {
        have = strlen(part);
        memcpy(buf, part, have);
        if ((k = read(fd, buf + have, sizeof buf - 1 - have)) <= 0) return;
        for (end = buf + have; end < buf + have + k; end++)
            if (!*end) *end = '?';
        buf[have + (size_t)k] = 0;
        for (line = buf; (end = strchr(line, '\n')) != NULL; line = end + 1) {
            int pid = 0, code = 0, w = -1, w2 = -1, pp = 0, d, i;
            *end = 0; /* this line's fields only (sscanf would read on past a newline) */
            if (sscanf(line, "%d %d %d %d %d", &pid, &code, &w, &w2, &pp) < 2 || pid <= 0) continue;
            /* a depth /proc did not give: 2 where its parent is the process the launcher started */
            d = w2 > 0 ? w2 : w >= 0 && w < n && pp > 0 && pp == pids[w] ? 2 : INT_MAX;
            if (code == DDP__JOINING && w >= 0 && w < n &&
                (pids[w] == pid ? alias[w] != -1 : !alias[w] || (alias[w] > 0 && d < depth[w]))) {
                if (alias[w] > 0) said[w] = waited[w] = -1; /* (its lines were a forked process's) */
                alias[w] = pids[w] == pid ? -1 : pid;
                depth[w] = d;
            }
            for (i = 0; i < n; i++)
                if (pids[i] != pid && alias[i] != pid) continue;
                else if (code == DDP__JOINING || code == DDP__LEAVING) joined[i] = code == DDP__JOINING ? 1 : 2;
                else if (w == -2) { /* what broke its group: that counts (a refusal before may not) */
                    said[i] = code;
                    waited[i] = w2 >= 0 && w2 < n && w2 != i ? w2 : -1; /* and, a timeout, for whom it waited */
                }
                else if (said[i] < 0) {
                    said[i] = code;
                    waited[i] = w >= 0 && w < n && w != i ? w : -1;
                }
        }
        ddp__copy(part, 64, strlen(line) < 64 ? line : ""); /* a line is under 48 bytes */
    }
}

/* One attempt of the job: nproc ranks under a job id, secret and port of their own, so
   that no rank of an earlier attempt can join; returns when every rank has ended: 0,
   or the status of the rank whose failure stopped the job, described in `why`.
   *final says not to restart (the launcher was signalled, or could not start ranks).
   After the first failure the others have 2 s to end on their own (and say why), then
   SIGTERM, and SIGKILL 3 s later: the job ends within seconds. A SIGINT, SIGTERM or
   SIGHUP to the launcher before any failure stops the job: passed on to the ranks, which
   have 30 s to end (Slurm's and torchrun's grace: time to save a checkpoint) before
   SIGKILL, or none if the signal comes again; the attempt's status is then 128 + the
   signal, whatever the ranks' own. A signal the launcher was started ignoring (nohup,
   a background job of a script) stays ignored, by it and by the ranks. */
static int ddp__attempt(int nproc, const char *path, char *const argv[], int threads, int attempt, char *why,
                        size_t why_size, int *final)
{
    sigset_t block, old;
    pid_t *pids, *started;
    ddp__end *ends;
    int *said, *waited, *depth, *halted, any_joined = 0;
    unsigned char *joined;
    char port[16], job[40], num[16], secret[65], id[17], prefix[40], report[64] = "1", part[64] = "";
    const char *given = getenv("DDP_SECRET");
    unsigned char raw[40];
    static const int stops[] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction chld, dfl;
    int i, live = 0, nends = 0, cause = -1, status = 0, others = 0, p, pipefd[2] = {-1, -1}, stopped = 0, from_tty = 0;
    int stopped_after = 0; /* a stop signal that came once a rank had failed: named after the failure */
    int64_t term_at = 0, kill_at = 0;
    const pid_t launcher = getpid();
    pid_t watchdog;
    int guard;
    struct stat sb;
    *why = 0;
    *final = 1;

    /* the attempt's port, its tables of ranks, the pipe the ranks report through, and
       the job's id and secret */
    if ((p = ddp__free_port()) < 0) {
        snprintf(why, why_size, "cannot find a free TCP port on 127.0.0.1: %s", strerror(errno));
        return 1;
    }
    pids = DDP__CAST(pid_t *, DDP_MALLOC(sizeof *pids * (size_t)nproc));
    started = DDP__CAST(pid_t *, DDP_MALLOC(sizeof *started * 2 * (size_t)nproc)); /* then the wrapped programs' */
    ends = DDP__CAST(ddp__end *, DDP_MALLOC(sizeof *ends * (size_t)nproc));
    said = DDP__CAST(int *, DDP_MALLOC(sizeof *said * 3 * (size_t)nproc)); /* then waited, then depth */
    halted = DDP__CAST(int *, DDP_MALLOC(sizeof *halted * (size_t)nproc));
    joined = DDP__CAST(unsigned char *, DDP_MALLOC((size_t)nproc));
    if (!pids || !started || !ends || !said || !halted || !joined) {
        DDP_FREE(pids); DDP_FREE(started); DDP_FREE(ends); DDP_FREE(said); DDP_FREE(halted); DDP_FREE(joined);
        snprintf(why, why_size, "out of memory");
        return 1;
    }
    waited = said + nproc;
    depth = waited + nproc;
    for (i = 0; i < nproc; i++) said[i] = waited[i] = -1, halted[i] = 0, joined[i] = 0, started[nproc + i] = 0, depth[i] = 0;
    /* ranks say how their first failure came about through a pipe (nonblocking: a rank
       never waits for the launcher), named to them with its inode */
    if (pipe(pipefd) == 0 && fstat(pipefd[1], &sb) == 0) {
        fcntl(pipefd[0], F_SETFD, FD_CLOEXEC);
        fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
        fcntl(pipefd[1], F_SETFL, O_NONBLOCK);
#ifdef F_SETPIPE_SZ
        fcntl(pipefd[1], F_SETPIPE_SZ, 1 << 20); /* room for thousands of ranks' lines at once (else 64 KiB) */
#endif
        snprintf(report, sizeof report, "%d:%lu:%d:%d", pipefd[1], (unsigned long)sb.st_ino, (int)getpid(), pipefd[0]);
    }
    if (!ddp__random(raw, sizeof raw) && !(given && *given)) { /* a guessable secret lets a stranger in */
        DDP_FREE(pids); DDP_FREE(started); DDP_FREE(ends); DDP_FREE(said); DDP_FREE(halted); DDP_FREE(joined);
        if (pipefd[0] >= 0) close(pipefd[0]), close(pipefd[1]);
        snprintf(why, why_size, "no random bytes for the job's secret (getrandom and /dev/urandom both failed: %s); "
                 "set DDP_SECRET (a long random string) yourself", strerror(errno));
        return 1;
    }
    ddp__hex(secret, raw, 32);
    ddp__hex(id, raw + 32, 8); /* the id crosses the network: no part of the secret */
    snprintf(job, sizeof job, "run-%s", id);
    snprintf(port, sizeof port, "%d", p);
    snprintf(num, sizeof num, "%d", nproc);
    snprintf(prefix, sizeof prefix, "ddp.%016llx.", (unsigned long long)ddp__hash(job)); /* its shared memory */

    /* the ranks, started with signals blocked: they arrive through sigtimedwait below,
       never asynchronously */
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    for (i = 0; i < 3; i++) {
        struct sigaction sa;
        if (sigaction(stops[i], NULL, &sa) != 0 || sa.sa_handler != SIG_IGN) sigaddset(&block, stops[i]);
    }
    /* an ignored SIGCHLD (inherited) would reap the ranks unseen: waitpid could not count them */
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &dfl, &chld);
    sigprocmask(SIG_BLOCK, &block, &old);
    fflush(NULL);
    watchdog = ddp__watchdog(job, prefix, pipefd, 2, &guard);
    *final = 0;
    for (i = 0; i < nproc; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            ddp__child_env(i, num, port, job, given && *given ? given : secret, threads, attempt, report);
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* no orphans if the launcher is killed, */
            if (getppid() != launcher) _exit(128 + SIGKILL); /* also before that line */
            sigaction(SIGCHLD, &chld, NULL);
            sigprocmask(SIG_SETMASK, &old, NULL);
            execvp(path, argv);
            fprintf(stderr, "ddp: cannot run '%s': %s\n", argv[0], strerror(errno));
            _exit(127);
        }
        if (pid < 0) {
            snprintf(why, why_size, "fork failed for rank %d: %s", i, strerror(errno));
            *final = 1;
            status = 1;
            cause = nproc; /* said */
            term_at = ddp__now_ms();
            nproc = i;
            break;
        }
        pids[i] = started[i] = pid;
        live++;
    }
    if (pipefd[1] >= 0) close(pipefd[1]);

    /* until every rank has ended: collect the ends and the reports, name the cause,
       stop the others (SIGTERM, then SIGKILL), pass on the user's signals */
    while (live > 0) {
        siginfo_t info;
        struct timespec ts;
        int sig, st, c, unsure;
        int64_t now = ddp__now_ms(), wait_ms = 200;
        pid_t pid;
        if (term_at && !kill_at && term_at - now < wait_ms) wait_ms = term_at > now ? term_at - now : 0;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)wait_ms * 1000000L;
        sig = sigtimedwait(&block, &info, &ts);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            /* a terminal's Ctrl-C already reached the whole process group */
            ddp__signal_all(pids, halted, nproc, job, info.si_code != SI_KERNEL ? sig : 0);
            if (stopped) { /* again: no more grace */
                ddp__signal_all(pids, halted, nproc, job, SIGKILL);
                kill_at = INT64_MAX;
            } else if (ddp__first_cause(ends, nends) < 0 && !term_at) { /* the user's stop, not a failure's end */
                stopped = sig;
                from_tty = info.si_code == SI_KERNEL;
                kill_at = ddp__now_ms() + 30000;
            } else {
                if (!kill_at) kill_at = ddp__now_ms() + 3000;
                if (!stopped_after) stopped_after = sig, from_tty = info.si_code == SI_KERNEL;
            }
            *final = 1; /* the user stops the job: never restarted */
        }
        for (i = 0; i < nproc; i++) { /* its own ranks only: a program that embeds ddp_run may have other children */
            if (pids[i] <= 0 || (pid = waitpid(pids[i], &st, WNOHANG | WUNTRACED | WCONTINUED)) <= 0) continue;
            if (WIFSTOPPED(st) || WIFCONTINUED(st)) {
                halted[i] = WIFSTOPPED(st) ? WSTOPSIG(st) : 0;
                continue;
            }
            pids[i] = 0;
            live--;
            ends[nends].rank = i;
            ends[nends].pid = (int)pid;
            ends[nends].signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
            ends[nends].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            ends[nends].caused = ends[nends].early = ends[nends].left = ends[nends].quiet = ends[nends].timed_out = 0;
            nends++;
        }
        if (pipefd[0] >= 0) /* written before they exited */
            ddp__read_reports(pipefd[0], started, started + nproc, depth, nproc, said, waited, joined, part);
        for (i = 0; i < nproc; i++) any_joined |= joined[i];
        for (i = 0; i < nends; i++) {
            ends[i].caused = said[ends[i].rank] == DDP_ERR_PEER || said[ends[i].rank] == DDP_ERR_ABORTED;
            /* a rank of a ddp.h program that left before ddp_init: the others would wait DDP_TIMEOUT for it
               (a program that never calls ddp_init, under ddprun, has no rank that joined) */
            ends[i].early = ends[i].status == 0 && !joined[ends[i].rank] && any_joined && i + 1 < nproc;
            ends[i].left = ends[i].status == 0 && joined[ends[i].rank] == 1;
            ends[i].quiet = said[ends[i].rank] < 0;
            ends[i].timed_out = said[ends[i].rank] == DDP_ERR_TIMEOUT;
        }
        now = ddp__now_ms();
        c = ddp__first_cause(ends, nends);
        if (c >= 0 && !term_at) {
            term_at = now + 2000;
            others = live;
        }
        /* a timeout that does not know for whom (NCCL's watchdog, a store wait off rank 0):
           the moment lets the other ranks time out too, and then one rank left running
           that never said a word is the one they waited for */
        unsure = c >= 0 && ends[c].timed_out && waited[ends[c].rank] < 0;
        /* the cause, once no rank that may still be it is left (or the moment is over) */
        if (cause < 0 && c >= 0 && (!ends[c].caused || live == 0 || now >= term_at) &&
            !(unsure && live > 1 && now < term_at)) {
            int n, h, w = ends[c].timed_out ? waited[ends[c].rank] : -1, silent = -1, own = -1;
            char late[120] = "";
            for (h = 0; ends[c].timed_out && w < 0 && any_joined && h < nproc; h++) /* never came to ddp_init */
                if (pids[h] > 0 && !joined[h]) w = h;
            for (h = 0; unsure && w < 0 && h < nproc; h++)
                if (pids[h] > 0 && said[h] < 0) silent = silent == -1 ? h : -2; /* exactly one */
            if (w >= 0) /* the rank it waited for: the one to look at (a loop, a deadlock, a hung read) */
                snprintf(late, sizeof late, " after it timed out waiting for rank %d (pid %d%s)", w, started[w],
                         pids[w] <= 0 ? "" : joined[w] ? ", still running" : ", still running, not yet in ddp_init");
            else if (silent >= 0)
                snprintf(late, sizeof late, " after it timed out; rank %d (pid %d) is still running and said nothing: the "
                         "one the others waited for", silent, started[silent]);
            for (h = 0; ends[c].caused && !late[0] && h < nproc; h++) /* stopped by the one rank alive whose failure */
                if (pids[h] > 0 && said[h] > DDP_OK && said[h] < DDP_RESULT_COUNT && said[h] != DDP_ERR_PEER && /* was */
                    said[h] != DDP_ERR_ABORTED && said[h] != DDP_ERR_TIMEOUT) /* its own (of two, one may have been */
                    own = own == -1 ? h : -2;                             /* a refused call that broke nothing) */
            if (own >= 0 && !late[0])
                snprintf(late, sizeof late, " after rank %d (pid %d) failed on its own (%s) and went on running", own,
                         started[own], ddp_strerror((ddp_result)said[own]));
            cause = c;
            status = ends[c].status;
            if (!status) status = 1; /* the job failed, though the rank's own status was 0 (early, left) */
            /* a rank held stopped (SIGSTOP, a debugger's attach gone wrong): the others time out waiting;
               where the timeout says for whom, only that rank */
            for (h = 0; h < nproc && !(pids[h] > 0 && halted[h] && (w < 0 || h == w)); h++) {}
            n = h < nproc && !ends[c].signal && (ends[c].caused || ends[c].timed_out)
                    ? snprintf(why, why_size, "rank %d (pid %d) stayed stopped by signal %d (%s) until rank %d exited with "
                               "status %d", h, started[h], halted[h], strsignal(halted[h]), ends[c].rank, ends[c].status)
                : ends[c].signal ? snprintf(why, why_size, "rank %d (pid %d) was killed by signal %d (%s)%s%s%s", ends[c].rank,
                                            ends[c].pid, ends[c].signal, strsignal(ends[c].signal),
                                            /* (a division by a zeroed ddp_ctx's world_size: ddp_init forgotten) */
                                            joined[ends[c].rank] ? "" : " before it called ddp_init",
                                            ends[c].signal == SIGKILL ? " (not by this launcher: the kernel's out-of-memory "
                                                                        "killer, or someone's kill -9)" : "", late)
                : ends[c].early ? snprintf(why, why_size, "rank %d (pid %d) exited with status 0 before ddp_init, while "
                                           "the others waited for it", ends[c].rank, ends[c].pid)
                : ends[c].status == 0 && ends[c].timed_out
                    ? snprintf(why, why_size, "rank %d (pid %d) exited with status 0%s", ends[c].rank, ends[c].pid,
                               late[0] ? late : " after it timed out waiting for the others")
                : ends[c].status == 0 ? snprintf(why, why_size, "rank %d (pid %d) exited with status 0 while the others "
                                                 "still needed it", ends[c].rank, ends[c].pid)
                                      : snprintf(why, why_size, "rank %d (pid %d) exited with status %d%s", ends[c].rank,
                                                 ends[c].pid, status, late);
            if (others && n > 0 && (size_t)n < why_size)
                snprintf(why + n, why_size - (size_t)n, "; stopped the other %d", others);
        }
        if (term_at && now >= term_at && live > 0 && !kill_at) {
            ddp__signal_all(pids, halted, nproc, job, SIGTERM);
            kill_at = now + 3000;
        }
        if (kill_at && now >= kill_at) {
            ddp__signal_all(pids, halted, nproc, job, SIGKILL);
            kill_at = INT64_MAX;
        }
    }

    if (pipefd[0] >= 0) close(pipefd[0]);
    if (!stopped && status == 0) { /* every rank ended well, and no rank that joined left with ddp_destroy */
        int in = 0, left = 0;
        for (i = 0; i < nproc; i++) in += joined[i] == 1, left += joined[i] == 2;
        if (in > 0 && left == 0)
            fprintf(stderr, "ddp: warning: no rank called ddp_destroy before it exited (each rank calls it last: "
                    "then a rank that ends early fails the job, rather than passing for done)\n");
    }
    if (stopped) { /* the ranks' ends were the stop's, even an exit 0 of a rank that caught it */
        status = 128 + stopped;
        snprintf(why, why_size, "stopped by signal %d (%s)%s", stopped, strsignal(stopped),
                 from_tty ? "" : " sent to the launcher");
    } else if (stopped_after && cause >= 0 && strlen(why) + 1 < why_size) { /* the failure's status, and why no restart */
        size_t n = strlen(why);
        snprintf(why + n, why_size - n, "; then signal %d (%s)%s ended the job, never restarted", stopped_after,
                 strsignal(stopped_after), from_tty ? "" : " sent to the launcher");
    }
    /* a failed or stopped attempt takes what its ranks started with it (SIGTERM, SIGKILL
       3 s later): nothing of it runs beside the next attempt, or after the launcher */
    if (status != 0) ddp__end_job(job);
    /* whatever shared memory a crash left behind goes with the attempt */
    ddp__shm_sweep(prefix, -1);
    if (watchdog > 0) { /* the attempt ended here: its watchdog goes, doing nothing */
        if (send(guard, "", 1, MSG_NOSIGNAL) < 0) {} /* (a watchdog killed already: EPIPE) */
        close(guard);
        while (waitpid(watchdog, NULL, 0) < 0 && errno == EINTR) {}
    }
    /* the signals again as they were, the cleanup done: one that came during it acts now.
       The caller's SIGCHLD handler first, told once (its own children may have ended, and
       their signal was taken here with the ranks') */
    sigaction(SIGCHLD, &chld, NULL);
    if (chld.sa_handler != SIG_DFL && chld.sa_handler != SIG_IGN) kill(getpid(), SIGCHLD); /* to the process: any thread */
    sigprocmask(SIG_SETMASK, &old, NULL);
    DDP_FREE(pids); DDP_FREE(started); DDP_FREE(ends); DDP_FREE(said); DDP_FREE(halted); DDP_FREE(joined);
    return status;
}

/* 0 if path can be run as execvp would (a name without '/' looked up in PATH), else
   the shell's status for it (127: not found, 126: found but not runnable), said once
   here rather than by every rank, and never restarted. */
static int ddp__runnable(const char *path, int quiet)
{
    const char *dirs = getenv("PATH"), *d, *end;
    char full[4096];
    struct stat sb;
    int seen = 0;
    if (strchr(path, '/')) {
        if (stat(path, &sb) != 0) seen = -1;
        else if (S_ISREG(sb.st_mode) && access(path, X_OK) == 0) return 0;
        else seen = 1;
    } else {
        for (d = dirs && *dirs ? dirs : "/usr/local/bin:/usr/bin:/bin"; ; d = end + 1) {
            end = strchr(d, ':');
            if (!end) end = d + strlen(d);
            snprintf(full, sizeof full, "%.*s/%s", end > d ? (int)(end - d) : 1, end > d ? d : ".", path);
            if (stat(full, &sb) == 0) {
                if (S_ISREG(sb.st_mode) && access(full, X_OK) == 0) return 0;
                seen = 1;
            }
            if (!*end) break;
        }
        seen = seen ? 1 : -1;
    }
    if (!quiet)
        fprintf(stderr, "ddp: cannot run '%s': %s\n", path, seen < 0 ? (strchr(path, '/') ? "no such file" :
                "not found in PATH") : "not an executable file (or no permission to run it)");
    return seen < 0 ? 127 : 126;
}

static int ddp__run(int nproc, int max_restarts, const char *path, char *const argv[]);

int ddp_run(int nproc, char *const argv[]) { return ddp_run_restarts(nproc, 0, argv); }

int ddp_run_restarts(int nproc, int max_restarts, char *const argv[])
{
    return ddp__run(nproc, max_restarts, argv ? argv[0] : NULL, argv);
}

/* The launcher: path is the program to start (ddp_launch's: argv[0], or this very
   binary where argv[0] names no program), argv its arguments, argv[0] included. */
static int ddp__run(int nproc, int max_restarts, const char *path, char *const argv[])
{
    char why[300];
    int attempt, status, final, threads;
    long cores = ddp__cores_allowed();
    const char *outer = ddp__launched_by(), *omp = getenv("OMP_NUM_THREADS");
    if (nproc < 1 || !argv || !argv[0] || !path || max_restarts < 0) {
        fprintf(stderr, "ddp: nothing to run (nproc %d, max_restarts %d)\n", nproc, max_restarts);
        return 2;
    }
    if ((status = ddp__runnable(path, 0)) != 0) return status;
    ddp__std_fds(); /* before the launcher's pipe and sockets */
    if (outer) { /* a job inside a job would be nproc unrelated jobs */
        fprintf(stderr, "ddp: this process is already a rank of a job started by %s: launch it once, not twice\n", outer);
        return 2;
    }
    if (getenv("DDP_SECRET") && strlen(getenv("DDP_SECRET")) >= sizeof(((ddp__settings *)0)->secret)) {
        fprintf(stderr, "ddp: DDP_SECRET is longer than %d bytes\n", (int)sizeof(((ddp__settings *)0)->secret) - 1);
        return 2; /* once here, not once per rank */
    }
    { /* once here, not once per rank */
        char why[256];
        if (ddp__omp_too_many(why, sizeof why)) {
            fprintf(stderr, "ddp: %s\n", why);
            return 2;
        }
    }
    /* said once per job, and only where it changes something: OpenMP takes every core
       the rank may use unless told otherwise, so with one core it takes 1 anyway */
    threads = ddp__omp_num_threads() > 0 ? 0 : cores > nproc ? (int)(cores / nproc) : 1;
    if (threads && omp && *omp)
        fprintf(stderr, "ddp: ignoring OMP_NUM_THREADS='%s': not a positive number of threads\n", omp);
    if (threads && nproc > 1 && cores > 1)
        fprintf(stderr, "ddp: %d ranks share %ld cores, so each rank gets OMP_NUM_THREADS=%d (a rank that uses "
                "OpenMP would otherwise start %ld threads); set OMP_NUM_THREADS to choose another number\n",
                nproc, cores, threads, cores);
    for (attempt = 0;; attempt++) {
        status = ddp__attempt(nproc, path, argv, threads, attempt, why, sizeof why, &final);
        if (status == 0) return 0;
        if (final || attempt == max_restarts) break;
        fprintf(stderr, "ddp: %s; restarting the job: attempt %d of %d\n", why, attempt + 2, max_restarts + 1);
    }
    if (*why && max_restarts && !final)
        fprintf(stderr, "ddp: %s; no restart left (attempt %d of %d)\n", why, attempt + 1, max_restarts + 1);
    else if (*why)
        fprintf(stderr, "ddp: %s\n", why);
    return status;
}

/* Finds one of names in argv (before "--"), reads its integer in [lo, hi] and removes
   it: 1 with *value, 0 when absent, -1 after a one-line error (a bad value, given twice). */
static int ddp__take_flag(int *argc, char **argv, const char *const *names, const char *what, long lo, long hi,
                          long *value)
{
    int i, j, used;
    size_t n;
    char *end;
    const char *val;
    for (i = 1; i < *argc && strcmp(argv[i], "--") != 0; i++) {
        if (!(n = ddp__flag(argv[i], names))) continue;
        used = argv[i][n] == '=' ? 1 : 2;
        val = argv[i][n] == '=' ? argv[i] + n + 1 : i + 1 < *argc ? argv[i + 1] : "";
        errno = 0;
        *value = strtol(val, &end, 10);
        if (errno || *end || !*val || *value < lo || *value > hi) {
            fprintf(stderr, "ddp: %.*s needs %s from %ld to %ld, not '%s'\n", (int)n, argv[i], what, lo, hi, val);
            return -1;
        }
        for (j = i + used; j < *argc && strcmp(argv[j], "--") != 0; j++)
            if (ddp__flag(argv[j], names)) {
                fprintf(stderr, "ddp: %.*s given twice ('%s' and '%s'): give it once\n", (int)n, argv[i], argv[i],
                        argv[j]);
                return -1;
            }
        memmove(&argv[i], &argv[i + used], sizeof *argv * (size_t)(*argc - i - used + 1));
        *argc -= used;
        return 1;
    }
    return 0;
}

int ddp_launch(int *argc, char **argv)
{
    int i, nproc_given, restarts_given;
    long nproc = 0, restarts = 0;
    const char *outer;
    if (!argc || !argv) return DDP_WORKER;
    for (i = 1; i < *argc && strcmp(argv[i], "--") != 0; i++)
        if (ddp__flag(argv[i], ddp__nproc_names) && (outer = ddp__launched_by()) != NULL) {
            const struct ddp__launcher *l = ddp__launcher_here();
            char left[192] = "";
            if (l && !getenv("DDP_LAUNCHER") && strcmp(outer, l->who) == 0) /* its variables: maybe a shell's leftovers */
                snprintf(left, sizeof left, " (%s=%.32s and %s=%.32s are set; left in the shell? unset them)", l->rank,
                         ddp__env(l->rank), l->world, ddp__env(l->world));
            fprintf(stderr, "ddp: %s inside a job started by %s%s: drop one of the two launchers\n", argv[i], outer, left);
            return 2;
        }
    if ((nproc_given = ddp__take_flag(argc, argv, ddp__nproc_names, "a process count", 1, DDP__MAX_CPU_RANKS, &nproc)) < 0 ||
        (restarts_given = ddp__take_flag(argc, argv, ddp__restart_names, "a restart count", 0, 1000000, &restarts)) < 0)
        return 2;
    if (restarts_given && !nproc_given) {
        fprintf(stderr, "ddp: --max-restarts restarts the ranks that --nproc N starts: give both (under another "
                "launcher, give it to that launcher)\n");
        return 2;
    }
    if (!nproc_given) {
        for (i = 1; i < *argc && strcmp(argv[i], "--") != 0; i++) /* mp.spawn's nprocs, a typo: not silently one rank */
            if (ddp__like_nproc(argv[i]) && !ddp__launched_by()) {
                fprintf(stderr, "ddp: warning: %.*s is not ddp_launch's flag (--nproc N starts N ranks): running as one "
                        "process\n", (int)strcspn(argv[i], "="), argv[i]);
                break;
            }
        return DDP_WORKER;
    }
    /* argv[0] as the user started it (under valgrind or ld.so, /proc/self/exe is those),
       else this very binary (exec -a, a name PATH does not hold) */
    return ddp__run((int)nproc, (int)restarts, ddp__runnable(argv[0], 1) == 0 || access("/proc/self/exe", X_OK) != 0 ?
                    argv[0] : "/proc/self/exe", argv);
}
/* ---- >>sampler ------------------------------------------------------------------------------ */
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

/* torch.randperm(n, generator) on the CPU. Below UINT32_MAX / 20 elements: a
   Fisher-Yates walk from the front, position i swapped with i + (32-bit draw mod n - i).
   From there on torch 2.7 and later switch to the "inside-out" form with 64-bit draws
   (two 32-bit ones, high word first): element i goes to a position z = draw mod (i + 1),
   and whatever was at z moves to i (older torch kept the front walk). */
static void ddp__randperm(size_t *perm, size_t n, uint64_t seed)
{
    ddp__mt mt;
    size_t i;
    ddp__mt_seed(&mt, seed);
    if ((uint64_t)n < 0xffffffffu / 20) {
        for (i = 0; i < n; i++) perm[i] = i;
        for (i = 0; i + 1 < n; i++) {
            size_t z = (size_t)(ddp__mt_next(&mt) % (uint64_t)(n - i)), t = perm[i];
            perm[i] = perm[i + z];
            perm[i + z] = t;
        }
        return;
    }
    for (i = 0; i < n; i++) {
        uint64_t r = ddp__mt_next(&mt);
        size_t z;
        r = (r << 32) | ddp__mt_next(&mt);
        z = (size_t)(r % ((uint64_t)i + 1));
        perm[i] = perm[z];
        perm[z] = i;
    }
}

/* Ranks that shuffle differently would train on overlapping or missing samples, and
   ranks with different batch counts would stop stepping together: with a context the
   sampler's settings are compared in one all-reduce (the max of each value and of its
   negation gives the largest and smallest across ranks). A rank whose call was refused
   (`refused`, told already) takes part all the same, so that no rank pairs this
   all-reduce with its next collective; the others then return DDP_ERR_PEER. */
static ddp_result ddp__sampler_agree(const ddp_sampler *s, ddp_ctx *ctx, int refused)
{
    static const char *const names[] = {"dataset_size", "seed (low 32 bits)", "seed (high 32 bits)", "no_shuffle",
                                        "drop_last", "batch_size", "drop_last_batch", "dataset_size (top 2 bits)",
                                        "batch_size (top 2 bits)"};
    enum { K = sizeof names / sizeof names[0] };
    int64_t v[2 * K + 1], mine[K];
    ddp_result r;
    int i;
    /* each value whole, in pieces an int64 max over (v, -v) can compare */
    v[0] = (int64_t)(s->dataset_size & (((uint64_t)1 << 62) - 1));
    v[1] = (int64_t)(s->seed & 0xffffffffu);
    v[2] = (int64_t)(s->seed >> 32);
    v[3] = !s->shuffle;
    v[4] = s->drop_last;
    v[5] = (int64_t)(s->batch_size & (((uint64_t)1 << 62) - 1));
    v[6] = s->drop_last_batch;
    v[7] = (int64_t)((uint64_t)s->dataset_size >> 62);
    v[8] = (int64_t)((uint64_t)s->batch_size >> 62);
    for (i = 0; i < K; i++) v[K + i] = -(mine[i] = v[i]);
    v[2 * K] = refused ? ctx->rank + 1 : 0;
    if ((r = ddp_all_reduce(ctx, v, v, 2 * K + 1, DDP_I64, DDP_MAX, NULL)) != DDP_OK) return r;
    if (v[2 * K])
        return refused ? DDP_ERR_ARG
                       : ddp__fail(ctx, DDP_ERR_PEER, "ddp_sampler_init: rank %lld's call was refused (its ddp_error "
                                   "says why)", (long long)v[2 * K] - 1);
    for (i = 0; i < K; i++)
        if (v[i] != -v[K + i])
            return ddp__fail(ctx, DDP_ERR_MISMATCH,
                             "ddp_sampler_init: ranks disagree on %s: from %lld to %lld across ranks (this rank: %lld)",
                             names[i], -(long long)v[K + i], (long long)v[i], (long long)mine[i]);
    return DDP_OK;
}

ddp_result ddp_sampler_init(ddp_sampler *s, ddp_ctx *ctx, const ddp_sampler_desc *desc)
{
    ddp__held *live = s ? ddp__held_by(s, DDP__HELD_SAMPLER) : NULL;
    size_t n, w;
    if (live && s->held_ != live) { /* another ddp_sampler where one was left undestroyed (a function's */
        ddp__unhold(live);          /* stack): that one's lists are lost, as before */
        live = NULL;
    }
    if (live) { /* its lists would be lost: refused, and it goes on; with a context, the others
                   may be in the agreement already: meet them */
        ddp_sampler none;
        ddp_result r = ddp__fail(ctx, DDP_ERR_ARG, "ddp_sampler_init on a ddp_sampler that ddp_sampler_init set up "
                                 "before: ddp_sampler_destroy it first");
        memset(&none, 0, sizeof none);
        if ((!desc || desc->world_size <= 0) && ctx && ctx->st && ctx->world_size > 1) ddp__sampler_agree(&none, ctx, 1);
        return r;
    }
    if (!s) { /* with a context, the others may be in the agreement already: meet them */
        ddp_sampler none;
        ddp_result r;
        if (ctx && !ctx->st) return ddp__no_state(ctx, "ddp_sampler_init");
        memset(&none, 0, sizeof none);
        r = ddp__fail(ctx, DDP_ERR_ARG, "ddp_sampler_init: no ddp_sampler to set up (NULL)");
        if (!ctx) return r; /* (a NULL context is allowed: the world in desc, else one) */
        if (ctx->world_size > 1) ddp__sampler_agree(&none, ctx, 1);
        return r;
    }
    memset(s, 0, sizeof *s);
    if (!desc && ctx && !ctx->st) return ddp__no_state(ctx, "ddp_sampler_init"); /* (no ctx: ddp__fail says it) */
    if (!desc) { /* with a context, the others may be in the agreement already: meet them */
        ddp_result r = ddp__fail(ctx, DDP_ERR_ARG, "ddp_sampler_init: no desc");
        if (ctx && ctx->st && ctx->world_size > 1) ddp__sampler_agree(s, ctx, 1);
        return r;
    }
    if (ctx && !ctx->st && desc->world_size <= 0) return ddp__no_state(ctx, "ddp_sampler_init");
    if (desc->world_size > 0) {
        s->world_size = desc->world_size;
        s->rank = desc->rank;
    } else if (ctx) {
        s->world_size = ctx->world_size;
        s->rank = ctx->rank;
    } else {
        s->world_size = 1;
    }
    if (s->world_size < 1 || s->rank < 0 || s->rank >= s->world_size)
        return ddp__fail(ctx, DDP_ERR_ARG, "ddp_sampler_init: rank %d is not a rank of a world of %d", s->rank,
                         s->world_size);
    n = s->dataset_size = desc->dataset_size;
    w = (size_t)s->world_size;
    if (n > SIZE_MAX / sizeof(size_t) - w) { /* its index arrays could not be allocated */
        ddp_result r = ddp__fail(ctx, DDP_ERR_NOMEM, "ddp_sampler_init: %zu samples are more than memory can index", n);
        if (desc->world_size <= 0 && ctx && ctx->st && ctx->world_size > 1) ddp__sampler_agree(s, ctx, 1);
        return r;
    }
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
    s->num_batches = s->num_samples / s->batch_size + (!s->drop_last_batch && s->num_samples % s->batch_size);
    if (desc->world_size <= 0 && ctx && ctx->st && ctx->world_size > 1) {
        ddp_result r = ddp__sampler_agree(s, ctx, 0);
        if (r != DDP_OK) return r;
    }
    s->indices = (size_t *)DDP_MALLOC((s->num_samples ? s->num_samples : 1) * sizeof(size_t));
    if (s->shuffle) s->perm_ = (size_t *)DDP_MALLOC((n ? n : 1) * sizeof(size_t));
    s->held_ = (ddp__held *)DDP_MALLOC(sizeof *s->held_);
    if (!s->indices || (s->shuffle && !s->perm_) || !s->held_) {
        if (s->held_) DDP_FREE(s->held_);
        s->held_ = NULL;
        ddp_sampler_destroy(s);
        return ddp__fail(ctx, DDP_ERR_NOMEM, "ddp_sampler_init: out of memory for the indices of %zu samples", n);
    }
    ddp__hold(s->held_, DDP__HELD_SAMPLER, s); /* what a ddp_sampler never set up holds is never read */
    return DDP_OK;
}

void ddp_sampler_destroy(ddp_sampler *s)
{
    if (!s) return;
    if (s->indices) DDP_FREE(s->indices);
    if (s->perm_) DDP_FREE(s->perm_);
    if (s->held_) {
        ddp__unhold(s->held_);
        DDP_FREE(s->held_);
    }
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

/* ---- >>metrics ------------------------------------------------------------------------------ */
void ddp_metric_add(ddp_metric *m, double value, double weight)
{
    if (!m || weight == 0) return;
    if (m->count == 0 || value != value) { /* a NaN wins, wherever and whenever it comes (as DDP_MIN/MAX's) */
        m->min = m->max = value;
    } else {
        if (value < m->min) m->min = value; /* false against a NaN: it stays */
        if (value > m->max) m->max = value;
    }
    m->sum += value * weight;
    m->count += weight;
}

void ddp_metric_merge(ddp_metric *into, const ddp_metric *from, size_t n)
{
    size_t i;
    if (!into || !from) return; /* as ddp_metric_add: nothing to merge (it crashed) */
    for (i = 0; i < n; i++) {
        ddp_metric *a = &into[i];
        const ddp_metric *b = &from[i];
        if (b->count != 0) {
            if (a->count == 0) {
                a->min = b->min;
                a->max = b->max;
            } else {
                if (b->min < a->min || b->min != b->min) a->min = b->min; /* a NaN wins */
                if (b->max > a->max || b->max != b->max) a->max = b->max;
            }
        }
        a->sum += b->sum;
        a->count += b->count;
        if (b->reduced) a->reduced = 1;
    }
}

DDP__STATIC_ASSERT(metric_in_doubles, sizeof(ddp_metric) % sizeof(double) == 0); /* gathered as f64 */
ddp_result ddp_metric_reduce(ddp_ctx *ctx, ddp_metric *m, size_t n)
{
    /* all_gather rather than all_reduce: sums, mins and maxes in one collective, and
       every rank adds the ranks up in the same order */
    size_t per, w, r, i;
    int64_t counts[3];
    double *all = NULL;
    const char *bad = NULL;
    char again[160];
    ddp_result res;
    if (!ctx || !ctx->st) return ddp__no_state(ctx, "ddp_metric_reduce");
    w = (size_t)ctx->world_size;
    if (!m && n) bad = "NULL metrics";
    else if (n > DDP__MAX_BYTES / sizeof(ddp_metric) / (w + 1)) bad = "more metrics than memory holds";
    for (i = 0; !bad && i < n && !m[i].reduced; i++) {}
    if (!bad && i < n) /* its totals again, W times each rank's part: zeroed, it starts anew */
        snprintf(again, sizeof again, "metric %zu holds totals over the ranks already (reduced before, or merged with "
                 "such): zero it to start again", i), bad = again;
    else if (!bad && n && !(all = (double *)DDP_MALLOC((w + 1) * n * sizeof(ddp_metric))))
        bad = "out of memory for them";
    /* every rank the same n, 0 too (a rank with none would skip the gather the others
       make, and NCCL drops an empty collective): the largest n and the smallest; and
       whether a rank's call is refused, which it says there rather than leave the others
       to pair its next collective with their gather */
    counts[0] = bad ? 0 : (int64_t)n;
    counts[1] = bad ? 0 : -(int64_t)n;
    counts[2] = bad ? ctx->rank + 1 : 0;
    if ((res = ddp_all_reduce(ctx, counts, counts, 3, DDP_I64, DDP_MAX, NULL)) == DDP_OK && counts[2])
        res = bad == again ? ddp__fail(ctx, DDP_ERR_ARG, "ddp_metric_reduce: %s", bad)
              : bad ? ddp__fail(ctx, DDP_ERR_ARG, "ddp_metric_reduce: %s (%zu)", bad, n)
                  : ddp__fail(ctx, DDP_ERR_PEER, "ddp_metric_reduce: rank %lld's call was refused (its ddp_error says why)",
                              (long long)counts[2] - 1);
    else if (res == DDP_OK && counts[0] != -counts[1])
        res = ddp__break(ctx, ddp__fail(ctx, DDP_ERR_MISMATCH, "ddp_metric_reduce: the ranks pass from %lld to %lld "
                                        "metrics (this one %zu)", (long long)-counts[1], (long long)counts[0], n));
    if (res != DDP_OK || n == 0) {
        DDP_FREE(all);
        return res;
    }
    per = n * sizeof(ddp_metric) / sizeof(double);
    memcpy(all + w * per, m, n * sizeof(ddp_metric));
    res = ddp_all_gather(ctx, all + w * per, all, per, DDP_F64, NULL); /* host memory on every backend */
    if (res == DDP_OK) {
        memset(m, 0, n * sizeof(ddp_metric));
        for (r = 0; r < w; r++) ddp_metric_merge(m, (const ddp_metric *)(all + r * per), n);
        for (i = 0; i < n; i++) m[i].reduced = 1;
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

/* Each rank's value as a slot of int64s: the hashes of the name and the whole value,
   its length, and its first characters (what a refusal shows). */
typedef struct ddp__agree_slot {
    uint64_t name, hash, len;
    char text[104];
} ddp__agree_slot;
DDP__STATIC_ASSERT(agree_slot, sizeof(ddp__agree_slot) % sizeof(int64_t) == 0);

ddp_result ddp_agree_on(ddp_ctx *ctx, const char *name, const char *value)
{
    ddp__agree_slot mine, *all;
    size_t w, r;
    ddp_result res;
    if (!ctx || !ctx->st) return ddp__no_state(ctx, "ddp_agree_on");
    memset(&mine, 0, sizeof mine);
    if (!name || !value) { /* refused, but in the gather all the same: the others may be in it already */
        res = ddp__fail(ctx, DDP_ERR_ARG, "ddp_agree_on: NULL %s", name ? "value" : "name");
        mine.len = UINT64_MAX;
    } else {
        mine.name = ddp__hash(name);
        mine.hash = ddp__hash(value);
        mine.len = strlen(value);
        snprintf(mine.text, sizeof mine.text, "%s", value);
    }
    w = (size_t)ctx->world_size;
    all = (ddp__agree_slot *)DDP_MALLOC(w * sizeof *all);
    if (!all) return ddp__numbered(ctx, ddp__fail(ctx, DDP_ERR_NOMEM, "ddp_agree_on: out of memory for %zu ranks", w));
    if ((res = ddp_all_gather(ctx, &mine, all, sizeof mine / sizeof(int64_t), DDP_I64, NULL)) == DDP_OK)
        for (r = 0; r < w; r++)
            if (all[r].len == UINT64_MAX) {
                res = mine.len == UINT64_MAX ? DDP_ERR_ARG
                      : ddp__fail(ctx, DDP_ERR_PEER, "ddp_agree_on: rank %zu's call was refused (its ddp_error says why)",
                                  r);
                break;
            }
    for (r = 1; res == DDP_OK && r < w; r++)
        if (all[r].name != all[0].name)
            res = ddp__fail(ctx, DDP_ERR_MISMATCH, "ddp_agree_on: rank %zu checks another setting than rank 0 (%s "
                            "here): the ranks call it in another order", r, name);
        else if (all[r].hash != all[0].hash || all[r].len != all[0].len || strcmp(all[r].text, all[0].text) != 0)
            res = ddp__fail(ctx, DDP_ERR_MISMATCH, "ranks disagree on %s: rank %zu has %s%s, rank 0 has %s%s%s", name, r,
                            all[r].text, all[r].len >= sizeof mine.text ? "..." : "", all[0].text,
                            all[0].len >= sizeof mine.text ? "..." : "",
                            strcmp(all[r].text, all[0].text) == 0 ? " (alike in what is shown: they differ further on)" : "");
    DDP_FREE(all);
    return res;
}

/* ---- >>grad ---------------------------------------------------------------------------------- */

typedef struct ddp__grad_bucket {
    size_t begin, count, pending; /* pending: elements not yet marked this step */
    ddp_work work;
} ddp__grad_bucket;

struct ddp__grad_state {
    ddp__held held;            /* first: the list's node is the state */
    ddp__grad_bucket *buckets;
    size_t launched, waited;   /* buckets started / finished this step, from the last one down */
    size_t marked;             /* elements marked this step */
    size_t *regions;           /* (offset, count) pairs marked this step */
    size_t num_regions, cap_regions;
    size_t lo, hi;             /* what they span: a region outside needs no overlap check */
    int accumulated;           /* steps ended under no_sync since the last sync */
    uint64_t ctx_id;           /* its context's id (ddp_ctx's st->id): a ddp_ctx destroyed and set up again is another */
    ddp__busy busy;            /* a call in progress: a second thread's is refused */
};

/* Its context pinned, where that is the one the sync was set up in; else NULL. */
static struct ddp__state *ddp__grad_pin(const ddp_grad *g)
{
    struct ddp__state *cs = ddp__pin(g->ctx);
    if (cs && cs->id != g->st->ctx_id) {
        ddp__unpin(cs);
        cs = NULL;
    }
    return cs;
}
/* DDP_ERR_ARG for a call whose sync or context is not the one ddp_grad_init set up (held:
   the sync is there, its context is not), said in the context's log for a ddp_grad
   destroyed while its context lives (it keeps its context to say so), else on stderr
   naming the call (the context's log is gone, or another's). */
static ddp_result ddp__grad_gone(const ddp_grad *g, const char *call, int held)
{
    struct ddp__state *cs = g && g->ctx ? ddp__pin(g->ctx) : NULL;
    ddp_result r = DDP_ERR_ARG;
    if (held && !cs) return ddp__no_state(g->ctx, call);
    if (held) /* a context, but not the one it was set up in */
        fprintf(stderr, "ddp: error: %s: its ddp_ctx was destroyed and set up again since ddp_grad_init (ddp_grad_init "
                "it again)\n", call);
    else if (cs)
        r = ddp__fail(g->ctx, DDP_ERR_ARG, "%s on a ddp_grad that was destroyed (or never set up): ddp_grad_init it "
                      "first", call);
    else
        fprintf(stderr, "ddp: error: %s: %s\n", call,
                !g ? "no ddp_grad (NULL)" : "this ddp_grad was destroyed, or never initialised (ddp_grad_init first)");
    if (cs) ddp__unpin(cs);
    return r;
}

/* One call at a time per ddp_grad, as per ddp_ctx: two threads marking at once corrupted
   the regions' list (a double free); the second is refused, and the group stops. A call
   holds its context pinned (another thread's ddp_destroy frees it after the call). */
static ddp_result ddp__grad_enter(ddp_grad *g, const char *call)
{
    struct ddp__grad_state *st = g ? __atomic_load_n(&g->st, __ATOMIC_ACQUIRE) : NULL;
    struct ddp__state *cs = st && g->ctx ? __atomic_load_n(&g->ctx->st, __ATOMIC_ACQUIRE) : NULL;
    ddp_result said;
    int r = -1, live = 0;
    if (st) { /* the sync claimed and its context pinned under one lock (ddp__enter_held, ddp__pin) */
        pthread_mutex_lock(&ddp__held_mu);
        if (ddp__in_list(&st->held, g, DDP__HELD_GRAD) && (r = ddp__claim(&st->busy, DDP__BUSY_CALL)) == 0 &&
            (live = cs && ddp__in_list(&cs->held, g->ctx, DDP__HELD_CTX) && cs->id == st->ctx_id))
            __atomic_add_fetch(&cs->waiting, 1, __ATOMIC_ACQ_REL);
        pthread_mutex_unlock(&ddp__held_mu);
    }
    switch (r) {
    case 0:
        if (live) {
            ddp__pinned(cs);
            return DDP_OK;
        }
        ddp__unclaim(&st->busy);
        return ddp__grad_gone(g, call, 1);
    case -1: return ddp__grad_gone(g, call, 0); /* (destroyed, maybe by another thread just now: nothing of it is read) */
    case DDP__BUSY_DESTROY: return ddp__fail(NULL, DDP_ERR_ARG, "%s: another thread destroys this ddp_grad", call);
    }
    /* another thread's call holds it (and its context pinned; this call has not claimed the sync, so
       the sync is not read) */
    if (!(cs = ddp__pin(g->ctx))) return ddp__no_state(g->ctx, call);
    said = ddp__break(g->ctx, ddp__fail(g->ctx, DDP_ERR_ARG, "%s: another thread is in a call of this ddp_grad: a "
                                        "ddp_grad takes one call at a time (threads that share it order their calls, "
                                        "alike on every rank)", call));
    ddp__unpin(cs);
    return said;
}
static ddp_result ddp__grad_leave(ddp_grad *g, ddp_result r)
{
    ddp__unpin(g->ctx->st);
    ddp__unclaim(&g->st->busy);
    return r;
}

static void ddp__grad_reset(ddp_grad *g)
{
    size_t i;
    for (i = 0; i < g->num_buckets; i++) g->st->buckets[i].pending = g->st->buckets[i].count;
    g->st->launched = g->st->waited = g->st->marked = g->st->num_regions = 0;
}

/* Every rank must cut the gradient into the same buckets: a difference would pair
   one rank's bucket with another's of a different size. A rank whose call was refused
   (`refused`: its reason told already) takes part all the same, as -1, so that no rank
   pairs this gather with its next collective; the others then return DDP_ERR_PEER. */
/* desc's params to broadcast (count -1: none) are compared too: on one rank only they were
   broadcast to nobody, and the next call paired with that broadcast (a named mismatch, late) */
static ddp_result ddp__grad_agree(ddp_grad *g, int refused, int64_t params, int64_t param_dtype)
{
    int64_t mine[6], *all;
    int r, w = g->ctx->world_size;
    ddp_result res;
    char p0[64], p1[64];
    mine[0] = refused ? -1 : (int64_t)g->count; mine[1] = g->dtype; mine[2] = (int64_t)g->bucket_count; mine[3] = g->sum;
    mine[4] = params; mine[5] = params < 0 ? -1 : param_dtype;
    if (!(all = DDP__CAST(int64_t *, DDP_MALLOC(sizeof mine * (size_t)w))))
        return ddp__numbered(g->ctx, ddp__fail(g->ctx, DDP_ERR_NOMEM, "ddp_grad_init: out of memory"));
    res = ddp_all_gather(g->ctx, mine, all, 6, DDP_I64, NULL);
    for (r = 0; res == DDP_OK && r < w; r++)
        if (all[6 * r] < 0)
            res = refused ? DDP_ERR_ARG
                          : ddp__fail(g->ctx, DDP_ERR_PEER, "ddp_grad_init: rank %d's call was refused (its ddp_error "
                                      "says why)", r);
    for (r = 0; res == DDP_OK && r < w; r++)
        if (memcmp(all + 6 * r, mine, sizeof mine) != 0) {
            const int64_t *o = all + 6 * r;
            p0[0] = p1[0] = 0; /* the params, where they differ */
            if (o[4] != mine[4] || o[5] != mine[5]) {
                if (mine[4] < 0) snprintf(p0, sizeof p0, ", no params to broadcast");
                else snprintf(p0, sizeof p0, ", %lld x %s params", (long long)mine[4], ddp_dtype_name((ddp_dtype)mine[5]));
                if (o[4] < 0) snprintf(p1, sizeof p1, ", no params to broadcast");
                else snprintf(p1, sizeof p1, ", %lld x %s params", (long long)o[4], ddp_dtype_name((ddp_dtype)o[5]));
            }
            res = ddp__fail(g->ctx, DDP_ERR_MISMATCH, "ddp_grad_init: rank %d has %lld x %s in buckets of %lld%s%s, "
                            "rank %d has %lld x %s in buckets of %lld%s%s", g->ctx->rank, (long long)mine[0],
                            ddp_dtype_name((ddp_dtype)mine[1]), (long long)mine[2], mine[3] ? " (sum)" : "", p0, r,
                            (long long)o[0], ddp_dtype_name((ddp_dtype)o[1]), (long long)o[2], o[3] ? " (sum)" : "", p1);
        }
    DDP_FREE(all);
    return res;
}

/* ddp_grad_init's checks of desc, and its buckets: DDP_OK, or the refusal (told) */
static ddp_result ddp__grad_layout(ddp_grad *g, const ddp_grad_desc *desc)
{
    ddp_ctx *ctx = g->ctx;
    size_t bytes, i;
    if (!desc || (desc->count && !desc->grads) || (unsigned)desc->dtype >= DDP_DTYPE_COUNT)
        return ddp__fail(ctx, DDP_ERR_ARG, "ddp_grad_init: needs a desc with grads, count and a valid dtype");
    if (desc->params && ((unsigned)desc->param_dtype >= DDP_DTYPE_COUNT ||
                         (desc->param_count ? desc->param_count : desc->count) >
                             DDP__MAX_BYTES / ddp_dtype_size(desc->param_dtype)))
        return ddp__fail(ctx, DDP_ERR_ARG, "ddp_grad_init: params to broadcast need a valid param_dtype and a "
                         "param_count that fits in memory (param_dtype %d, param_count %zu)", (int)desc->param_dtype,
                         desc->param_count ? desc->param_count : desc->count);
    if ((desc->dtype == DDP_I32 || desc->dtype == DDP_I64) && !desc->sum)
        return ddp__fail(ctx, DDP_ERR_ARG, "ddp_grad_init: %s gradients would average by truncation (0.5 -> 0): a "
                         "floating dtype, or .sum = 1 for the sum", ddp_dtype_name(desc->dtype));
    g->grads = desc->grads;
    g->count = desc->count;
    g->dtype = desc->dtype;
    g->stream = desc->stream;
    g->sum = desc->sum != 0;
    bytes = desc->bucket_bytes ? desc->bucket_bytes : DDP__DEFAULT_BUCKET_BYTES;
    g->bucket_count = bytes / ddp_dtype_size(g->dtype);
    if (g->bucket_count == 0) g->bucket_count = 1;
    if (g->count > DDP__MAX_BYTES / ddp_dtype_size(g->dtype))
        return ddp__fail(ctx, DDP_ERR_ARG, "ddp_grad_init: %zu gradients of %s are more bytes than memory holds", g->count,
                         ddp_dtype_name(g->dtype));
    g->num_buckets = g->count / g->bucket_count + (g->count % g->bucket_count != 0);
    g->st = (struct ddp__grad_state *)DDP_MALLOC(sizeof *g->st);
    if (g->st) {
        memset(g->st, 0, sizeof *g->st);
        ddp__hold(&g->st->held, DDP__HELD_GRAD, g);
        g->st->ctx_id = ctx->st->id;
        g->st->buckets = (ddp__grad_bucket *)DDP_MALLOC((g->num_buckets ? g->num_buckets : 1) * sizeof(ddp__grad_bucket));
    }
    if (!g->st || !g->st->buckets)
        return ddp__fail(ctx, DDP_ERR_NOMEM, "ddp_grad_init: out of memory for %zu buckets", g->num_buckets);
    for (i = 0; i < g->num_buckets; i++) {
        ddp__grad_bucket *b = &g->st->buckets[i];
        memset(b, 0, sizeof *b);
        b->begin = i * g->bucket_count;
        b->count = g->count - b->begin < g->bucket_count ? g->count - b->begin : g->bucket_count;
    }
    ddp__grad_reset(g);
    return DDP_OK;
}

ddp_result ddp_grad_init(ddp_grad *g, ddp_ctx *ctx, const ddp_grad_desc *desc)
{
    ddp__held *live = g ? ddp__held_by(g, DDP__HELD_GRAD) : NULL;
    ddp_result r;
    if (live && (ddp__held *)g->st != live) { /* another ddp_grad where one was left undestroyed (a function's */
        ddp__unhold(live);                    /* stack): that one is lost, as before; its buckets end on their own */
        live = NULL;
    }
    if (!g || live) { /* the others may be in the agreement already: meet them */
        ddp_grad none;
        if (!ctx || !ctx->st) return ddp__no_state(ctx, "ddp_grad_init");
        memset(&none, 0, sizeof none);
        none.ctx = ctx;
        r = ddp__fail(ctx, DDP_ERR_ARG, g ? "ddp_grad_init on a ddp_grad that ddp_grad_init set up before: "
                                            "ddp_grad_destroy it first"
                                          : "ddp_grad_init: no ddp_grad to set up (NULL)");
        ddp__grad_agree(&none, 1, -1, -1);
        return r;
    }
    memset(g, 0, sizeof *g);
    if (!ctx || !ctx->st) return ddp__no_state(ctx, "ddp_grad_init");
    g->ctx = ctx;
    if ((r = ddp__grad_layout(g, desc)) != DDP_OK) /* the others may be in the agreement already: meet them */
        ddp__grad_agree(g, 1, -1, -1);
    else
        r = ddp__grad_agree(g, 0, desc->params ? (int64_t)(desc->param_count ? desc->param_count : desc->count) : -1,
                            desc->params ? (int64_t)desc->param_dtype : -1);
    if (r == DDP_OK && desc->params) {
        float one = 1;
        r = ddp_broadcast(ctx, desc->params, desc->param_count ? desc->param_count : desc->count, desc->param_dtype, 0,
                          g->stream);
        /* a GPU broadcast is only queued: a host collective after it returns once it is
           done, within the timeout, so a hung peer is an error here, not a hang later */
        if (r == DDP_OK && ctx->backend != DDP_BACKEND_CPU) r = ddp_all_reduce(ctx, &one, &one, 1, DDP_F32, DDP_SUM, NULL);
    }
    if (r != DDP_OK) ddp_grad_destroy(g);
    return r;
}

/* Waits for the buckets started this step until at most `keep` are in flight,
   oldest first. */
static ddp_result ddp__grad_wait(ddp_grad *g, size_t keep)
{
    struct ddp__grad_state *st = g->st;
    ddp_result first = DDP_OK;
    while (st->launched - st->waited > keep) {
        /* after a failure the group is broken: the rest would each be refused, in a line
           of their own, and ddp_error would tell the refusal rather than the failure */
        ddp_result r = first != DDP_OK ? first : ddp__wait(g->ctx, &st->buckets[g->num_buckets - 1 - st->waited].work,
                                                           g->stream, 0);
        if (r != DDP_OK && first == DDP_OK) first = r;
        st->waited++;
    }
    return first;
}

void ddp_grad_destroy(ddp_grad *g)
{
    ddp_ctx *ctx;
    if (!g) return;
    if (g->st) {
        const int took = ddp__unhold_mine(&g->st->held); /* 0: a child of fork() frees its copy, the group left alone */
        struct ddp__state *cs;
        if (took < 0) {
            ddp__fail(NULL, DDP_ERR_ARG, "ddp_grad_destroy: another thread destroys this ddp_grad already");
            return;
        }
        cs = took ? ddp__grad_pin(g) : NULL; /* (NULL: ddp_destroy ended what was in flight) */
        if (took && ddp__claim_for_destroy(cs ? g->ctx : NULL, &g->st->busy, "ddp_grad_destroy",
                                           "a call of this ddp_grad") != DDP_OK) {
            if (cs) ddp__unpin(cs);
            ddp__rehold(&g->st->held);
            return;
        }
        if (cs && g->st->buckets) (void)ddp__grad_wait(g, 0);
        if (cs) ddp__unpin(cs);
        if (g->st->buckets) DDP_FREE(g->st->buckets);
        if (g->st->regions) DDP_FREE(g->st->regions);
        DDP_FREE(g->st);
        __atomic_store_n(&g->st, NULL, __ATOMIC_RELEASE); /* (a call starting now may read it: see ddp__enter_held) */
    }
    ctx = g->ctx;
    memset(g, 0, sizeof *g);
    g->ctx = ctx; /* only to name a later call on it in ctx's ddp_error */
}

/* Starts every complete bucket whose turn it is: the same order on every rank. */
static ddp_result ddp__grad_launch(ddp_grad *g)
{
    size_t esize = ddp_dtype_size(g->dtype);
    while (g->st->launched < g->num_buckets) {
        ddp__grad_bucket *b = &g->st->buckets[g->num_buckets - 1 - g->st->launched];
        void *p = (char *)g->grads + b->begin * esize;
        ddp__coll c;
        ddp_result r;
        if (b->pending) break;
        memset(&c, 0, sizeof c);
        c.kind = DDP__ALL_REDUCE;
        c.send = c.recv = p;
        c.count = b->count;
        c.dtype = g->dtype;
        c.op = g->sum ? DDP_SUM : DDP_AVG;
        c.bucket = (int32_t)g->st->launched + 1; /* a name in traces */
        c.steps = g->sum ? 0 : g->st->accumulated + 1; /* a sum is the caller's to scale: ranks may add unevenly */
        r = ddp__issue(g->ctx, &c, g->stream, &b->work);
        if (r != DDP_OK) return r;
        g->st->launched++;
    }
    return DDP_OK;
}

/* Marks [offset, offset + count) and starts the buckets it completes; `known_free`: the
   region is a gap between marked ones (ddp_grad_all_reduce), no need to look for overlap. */
static ddp_result ddp__grad_mark(ddp_grad *g, size_t offset, size_t count, int known_free)
{
    struct ddp__grad_state *st = g->st;
    size_t i, end = offset + count;
    /* backward passes mark in order (last layer first, or first first): outside what is
       marked, a region overlaps nothing, and a step of n regions costs n, not n^2 */
    if (known_free || !st->num_regions || end <= st->lo || offset >= st->hi) i = st->num_regions;
    else i = 0;
    for (; i < st->num_regions; i++) {
        size_t o = st->regions[2 * i], e = o + st->regions[2 * i + 1];
        if (offset < e && o < end)
            return ddp__fail(g->ctx, DDP_ERR_ARG,
                                  "ddp_grad_ready: region [%zu, %zu) overlaps [%zu, %zu), already marked this step",
                                  offset, end, o, e);
    }
    if (st->num_regions == st->cap_regions) {
        size_t cap = st->cap_regions ? 2 * st->cap_regions : 64;
        size_t *nr = (size_t *)DDP_MALLOC(2 * cap * sizeof(size_t));
        if (!nr) return ddp__fail(g->ctx, DDP_ERR_NOMEM, "ddp_grad_ready: out of memory for %zu regions", cap);
        if (st->regions) {
            memcpy(nr, st->regions, 2 * st->num_regions * sizeof(size_t));
            DDP_FREE(st->regions);
        }
        st->regions = nr;
        st->cap_regions = cap;
    }
    st->regions[2 * st->num_regions] = offset;
    st->regions[2 * st->num_regions + 1] = count;
    if (!st->num_regions || offset < st->lo) st->lo = offset;
    if (!st->num_regions || end > st->hi) st->hi = end;
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

ddp_result ddp_grad_ready(ddp_grad *g, size_t offset, size_t count)
{
    size_t end = offset + count;
    ddp_result r;
    if ((r = ddp__grad_enter(g, "ddp_grad_ready")) != DDP_OK) return r;
    if (end < offset || end > g->count)
        return ddp__grad_leave(g, ddp__fail(g->ctx, DDP_ERR_ARG, "ddp_grad_ready: %zu elements at offset %zu are outside "
                                            "the gradient buffer of %zu elements", count, offset, g->count));
    return ddp__grad_leave(g, count ? ddp__grad_mark(g, offset, count, 0) : DDP_OK);
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
    if (st->num_regions > 1) qsort(st->regions, st->num_regions, 2 * sizeof(size_t), ddp__grad_region_cmp);
    for (i = 0; i < st->num_regions && st->regions[2 * i] == pos; i++) pos += st->regions[2 * i + 1];
    *gap_end = i < st->num_regions ? st->regions[2 * i] : g->count;
    return pos;
}

static ddp_result ddp__grad_finish(ddp_grad *g)
{
    ddp_result r;
    if (g->no_sync) {
        if (g->st->accumulated < INT_MAX - 1) g->st->accumulated++;
        ddp__grad_reset(g);
        return DDP_OK;
    }
    if (g->st->marked != g->count) {
        size_t end, gap = ddp__grad_first_gap(g, &end), unmarked = g->count - g->st->marked;
        (void)ddp__grad_wait(g, 0);
        ddp__grad_reset(g);
        g->st->accumulated = 0;
        r = ddp__fail(g->ctx, DDP_ERR_ARG, "ddp_grad_finish: %zu of %zu gradient elements were never marked ready, "
                      "the first at [%zu, %zu)", unmarked, g->count, gap, end);
        /* the buckets never sent leave the other ranks in all-reduces this rank will not
           join, or paired with its next step's: the group stops, and they hear why */
        return ddp__break(g->ctx, r);
    }
    r = ddp__grad_launch(g);
    if (r == DDP_OK) r = ddp__grad_wait(g, 0);
    else (void)ddp__grad_wait(g, 0);
    ddp__grad_reset(g);
    g->st->accumulated = 0;
    return r;
}

ddp_result ddp_grad_finish(ddp_grad *g)
{
    ddp_result r;
    if ((r = ddp__grad_enter(g, "ddp_grad_finish")) != DDP_OK) return r;
    return ddp__grad_leave(g, ddp__grad_finish(g));
}

static ddp_result ddp__grad_all_reduce(ddp_grad *g)
{
    ddp_result r = DDP_OK;
    struct ddp__grad_state *st = g->st;
    size_t i, n, pos = 0, *gaps;
    /* the gaps between the regions marked so far, found in one pass over them sorted */
    if (st->num_regions > 1) qsort(st->regions, st->num_regions, 2 * sizeof(size_t), ddp__grad_region_cmp);
    n = st->num_regions;
    if (!(gaps = (size_t *)DDP_MALLOC(2 * (n + 1) * sizeof(size_t))))
        return ddp__fail(g->ctx, DDP_ERR_NOMEM, "ddp_grad_all_reduce: out of memory for %zu regions", n);
    for (i = 0, n = 0; i <= st->num_regions; i++) {
        size_t at = i < st->num_regions ? st->regions[2 * i] : g->count;
        if (at > pos) gaps[2 * n] = pos, gaps[2 * n + 1] = at - pos, n++;
        if (i < st->num_regions) pos = at + st->regions[2 * i + 1];
    }
    for (i = 0; r == DDP_OK && i < n; i++) r = ddp__grad_mark(g, gaps[2 * i], gaps[2 * i + 1], 1);
    DDP_FREE(gaps);
    return r == DDP_OK ? ddp__grad_finish(g) : r;
}

ddp_result ddp_grad_all_reduce(ddp_grad *g)
{
    ddp_result r;
    if ((r = ddp__grad_enter(g, "ddp_grad_all_reduce")) != DDP_OK) return r;
    return ddp__grad_leave(g, ddp__grad_all_reduce(g));
}

ddp_result ddp_grad_no_sync(ddp_grad *g, int on)
{
    ddp_result r;
    if ((r = ddp__grad_enter(g, "ddp_grad_no_sync")) != DDP_OK) return r;
    if (g->st->num_regions)
        return ddp__grad_leave(g, ddp__fail(g->ctx, DDP_ERR_ARG, "ddp_grad_no_sync: called in the middle of a step"));
    g->no_sync = on != 0;
    return ddp__grad_leave(g, DDP_OK);
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
