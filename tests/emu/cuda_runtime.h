/* tests/emu/cuda_runtime.h - the CUDA runtime, and the CUDA C++ that ddp.h's GPU code
   uses, for a host C++ compiler. With these headers first on the include path
   (-I tests/emu, -D__CUDACC__) the GPU sources compile with g++ unchanged, once
   tests/emu/rewrite.pl has turned each launch `k<<<grid, block, shmem, stream>>>(args)`
   into EMU_LAUNCH(k)(grid, block, shmem, stream)(args) and each static __shared__
   declaration into one that is poisoned per block. `make emu` builds every GPU program
   this way under build/emu/; `make check-emu` runs the GPU tests with them.

   What it models (the implementation is tests/emu/emu.cpp):
   - a GPU thread is a fiber; a block's threads run one at a time until they finish or
     reach __syncthreads or a warp shuffle, which are checked switch points: a barrier
     that not every live thread reaches, a shuffle whose partner lane exits or waits
     elsewhere, or a deadlock is reported with the kernel, block and thread;
   - blocks run one at a time in a seeded shuffled order, and the threads between two
     barriers in a changing order, with some warps (a seeded draw for each warp between
     two barriers) running ahead of the others through their shuffles, so a missing
     barrier or a block that depends on another gives a wrong result or a report
     instead of passing by luck;
   - device memory is host memory of the exact size (rounded to 256 bytes) between
     inaccessible pages and filled with 0xFF bytes (NaN, -1); every kernel pointer
     argument, copy, cuBLAS operand and NCCL buffer is checked against it;
   - streams are queues that run only when the host waits (a synchronisation, a
     blocking copy, a query), the ready work issued last first (a consumer on another
     stream that does not wait for its producer runs before it); events, the legacy
     default stream's implicit ordering and pageable/pinned copy rules are CUDA's;
   - each host thread has its own current device (device 0 until cudaSetDevice), and
     the devices a process touched are recorded (DDP_EMU_TOUCH_LOG, DDP_EMU_STRICT_DEVICES).
   - expf, logf, tanhf and rsqrtf in a kernel give either float next to the exact value
     (CUDA's are within 1-2 units in the last place, not rounded to nearest), by a seeded
     draw on the argument; host code keeps glibc's (emu.cpp; the link's EMU_WRAP);
   - a vector access (a cast to int4, float2, ...: rewrite.pl) must be aligned to its
     size, and a block no larger than its kernel's __launch_bounds__;
   - %globaltimer (the inline PTX rewrite.pl turns into emu::globaltimer()) is a clock
     per GPU thread that each read moves on; a grid lasts in wall time as long as its
     latest clock says, so a kernel that spins for a second takes a second.
   What it does not: measure speed, run blocks or warps concurrently (races between
   blocks that real hardware would show only sometimes are found only through the
   shuffled order; a read-modify-write of shared or global memory by many threads is
   never interleaved), model memory consistency inside a block beyond barriers, check
   indices into __shared__ arrays or their total size (nvcc's ptxas refuses more than
   48 KB: `make` builds every GPU source with it), check a C-style vector cast of &x[i]
   or x[i] (rewrite.pl wraps those of a name or a parenthesized expression), dynamic
   shared memory, graphs, cooperative groups, peer access or unified memory.

   Environment (read once, at the first CUDA call): DDP_EMU_DEVICES=N devices per
   process (default 8; CUDA_VISIBLE_DEVICES selects among them), DDP_EMU_SEED=N the
   order of blocks and threads and the math functions' roundings, DDP_EMU_SAMPLE=1 runs
   only the corner blocks of each grid (GPT-2-sized shapes in seconds: for index
   overflow, not for results), DDP_EMU_FILL_LIMIT=bytes fills larger allocations only
   that far (default 256 MiB),
   DDP_EMU_WAIT_LIMIT=seconds reports a host wait that makes no progress (default 300),
   DDP_EMU_TOUCH_LOG=FILE appends the devices each process touched at its exit,
   DDP_EMU_STRICT_DEVICES=1 reports a process that touches a second device; NCCL's
   are in nccl.h. */
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H
#ifndef __cplusplus
#error "the CUDA emulator (tests/emu) needs C++: compile with g++ -x c++"
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <tuple>
#include <type_traits>
#include <utility>

#define CUDART_VERSION 13000
#define DDP_EMU 1 /* the few tests that must tell the emulator from a GPU */

/* ---- CUDA C++ keywords ---- */
/* nvcc fuses a*b + c into one multiply-add in device code (--fmad=true, its default), never
   in host code: with DDP_EMU_FMA (make's EMU_FMA, where the CPU has FMA) g++ does the same,
   kernels and device functions fused, the host code around them as the host compiler builds it */
#if defined(DDP_EMU_FMA) && defined(__x86_64__)
#define DDP_EMU_DEVICE_CODE __attribute__((optimize("fp-contract=fast", "expensive-optimizations"), target("fma")))
#elif defined(DDP_EMU_FMA)
#define DDP_EMU_DEVICE_CODE __attribute__((optimize("fp-contract=fast", "expensive-optimizations")))
#else
#define DDP_EMU_DEVICE_CODE
#endif
#define __global__ DDP_EMU_DEVICE_CODE
#define __device__ DDP_EMU_DEVICE_CODE
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static /* rewrite.pl adds EMU_SHARED for each array: poisoned per block */

/* ---- built-in vector types and variables ---- */
struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
/* Set by the emulator on every switch between GPU threads (plain variables, so a
   debugger prints them). */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

/* ---- runtime types ---- */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorMisalignedAddress = 716,
    cudaErrorLaunchFailure = 719,
    cudaErrorUnknown = 999
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3 };
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxBlockDimY = 3,
    cudaDevAttrMaxBlockDimZ = 4,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxGridDimZ = 7,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMaxRegistersPerBlock = 12,
    cudaDevAttrClockRate = 13,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrPciBusId = 33,
    cudaDevAttrPciDeviceId = 34,
    cudaDevAttrMemoryClockRate = 36,
    cudaDevAttrGlobalMemoryBusWidth = 37,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrMaxThreadsPerMultiProcessor = 39,
    cudaDevAttrUnifiedAddressing = 41,
    cudaDevAttrPciDomainId = 50,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

/* The fields programs read; an emulated device is an sm_90 part. */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    int multiProcessorCount;
    int l2CacheSize;
    int maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    size_t sharedMemPerBlockOptin;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int memoryBusWidth;
    int unifiedAddressing;
};

/* ---- runtime API (tests/emu/emu.cpp) ---- */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaRuntimeGetVersion(int *version);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attributes, const void *ptr);
template <class T> static inline cudaError_t cudaMalloc(T **ptr, size_t size) { return cudaMalloc((void **)ptr, size); }
template <class T> static inline cudaError_t cudaMallocHost(T **ptr, size_t size) { return cudaMallocHost((void **)ptr, size); }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream = 0);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream = 0);

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);
typedef void (*cudaHostFn_t)(void *user_data);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *user_data);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* ---- the emulator's side of a launch and of device code ---- */
namespace emu {
struct kernel_site {
    const char *name, *file;
    int line;
};
/* Queues a grid on stream: body(closure) is one GPU thread; ptrs are the pointer
   arguments, checked here against the device's memory. Returns the launch's error
   (also the thread's last error): an invalid configuration, a bad stream. */
cudaError_t launch(const kernel_site &site, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
                   void (*body)(void *), void *closure, void (*drop)(void *), const void *const *ptrs, int nptrs);

template <class Fn, class Args> struct closure {
    Fn fn;
    Args args;
};
template <class C> static void run_closure(void *p) { std::apply(static_cast<C *>(p)->fn, static_cast<C *>(p)->args); }
template <class C> static void drop_closure(void *p) { delete static_cast<C *>(p); }
template <class T> static inline void pointer_arg(const void **out, int *n, const T &v)
{
    if constexpr (std::is_pointer<typename std::decay<T>::type>::value) out[(*n)++] = (const void *)v;
    (void)out, (void)n, (void)v;
}

template <class Fn> struct launch_config {
    kernel_site site;
    Fn fn;
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
    /* the arguments are copied now, as a launch copies them, and converted to the
       kernel's parameters by the call in Fn when each GPU thread runs */
    template <class... A> void operator()(A &&...a) const
    {
        typedef closure<Fn, std::tuple<typename std::decay<A>::type...>> C;
        const void *ptrs[sizeof...(A) + 1];
        int n = 0;
        (pointer_arg(ptrs, &n, a), ...);
        launch(site, grid, block, shmem, stream, run_closure<C>, new C{fn, std::make_tuple(std::forward<A>(a)...)},
               drop_closure<C>, ptrs, n);
    }
};
template <class Fn> struct launch_site {
    kernel_site site;
    Fn fn;
    launch_config<Fn> operator()(dim3 grid, dim3 block, size_t shmem = 0, cudaStream_t stream = 0) const
    {
        return launch_config<Fn>{site, fn, grid, block, shmem, stream};
    }
};
template <class Fn> static inline launch_site<Fn> make_site(const char *name, const char *file, int line, Fn fn)
{
    return launch_site<Fn>{kernel_site{name, file, line}, fn};
}

/* switch points: barrier and warp exchange, with the place they are called from */
void barrier(const char *file, int line);
enum shfl_kind { SHFL_IDX, SHFL_XOR, SHFL_DOWN, SHFL_UP, SHFL_SYNCWARP };
uint64_t shuffle(const char *file, int line, shfl_kind kind, unsigned mask, uint64_t bits, int arg, int width);
template <class T> static inline T shfl(const char *file, int line, shfl_kind kind, unsigned mask, T v, int arg, int width)
{
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 64 bits");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    asm volatile("" ::: "memory");
    bits = shuffle(file, line, kind, mask, bits, arg, width);
    asm volatile("" ::: "memory");
    memcpy(&v, &bits, sizeof v);
    return v;
}
/* the memory clobbers stop the compiler from moving loads and stores of shared
   arrays across the barrier (it cannot see that other fibers write them) */
static inline void syncthreads(const char *file, int line)
{
    asm volatile("" ::: "memory");
    barrier(file, line);
    asm volatile("" ::: "memory");
}
unsigned long long globaltimer(); /* %globaltimer in ns, from inline PTX (rewrite.pl) */
/* a vector access through reinterpret_cast<int4 *> (rewrite.pl): a GPU stops the kernel
   with cudaErrorMisalignedAddress where the address is not a multiple of the type's
   size; the CPU would not mind, so the emulator reports it */
void misaligned(const char *file, int line, const void *p, size_t align);
template <typename T> static inline T *aligned(const char *file, int line, T *p)
{
    if ((uintptr_t)p % alignof(T)) misaligned(file, line, (const void *)p, alignof(T));
    return p;
}
/* the top of a kernel declared __launch_bounds__(max, ...) (rewrite.pl): a GPU refuses
   a launch of more threads a block than max (too many resources requested) */
void launch_bounds(const char *file, int line, unsigned max);
extern unsigned long long block_serial; /* changes at the start of every block */
void poison_shared(void *p, size_t bytes);
} // namespace emu

#define EMU_LAUNCH(...) ::emu::make_site(#__VA_ARGS__, __FILE__, __LINE__, [=](auto... emu_a) { __VA_ARGS__(emu_a...); })
/* a static __shared__ array becomes 0xFF bytes when the first thread of each block
   reaches its declaration */
#define EMU_SHARED(a)                                                                                  \
    do {                                                                                               \
        static unsigned long long emu_seen_;                                                           \
        if (emu_seen_ != ::emu::block_serial) { emu_seen_ = ::emu::block_serial; ::emu::poison_shared(a, sizeof(a)); } \
    } while (0)

#define __syncthreads() ::emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::emu::syncwarp(__FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_sync(mask, v, ...) ::emu::shfl(__FILE__, __LINE__, ::emu::SHFL_IDX, mask, v, __VA_ARGS__)
#define __shfl_xor_sync(mask, v, ...) ::emu::shfl(__FILE__, __LINE__, ::emu::SHFL_XOR, mask, v, __VA_ARGS__)
#define __shfl_down_sync(mask, v, ...) ::emu::shfl(__FILE__, __LINE__, ::emu::SHFL_DOWN, mask, v, __VA_ARGS__)
#define __shfl_up_sync(mask, v, ...) ::emu::shfl(__FILE__, __LINE__, ::emu::SHFL_UP, mask, v, __VA_ARGS__)
namespace emu {
/* the optional width of a shuffle */
template <class T> static inline T shfl(const char *f, int l, shfl_kind k, unsigned m, T v, int arg) { return shfl(f, l, k, m, v, arg, 32); }
static inline void syncwarp(const char *f, int l, unsigned mask = 0xffffffffu) { shfl(f, l, SHFL_SYNCWARP, mask, 0, 0, 32); }
}

/* ---- device functions: one block runs at a time, so an atomic is a plain update ---- */
template <class T, class U> static inline T atomicAdd(T *p, U v) { T old = *p; *p = old + (T)v; return old; }
template <class T, class U> static inline T atomicMax(T *p, U v) { T old = *p; *p = old > (T)v ? old : (T)v; return old; }
template <class T, class U> static inline T atomicMin(T *p, U v) { T old = *p; *p = old < (T)v ? old : (T)v; return old; }
template <class T, class U> static inline T atomicExch(T *p, U v) { T old = *p; *p = (T)v; return old; }
template <class T, class U> static inline T atomicCAS(T *p, U cmp, U v) { T old = *p; if (old == (T)cmp) *p = (T)v; return old; }

namespace emu { float device_rsqrtf(float x); } /* as CUDA's may round it (emu.cpp) */
static inline float rsqrtf(float x) { return emu::device_rsqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
/* a product nvcc never fuses into a multiply-add: rounded here too (the empty asm keeps g++'s
   contraction from seeing through it once inlined into fused device code) */
static inline float __fmul_rn(float a, float b)
{
    float r = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__ volatile("" : "+x"(r));
#elif defined(__GNUC__)
    __asm__ volatile("" : "+w"(r));
#endif
    return r;
}
#define EMU_MINMAX(T)                                                   \
    static inline T min(T a, T b) { return a < b ? a : b; }           \
    static inline T max(T a, T b) { return a > b ? a : b; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned int)
EMU_MINMAX(long)
EMU_MINMAX(unsigned long)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
EMU_MINMAX(float)
EMU_MINMAX(double)
#undef EMU_MINMAX
#endif
