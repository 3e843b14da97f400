/* tests/emu/emu_internal.h - what the emulator's parts share: settings, reports,
   device memory, streams and the engine thread (emu.cpp), used by the libraries
   (emu_blas.cpp: cuBLAS, cuBLASLt, CUB; emu_nccl.cpp: NCCL). Not for programs. */
#ifndef EMU_INTERNAL_H
#define EMU_INTERNAL_H
#include "cuda_runtime.h"
#include <functional>
#include <sys/types.h>
#include <string>

namespace emu {
struct settings {
    int devices;           /* DDP_EMU_DEVICES, before CUDA_VISIBLE_DEVICES */
    int visible[64];       /* physical id of each visible device */
    int nvisible;
    unsigned long long seed;
    int sample;            /* DDP_EMU_SAMPLE */
    size_t fill_limit;     /* DDP_EMU_FILL_LIMIT */
    double wait_limit;     /* DDP_EMU_WAIT_LIMIT, seconds */
    int strict_devices;    /* DDP_EMU_STRICT_DEVICES */
    const char *touch_log; /* DDP_EMU_TOUCH_LOG */
};
extern settings cfg;
void init(); /* reads the settings once; every entry point calls it */

/* One line "emu: ..." on stderr, then abort(): the process fails loudly where real
   hardware would misbehave. note() prints without aborting. */
[[noreturn]] void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double now_s();
void set_error(cudaError_t e); /* the calling thread's last error */
pid_t tid();                   /* the calling thread's id, for messages */

/* IEEE half precision, rounded to nearest even (cuBLAS fp16 operands, NCCL's ncclFloat16) */
static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) u = sign | 0x7f800000u | man << 13;
    else if (exp) u = sign | (exp + 112) << 23 | man << 13;
    else if (!man) u = sign;
    else { /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        u = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t float_to_half(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) return (uint16_t)(sign | (uint32_t)nearbyintf(fabsf(f) * 16777216.0f)); /* subnormal */
    a += 0xfffu + ((a >> 13) & 1) - (112u << 23);
    return (uint16_t)(sign | (a >> 13));
}

/* ---- memory ---- */
enum mem_kind { MEM_DEVICE, MEM_PINNED };
/* "device 0 memory (allocation #3 of 4096 bytes, offset 16)", "pinned host memory
   (...)", "freed device memory (...)", "host memory (not from cudaMalloc or
   cudaMallocHost)" */
std::string describe(const void *p);
/* 1 when [p, p + bytes) lies inside one live allocation: device memory of `device`,
   or pinned host memory when pinned_ok (NCCL and kernels may use mapped pinned
   memory); else 0 and *why says what p is. */
int in_memory(const void *p, size_t bytes, int device, int pinned_ok, std::string *why);
/* Reports unless in_memory: "<what>: 4096 bytes at 0x...: <why>". */
void check_range(const void *p, size_t bytes, int device, int pinned_ok, const char *what);
mem_kind kind_of(const void *p, int *device); /* MEM_DEVICE/MEM_PINNED, or -1 (cast) when neither */
extern thread_local const char *call_name; /* the API call being checked, for messages */

/* ---- devices ---- */
/* The calling thread's device (0 unless cudaSetDevice chose another), marked as
   touched by `call`; -1 when the process has no device. */
int current_device(const char *call);

/* ---- streams and the engine ---- */
struct stream;
/* The stream a handle names on `device` (NULL: that device's legacy default stream);
   NULL with *err set for a destroyed or foreign handle. */
stream *stream_of(cudaStream_t s, int device, cudaError_t *err);
int stream_device(const stream *s);
/* Queues fn on s; it runs on the engine thread when the host waits for something. */
void enqueue(stream *s, const char *what, std::function<void()> fn);
/* Queues a waiting operation (NCCL): body runs in a fiber of its own on the engine
   thread and calls op_yield() while it waits for other processes; the stream is busy
   until body returns. */
void enqueue_waiting(stream *s, const char *what, std::function<void()> body);
void op_yield(const uint32_t *futex_word, uint32_t seen); /* sleep until *word != seen (short timeout) */
/* Blocks the calling host thread until everything queued on s so far has run. */
void wait_stream(stream *s, const char *call);
/* Asks the engine to run work until pred() holds, without waiting (a peer process
   waits for this one). pred runs under the engine's lock. */
void demand(std::function<bool()> pred);
/* Called by the engine about once a millisecond while anything is registered: the
   NCCL layer looks for peers that wait for this process. */
void set_idle_hook(void (*hook)());
void wake_engine();
} // namespace emu
#endif
