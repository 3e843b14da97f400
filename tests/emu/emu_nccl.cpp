/* tests/emu/emu_nccl.cpp - NCCL for the CUDA emulator (the API and its rules are in
   nccl.h).

   Ranks are processes. They meet in a POSIX shared-memory object named from the
   ncclUniqueId (ncclGetUniqueId makes a random one; ddp.h passes it through its
   store): a header, one slot per rank (its pid, GPU, progress counters and the
   arguments of its current collective) and one staging buffer per rank. Each rank
   holds an open-file-description lock on its byte of the object for as long as it
   lives, so the others can tell a dead process from a late one.

   A collective is queued on its stream as a waiting operation: when the engine
   reaches it (emu.cpp), the rank publishes its arguments and waits until every rank
   has arrived at the same collective number; the arguments are compared; then the
   data moves through the staging buffers chunk by chunk, each chunk between two
   barriers: copy in, barrier, every rank combines all ranks' chunks in rank order
   into its own result, barrier. While a rank waits for a peer that has not arrived,
   it sets the peer's "wanted" counter: the peer's engine looks at it about once a
   millisecond and runs its queued work up to that collective, as a GPU would run on
   without its host. Waits sleep on a futex word in the shared object that every
   rank bumps when it moves on. */
#include "cuda_bf16.h"
#include "emu_internal.h"
#include "nccl.h"
#include <algorithm>
#include <atomic>
#include <fcntl.h>
#include <linux/futex.h>
#include <mutex>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

using namespace emu;

namespace {
const uint32_t SHM_MAGIC = 0x454d4e43, COMM_MAGIC = 0x636f6d6d;

enum coll_kind { ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER };
const char *const kind_names[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter"};
const char *const type_names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                                  "float64", "bfloat16"};
const char *const op_names[] = {"sum", "prod", "max", "min", "avg"};
const size_t type_sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

/* what every rank must agree on */
struct coll_args {
    uint64_t seq;
    int32_t kind, type, op, root;
    uint64_t count;
};

struct alignas(64) slot {
    std::atomic<int32_t> pid;
    std::atomic<uint32_t> joined, gone;
    int32_t phys;
    char host[96];
    std::atomic<uint64_t> phase;   /* barriers passed */
    std::atomic<uint64_t> arrived; /* collectives begun */
    std::atomic<uint64_t> wanted;  /* a peer waits for this rank to begin collective #wanted */
    coll_args args;                /* the collective #arrived's arguments */
};

struct alignas(64) shm_header {
    std::atomic<uint32_t> magic;
    std::atomic<int32_t> nranks;
    std::atomic<uint64_t> chunk;
    std::atomic<uint32_t> joined;
    std::atomic<uint32_t> bell; /* bumped on every change; waiters sleep on it */
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory counters need lock-free atomics");

struct collective {
    coll_args a;
    const void *send;
    void *recv;
    bool hang;
    int error;
};
} // namespace

struct ncclComm {
    uint32_t magic;
    int rank, nranks, device;
    shm_header *h;
    slot *slots;
    char *data;
    size_t chunk;
    int fd;
    char name[64];
    bool blocking;
    std::atomic<int> state{0}; /* 0 joining, 1 ready, 2 failed (the engine reads it in doorbells) */
    std::atomic<int> async;    /* ncclResult_t */
    char last[300];
    uint64_t issued;           /* collectives queued */
    std::atomic<long> pending; /* queued and not finished */
    std::atomic<bool> aborted;
    bool destroyed, finalizing;
    char ended_by[160];        /* "ncclCommAbort on thread 42" */
    std::atomic<long> in_call; /* the thread inside an NCCL call on this communicator */
    const char *in_call_name;
    int inprogress_left;
    uint64_t demanded;         /* peers' "wanted" already passed to the engine */
};

namespace {
std::mutex comms_mu;
std::vector<ncclComm *> &comms = *new std::vector<ncclComm *>; /* never destroyed: the engine may outlive main */
int inject_inprogress = -1, hang_rank = -1, error_rank = -1, error_code = ncclSystemError, delay_us;
long long hang_k, error_k;
size_t chunk_bytes;

void parse_rank_k(const char *name, int *rank, long long *k, int *code)
{
    const char *v = getenv(name);
    int n, r, c;
    long long kk;
    if (!v || !*v) return;
    n = sscanf(v, "%d:%lld:%d", &r, &kk, &c);
    if (n < 2 || r < 0 || kk < 1 || (code == NULL && n != 2) || (n == 3 && (c < 1 || c >= ncclNumResults)))
        report("%s='%s': want RANK:K%s (K counts collectives from 1)", name, v, code ? "[:CODE]" : "");
    *rank = r;
    *k = kk;
    if (code && n == 3) *code = c;
}

void read_settings()
{
    static std::once_flag once;
    std::call_once(once, []() {
        init();
        const char *v = getenv("DDP_EMU_NCCL_INPROGRESS");
        inject_inprogress = v && *v ? atoi(v) : 0;
        v = getenv("DDP_EMU_NCCL_DELAY_US");
        delay_us = v && *v ? atoi(v) : 0;
        v = getenv("DDP_EMU_NCCL_CHUNK");
        chunk_bytes = v && *v ? (size_t)strtoull(v, NULL, 10) : (size_t)1 << 20;
        if (chunk_bytes < 64 || chunk_bytes % 64) report("DDP_EMU_NCCL_CHUNK='%s': want a multiple of 64 bytes", v);
        parse_rank_k("DDP_EMU_NCCL_HANG", &hang_rank, &hang_k, NULL);
        parse_rank_k("DDP_EMU_NCCL_ERROR", &error_rank, &error_k, &error_code);
    });
}

void ring(shm_header *h)
{
    h->bell.fetch_add(1);
    syscall(SYS_futex, &h->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void set_last(ncclComm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void set_last(ncclComm *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last, sizeof c->last, fmt, ap);
    va_end(ap);
}

/* Every call on a communicator: it must be live, and no other thread may be inside
   an NCCL call on it (NCCL forbids concurrent calls on one communicator). */
struct entry {
    ncclComm *c;
    entry(ncclComm *comm, const char *call) : c(comm)
    {
        read_settings();
        if (!c || c->magic != COMM_MAGIC) report("%s(%p): not a communicator", call, (void *)c);
        if (c->ended_by[0])
            report("%s on a communicator after %s: the communicator is gone (a use after free on NCCL)", call, c->ended_by);
        long none = 0, me = tid();
        if (!c->in_call.compare_exchange_strong(none, me))
            report("%s on thread %ld while thread %ld is inside %s on the same communicator: NCCL forbids concurrent "
                   "calls on one communicator", call, me, none, c->in_call_name);
        c->in_call_name = call;
        if (delay_us) usleep((useconds_t)delay_us);
    }
    ~entry() { c->in_call.store(0); }
};

/* the host's identity: two ranks on one host must not share a GPU */
void host_id(char *out, size_t n)
{
    char name[64] = "?", boot[40] = "";
    gethostname(name, sizeof name);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = 0;
    snprintf(out, n, "%s/%s", name, boot);
}

/* The lock on rank r's byte of the shared object: cmd F_OFD_SETLK takes it (0 when
   another process holds it), F_OFD_GETLK asks whether a live process holds it. */
int rank_lock(int fd, int r, int cmd)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = r;
    fl.l_len = 1;
    if (fcntl(fd, cmd, &fl) != 0) return cmd == F_OFD_GETLK;
    return cmd == F_OFD_SETLK || fl.l_type != F_UNLCK;
}

bool peer_alive(ncclComm *c, int r) { return rank_lock(c->fd, r, F_OFD_GETLK); }

/* Init finishes when every rank has joined: no two ranks on one GPU. */
void finish_init(ncclComm *c)
{
    if (c->state != 0 || c->h->joined.load() < (uint32_t)c->nranks) return;
    for (int i = 0; i < c->nranks; i++)
        for (int j = i + 1; j < c->nranks; j++)
            if (c->slots[i].phys == c->slots[j].phys && strcmp(c->slots[i].host, c->slots[j].host) == 0) {
                set_last(c, "Duplicate GPU detected: rank %d and rank %d both on CUDA device %d (emulated GPU %d of "
                         "this host)", i, j, c->slots[i].phys, c->slots[i].phys);
                c->state = 2;
                c->async = ncclInvalidUsage;
                return;
            }
    shm_unlink(c->name); /* everyone has it mapped: the name is no longer needed */
    c->state = 1;
    c->async = ncclSuccess;
}

/* The engine, about once a millisecond: a peer waits for this rank to begin a
   collective it has queued? Then run the queued work up to it. */
void doorbells()
{
    std::lock_guard<std::mutex> lk(comms_mu);
    for (ncclComm *c : comms) {
        if (c->state != 1 || c->aborted || c->ended_by[0]) continue;
        slot *me = &c->slots[c->rank];
        const uint64_t w = me->wanted.load();
        if (w > c->demanded && w > me->arrived.load()) {
            c->demanded = w;
            demand([c, w]() { return c->slots[c->rank].arrived.load() >= w || c->aborted.load(); });
        }
    }
}

/* ---- the collective, on the engine thread ---- */
/* Waits (in the operation's fiber) until ready() holds; false when the communicator
   was aborted. A peer that died makes the async error ncclRemoteError: the wait goes
   on, as NCCL's kernels do, until the caller aborts. */
template <class Ready, class Lag> bool wait_for(ncclComm *c, Ready ready, Lag lagging, const collective &k)
{
    double last_check = now_s();
    for (;;) {
        const uint32_t seen = c->h->bell.load();
        if (ready()) return true;
        if (c->aborted) return false;
        for (int r = 0; r < c->nranks; r++)
            if (lagging(r)) {
                uint64_t w = c->slots[r].wanted.load();
                while (w < k.a.seq && !c->slots[r].wanted.compare_exchange_weak(w, k.a.seq)) {}
            }
        if (now_s() - last_check > 0.05 && c->async == ncclSuccess) {
            last_check = now_s();
            for (int r = 0; r < c->nranks; r++)
                if (lagging(r) && !peer_alive(c, r)) { /* as NCCL: an async error, the collective waits on */
                    set_last(c, "%s #%llu: rank %d (pid %d) exited", kind_names[k.a.kind], (unsigned long long)k.a.seq,
                             r, (int)c->slots[r].pid.load());
                    c->async = ncclRemoteError;
                }
        }
        op_yield((const uint32_t *)&c->h->bell, seen);
    }
}

bool barrier(ncclComm *c, const collective &k)
{
    slot *me = &c->slots[c->rank];
    const uint64_t p = me->phase.fetch_add(1) + 1;
    ring(c->h);
    return wait_for(c, [&]() {
        for (int r = 0; r < c->nranks; r++)
            if (c->slots[r].phase.load() < p) return false;
        return true;
    }, [&](int r) { return c->slots[r].phase.load() < p; }, k);
}

/* acc = op(acc, x) for n elements of one type, in place. */
template <class T> void combine(T *acc, const T *x, size_t n, int op)
{
    switch (op) {
    case ncclSum: case ncclAvg: for (size_t i = 0; i < n; i++) acc[i] = (T)(acc[i] + x[i]); break;
    case ncclProd: for (size_t i = 0; i < n; i++) acc[i] = (T)(acc[i] * x[i]); break;
    case ncclMax: for (size_t i = 0; i < n; i++) acc[i] = x[i] > acc[i] ? x[i] : acc[i]; break;
    default: for (size_t i = 0; i < n; i++) acc[i] = x[i] < acc[i] ? x[i] : acc[i]; break;
    }
}

/* 16-bit floats: each step in float, rounded back to 16 bits, as NCCL's reductions go. */
template <bool BF> void combine16(uint16_t *acc, const uint16_t *x, size_t n, int op)
{
    auto in = [](uint16_t v) { return BF ? bf16_bits_to_float(v) : half_to_float(v); };
    auto out = [](float v) { return BF ? float_to_bf16_bits(v) : float_to_half(v); };
    switch (op) {
    case ncclSum: case ncclAvg: for (size_t i = 0; i < n; i++) acc[i] = out(in(acc[i]) + in(x[i])); break;
    case ncclProd: for (size_t i = 0; i < n; i++) acc[i] = out(in(acc[i]) * in(x[i])); break;
    case ncclMax: for (size_t i = 0; i < n; i++) acc[i] = in(x[i]) > in(acc[i]) ? x[i] : acc[i]; break;
    default: for (size_t i = 0; i < n; i++) acc[i] = in(x[i]) < in(acc[i]) ? x[i] : acc[i]; break;
    }
}

/* ncclAvg: floats are multiplied by 1/nranks as they are loaded (NCCL's pre-multiplied
   sum), the factor itself in the data's type (1/3 is 0.333984375 in bf16); integers are
   summed and then divided. */
void premultiply(char *p, size_t n, int type, int nranks)
{
    const double inv = 1.0 / nranks;
    const float inv_bf16 = bf16_bits_to_float(float_to_bf16_bits((float)inv)), inv_f16 = half_to_float(float_to_half((float)inv));
    for (size_t i = 0; i < n; i++) switch (type) {
        case ncclFloat32: ((float *)p)[i] = ((float *)p)[i] * (float)inv; break;
        case ncclFloat64: ((double *)p)[i] = ((double *)p)[i] * inv; break;
        case ncclBfloat16: ((uint16_t *)p)[i] = float_to_bf16_bits(bf16_bits_to_float(((uint16_t *)p)[i]) * inv_bf16); break;
        case ncclFloat16: ((uint16_t *)p)[i] = float_to_half(half_to_float(((uint16_t *)p)[i]) * inv_f16); break;
        default: break;
        }
}

void divide(char *p, size_t n, int type, int nranks)
{
    for (size_t i = 0; i < n; i++) switch (type) {
        case ncclInt8: ((int8_t *)p)[i] = (int8_t)(((int8_t *)p)[i] / nranks); break;
        case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)(((uint8_t *)p)[i] / nranks); break;
        case ncclInt32: ((int32_t *)p)[i] /= nranks; break;
        case ncclUint32: ((uint32_t *)p)[i] /= (uint32_t)nranks; break;
        case ncclInt64: ((int64_t *)p)[i] /= nranks; break;
        case ncclUint64: ((uint64_t *)p)[i] /= (uint64_t)nranks; break;
        default: break;
        }
}

bool is_float(int t) { return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16; }

/* out = the reduction over ranks 0..W-1 of srcs[r][0..n), in rank order. */
void reduce(char *out, char *const *srcs, int W, size_t n, int type, int op)
{
    const size_t es = type_sizes[type];
    std::vector<char> x;
    memcpy(out, srcs[0], n * es);
    if (op == ncclAvg && is_float(type)) premultiply(out, n, type, W);
    for (int r = 1; r < W; r++) {
        const char *src = srcs[r];
        if (op == ncclAvg && is_float(type)) {
            x.assign(src, src + n * es);
            premultiply(x.data(), n, type, W);
            src = x.data();
        }
        /* signed integers compare as signed and add as unsigned (wrapping, as on the GPU) */
        const bool cmp = op == ncclMax || op == ncclMin;
        switch (type) {
        case ncclInt8: cmp ? combine((int8_t *)out, (const int8_t *)src, n, op) : combine((uint8_t *)out, (const uint8_t *)src, n, op); break;
        case ncclUint8: combine((uint8_t *)out, (const uint8_t *)src, n, op); break;
        case ncclInt32: cmp ? combine((int32_t *)out, (const int32_t *)src, n, op) : combine((uint32_t *)out, (const uint32_t *)src, n, op); break;
        case ncclUint32: combine((uint32_t *)out, (const uint32_t *)src, n, op); break;
        case ncclInt64: cmp ? combine((int64_t *)out, (const int64_t *)src, n, op) : combine((uint64_t *)out, (const uint64_t *)src, n, op); break;
        case ncclUint64: combine((uint64_t *)out, (const uint64_t *)src, n, op); break;
        case ncclFloat32: combine((float *)out, (const float *)src, n, op); break;
        case ncclFloat64: combine((double *)out, (const double *)src, n, op); break;
        case ncclBfloat16: combine16<true>((uint16_t *)out, (const uint16_t *)src, n, op); break;
        default: combine16<false>((uint16_t *)out, (const uint16_t *)src, n, op); break;
        }
    }
    if (op == ncclAvg && !is_float(type)) divide(out, n, type, W);
}

void run_collective(ncclComm *c, const collective &k)
{
    slot *me = &c->slots[c->rank];
    const int W = c->nranks;
    const size_t es = type_sizes[k.a.type], n = k.a.count;
    me->args = k.a;
    me->arrived.store(k.a.seq);
    ring(c->h);
    if (!wait_for(c, [&]() {
            for (int r = 0; r < W; r++)
                if (c->slots[r].arrived.load() < k.a.seq) return false;
            return true;
        }, [&](int r) { return c->slots[r].arrived.load() < k.a.seq; }, k))
        return;
    for (int r = 0; r < W; r++) {
        const coll_args &o = c->slots[r].args;
        if (memcmp(&o, &k.a, sizeof o) != 0) {
            char mine[120], theirs[120];
            snprintf(mine, sizeof mine, "%s %llu x %s %s root %d", kind_names[k.a.kind], (unsigned long long)k.a.count,
                     type_names[k.a.type], op_names[k.a.op], k.a.root);
            snprintf(theirs, sizeof theirs, "%s %llu x %s %s root %d", kind_names[o.kind], (unsigned long long)o.count,
                     type_names[o.type], op_names[o.op], o.root);
            report("collective #%llu of the communicator: rank %d calls %s, rank %d calls %s (every rank must pass the "
                   "same)", (unsigned long long)k.a.seq, c->rank, mine, r, theirs);
        }
    }
    std::vector<char *> slots((size_t)W);
    for (int r = 0; r < W; r++) slots[r] = c->data + (size_t)r * c->chunk;
    char *mine = slots[c->rank];
    const char *send = (const char *)k.send;
    char *recv = (char *)k.recv;
    /* elements per round: one block each (all-reduce, broadcast, reduce, all-gather)
       or one block per destination rank (reduce-scatter) in each rank's staging */
    const size_t per = k.a.kind == REDUCE_SCATTER ? c->chunk / es / (size_t)W : c->chunk / es;
    std::vector<char> tmp;
    /* NCCL before 2.29.7 (issue 1950): with one rank a floating-point average runs a
       kernel whose min(32, bytes / 16 KiB) blocks each take floor(n / blocks) elements
       rounded up to a 16-byte pack, so the last few elements of an out-of-place output
       can stay unwritten (f64, 1000003 elements: the last 3). Kept as it was here. */
    size_t unwritten = 0;
    if (W == 1 && k.a.op == ncclAvg && is_float(k.a.type) && NCCL_VERSION_CODE < NCCL_VERSION(2, 29, 7) &&
        (k.a.kind == ALL_REDUCE || k.a.kind == REDUCE_SCATTER || k.a.kind == REDUCE) && send != recv) {
        const size_t blocks = std::min<size_t>(32, std::max<size_t>(1, (n * es + 16383) / 16384)), pack = 16 / es;
        const size_t covered = blocks * ((n / blocks + pack - 1) / pack * pack);
        if (covered < n) {
            unwritten = n - covered;
            tmp.assign(recv + covered * es, recv + n * es);
        }
    }
    for (size_t lo = 0; lo < n || (n == 0 && lo == 0); lo += per) {
        if (n == 0) break;
        const size_t m = n - lo < per ? n - lo : per;
        switch (k.a.kind) {
        case ALL_REDUCE: case REDUCE: memcpy(mine, send + lo * es, m * es); break;
        case BROADCAST: if (c->rank == k.a.root) memcpy(mine, send + lo * es, m * es); break;
        case ALL_GATHER: memcpy(mine, send + lo * es, m * es); break;
        case REDUCE_SCATTER:
            for (int q = 0; q < W; q++) memcpy(mine + (size_t)q * per * es, send + ((size_t)q * n + lo) * es, m * es);
            break;
        }
        if (!barrier(c, k)) return;
        switch (k.a.kind) {
        case ALL_REDUCE: reduce(recv + lo * es, slots.data(), W, m, k.a.type, k.a.op); break;
        case REDUCE:
            if (c->rank == k.a.root) reduce(recv + lo * es, slots.data(), W, m, k.a.type, k.a.op);
            break;
        case BROADCAST: memcpy(recv + lo * es, slots[k.a.root], m * es); break;
        case ALL_GATHER:
            for (int r = 0; r < W; r++) memcpy(recv + ((size_t)r * n + lo) * es, slots[r], m * es);
            break;
        case REDUCE_SCATTER: {
            std::vector<char *> mine_part((size_t)W);
            for (int r = 0; r < W; r++) mine_part[r] = slots[r] + (size_t)c->rank * per * es;
            reduce(recv + lo * es, mine_part.data(), W, m, k.a.type, k.a.op);
            break;
        }
        }
        if (!barrier(c, k)) return;
    }
    if (unwritten) memcpy(recv + (n - unwritten) * es, tmp.data(), unwritten * es);
}

/* Checks a collective's arguments and buffers, then queues it. */
ncclResult_t issue(int kind, const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                   ncclComm_t c, cudaStream_t user_stream)
{
    const char *call = kind_names[kind];
    entry guard(c, call);
    if (c->state == 0) finish_init(c);
    if (c->state != 1) {
        set_last(c, "%s before the communicator finished its init", call);
        return c->state == 2 ? (ncclResult_t)c->async.load() : ncclInvalidUsage;
    }
    if (c->async != ncclSuccess && c->async != ncclInProgress) return (ncclResult_t)c->async.load();
    if ((unsigned)type >= ncclNumTypes || (unsigned)op >= ncclNumOps ||
        ((kind == BROADCAST || kind == REDUCE) && (root < 0 || root >= c->nranks))) {
        set_last(c, "%s: invalid type %d, op %d or root %d", call, (int)type, (int)op, root);
        return ncclInvalidArgument;
    }
    const size_t es = type_sizes[type], W = (size_t)c->nranks, n = count * es;
    const bool root_only_send = kind == BROADCAST && c->rank != root, root_only_recv = kind == REDUCE && c->rank != root;
    const size_t sbytes = root_only_send ? 0 : kind == REDUCE_SCATTER ? n * W : n;
    const size_t rbytes = root_only_recv ? 0 : kind == ALL_GATHER ? n * W : n;
    collective k;
    memset(&k, 0, sizeof k);
    k.a.seq = c->issued + 1;
    k.a.kind = kind, k.a.type = type, k.a.op = kind == BROADCAST || kind == ALL_GATHER ? 0 : op;
    k.a.root = kind == BROADCAST || kind == REDUCE ? root : 0;
    k.a.count = count;
    k.send = send, k.recv = recv;
    char what[300];
    snprintf(what, sizeof what, "%s #%llu (%zu x %s) on rank %d: sendbuff", call, (unsigned long long)k.a.seq, count,
             type_names[type], c->rank);
    check_range(send, sbytes, c->device, 1, what);
    snprintf(what, sizeof what, "%s #%llu (%zu x %s) on rank %d: recvbuff", call, (unsigned long long)k.a.seq, count,
             type_names[type], c->rank);
    check_range(recv, rbytes, c->device, 1, what);
    /* in place is send == recv, or the rank's own block of the larger buffer */
    if (sbytes && rbytes) {
        const char *s = (const char *)send, *r = (const char *)recv;
        const bool overlap = s < r + rbytes && r < s + sbytes;
        const bool in_place = s == r || (kind == ALL_GATHER && s == r + c->rank * n) ||
                              (kind == REDUCE_SCATTER && r == s + c->rank * n);
        if (overlap && !in_place)
            report("%s #%llu on rank %d: sendbuff %p and recvbuff %p overlap without being in place", call,
                   (unsigned long long)k.a.seq, c->rank, send, recv);
    }
    cudaError_t e;
    stream *s = stream_of(user_stream, c->device, &e);
    if (!s) {
        set_last(c, "%s: the stream belongs to another device than the communicator's (device %d)", call, c->device);
        return ncclInvalidArgument;
    }
    c->issued++;
    k.hang = c->rank == hang_rank && (long long)k.a.seq == hang_k;
    k.error = c->rank == error_rank && (long long)k.a.seq == error_k ? error_code : 0;
    c->pending++;
    enqueue_waiting(s, call, [c, k]() {
        if (k.hang) { /* DDP_EMU_NCCL_HANG: this rank never arrives */
            while (!c->aborted) op_yield((const uint32_t *)&c->h->bell, c->h->bell.load());
        } else if (k.error) {
            set_last(c, "%s #%llu failed (DDP_EMU_NCCL_ERROR)", kind_names[k.a.kind], (unsigned long long)k.a.seq);
            c->async = k.error;
        } else if (!c->aborted) {
            run_collective(c, k);
        }
        c->pending--;
    });
    if (inject_inprogress > 0) {
        c->inprogress_left = inject_inprogress;
        return ncclInProgress;
    }
    return ncclSuccess;
}

/* Marks c gone (abort or destroy): its collectives end, its rank is left. */
void end_comm(ncclComm *c, const char *how)
{
    {
        std::lock_guard<std::mutex> lk(comms_mu); /* the engine's doorbells read it */
        snprintf(c->ended_by, sizeof c->ended_by, "%s on thread %d", how, (int)tid());
    }
    c->slots[c->rank].gone = 1;
    ring(c->h);
    wake_engine();
}
} // namespace

/* ---- API ---- */
ncclResult_t ncclGetVersion(int *version)
{
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    if (getrandom(id->internal, 16, 0) != 16) return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config)
{
    read_settings();
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    const int device = current_device("ncclCommInitRank");
    if (device < 0) return ncclUnhandledCudaError;
    ncclComm *c = new ncclComm();
    c->magic = COMM_MAGIC;
    c->rank = rank, c->nranks = nranks, c->device = device;
    c->blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
    c->chunk = chunk_bytes;
    char hex[33];
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
    snprintf(c->name, sizeof c->name, "/ddp-emu-nccl-%s", hex);
    const size_t size = sizeof(shm_header) + (size_t)nranks * sizeof(slot) + (size_t)nranks * c->chunk;
    c->fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
    if (c->fd < 0 || ftruncate(c->fd, (off_t)size) != 0) {
        set_last(c, "shm_open/ftruncate %s: %s", c->name, strerror(errno));
        return ncclSystemError;
    }
    char *m = (char *)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (m == MAP_FAILED) return ncclSystemError;
    c->h = (shm_header *)m;
    c->slots = (slot *)(m + sizeof(shm_header));
    c->data = m + sizeof(shm_header) + (size_t)nranks * sizeof(slot);
    uint32_t zero = 0;
    int32_t z32 = 0;
    uint64_t z64 = 0;
    c->h->magic.compare_exchange_strong(zero, SHM_MAGIC);
    c->h->nranks.compare_exchange_strong(z32, nranks);
    c->h->chunk.compare_exchange_strong(z64, c->chunk);
    if (c->h->nranks.load() != nranks || c->h->chunk.load() != c->chunk)
        report("ncclCommInitRank: rank %d says %d ranks and DDP_EMU_NCCL_CHUNK=%zu, an earlier rank %d ranks and %llu",
               rank, nranks, c->chunk, (int)c->h->nranks.load(), (unsigned long long)c->h->chunk.load());
    if (!rank_lock(c->fd, rank, F_OFD_SETLK))
        report("ncclCommInitRank: rank %d of this communicator is already taken (by pid %d)", rank,
               (int)c->slots[rank].pid.load());
    slot *me = &c->slots[rank];
    me->pid = getpid();
    me->phys = cfg.visible[device];
    host_id(me->host, sizeof me->host);
    me->joined = 1;
    c->h->joined.fetch_add(1);
    ring(c->h);
    c->async = ncclInProgress;
    {
        std::lock_guard<std::mutex> lk(comms_mu);
        comms.push_back(c);
    }
    set_idle_hook(doorbells);
    *out = c;
    finish_init(c);
    if (!c->blocking) {
        c->inprogress_left = inject_inprogress;
        return c->state == 2 ? (ncclResult_t)c->async.load() : ncclInProgress;
    }
    const double t0 = now_s();
    while (c->state == 0) {
        const uint32_t seen = c->h->bell.load();
        finish_init(c);
        if (c->state) break;
        if (now_s() - t0 > cfg.wait_limit)
            report("ncclCommInitRank: rank %d has waited %.0f s for the other %d ranks to join", rank, now_s() - t0,
                   nranks - (int)c->h->joined.load());
        struct timespec ts = {0, 10000000};
        syscall(SYS_futex, &c->h->bell, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
    return (ncclResult_t)c->async.load();
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err)
{
    entry guard(c, "ncclCommGetAsyncError");
    finish_init(c);
    if (c->inprogress_left > 0) {
        c->inprogress_left--;
        *err = ncclInProgress;
    } else if (c->state == 0) {
        *err = ncclInProgress;
    } else if (c->finalizing && c->pending > 0 && c->async == ncclSuccess) {
        *err = ncclInProgress;
    } else {
        *err = (ncclResult_t)c->async.load();
    }
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    entry guard(c, "ncclCommFinalize");
    c->finalizing = true;
    if (c->pending > 0) demand([c]() { return c->pending.load() == 0 || c->aborted.load(); });
    if (!c->blocking) return c->pending > 0 ? ncclInProgress : ncclSuccess;
    const double t0 = now_s();
    while (c->pending > 0 && !c->aborted) {
        if (now_s() - t0 > cfg.wait_limit) report("ncclCommFinalize: rank %d has waited %.0f s for its collectives", c->rank, now_s() - t0);
        usleep(1000);
    }
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    {
        entry guard(c, "ncclCommDestroy");
        if (c->pending > 0 && !c->aborted) {
            set_last(c, "ncclCommDestroy with %ld collectives not finished", c->pending.load());
            note("ncclCommDestroy on rank %d with %ld collectives not finished (call ncclCommFinalize first)", c->rank,
                 c->pending.load());
        }
    }
    end_comm(c, "ncclCommDestroy");
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
    {
        entry guard(c, "ncclCommAbort");
        c->aborted = true;
        if (c->pending > 0) demand([c]() { return c->pending.load() == 0; });
    }
    end_comm(c, "ncclCommAbort");
    const double t0 = now_s(); /* its collectives end at their next poll */
    while (c->pending > 0 && now_s() - t0 < 1.0) usleep(200);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *count)
{
    entry guard(c, "ncclCommCount");
    *count = c->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *device)
{
    entry guard(c, "ncclCommCuDevice");
    *device = c->device;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank)
{
    entry guard(c, "ncclCommUserRank");
    *rank = c->rank;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t c)
{
    if (!c) return "";
    entry guard(c, "ncclGetLastError");
    return c->last;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s)
{
    return issue(ALL_REDUCE, send, recv, count, type, op, 0, c, s);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t c,
                           cudaStream_t s)
{
    return issue(BROADCAST, send, recv, count, type, ncclSum, root, c, s);
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t c, cudaStream_t s)
{
    return issue(REDUCE, send, recv, count, type, op, root, c, s);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t c, cudaStream_t s)
{
    return issue(ALL_GATHER, send, recv, count, type, ncclSum, 0, c, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t s)
{
    return issue(REDUCE_SCATTER, send, recv, count, type, op, 0, c, s);
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; } /* each call in a group is queued as it comes */
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
