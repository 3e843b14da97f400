/* tests/emu/emu.cpp - the CUDA emulator's runtime: settings and reports, device memory,
   GPU threads as fibers, the block scheduler with its barrier and shuffle checks,
   streams and events, and the engine thread that runs queued work.

   How a launch runs. EMU_LAUNCH (cuda_runtime.h) copies the arguments and calls
   emu::launch, which checks the configuration and every pointer argument and queues
   the grid on its stream. Nothing runs yet: the engine thread starts queued work only
   when a host thread waits for something (a stream or device synchronisation, a
   blocking copy, an event or stream query, cudaFree) or when another process's NCCL
   rank waits for this one, as a GPU would go on working by itself. Of the operations
   ready to run (first in their stream, their events recorded) it starts the one
   issued last: a consumer on one stream that does not wait for its producer on
   another was issued after it, so it runs first and reads what was there before.

   A grid runs block by block in a shuffled order. In a block, a "runner" fiber starts
   the threads one after another (a thread that never waits costs one function call);
   a thread that reaches __syncthreads or a shuffle keeps its fiber and waits, and a
   new runner starts the remaining threads. When every live thread waits, the barrier
   is checked and released, and the threads go on in a new order. The fibers switch
   with a few instructions (x86-64; ucontext elsewhere). A kernel that spins on
   %globaltimer reads per-thread virtual clocks (globaltimer below), and its grid then
   lasts as long in wall time as the latest clock says.

   What is checked, each a one-line report and abort(): a barrier not reached by
   every live thread at the same place, a shuffle whose mask or partner lane does not
   take part, a deadlock, a kernel pointer argument that is not device memory of the
   launch's device (or mapped pinned memory), an access outside device memory (the
   pages around each allocation are inaccessible; the bytes between its end and the
   next 256-byte boundary are checked after each kernel), copies outside their
   allocations or against their direction, use of a destroyed stream or event, CUDA
   used in a process forked after its parent used it (a real error), and a host wait
   that makes no progress for DDP_EMU_WAIT_LIMIT seconds. Launch configurations that
   CUDA refuses return CUDA's error instead. */
#include "emu_internal.h"
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <linux/futex.h>
#include <map>
#include <mutex>
#include <pthread.h>
#include <set>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace emu {
settings cfg;
unsigned long long block_serial;
thread_local const char *call_name = "";

static const size_t page = 4096;
static std::atomic<bool> cuda_used; /* this process has initialised CUDA (for the fork rule); any thread sets it */
static bool forked_after_use;
static thread_local cudaError_t last_error;

/* ---- reports ---------------------------------------------------------------------- */
static void vsay(const char *fmt, va_list ap)
{
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "emu: ");
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    fflush(stdout);
    if (write(2, buf, (size_t)n) < 0) {}
}

void report(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay(fmt, ap);
    va_end(ap);
    abort();
}

void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay(fmt, ap);
    va_end(ap);
}

double now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void set_error(cudaError_t e)
{
    if (e != cudaSuccess) last_error = e;
}

pid_t tid() { return (pid_t)syscall(SYS_gettid); }

/* ---- settings --------------------------------------------------------------------- */
static long long env_number(const char *name, long long def, long long lo, long long hi)
{
    const char *v = getenv(name);
    char *end;
    long long x;
    if (!v || !*v) return def;
    errno = 0;
    x = strtoll(v, &end, 10);
    if (errno || *end || x < lo || x > hi) report("%s='%s': want an integer from %lld to %lld", name, v, lo, hi);
    return x;
}

static void at_exit();
static void on_fault(int sig, siginfo_t *si, void *uc);
static void after_fork() { forked_after_use = cuda_used.load(std::memory_order_relaxed); }

static void read_settings()
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    struct sigaction sa;
    cfg.devices = (int)env_number("DDP_EMU_DEVICES", 8, 0, 64);
    cfg.seed = (unsigned long long)env_number("DDP_EMU_SEED", 1, 0, LLONG_MAX);
    cfg.sample = (int)env_number("DDP_EMU_SAMPLE", 0, 0, 1);
    cfg.fill_limit = (size_t)env_number("DDP_EMU_FILL_LIMIT", 256ll << 20, 0, LLONG_MAX);
    cfg.wait_limit = (double)env_number("DDP_EMU_WAIT_LIMIT", 300, 1, 1000000);
    cfg.strict_devices = (int)env_number("DDP_EMU_STRICT_DEVICES", 0, 0, 1);
    cfg.touch_log = getenv("DDP_EMU_TOUCH_LOG");
    /* CUDA_VISIBLE_DEVICES: the listed ordinals, up to the first that does not exist */
    cfg.nvisible = 0;
    if (!vis) {
        for (int i = 0; i < cfg.devices; i++) cfg.visible[cfg.nvisible++] = i;
    } else {
        const char *p = vis;
        while (*p && cfg.nvisible < 64) {
            char *end;
            long d = strtol(p, &end, 10);
            if (end == p || d < 0 || d >= cfg.devices) break;
            cfg.visible[cfg.nvisible++] = (int)d;
            p = end;
            while (*p == ' ') p++;
            if (*p != ',') break;
            p++;
        }
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    atexit(at_exit);
    pthread_atfork(NULL, NULL, after_fork);
}

void init()
{
    static std::once_flag once;
    std::call_once(once, read_settings);
}

/* Entry of every call that needs CUDA: 0 when the call may go on. */
static cudaError_t enter(const char *call)
{
    init();
    call_name = call;
    if (forked_after_use) {
        static bool said;
        if (!said) note("%s in a process forked after its parent used CUDA: CUDA fails here as on a GPU", call);
        said = true;
        return cudaErrorInitializationError;
    }
    cuda_used.store(true, std::memory_order_relaxed);
    return cudaSuccess;
}

/* ---- devices ---------------------------------------------------------------------- */
struct device_state {
    bool touched;
    char how[200]; /* what touched it first */
    size_t used;   /* bytes allocated */
};
static device_state devs[64];
static std::mutex dev_mu;
static thread_local int tl_device = -1;

static void touch(int d, const char *call, bool implicit)
{
    std::lock_guard<std::mutex> lk(dev_mu);
    if (devs[d].touched) return;
    devs[d].touched = true;
    snprintf(devs[d].how, sizeof devs[d].how, "%s on thread %d%s%s", call, (int)tid(),
             tid() == getpid() ? " (the main thread)" : "", implicit ? ", which never called cudaSetDevice" : "");
    if (cfg.strict_devices)
        for (int o = 0; o < cfg.nvisible; o++)
            if (o != d && devs[o].touched)
                report("process %d touched device %d by %s, but it already uses device %d (first by %s) "
                       "(DDP_EMU_STRICT_DEVICES=1: one device per process)", (int)getpid(), d, devs[d].how, o,
                       devs[o].how);
}

int current_device(const char *call)
{
    if (cfg.nvisible == 0) return -1;
    bool implicit = tl_device < 0;
    if (implicit) tl_device = 0;
    touch(tl_device, call, implicit);
    return tl_device;
}

/* ---- memory ----------------------------------------------------------------------- */
/* An allocation is a mapping [guard page][slack | user bytes | tail][guard page]: the
   user bytes end on a 256-byte boundary just before the second guard page, so a read
   or write past the end faults or lands in checked slack. */
struct alloc {
    char *base;      /* what the program got */
    size_t size;     /* what it asked for */
    size_t span;     /* size rounded up to 256 */
    char *map;       /* the whole mapping */
    size_t maplen;
    int device;      /* -1 for pinned host memory */
    mem_kind kind;
    unsigned long long id;
    bool live;
};
static std::mutex mem_mu;
/* The emulator's containers live on the heap and are never destroyed: the engine may
   still be running when the program exits, and must not find them torn down. */
static auto &live_allocs = *new std::map<uintptr_t, alloc *>; /* by the start of their mapping */
static auto &freed_allocs = *new std::deque<alloc *>;         /* kept inaccessible to name a use after free */
static size_t freed_bytes;
static unsigned long long alloc_serial;

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

/* the allocation whose mapping holds p (live, or freed and still kept), under mem_mu */
static alloc *mapping_of(const void *p, bool freed_too)
{
    uintptr_t a = (uintptr_t)p;
    auto it = live_allocs.upper_bound(a);
    if (it != live_allocs.begin()) {
        alloc *x = (--it)->second;
        if (a < (uintptr_t)x->map + x->maplen) return x;
    }
    if (freed_too)
        for (alloc *x : freed_allocs)
            if (a >= (uintptr_t)x->map && a < (uintptr_t)x->map + x->maplen) return x;
    return NULL;
}

static std::string describe_locked(const void *p)
{
    char buf[300];
    alloc *x = mapping_of(p, true);
    const char *what = x && x->kind == MEM_PINNED ? "pinned host memory" : "device memory";
    if (!x) return "host memory (not from cudaMalloc or cudaMallocHost)";
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)x->base;
    char dev[32] = "";
    if (x->kind == MEM_DEVICE) snprintf(dev, sizeof dev, " of device %d", x->device);
    if (!x->live)
        snprintf(buf, sizeof buf, "freed %s%s (allocation #%llu of %zu bytes, offset %lld)", what, dev, x->id, x->size,
                 (long long)(a - b));
    else if (a < b)
        snprintf(buf, sizeof buf, "%llu bytes before the start of %s%s (allocation #%llu of %zu bytes)",
                 (unsigned long long)(b - a), what, dev, x->id, x->size);
    else if (a >= b + x->size)
        snprintf(buf, sizeof buf, "%llu bytes past the end of %s%s (allocation #%llu of %zu bytes)",
                 (unsigned long long)(a - b - x->size), what, dev, x->id, x->size);
    else
        snprintf(buf, sizeof buf, "%s%s (allocation #%llu of %zu bytes, offset %llu)", what, dev, x->id, x->size,
                 (unsigned long long)(a - b));
    return buf;
}

std::string describe(const void *p)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    return describe_locked(p);
}

int in_memory(const void *p, size_t bytes, int device, int pinned_ok, std::string *why)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    alloc *x = mapping_of(p, true);
    char buf[200];
    if (x && x->live && (uintptr_t)p >= (uintptr_t)x->base && (uintptr_t)p + bytes <= (uintptr_t)x->base + x->size &&
        (uintptr_t)p + bytes >= (uintptr_t)p) {
        if (x->kind == MEM_PINNED && pinned_ok) return 1;
        if (x->kind == MEM_DEVICE && (device < 0 || x->device == device)) return 1;
    }
    if (why) {
        *why = describe_locked(p);
        if (x && x->live && (uintptr_t)p >= (uintptr_t)x->base && (uintptr_t)p < (uintptr_t)x->base + x->size) {
            if ((uintptr_t)p + bytes > (uintptr_t)x->base + x->size) {
                snprintf(buf, sizeof buf, "; the range ends %llu bytes past its end",
                         (unsigned long long)((uintptr_t)p + bytes - (uintptr_t)x->base - x->size));
                *why += buf;
            } else if (x->kind == MEM_DEVICE) {
                snprintf(buf, sizeof buf, ", not of device %d", device);
                *why += buf;
            } else {
                *why += ", which this call cannot use";
            }
        }
    }
    return 0;
}

void check_range(const void *p, size_t bytes, int device, int pinned_ok, const char *what)
{
    std::string why;
    if (bytes == 0 || in_memory(p, bytes, device, pinned_ok, &why)) return;
    report("%s: %zu bytes at %p: %s", what, bytes, p, why.c_str());
}

mem_kind kind_of(const void *p, int *device)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    alloc *x = mapping_of(p, false);
    if (!x || (uintptr_t)p < (uintptr_t)x->base || (uintptr_t)p >= (uintptr_t)x->base + x->size) return (mem_kind)-1;
    if (device) *device = x->device;
    return x->kind;
}

static void *allocate(size_t size, int device, mem_kind kind)
{
    alloc *x = new alloc();
    x->size = size;
    x->span = round_up(size, 256);
    const size_t data = round_up(x->span, page);
    x->maplen = data + 2 * page;
    x->map = (char *)mmap(NULL, x->maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (x->map == MAP_FAILED) {
        delete x;
        return NULL;
    }
    mprotect(x->map, page, PROT_NONE);
    mprotect(x->map + page + data, page, PROT_NONE);
    x->base = x->map + page + data - x->span;
    /* never-written memory reads as NaN (or -1); very large buffers stay untouched
       beyond the fill limit, so GPT-2-sized ones cost no memory until used */
    memset(x->map + page, 0xff, (size_t)(x->base - x->map - page) + std::min(size, cfg.fill_limit));
    memset(x->base + size, 0xff, x->span - size);
    x->device = device;
    x->kind = kind;
    x->live = true;
    std::lock_guard<std::mutex> lk(mem_mu);
    x->id = ++alloc_serial;
    live_allocs[(uintptr_t)x->map] = x;
    return x->base;
}

/* Makes the allocation at base inaccessible (a later use faults and is named), or
   returns 0 when base is not the start of a live allocation of that kind. */
static int release(void *base, mem_kind kind, int *device, size_t *size)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    alloc *x = mapping_of(base, false);
    if (!x || x->base != base || x->kind != kind) return 0;
    live_allocs.erase((uintptr_t)x->map);
    *device = x->device;
    *size = x->size;
    x->live = false;
    mprotect(x->map, x->maplen, PROT_NONE);
    madvise(x->map, x->maplen, MADV_DONTNEED);
    freed_allocs.push_back(x);
    freed_bytes += x->maplen;
    while (freed_bytes > ((size_t)64 << 30) && !freed_allocs.empty()) { /* address space only */
        alloc *old = freed_allocs.front();
        freed_allocs.pop_front();
        freed_bytes -= old->maplen;
        munmap(old->map, old->maplen);
        delete old;
    }
    return 1;
}

/* After a kernel: the slack around each allocation it was given must be untouched. */
static void check_slack(const void *p, const kernel_site &site)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    alloc *x = mapping_of(p, false);
    if (!x) return;
    for (const char *q = x->map + page; q < x->base; q++)
        if ((unsigned char)*q != 0xff)
            report("kernel %s (%s:%d) wrote %lld bytes before the start of device memory (allocation #%llu of %zu bytes)",
                   site.name, site.file, site.line, (long long)(x->base - q), x->id, x->size);
    for (const char *q = x->base + x->size; q < x->base + x->span; q++)
        if ((unsigned char)*q != 0xff)
            report("kernel %s (%s:%d) wrote past the end of device memory: byte %lld of allocation #%llu of %zu bytes",
                   site.name, site.file, site.line, (long long)(q - x->base), x->id, x->size);
}


/* ---- fibers ----------------------------------------------------------------------- */
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define EMU_TSAN 1 /* ThreadSanitizer follows each fiber as a thread of its own, told at every switch */
#endif
/* A fiber is a stack and a saved stack pointer. The switch saves the callee-saved
   registers, MXCSR and the x87 control word on the old stack, stores its pointer,
   and restores the same from the new one: what the ABI says survives a call. */
struct fiber {
    void *sp;
    char *stack = nullptr; /* lowest usable byte; a guard page lies below (none: a thread's own context) */
    void *carries; /* the GPU thread it runs now */
    void *tsan = nullptr; /* ThreadSanitizer's fiber (for a thread's own context, taken as it switches away) */
#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
    ucontext_t uc;
#endif
};
static const size_t stack_size = 256 << 10;
static auto &spare_stacks = *new std::vector<char *>;
static auto &stack_guards = *new std::vector<std::pair<char *, char *>>; /* for naming an overflow */

#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
extern "C" void emu_switch(void **save_sp, void *to_sp);
extern "C" void emu_fiber_start(void);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
    .globl emu_fiber_start
    .type emu_fiber_start, @function
emu_fiber_start:
    .cfi_startproc
    .cfi_undefined rip
    movq %rbx, %rdi
    callq *%r12
    ud2
    .cfi_endproc
    .size emu_fiber_start, .-emu_fiber_start
)");
#endif

static char *new_stack()
{
    if (!spare_stacks.empty()) {
        char *s = spare_stacks.back();
        spare_stacks.pop_back();
        return s;
    }
    char *m = (char *)mmap(NULL, stack_size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                           -1, 0);
    if (m == MAP_FAILED) report("out of memory for a GPU thread's stack");
    mprotect(m, page, PROT_NONE);
    stack_guards.push_back({m, m + page});
    return m + page;
}

/* Prepares f to run entry(arg) on a fresh stack at its first switch. */
static void fiber_init(fiber *f, void (*entry)(void *), void *arg)
{
    f->stack = new_stack();
#ifdef EMU_TSAN
    f->tsan = __tsan_create_fiber(0);
#endif
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
    uint64_t *top = (uint64_t *)(f->stack + stack_size); /* 16-byte aligned */
    uint64_t *sp = top - 10;
    uint32_t mxcsr;
    uint16_t fpucw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    sp[0] = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
    sp[1] = 0;                           /* r15 */
    sp[2] = 0;                           /* r14 */
    sp[3] = 0;                           /* r13 */
    sp[4] = (uint64_t)(uintptr_t)entry;  /* r12: called by emu_fiber_start */
    sp[5] = (uint64_t)(uintptr_t)arg;    /* rbx: its argument */
    sp[6] = 0;                           /* rbp */
    sp[7] = (uint64_t)(uintptr_t)emu_fiber_start; /* the ret of emu_switch lands here */
    sp[8] = sp[9] = 0;
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = stack_size;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, (void (*)())entry, 1, arg); /* one pointer-sized argument (glibc passes it whole) */
#endif
}

static void fiber_switch(fiber *from, fiber *to)
{
#ifdef EMU_TSAN /* without it, its record of the one thread's calls grew past its limit, and it aborted */
    if (!from->stack) from->tsan = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(to->tsan, 0); /* the switch orders what from did before what to does next */
#endif
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
    emu_switch(&from->sp, to->sp);
#else
    swapcontext(&from->uc, &to->uc);
#endif
}

static void fiber_free(fiber *f)
{
#ifdef EMU_TSAN
    __tsan_destroy_fiber(f->tsan);
    f->tsan = nullptr;
#endif
    spare_stacks.push_back(f->stack);
    f->stack = NULL;
}

/* ---- the block scheduler ---------------------------------------------------------- */
enum thread_state { T_NEW, T_RUN, T_BARRIER, T_SHUFFLE, T_DONE };
struct gpu_thread {
    uint3 idx;
    int state;
    fiber *f;
    const char *file; /* where it waits */
    int line;
    /* a shuffle in progress */
    int kind, arg, width;
    unsigned mask;
    uint64_t bits, out;
    unsigned long long vt; /* ns of %globaltimer since the grid started, by this thread's clock */
};
struct kernel_op {
    kernel_site site;
    dim3 grid, block;
    void (*body)(void *);
    void *closure;
    void (*drop)(void *);
    std::vector<const void *> ptrs;
};
/* The shuffles a warp is in the middle of (lanes with disjoint masks may shuffle at
   different places) and which of its lanes have exited or wait at a barrier. */
struct warp_group {
    const char *file;
    int line;
    unsigned mask, arrived;
};
struct warp_state {
    unsigned done, at_barrier;
    int ngroups;
    warp_group g[32];
};
struct block_run {
    const kernel_op *k;
    int n;                        /* threads */
    std::vector<gpu_thread> t;
    std::vector<warp_state> warps;
    std::vector<int> start_order; /* the order in which runners start threads */
    int next_new;
    int live;
    std::deque<fiber *> ready;
    std::vector<fiber> fibers;    /* every fiber made for this block (reserved: they do not move) */
    std::vector<int> order;       /* the order a barrier releases the threads in */
    fiber sched;                  /* the scheduler's own context */
    fiber *running;
    fiber *finished;              /* a runner out of threads, for the scheduler to free */
    gpu_thread *current;
    unsigned long long phase;
};
static block_run *blk;           /* the block being run (the engine thread only) */
static double grid_start;        /* now_s() when the grid started */
static unsigned long long grid_vt; /* the latest any of its threads' clocks reached */
static volatile int in_kernel;   /* for the fault handler */
static thread_local bool device_math; /* this thread runs a grid: CUDA's math functions (below) */

static unsigned long long mix(unsigned long long x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* "thread (x,y,z)", for a report (four at a time) */
static const char *tname(const gpu_thread *t)
{
    static char buf[4][48];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "thread (%u,%u,%u)", t->idx.x, t->idx.y, t->idx.z);
    return b;
}

[[noreturn]] static void kernel_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void kernel_report(const char *fmt, ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    report("kernel %s (launched at %s:%d), block (%u,%u,%u) of (%u,%u,%u): %s", blk->k->site.name, blk->k->site.file,
           blk->k->site.line, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, msg);
}

static int linear(const gpu_thread *t) { return (int)(t - &blk->t[0]); }

void misaligned(const char *file, int line, const void *p, size_t align)
{
    if (!in_kernel) return; /* host code: the CPU's own rules */
    kernel_report("%s: a %zu-byte vector access to %p at %s:%d, not %zu-byte aligned (cudaErrorMisalignedAddress on a GPU)",
                  tname(blk->current), align, p, file, line, align);
}

/* Every static __shared__ array a block reaches counts against the 48 KB a kernel may
   declare (ptxas refuses more: "uses too much shared data"); then it is poisoned. */
void poison_shared(void *p, size_t bytes)
{
    static unsigned long long serial;
    static size_t total;
    if (serial != block_serial) serial = block_serial, total = 0;
    total += bytes;
    if (total > 48 * 1024 && blk)
        kernel_report("%zu bytes of static shared memory: more than the 48 KB a kernel may declare (ptxas: uses too "
                      "much shared data)", total);
    memset(p, 0xff, bytes);
}

void launch_bounds(const char *file, int line, unsigned max)
{
    const unsigned long n = (unsigned long)blockDim.x * blockDim.y * blockDim.z;
    if (!in_kernel || n <= max) return;
    kernel_report("blocks of %lu threads, but the kernel at %s:%d is declared __launch_bounds__(%u): a GPU refuses the "
                  "launch (cudaErrorLaunchOutOfResources)", n, file, line, max);
}

static void runner_entry(void *);

static fiber *new_runner()
{
    if (blk->fibers.size() == blk->fibers.capacity()) report("internal: more runner fibers than threads");
    blk->fibers.emplace_back(); /* within the capacity reserved: a runner starts a thread before it blocks */
    fiber *f = &blk->fibers.back();
    fiber_init(f, runner_entry, NULL);
    f->carries = NULL;
    return f;
}

/* The calling thread waits: hand the CPU straight to the next fiber (a runner for
   threads not started yet first, so that every thread starts in the phase's order),
   or to the scheduler when nobody can run. Returns when this thread is resumed. */
static void yield_thread()
{
    fiber *me = blk->running, *next = &blk->sched;
    if (blk->next_new < blk->n) {
        next = new_runner();
    } else if (!blk->ready.empty()) {
        next = blk->ready.front();
        blk->ready.pop_front();
    }
    blk->running = next;
    fiber_switch(me, next);
    blk->running = me;
}

static int lowest(unsigned bits) { return __builtin_ctz(bits); }

/* A lane leaves for a barrier or exits: no shuffle of its warp may be waiting for it. */
static void leaving(gpu_thread *me, const char *going)
{
    const int l = linear(me), lane = l % 32;
    const warp_state &ws = blk->warps[l / 32];
    for (int i = 0; i < ws.ngroups; i++)
        if (ws.g[i].mask >> lane & 1) {
            const gpu_thread *o = &blk->t[l / 32 * 32 + lowest(ws.g[i].arrived)];
            kernel_report("%s %s while %s (lane %d) waits for it in a warp shuffle at %s:%d (mask 0x%08x): "
                          "every lane of a shuffle's mask must execute that shuffle", tname(me), going, tname(o),
                          lowest(ws.g[i].arrived), ws.g[i].file, ws.g[i].line, ws.g[i].mask);
        }
}

static void thread_finished(gpu_thread *t)
{
    t->state = T_DONE;
    blk->live--;
    leaving(t, "exited");
    blk->warps[linear(t) / 32].done |= 1u << (linear(t) % 32);
}

static void runner_entry(void *)
{
    for (;;) {
        if (blk->next_new >= blk->n) break;
        gpu_thread *t = &blk->t[blk->start_order[blk->next_new++]];
        t->state = T_RUN;
        t->f = blk->running;
        t->f->carries = t;
        blk->current = t;
        threadIdx = t->idx;
        blk->k->body(blk->k->closure);
        thread_finished(t);
    }
    blk->finished = blk->running; /* out of threads: the scheduler frees this fiber */
    fiber_switch(blk->running, &blk->sched);
    __builtin_unreachable();
}

void barrier(const char *file, int line)
{
    if (!in_kernel) report("__syncthreads called outside a kernel (%s:%d)", file, line);
    gpu_thread *me = blk->current;
    me->file = file;
    me->line = line;
    leaving(me, "reached __syncthreads");
    blk->warps[linear(me) / 32].at_barrier |= 1u << (linear(me) % 32);
    me->state = T_BARRIER;
    yield_thread();
    blk->current = me;
    threadIdx = me->idx;
}

/* the lane whose value lane j receives */
static int shuffle_source(const gpu_thread *t, int j)
{
    const int w = t->width, seg = j & ~(w - 1);
    switch (t->kind) {
    case SHFL_XOR: return seg + ((j ^ t->arg) & (w - 1));
    case SHFL_DOWN: return (j & (w - 1)) + t->arg < w ? j + t->arg : j;
    case SHFL_UP: return (j & (w - 1)) - t->arg >= 0 ? j - t->arg : j;
    case SHFL_IDX: return seg + (t->arg & (w - 1));
    default: return j;
    }
}

uint64_t shuffle(const char *file, int line, shfl_kind kind, unsigned mask, uint64_t bits, int arg, int width)
{
    if (!in_kernel) report("a warp shuffle called outside a kernel (%s:%d)", file, line);
    gpu_thread *me = blk->current;
    const int l = linear(me), w0 = l / 32 * 32, lane = l % 32;
    if (width < 1 || width > 32 || (width & (width - 1)))
        kernel_report("%s: shuffle width %d at %s:%d is not a power of two up to 32", tname(me), width, file, line);
    if (!(mask >> lane & 1))
        kernel_report("%s (lane %d) calls a warp shuffle at %s:%d with mask 0x%08x, which leaves itself out", tname(me),
                      lane, file, line, mask);
    me->kind = kind, me->arg = arg, me->width = width, me->mask = mask, me->bits = bits;
    me->file = file, me->line = line;
    /* every lane of the mask must reach this same shuffle with the same mask */
    warp_state &ws = blk->warps[l / 32];
    const unsigned exists = blk->n - w0 >= 32 ? ~0u : (1u << (blk->n - w0)) - 1;
    if (mask & ~exists)
        kernel_report("%s: the shuffle at %s:%d names lane %d in mask 0x%08x, but the block has no such thread",
                      tname(me), file, line, lowest(mask & ~exists), mask);
    if (mask & ws.done)
        kernel_report("%s (lane %d) shuffles at %s:%d with mask 0x%08x, but %s (lane %d) has exited", tname(me), lane,
                      file, line, mask, tname(&blk->t[w0 + lowest(mask & ws.done)]), lowest(mask & ws.done));
    if (mask & ws.at_barrier) {
        const gpu_thread *o = &blk->t[w0 + lowest(mask & ws.at_barrier)];
        kernel_report("%s (lane %d) shuffles at %s:%d with mask 0x%08x, but %s (lane %d) waits at __syncthreads at "
                      "%s:%d", tname(me), lane, file, line, mask, tname(o), lowest(mask & ws.at_barrier), o->file,
                      o->line);
    }
    warp_group *g = NULL;
    for (int i = 0; i < ws.ngroups; i++) {
        warp_group &x = ws.g[i];
        if (x.mask == mask && x.file == file && x.line == line) {
            g = &x;
        } else if (x.mask & mask) {
            const gpu_thread *o = &blk->t[w0 + lowest(x.arrived)];
            kernel_report("divergent warp shuffles: %s (lane %d) at %s:%d with mask 0x%08x, %s (lane %d) at %s:%d "
                          "with mask 0x%08x", tname(me), lane, file, line, mask, tname(o), lowest(x.arrived), x.file,
                          x.line, x.mask);
        }
    }
    if (!g) {
        g = &ws.g[ws.ngroups++];
        g->file = file, g->line = line, g->mask = mask, g->arrived = 0;
    }
    g->arrived |= 1u << lane;
    if (g->arrived != mask) {
        me->state = T_SHUFFLE;
        yield_thread();
        blk->current = me;
        threadIdx = me->idx;
        return me->out;
    }
    /* the last lane to arrive exchanges for all */
    *g = ws.g[--ws.ngroups];
    for (unsigned m = mask; m; m &= m - 1) {
        const int j = lowest(m);
        gpu_thread *o = &blk->t[w0 + j];
        if (kind == SHFL_SYNCWARP) continue;
        const int src = shuffle_source(o, j);
        if (!(mask >> src & 1))
            kernel_report("%s (lane %d) reads lane %d in the shuffle at %s:%d, which is not in its mask 0x%08x (the "
                          "value is undefined)", tname(o), j, src, file, line, mask);
        o->out = blk->t[w0 + src].bits;
    }
    /* the woken lanes wait behind every thread ready to run, or (a seeded draw for each
       warp between two barriers) go first: their warp then runs ahead of the others
       through its shuffles, as warps do on a GPU, so that a barrier missing between the
       block's reads of shared memory and a warp's next write to it shows */
    const bool ahead = mix(cfg.seed ^ blk->phase * 0x9e3779b1ull ^ (unsigned long long)(w0 / 32) << 40 ^
                           block_serial << 20) & 1;
    for (unsigned m = mask & ~(1u << lane); m; m &= m - 1) {
        gpu_thread *o = &blk->t[w0 + lowest(m)];
        o->state = T_RUN;
        if (ahead) blk->ready.push_front(o->f);
        else blk->ready.push_back(o->f);
    }
    return me->out;
}

/* %globaltimer, which a kernel reads to spin for a while (inline PTX that rewrite.pl
   turns into this call). Threads run one after another here, so wall time cannot be
   their clock: each thread has its own, from the grid's start, and every read moves it
   on by 1/64 of its value (at least 1 us), so a spin of t ns costs about 64 ln(t/1us)
   reads instead of t ns per thread. A barrier sets a block's clocks to the latest; all
   blocks start together, as on a GPU with room for them; and the grid ends, in wall
   time, no earlier than its latest clock says (run_grid waits for it). */
unsigned long long globaltimer()
{
    if (!in_kernel) report("%%globaltimer read outside a kernel");
    gpu_thread *me = blk->current;
    const unsigned long long t = (unsigned long long)(grid_start * 1e9) + me->vt;
    me->vt += std::max(1000ull, me->vt / 64);
    grid_vt = std::max(grid_vt, me->vt);
    return t;
}

/* CUDA's expf, tanhf and rsqrtf are accurate to 2 units in the last place and logf to 1,
   where glibc's come close to rounding to nearest: in a kernel each result is either float
   next to the exact value t (in double), drawn from the seed, the function and the argument,
   so one argument always gives one result (as on a GPU), and code that holds only for
   glibc's roundings fails here as it would there. Where t is a float (expf(0), logf(1)),
   infinite, NaN or subnormal, or where tanhf saturates at +-1, the result is glibc's, r;
   so is every call from host code. */
static float faithful(float r, double t, unsigned fn, float x)
{
    uint32_t bits;
    const float n = (float)t; /* t to nearest */
    if (!std::isfinite(r) || !std::isfinite(t) || std::fabs(t) < FLT_MIN || (double)n == t) return r;
    const float lo = (double)n < t ? n : std::nextafter(n, -INFINITY), hi = (double)n < t ? std::nextafter(n, INFINITY) : n;
    if (!std::isfinite(lo) || !std::isfinite(hi)) return r;
    memcpy(&bits, &x, sizeof bits);
    return mix(cfg.seed ^ (unsigned long long)fn << 32 ^ bits) & 1 ? hi : lo;
}
float device_rsqrtf(float x)
{
    const double t = 1.0 / std::sqrt((double)x);
    return device_math ? faithful((float)t, t, 4, x) : 1.0f / sqrtf(x);
}

/* All live threads wait: release a barrier, or report why nothing can move. */
static void release_or_report()
{
    gpu_thread *first_bar = NULL, *first_done = NULL;
    for (size_t w = 0; w < blk->warps.size(); w++)
        if (blk->warps[w].ngroups) { /* a shuffle that cannot complete: who is missing? */
            const warp_group &g = blk->warps[w].g[0];
            const int j = lowest(g.mask & ~g.arrived);
            const gpu_thread *o = &blk->t[w * 32 + (size_t)j];
            kernel_report("deadlock: %s waits in a warp shuffle at %s:%d (mask 0x%08x) for %s (lane %d), which %s",
                          tname(&blk->t[w * 32 + (size_t)lowest(g.arrived)]), g.file, g.line, g.mask, tname(o), j,
                          o->state == T_DONE ? "has exited" : o->state == T_BARRIER ? "waits at __syncthreads"
                                                                                   : "waits in another shuffle");
        }
    for (gpu_thread &t : blk->t) {
        if (t.state == T_BARRIER && !first_bar) first_bar = &t;
        if (t.state == T_DONE && !first_done) first_done = &t;
    }
    for (gpu_thread &t : blk->t)
        if (t.state == T_BARRIER && (t.file != first_bar->file || t.line != first_bar->line))
            kernel_report("divergent __syncthreads: %s waits at %s:%d, %s at %s:%d (every thread of the block must "
                          "reach the same barrier)", tname(first_bar), first_bar->file, first_bar->line, tname(&t),
                          t.file, t.line);
    if (first_done)
        kernel_report("%s waits at __syncthreads at %s:%d, but %s has exited: a barrier that not every thread of the "
                      "block reaches", tname(first_bar), first_bar->file, first_bar->line, tname(first_done));
    /* release in a new order: a permutation drawn for this phase */
    blk->phase++;
    std::vector<int> &order = blk->order;
    order.resize((size_t)blk->n);
    for (int i = 0; i < blk->n; i++) order[i] = i;
    unsigned long long r = mix(cfg.seed ^ blk->phase * 0x51ed27ull ^ block_serial);
    for (int i = blk->n - 1; i > 0; i--) {
        r = mix(r);
        std::swap(order[i], order[r % (unsigned long long)(i + 1)]);
    }
    unsigned long long vt = 0; /* a barrier waits for the latest clock */
    for (const gpu_thread &t : blk->t) vt = std::max(vt, t.vt);
    for (int i : order) {
        gpu_thread *t = &blk->t[i];
        if (t->state != T_BARRIER) continue;
        t->state = T_RUN;
        t->vt = vt;
        blk->ready.push_back(t->f);
    }
    for (warp_state &w : blk->warps) w.at_barrier = 0;
}

static void run_block(const kernel_op *k, uint3 b, block_run *run)
{
    const int n = (int)(k->block.x * k->block.y * k->block.z);
    blk = run;
    run->k = k;
    run->n = n;
    run->t.assign((size_t)n, gpu_thread());
    run->warps.assign((size_t)(n + 31) / 32, warp_state());
    for (int i = 0; i < n; i++) {
        gpu_thread &t = run->t[i];
        t.idx = uint3{(unsigned)i % k->block.x, (unsigned)i / k->block.x % k->block.y,
                      (unsigned)i / (k->block.x * k->block.y)};
        t.state = T_NEW;
    }
    /* the first phase starts the threads last to first */
    run->start_order.resize((size_t)n);
    for (int i = 0; i < n; i++) run->start_order[i] = n - 1 - i;
    run->next_new = 0;
    run->live = n;
    run->phase = 0;
    run->current = NULL;
    run->ready.clear();
    run->fibers.clear();
    run->fibers.reserve((size_t)n + 1);
    blockIdx = b;
    block_serial++;
    for (;;) {
        fiber *f = NULL;
        if (run->next_new < n) {
            f = new_runner();
        } else if (!run->ready.empty()) {
            f = run->ready.front();
            run->ready.pop_front();
        } else if (run->live == 0) {
            break;
        } else {
            release_or_report(); /* every live thread waits */
            continue;
        }
        run->running = f;
        run->finished = NULL;
        fiber_switch(&run->sched, f); /* back when a runner runs out of threads, or nobody can run */
        if (run->finished) fiber_free(run->finished);
    }
}

/* Which blocks run: all of them in a shuffled order (a bijection of the block index
   through a Feistel network, so a huge grid needs no table), or with DDP_EMU_SAMPLE
   the corners of the grid and two more. */
static unsigned long long permute(unsigned long long i, unsigned long long n, unsigned long long key)
{
    if (n <= 1) return i;
    int bits = 1;
    while ((1ull << bits) < n) bits++;
    const int h = (bits + 1) / 2;
    const unsigned long long m = (1ull << h) - 1;
    do {
        unsigned long long L = i >> h, R = i & m;
        for (int r = 0; r < 4; r++) {
            unsigned long long t = L ^ (mix(R ^ key ^ (unsigned long long)r << 56) & m);
            L = R;
            R = t;
        }
        i = L << h | R;
    } while (i >= n);
    return i;
}

static void run_grid(kernel_op *k)
{
    static block_run &run = *new block_run;
    const unsigned long long gx = k->grid.x, gy = k->grid.y, gz = k->grid.z, total = gx * gy * gz;
    std::vector<unsigned long long> sample;
    gridDim = k->grid;
    blockDim = k->block;
    if (cfg.sample && total > 8) {
        const unsigned long long xs[2] = {0, gx - 1}, ys[2] = {0, gy - 1}, zs[2] = {0, gz - 1};
        for (int z = 0; z < (gz > 1 ? 2 : 1); z++)
            for (int y = 0; y < (gy > 1 ? 2 : 1); y++)
                for (int x = 0; x < (gx > 1 ? 2 : 1); x++) sample.push_back(xs[x] + gx * (ys[y] + gy * zs[z]));
        for (int i = 0; i < 2; i++) sample.push_back(mix(cfg.seed + block_serial + (unsigned)i) % total);
        std::sort(sample.begin(), sample.end());
        sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
    }
    const unsigned long long key = mix(cfg.seed ^ block_serial);
    grid_start = now_s();
    grid_vt = 0;
    in_kernel = 1;
    device_math = true;
    for (unsigned long long i = 0; i < (sample.empty() ? total : sample.size()); i++) {
        const unsigned long long lin = sample.empty() ? permute(i, total, key) : sample[i];
        run_block(k, uint3{(unsigned)(lin % gx), (unsigned)(lin / gx % gy), (unsigned)(lin / (gx * gy))}, &run);
    }
    device_math = false;
    in_kernel = 0;
    for (double left; (left = grid_start + grid_vt * 1e-9 - now_s()) > 0;) /* a kernel that spun on %globaltimer */
        usleep((useconds_t)(left * 1e6) + 1);
    blk = &run;
    for (const void *p : k->ptrs)
        if (p) check_slack(p, k->site);
}

/* ---- streams, events and the engine ------------------------------------------------ */
struct op {
    unsigned long long seq;        /* in its stream */
    unsigned long long issued;     /* in the process, for the order of ready work */
    const char *what;
    std::function<void()> fn;      /* work that runs to its end */
    std::function<void()> body;    /* or a waiting operation, in a fiber */
    std::vector<std::pair<stream *, unsigned long long>> deps; /* (stream, seq) that must be done first */
    bool started, finished;
    bool marker;                   /* an event record or wait: it touches no memory */
    fiber f;
    const uint32_t *futex_word;    /* what a waiting operation sleeps on */
    uint32_t futex_seen;
};
struct stream {
    int device;
    bool legacy, nonblocking, destroyed;
    unsigned long long enq, done, id;
    std::deque<op *> q;
};
struct event {
    int device;
    unsigned flags;
    stream *s;
    unsigned long long seq;
    bool recorded, destroyed;
    double t;
};

static std::mutex mu;
static auto &engine_cv = *new std::condition_variable, &done_cv = *new std::condition_variable;
static auto &streams = *new std::vector<stream *>;
static auto &handles = *new std::set<void *>; /* every stream and event ever made: a stale handle is named, not followed */
static stream *legacy_streams[64];
static auto &demands = *new std::vector<std::function<bool()>>; /* what someone waits for; work runs while one is unmet */
static auto &waiting_ops = *new std::vector<op *>; /* started waiting operations */
static bool engine_running, engine_stop;
static pthread_t engine_thread;
static void (*idle_hook)();
static op *engine_op;                 /* the operation running, for the fault handler */
static fiber engine_ctx;
static op *current_waiting;           /* the waiting operation whose fiber runs */
static unsigned long long stream_serial, issue_serial;

int stream_device(const stream *s) { return s->device; }

static stream *make_stream(int device, bool legacy, bool nonblocking)
{
    stream *s = new stream();
    s->device = device;
    s->legacy = legacy;
    s->nonblocking = nonblocking;
    s->id = stream_serial++;
    streams.push_back(s);
    handles.insert(s);
    return s;
}

stream *stream_of(cudaStream_t h, int device, cudaError_t *err)
{
    std::lock_guard<std::mutex> lk(mu);
    *err = cudaSuccess;
    if (h == NULL || h == cudaStreamLegacy) {
        if (!legacy_streams[device]) legacy_streams[device] = make_stream(device, true, false);
        return legacy_streams[device];
    }
    if (h == cudaStreamPerThread) report("%s: cudaStreamPerThread is not emulated", call_name);
    if (!handles.count((void *)h)) report("%s: %p is not a stream this process created", call_name, (void *)h);
    stream *s = (stream *)(void *)h;
    if (s->destroyed) report("%s: stream %llu was destroyed (cudaStreamDestroy) before this call", call_name, s->id);
    if (s->device != device) {
        note("%s: stream %llu belongs to device %d, the calling thread's device is %d", call_name, s->id, s->device,
             device);
        *err = cudaErrorInvalidResourceHandle;
        return NULL;
    }
    return s;
}

static bool deps_done(const op *o)
{
    for (auto &d : o->deps)
        if (d.first->done < d.second) return false;
    return true;
}

static void push_op(stream *s, op *o)
{
    o->seq = ++s->enq;
    o->issued = ++issue_serial;
    /* the legacy default stream waits for the blocking streams of its device, and they for it */
    if (s->legacy) {
        for (stream *x : streams)
            if (x != s && x->device == s->device && !x->nonblocking && !x->legacy && x->enq > x->done)
                o->deps.push_back({x, x->enq});
    } else if (!s->nonblocking) {
        stream *L = legacy_streams[s->device];
        if (L && L->enq > L->done) o->deps.push_back({L, L->enq});
    }
    s->q.push_back(o);
    engine_cv.notify_all();
}

static void *engine_main(void *);

static void start_engine()
{
    if (engine_running) return;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 8 << 20);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED); /* nobody joins it: it stops at exit (at_exit) */
    if (pthread_create(&engine_thread, &at, engine_main, NULL) != 0) report("cannot start the engine thread");
    pthread_attr_destroy(&at);
    engine_running = true;
}

void enqueue(stream *s, const char *what, std::function<void()> fn)
{
    std::lock_guard<std::mutex> lk(mu);
    op *o = new op();
    o->what = what;
    o->fn = std::move(fn);
    start_engine();
    push_op(s, o);
}

void enqueue_waiting(stream *s, const char *what, std::function<void()> body)
{
    std::lock_guard<std::mutex> lk(mu);
    op *o = new op();
    o->what = what;
    o->body = std::move(body);
    start_engine();
    push_op(s, o);
}

void demand(std::function<bool()> pred)
{
    std::lock_guard<std::mutex> lk(mu);
    start_engine();
    demands.push_back(std::move(pred));
    engine_cv.notify_all();
}

void set_idle_hook(void (*hook)())
{
    std::lock_guard<std::mutex> lk(mu);
    idle_hook = hook;
    engine_cv.notify_all();
}

void wake_engine()
{
    std::lock_guard<std::mutex> lk(mu);
    engine_cv.notify_all();
}

static void complete(stream *s, op *o);

/* The next operation to start, or NULL. Only while something is demanded: of the
   ready operations the one issued last, once the ready event records and waits at
   the heads of the streams are done (they move no data; an early one only lets
   later work become ready). */
static op *pick(stream **owner)
{
    op *best = NULL;
    if (demands.empty()) return NULL;
    for (bool again = true; again;) {
        again = false;
        for (stream *s : streams)
            if (!s->q.empty() && s->q.front()->marker && !s->q.front()->started && deps_done(s->q.front())) {
                if (s->q.front()->fn) s->q.front()->fn();
                complete(s, s->q.front());
                again = true;
            }
    }
    for (stream *s : streams) {
        if (s->q.empty()) continue;
        op *o = s->q.front();
        if (o->started || !deps_done(o) || (best && best->issued > o->issued)) continue;
        best = o;
        *owner = s;
    }
    return best;
}

static void complete(stream *s, op *o)
{
    s->q.pop_front();
    s->done = o->seq;
    delete o;
    done_cv.notify_all();
}

static void prune_demands()
{
    demands.erase(std::remove_if(demands.begin(), demands.end(), [](std::function<bool()> &d) { return d(); }),
                  demands.end());
}

static void waiting_entry(void *arg)
{
    op *o = (op *)arg;
    o->body();
    o->finished = true;
    fiber_switch(&o->f, &engine_ctx);
    __builtin_unreachable();
}

void op_yield(const uint32_t *word, uint32_t seen)
{
    op *o = current_waiting;
    if (!o) report("op_yield outside a waiting operation");
    o->futex_word = word;
    o->futex_seen = seen;
    fiber_switch(&o->f, &engine_ctx);
}

static stream *owner_of(op *o)
{
    for (stream *s : streams)
        if (!s->q.empty() && s->q.front() == o) return s;
    return NULL;
}

static void *engine_main(void *)
{
    stack_t ss;
    ss.ss_sp = malloc(1 << 16);
    ss.ss_size = 1 << 16;
    ss.ss_flags = 0;
    sigaltstack(&ss, NULL); /* the fault handler must run even when a fiber's stack overflowed */
    std::unique_lock<std::mutex> lk(mu);
    double last_hook = 0;
    for (;;) {
        if (engine_stop) break;
        prune_demands();
        stream *s = NULL;
        op *o = pick(&s);
        if (o) {
            o->started = true;
            if (o->body) {
                fiber_init(&o->f, waiting_entry, o);
                waiting_ops.push_back(o);
            } else {
                engine_op = o;
                lk.unlock();
                if (o->fn) o->fn();
                lk.lock();
                engine_op = NULL;
                complete(s, o);
                continue;
            }
        }
        if (!waiting_ops.empty()) {
            std::vector<op *> now = waiting_ops;
            bool finished_any = false;
            for (op *w : now) {
                current_waiting = w;
                engine_op = w;
                lk.unlock();
                fiber_switch(&engine_ctx, &w->f);
                lk.lock();
                engine_op = NULL;
                current_waiting = NULL;
                if (w->finished) {
                    fiber_free(&w->f);
                    waiting_ops.erase(std::find(waiting_ops.begin(), waiting_ops.end(), w));
                    complete(owner_of(w), w);
                    finished_any = true;
                }
            }
            if (!finished_any && !o) { /* everyone waits for other processes: sleep briefly */
                op *w = waiting_ops.front();
                if (idle_hook && now_s() - last_hook > 0.001) {
                    last_hook = now_s();
                    lk.unlock();
                    idle_hook();
                    lk.lock();
                } else if (w->futex_word) {
                    const uint32_t *word = w->futex_word;
                    uint32_t seen = w->futex_seen;
                    lk.unlock();
                    struct timespec ts = {0, 1000000};
                    syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
                    lk.lock();
                } else {
                    engine_cv.wait_for(lk, std::chrono::microseconds(500));
                }
            }
            continue;
        }
        if (o) continue;
        if (idle_hook) {
            engine_cv.wait_for(lk, std::chrono::milliseconds(1));
            last_hook = now_s();
            lk.unlock();
            idle_hook();
            lk.lock();
        } else {
            engine_cv.wait(lk);
        }
    }
    return NULL;
}

/* What a stuck wait is waiting for: the first unfinished operation of the stream. */
static std::string stuck(stream *s)
{
    char buf[300];
    if (s->q.empty()) return "nothing";
    op *o = s->q.front();
    snprintf(buf, sizeof buf, "%s (%s)", o->what, o->started ? "started" : !deps_done(o) ? "waiting for another stream"
                                                                                         : "not started");
    return buf;
}

/* Blocks until every (stream, seq) target is done. Under mu. */
static void wait_targets(std::unique_lock<std::mutex> &lk, std::vector<std::pair<stream *, unsigned long long>> targets,
                         const char *call)
{
    auto all_done = [&]() {
        for (auto &t : targets)
            if (t.first->done < t.second) return false;
        return true;
    };
    if (all_done()) return;
    start_engine();
    for (auto &t : targets) {
        stream *s = t.first;
        unsigned long long seq = t.second;
        demands.push_back([s, seq]() { return s->done >= seq; });
    }
    engine_cv.notify_all();
    const double t0 = now_s();
    while (!all_done()) {
        done_cv.wait_for(lk, std::chrono::milliseconds(200));
        if (!all_done() && now_s() - t0 > cfg.wait_limit)
            for (auto &t : targets)
                if (t.first->done < t.second)
                    report("%s has waited %.0f s (DDP_EMU_WAIT_LIMIT) for stream %llu of device %d, which is at %s",
                           call, now_s() - t0, t.first->id, t.first->device, stuck(t.first).c_str());
    }
}

void wait_stream(stream *s, const char *call)
{
    std::unique_lock<std::mutex> lk(mu);
    wait_targets(lk, {{s, s->enq}}, call);
}

static void wait_device(int device, const char *call)
{
    std::unique_lock<std::mutex> lk(mu);
    std::vector<std::pair<stream *, unsigned long long>> targets;
    for (stream *s : streams)
        if (s->device == device && s->enq > s->done) targets.push_back({s, s->enq});
    wait_targets(lk, targets, call);
}

/* At exit the engine stops where it is (work still queued is dropped, as a GPU's is
   when its process ends); the devices this process touched go to DDP_EMU_TOUCH_LOG. */
static void at_exit()
{
    if (engine_running) {
        std::lock_guard<std::mutex> lk(mu);
        engine_stop = true;
        engine_cv.notify_all();
    }
    if (cfg.touch_log) {
        std::string line;
        char buf[400];
        const char *rank = getenv("RANK");
        snprintf(buf, sizeof buf, "pid %d rank %s devices", (int)getpid(), rank ? rank : "-");
        line = buf;
        for (int d = 0; d < cfg.nvisible; d++)
            if (devs[d].touched) {
                snprintf(buf, sizeof buf, " %d", d);
                line += buf;
            }
        for (int d = 0; d < cfg.nvisible; d++)
            if (devs[d].touched) {
                snprintf(buf, sizeof buf, "; device %d first by %s", d, devs[d].how);
                line += buf;
            }
        line += "\n";
        FILE *f = fopen(cfg.touch_log, "a");
        if (f) {
            fputs(line.c_str(), f);
            fclose(f);
        }
    }
}

/* ---- faults ----------------------------------------------------------------------- */
static void on_fault(int sig, siginfo_t *si, void *)
{
    char buf[900], where[300] = "";
    const void *addr = si->si_addr;
    const bool engine = engine_running && pthread_equal(pthread_self(), engine_thread);
    std::string what = "?";
    if (!engine) { /* the program's own fault: crash as usual */
        signal(sig, SIG_DFL);
        return;
    }
    for (auto &g : stack_guards)
        if ((const char *)addr >= g.first && (const char *)addr < g.second) what = "the guard page of a stack: a stack overflow";
    if (what == "?" && mem_mu.try_lock()) {
        what = describe_locked(addr);
        mem_mu.unlock();
    }
    if (in_kernel && blk && blk->current)
        snprintf(where, sizeof where, "kernel %s (launched at %s:%d), block (%u,%u,%u), thread (%u,%u,%u)",
                 blk->k->site.name, blk->k->site.file, blk->k->site.line, blockIdx.x, blockIdx.y, blockIdx.z,
                 threadIdx.x, threadIdx.y, threadIdx.z);
    else
        snprintf(where, sizeof where, "%s", engine_op ? engine_op->what : "the engine");
    snprintf(buf, sizeof buf, "emu: %s: invalid access to %p: %s\n", where, addr, what.c_str());
    if (write(2, buf, strlen(buf)) < 0) {}
    signal(SIGABRT, SIG_DFL);
    abort();
}

/* ---- launch ----------------------------------------------------------------------- */
cudaError_t launch(const kernel_site &site, dim3 grid, dim3 block, size_t shmem, cudaStream_t h,
                   void (*body)(void *), void *closure, void (*drop)(void *), const void *const *ptrs, int nptrs)
{
    cudaError_t e = enter("a kernel launch");
    const int device = e ? -1 : current_device("a kernel launch");
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    stream *s = NULL;
    if (!e && device < 0) e = cudaErrorNoDevice;
    if (!e) s = stream_of(h, device, &e);
    if (!e && (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x == 0 ||
               grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)) {
        note("launch of %s at %s:%d: grid (%u,%u,%u), block (%u,%u,%u): outside CUDA's limits (blocks of 1 to 1024 "
             "threads, (1024,1024,64); grids up to (2^31-1,65535,65535)): cudaErrorInvalidConfiguration",
             site.name, site.file, site.line, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        e = cudaErrorInvalidConfiguration;
    }
    if (!e && shmem > 48 * 1024) {
        note("launch of %s at %s:%d asks for %zu bytes of dynamic shared memory: more than 48 KiB needs "
             "cudaFuncSetAttribute: cudaErrorInvalidValue", site.name, site.file, site.line, shmem);
        e = cudaErrorInvalidValue;
    }
    if (e) {
        drop(closure);
        set_error(e);
        return e;
    }
    for (int i = 0; i < nptrs; i++) {
        std::string why;
        if (ptrs[i] && !in_memory(ptrs[i], 0, device, 1, &why))
            report("launch of %s at %s:%d on device %d: pointer argument %d of %d is %p, %s", site.name, site.file,
                   site.line, device, i + 1, nptrs, ptrs[i], why.c_str());
    }
    kernel_op *k = new kernel_op{site, grid, block, body, closure, drop, std::vector<const void *>(ptrs, ptrs + nptrs)};
    enqueue(s, site.name, [k]() {
        run_grid(k);
        k->drop(k->closure);
        delete k;
    });
    return cudaSuccess;
}
} // namespace emu

/* ---- the runtime API -------------------------------------------------------------- */
using namespace emu;

/* the program's calls of expf, logf and tanhf, through the linker (-Wl,--wrap=expf: the
   Makefile's EMU_WRAP), __real_expf being glibc's; weak, so that a program linked without
   the wraps (kernels with glibc's roundings) needs none */
extern "C" {
float __real_expf(float) __attribute__((weak)), __real_logf(float) __attribute__((weak)),
    __real_tanhf(float) __attribute__((weak));
float __wrap_expf(float x) { const float r = __real_expf(x); return device_math ? faithful(r, std::exp((double)x), 1, x) : r; }
float __wrap_logf(float x) { const float r = __real_logf(x); return device_math ? faithful(r, std::log((double)x), 2, x) : r; }
float __wrap_tanhf(float x)
{
    const float r = __real_tanhf(x);
    return device_math && std::fabs(r) != 1.0f ? faithful(r, std::tanh((double)x), 3, x) : r;
}
}

#define ENTER(name)                                  \
    do {                                             \
        cudaError_t e_ = enter(name);                \
        if (e_) { set_error(e_); return e_; }        \
    } while (0)
#define FAIL(e)                                      \
    do { set_error(e); return e; } while (0)

static int device_or_fail(const char *call, cudaError_t *e)
{
    int d = current_device(call);
    *e = d < 0 ? cudaErrorNoDevice : cudaSuccess;
    return d;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    ENTER("cudaGetDeviceCount");
    *count = cfg.nvisible;
    if (cfg.nvisible == 0) FAIL(cudaErrorNoDevice);
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    ENTER("cudaSetDevice");
    if (device < 0 || device >= cfg.nvisible) FAIL(cudaErrorInvalidDevice);
    tl_device = device;
    touch(device, "cudaSetDevice", false);
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    ENTER("cudaGetDevice");
    if (cfg.nvisible == 0) FAIL(cudaErrorNoDevice);
    *device = tl_device < 0 ? 0 : tl_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    ENTER("cudaGetDeviceProperties");
    if (device < 0 || device >= cfg.nvisible) FAIL(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "emulated GPU %d (tests/emu, on the CPU)", cfg.visible[device]);
    p->totalGlobalMem = (size_t)80 << 30;
    p->sharedMemPerBlock = 48 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->l2CacheSize = 50 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->pciBusID = cfg.visible[device] + 1; /* 0000:bus:00.0, one per physical device: ranks compare them */
    p->memoryBusWidth = 5120;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e) return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = p.regsPerBlock; break;
    case cudaDevAttrClockRate: *value = 1980000; break; /* kHz; CUDA 13's cudaDeviceProp no longer has it */
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrPciBusId: *value = p.pciBusID; break;
    case cudaDevAttrPciDeviceId: *value = p.pciDeviceID; break;
    case cudaDevAttrPciDomainId: *value = p.pciDomainID; break;
    case cudaDevAttrMemoryClockRate: *value = 2619000; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = p.memoryBusWidth; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = (int)p.sharedMemPerMultiprocessor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: FAIL(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e;
    ENTER("cudaDeviceSynchronize");
    int d = device_or_fail("cudaDeviceSynchronize", &e);
    if (e) FAIL(e);
    wait_device(d, "cudaDeviceSynchronize");
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

#define EMU_ERRORS(X)                                                                                   \
    X(cudaSuccess, "no error")                                                                          \
    X(cudaErrorInvalidValue, "invalid argument")                                                        \
    X(cudaErrorMemoryAllocation, "out of memory")                                                       \
    X(cudaErrorInitializationError, "initialization error")                                             \
    X(cudaErrorInvalidConfiguration, "invalid configuration argument")                                  \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                                          \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")                             \
    X(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version")      \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                          \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                                 \
    X(cudaErrorNoKernelImageForDevice, "no kernel image is available for execution on the device")      \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                                        \
    X(cudaErrorNotReady, "device not ready")                                                            \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")                              \
    X(cudaErrorLaunchOutOfResources, "too many resources requested for launch")                         \
    X(cudaErrorMisalignedAddress, "misaligned address")                                                 \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                                             \
    X(cudaErrorUnknown, "unknown error")

const char *cudaGetErrorString(cudaError_t e)
{
#define EMU_CASE(name, text) case name: return text;
    switch (e) { EMU_ERRORS(EMU_CASE) }
#undef EMU_CASE
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e)
{
#define EMU_CASE(name, text) case name: return #name;
    switch (e) { EMU_ERRORS(EMU_CASE) }
#undef EMU_CASE
    return "cudaErrorUnknown";
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    cudaError_t e;
    ENTER("cudaMemGetInfo");
    int d = device_or_fail("cudaMemGetInfo", &e);
    if (e) FAIL(e);
    std::lock_guard<std::mutex> lk(dev_mu);
    *total_bytes = (size_t)80 << 30;
    *free_bytes = *total_bytes - devs[d].used;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    cudaError_t e;
    ENTER("cudaMalloc");
    int d = device_or_fail("cudaMalloc", &e);
    if (e) FAIL(e);
    *ptr = NULL;
    if (size == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(dev_mu);
        if (size > ((size_t)80 << 30) - devs[d].used) FAIL(cudaErrorMemoryAllocation);
        devs[d].used += size;
    }
    if (!(*ptr = allocate(size, d, MEM_DEVICE))) FAIL(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    int d;
    size_t size;
    ENTER("cudaFree");
    current_device("cudaFree");
    if (!ptr) return cudaSuccess;
    int dev = -1;
    if (kind_of(ptr, &dev) == MEM_DEVICE) wait_device(dev, "cudaFree"); /* cudaFree waits for the device */
    if (!release(ptr, MEM_DEVICE, &d, &size)) {
        note("cudaFree(%p): %s: cudaErrorInvalidValue", ptr, describe(ptr).c_str());
        FAIL(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lk(dev_mu);
    devs[d].used -= size;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    cudaError_t e;
    ENTER("cudaMallocHost");
    device_or_fail("cudaMallocHost", &e);
    if (e) FAIL(e);
    *ptr = NULL;
    if (size == 0) return cudaSuccess;
    if (!(*ptr = allocate(size, -1, MEM_PINNED))) FAIL(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int) { return cudaMallocHost(ptr, size); }

cudaError_t cudaFreeHost(void *ptr)
{
    int d;
    size_t size;
    ENTER("cudaFreeHost");
    current_device("cudaFreeHost");
    if (!ptr) return cudaSuccess;
    for (int dev = 0; dev < cfg.nvisible; dev++) /* the copies that read or write it must be done */
        if (devs[dev].touched) wait_device(dev, "cudaFreeHost");
    if (!release(ptr, MEM_PINNED, &d, &size)) {
        note("cudaFreeHost(%p): %s: cudaErrorInvalidValue", ptr, describe(ptr).c_str());
        FAIL(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *ptr)
{
    ENTER("cudaPointerGetAttributes");
    current_device("cudaPointerGetAttributes");
    int d = -1;
    memset(a, 0, sizeof *a);
    a->device = -2;
    switch ((int)kind_of(ptr, &d)) {
    case MEM_DEVICE:
        a->type = cudaMemoryTypeDevice;
        a->device = d;
        a->devicePointer = (void *)ptr;
        break;
    case MEM_PINNED: /* mapped into every device's address space, as with unified addressing */
        a->type = cudaMemoryTypeHost;
        a->device = tl_device < 0 ? 0 : tl_device;
        a->devicePointer = a->hostPointer = (void *)ptr;
        break;
    default: a->type = cudaMemoryTypeUnregistered; break;
    }
    return cudaSuccess;
}

/* ---- copies ---- */
enum side { HOST_PAGEABLE, HOST_PINNED, DEVICE };

static side side_of(const void *p, size_t n, const char *call, const char *which, int *dev)
{
    int d = -1;
    int k = (int)kind_of(p, &d);
    if (k == MEM_DEVICE) {
        char what[160];
        snprintf(what, sizeof what, "%s: the %s", call, which);
        check_range(p, n, d, 0, what);
        *dev = d;
        return DEVICE;
    }
    if (k == MEM_PINNED) {
        char what[160];
        snprintf(what, sizeof what, "%s: the %s", call, which);
        check_range(p, n, -1, 1, what);
        return HOST_PINNED;
    }
    std::string why = describe(p);
    if (why.compare(0, 4, "host") != 0) report("%s: the %s, %zu bytes at %p: %s", call, which, n, p, why.c_str());
    return HOST_PAGEABLE;
}

static const char *kind_name(cudaMemcpyKind k)
{
    static const char *names[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost",
                                  "cudaMemcpyDeviceToDevice", "cudaMemcpyDefault"};
    return (unsigned)k < 5 ? names[k] : "an unknown cudaMemcpyKind";
}

/* A copy on stream h, with CUDA's rules for when the host waits: a pageable source
   is read at the call; a pageable destination, and cudaMemcpy except device to
   device, return when the copy is done. */
static cudaError_t copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t h, bool blocking,
                        const char *call)
{
    cudaError_t e;
    ENTER(call);
    int device = device_or_fail(call, &e);
    if (e) FAIL(e);
    if ((unsigned)kind > 4) FAIL(cudaErrorInvalidMemcpyDirection);
    stream *s = stream_of(h, device, &e);
    if (e) FAIL(e);
    if (n == 0) return cudaSuccess;
    int dd = -1, sd = -1;
    const side ds = side_of(dst, n, call, "destination", &dd), ss = side_of(src, n, call, "source", &sd);
    const bool to_dev = ds == DEVICE, from_dev = ss == DEVICE;
    const cudaMemcpyKind real = to_dev && from_dev ? cudaMemcpyDeviceToDevice : to_dev ? cudaMemcpyHostToDevice
                                : from_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
    if (kind != cudaMemcpyDefault && kind != real)
        report("%s(%p, %p, %zu, %s): the pointers say %s (destination: %s; source: %s)", call, dst, src, n,
               kind_name(kind), kind_name(real), describe(dst).c_str(), describe(src).c_str());
    if (ss == HOST_PAGEABLE) { /* pageable source: read now, into a staging copy */
        std::shared_ptr<std::vector<char>> staged = std::make_shared<std::vector<char>>((const char *)src,
                                                                                      (const char *)src + n);
        enqueue(s, call, [dst, staged]() { memcpy(dst, staged->data(), staged->size()); });
    } else {
        enqueue(s, call, [dst, src, n]() { memmove(dst, src, n); });
    }
    if (ds == HOST_PAGEABLE || (blocking && real != cudaMemcpyDeviceToDevice)) wait_stream(s, call);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    return copy(dst, src, n, kind, NULL, true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
    return copy(dst, src, n, kind, s, false, "cudaMemcpyAsync");
}

static cudaError_t set(void *p, int value, size_t n, cudaStream_t h, const char *call)
{
    cudaError_t e;
    ENTER(call);
    int device = device_or_fail(call, &e);
    if (e) FAIL(e);
    stream *s = stream_of(h, device, &e);
    if (e) FAIL(e);
    if (n == 0) return cudaSuccess;
    char what[80];
    snprintf(what, sizeof what, "%s", call);
    check_range(p, n, -1, 1, what);
    enqueue(s, call, [p, value, n]() { memset(p, value, n); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t n) { return set(p, value, n, NULL, "cudaMemset"); }
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) { return set(p, value, n, s, "cudaMemsetAsync"); }

/* ---- streams ---- */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags)
{
    cudaError_t e;
    ENTER("cudaStreamCreate");
    int d = device_or_fail("cudaStreamCreate", &e);
    if (e) FAIL(e);
    std::lock_guard<std::mutex> lk(mu);
    *out = (cudaStream_t)(void *)make_stream(d, false, (flags & cudaStreamNonBlocking) != 0);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t h)
{
    cudaError_t e;
    ENTER("cudaStreamDestroy");
    int d = device_or_fail("cudaStreamDestroy", &e);
    if (e) FAIL(e);
    if (h == NULL || h == cudaStreamLegacy) FAIL(cudaErrorInvalidResourceHandle);
    stream *s = stream_of(h, d, &e);
    if (e) FAIL(e);
    std::lock_guard<std::mutex> lk(mu);
    s->destroyed = true; /* its queued work still runs, as on a GPU */
    unsigned long long seq = s->enq;
    demands.push_back([s, seq]() { return s->done >= seq; });
    engine_cv.notify_all();
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
    cudaError_t e;
    ENTER("cudaStreamSynchronize");
    int d = device_or_fail("cudaStreamSynchronize", &e);
    if (e) FAIL(e);
    stream *s = stream_of(h, d, &e);
    if (e) FAIL(e);
    wait_stream(s, "cudaStreamSynchronize");
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t h)
{
    cudaError_t e;
    ENTER("cudaStreamQuery");
    int d = device_or_fail("cudaStreamQuery", &e);
    if (e) FAIL(e);
    stream *s = stream_of(h, d, &e);
    if (e) FAIL(e);
    std::lock_guard<std::mutex> lk(mu);
    if (s->done >= s->enq) return cudaSuccess;
    unsigned long long seq = s->enq; /* the query sets the device going, as a GPU goes by itself */
    start_engine();
    demands.push_back([s, seq]() { return s->done >= seq; });
    engine_cv.notify_all();
    return cudaErrorNotReady;
}

static event *event_of(cudaEvent_t h, const char *call)
{
    std::lock_guard<std::mutex> lk(mu);
    if (!h || !handles.count((void *)h)) report("%s: %p is not an event this process created", call, (void *)h);
    event *ev = (event *)(void *)h;
    if (ev->destroyed) report("%s: the event was destroyed (cudaEventDestroy) before this call", call);
    return ev;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t evh, unsigned int)
{
    cudaError_t e;
    ENTER("cudaStreamWaitEvent");
    int d = device_or_fail("cudaStreamWaitEvent", &e);
    if (e) FAIL(e);
    stream *s = stream_of(h, d, &e);
    if (e) FAIL(e);
    event *ev = event_of(evh, "cudaStreamWaitEvent");
    std::lock_guard<std::mutex> lk(mu);
    if (!ev->recorded) return cudaSuccess; /* never recorded: nothing to wait for */
    op *o = new op();
    o->what = "cudaStreamWaitEvent";
    o->marker = true;
    o->deps.push_back({ev->s, ev->seq}); /* the record as it stands now, not a later one */
    start_engine();
    push_op(s, o);
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *data)
{
    cudaError_t e;
    ENTER("cudaLaunchHostFunc");
    int d = device_or_fail("cudaLaunchHostFunc", &e);
    if (e) FAIL(e);
    stream *s = stream_of(h, d, &e);
    if (e) FAIL(e);
    enqueue(s, "cudaLaunchHostFunc", [fn, data]() { fn(data); });
    return cudaSuccess;
}

/* ---- events ---- */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags)
{
    cudaError_t e;
    ENTER("cudaEventCreate");
    int d = device_or_fail("cudaEventCreate", &e);
    if (e) FAIL(e);
    event *ev = new event();
    ev->device = d;
    ev->flags = flags;
    std::lock_guard<std::mutex> lk(mu);
    handles.insert(ev);
    *out = (cudaEvent_t)(void *)ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t h)
{
    ENTER("cudaEventDestroy");
    current_device("cudaEventDestroy");
    event *ev = event_of(h, "cudaEventDestroy");
    std::lock_guard<std::mutex> lk(mu);
    ev->destroyed = true;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t h, cudaStream_t sh)
{
    cudaError_t e;
    ENTER("cudaEventRecord");
    int d = device_or_fail("cudaEventRecord", &e);
    if (e) FAIL(e);
    event *ev = event_of(h, "cudaEventRecord");
    stream *s = stream_of(sh, d, &e);
    if (e) FAIL(e);
    if (ev->device != s->device) FAIL(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lk(mu);
    op *o = new op();
    o->what = "cudaEventRecord";
    o->marker = true;
    o->fn = [ev]() { ev->t = now_s(); };
    start_engine();
    push_op(s, o);
    ev->s = s;
    ev->seq = o->seq;
    ev->recorded = true;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t h)
{
    ENTER("cudaEventQuery");
    current_device("cudaEventQuery"); /* a thread without cudaSetDevice works on device 0 here, as in CUDA */
    event *ev = event_of(h, "cudaEventQuery");
    std::lock_guard<std::mutex> lk(mu);
    if (!ev->recorded || ev->s->done >= ev->seq) return cudaSuccess;
    stream *s = ev->s;
    unsigned long long seq = ev->seq;
    start_engine();
    demands.push_back([s, seq]() { return s->done >= seq; });
    engine_cv.notify_all();
    return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t h)
{
    ENTER("cudaEventSynchronize");
    current_device("cudaEventSynchronize");
    event *ev = event_of(h, "cudaEventSynchronize");
    std::unique_lock<std::mutex> lk(mu);
    if (!ev->recorded) return cudaSuccess;
    wait_targets(lk, {{ev->s, ev->seq}}, "cudaEventSynchronize");
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    ENTER("cudaEventElapsedTime");
    current_device("cudaEventElapsedTime");
    event *x = event_of(a, "cudaEventElapsedTime"), *y = event_of(b, "cudaEventElapsedTime");
    std::lock_guard<std::mutex> lk(mu);
    if ((x->flags | y->flags) & cudaEventDisableTiming) FAIL(cudaErrorInvalidResourceHandle);
    if (!x->recorded || !y->recorded) FAIL(cudaErrorInvalidResourceHandle);
    if (x->s->done < x->seq || y->s->done < y->seq) FAIL(cudaErrorNotReady);
    *ms = (float)((y->t - x->t) * 1000.0);
    return cudaSuccess;
}
