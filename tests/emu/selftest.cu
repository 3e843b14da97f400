/* tests/emu/selftest.cu - the CUDA emulator's own checks, one small program per case:
   tests/emu/test_emu.sh runs `selftest CASE` for each and expects either "ok" and
   status 0 (the emulator behaves as CUDA does) or the emulator's one-line report and
   an abort (it catches what a GPU would make undefined). Built like every emulated
   program (make emu: build/emu/tests/emu/selftest); meaningless on a real GPU. */
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <cub/device/device_radix_sort.cuh>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define OK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { printf("%s: %s\n", #call, cudaGetErrorString(e_)); exit(1); } } while (0)
#define FULL 0xffffffffu

static float *dev_floats(size_t n, float v)
{
    float *d, *h = (float *)malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = v;
    OK(cudaMalloc(&d, n * sizeof *d));
    OK(cudaMemcpy(d, h, n * sizeof *d, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static float get1(const float *d)
{
    float x;
    OK(cudaMemcpy(&x, d, sizeof x, cudaMemcpyDeviceToHost));
    return x;
}

/* ---- kernels with the bugs a GPU would not report ---- */
__global__ void divergent_barrier(float *p)
{
    if (threadIdx.x < 16) __syncthreads();
    else __syncthreads();
    p[threadIdx.x] = 1;
}

__global__ void barrier_after_exit(float *p)
{
    if (threadIdx.x == 3) return;
    __syncthreads();
    p[threadIdx.x] = 1;
}

__global__ void shuffle_partner_exited(float *p)
{
    float v = p[threadIdx.x];
    if (threadIdx.x == 5) return;
    p[threadIdx.x] = __shfl_xor_sync(FULL, v, 1);
}

__global__ void shuffle_under_branch(float *p)
{
    float v = p[threadIdx.x];
    if (threadIdx.x % 2) v += __shfl_xor_sync(FULL, v, 1);
    p[threadIdx.x] = v;
}

__global__ void shuffle_masks_differ(float *p)
{
    float v = p[threadIdx.x];
    p[threadIdx.x] = __shfl_xor_sync(threadIdx.x < 16 ? 0x0000ffffu : FULL, v, 1);
}

__global__ void shuffle_meets_barrier(float *p)
{
    float v = p[threadIdx.x];
    if (threadIdx.x < 16) v = __shfl_xor_sync(FULL, v, 1);
    else __syncthreads();
    p[threadIdx.x] = v;
}

/* two block sums through one shared array with no barrier before the second's writes:
   a warp through its shuffles ahead of the others overwrites what they still read */
__device__ float block_sum_unguarded(float v)
{
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    float r = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; w++) r += part[w];
    return r;
}
__global__ void two_sums_unguarded(float *out)
{
    const float first = block_sum_unguarded(1.0f);
    out[blockIdx.x * blockDim.x + threadIdx.x] = first + 0.0f * block_sum_unguarded(100.0f);
}

/* 16 bytes read where a float4 cannot start (one float in), through either kind of cast */
__global__ void vector_misaligned_cpp(float *p) { p[0] = reinterpret_cast<const float4 *>(p + 1)->x; }
__global__ void vector_misaligned_c(float *p) { p[0] = ((const float4 *)(p + 1))->x; }
__global__ void __launch_bounds__(32) bounded_to_32(float *p) { p[threadIdx.x] = 2.0f; }
/* two arrays of 32 KB: past the 48 KB of static shared memory a kernel may declare */
__global__ void too_much_shared(float *p)
{
    __shared__ float a[8192], b[8192];
    a[threadIdx.x] = p[threadIdx.x];
    b[threadIdx.x] = a[threadIdx.x];
    __syncthreads();
    p[threadIdx.x] = b[threadIdx.x];
}
__global__ void write_at(float *p, long i) { p[i] = 1.0f; }
__global__ void read_shared_first(float *out)
{
    __shared__ float s[64];
    out[threadIdx.x + 64 * blockIdx.x] = s[threadIdx.x]; /* never written: the block's poison */
    __syncthreads();
    s[threadIdx.x] = 1.0f;
}
__global__ void set_value(float *p, float v) { *p = v; }
__global__ void copy_value(float *dst, const float *src) { *dst = *src; }
__global__ void multiply_add(float *p) { p[3] = p[0] * p[1] + p[2]; }
__global__ void math_functions(float *out, const float *x, int n)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    out[i] = expf(x[i]);
    out[n + i] = logf(x[i]);
    out[2 * n + i] = tanhf(x[i]);
    out[3 * n + i] = rsqrtf(x[i]);
}
__global__ void block_order(int *order, int *next) { order[atomicAdd(next, 1)] = (int)blockIdx.x; }
__global__ void warp_sum(float *p)
{
    float v = p[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    p[threadIdx.x] = v;
}

/* ---- cases ---- */
typedef int (*case_fn)(void);

static int launch_one(void (*k)(float *), int threads)
{
    float *p = dev_floats(1024, 1.0f);
    k<<<1, threads>>>(p);
    OK(cudaDeviceSynchronize());
    return 0;
}
static int c_divergent_barrier(void) { return launch_one(divergent_barrier, 64); }
static int c_barrier_after_exit(void) { return launch_one(barrier_after_exit, 64); }
static int c_shuffle_partner_exited(void) { return launch_one(shuffle_partner_exited, 32); }
static int c_shuffle_under_branch(void) { return launch_one(shuffle_under_branch, 32); }
static int c_shuffle_masks_differ(void) { return launch_one(shuffle_masks_differ, 32); }
static int c_shuffle_meets_barrier(void) { return launch_one(shuffle_meets_barrier, 32); }
/* the race above shows: some thread reads another warp's second sum as part of its first */
static int c_warps_run_ahead(void)
{
    enum { B = 16, T = 512 };
    static float h[B * T];
    float *p = dev_floats(B * T, 0.0f);
    int wrong = 0;
    two_sums_unguarded<<<B, T>>>(p);
    OK(cudaMemcpy(h, p, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < B * T; i++) wrong += h[i] != (float)T;
    if (!wrong) return printf("no warp ran ahead of the others: the missing barrier went unseen\n"), 1;
    return 0;
}
static int c_vector_misaligned_cpp(void) { return launch_one(vector_misaligned_cpp, 1); }
static int c_vector_misaligned_c(void) { return launch_one(vector_misaligned_c, 1); }
static int c_past_launch_bounds(void) { return launch_one(bounded_to_32, 64); }
static int c_within_launch_bounds(void) { return launch_one(bounded_to_32, 32); }
static int c_too_much_shared(void) { return launch_one(too_much_shared, 32); }

/* a*b + c in one rounding, as nvcc compiles it (--fmad=true, its default): (1 + 2^-12)^2
   - (1 + 2^-11) is 2^-24 fused, 0 with the product rounded first */
static int c_multiply_add_fused(void)
{
    float h[4] = {1.0f + 0x1p-12f, 1.0f + 0x1p-12f, -(1.0f + 0x1p-11f), 0.0f}, *p = dev_floats(4, 0.0f);
    OK(cudaMemcpy(p, h, sizeof h, cudaMemcpyHostToDevice));
    multiply_add<<<1, 1>>>(p);
    return get1(p + 3) == 0x1p-24f ? 0 : (printf("a*b + c = %g, want 2^-24 (fused)\n", get1(p + 3)), 1);
}

/* CUDA's expf, logf, tanhf and rsqrtf are within 1-2 units in the last place, not rounded to
   nearest: in a kernel each result is one of the two floats around the exact value (many not
   glibc's), the same for the same argument; host code's calls stay glibc's (__real_: the
   linker's --wrap) */
extern "C" float __real_expf(float), __real_logf(float), __real_tanhf(float);
static int c_math_faithful(void)
{
    enum { N = 4096 };
    static float x[N], h[2][4 * N];
    static const char *name[4] = {"expf", "logf", "tanhf", "rsqrtf"};
    float *dx = dev_floats(N, 0.0f), *out = dev_floats(4 * N, 0.0f);
    int moved[4] = {0, 0, 0, 0};
    for (int i = 0; i < N; i++) x[i] = i < 2 ? (float)i : ldexpf(1.0f + (float)(i % 512) / 512.0f, i / 512 - 4); /* 0, 1, 2^-4 .. 2^4 */
    OK(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));
    for (int run = 0; run < 2; run++) {
        math_functions<<<N / 256, 256>>>(out, dx, N);
        OK(cudaMemcpy(h[run], out, sizeof h[run], cudaMemcpyDeviceToHost));
    }
    if (memcmp(h[0], h[1], sizeof h[0])) return printf("two launches with the same arguments differ\n"), 1;
    for (int i = 0; i < N; i++) {
        const double t[4] = {exp((double)x[i]), log((double)x[i]), tanh((double)x[i]), 1.0 / sqrt((double)x[i])};
        const float host[4] = {expf(x[i]), logf(x[i]), tanhf(x[i]), 1.0f / sqrtf(x[i])};
        if (host[0] != __real_expf(x[i]) || host[1] != __real_logf(x[i]) || host[2] != __real_tanhf(x[i]))
            return printf("host code's expf, logf or tanhf of %a is not glibc's\n", x[i]), 1;
        for (int f = 0; f < 4; f++) {
            const float d = h[0][f * N + i], r = (float)t[f]; /* r: t to nearest */
            const float lo = (double)r > t[f] ? nextafterf(r, -INFINITY) : r;
            const float hi = (double)r < t[f] ? nextafterf(r, INFINITY) : r;
            if (!isfinite(t[f]) ? d != host[f] : d != lo && d != hi)
                return printf("%s(%a) = %a in a kernel, want %a or %a\n", name[f], x[i], d, lo, hi), 1;
            moved[f] += d != host[f];
        }
    }
    for (int f = 0; f < 4; f++)
        if (moved[f] < N / 8) return printf("%s: only %d of %d results differ from glibc's\n", name[f], moved[f], N), 1;
    return 0;
}

/* a correct warp reduction gives every lane the sum */
static int c_shuffle_ok(void)
{
    float h[32], *p = dev_floats(32, 0.0f);
    for (int i = 0; i < 32; i++) h[i] = (float)i;
    OK(cudaMemcpy(p, h, sizeof h, cudaMemcpyHostToDevice));
    warp_sum<<<1, 32>>>(p);
    OK(cudaMemcpy(h, p, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 32; i++)
        if (h[i] != 496.0f) return printf("lane %d has %g, want 496\n", i, h[i]), 1;
    return 0;
}

static int c_host_pointer_arg(void)
{
    static float host[4];
    set_value<<<1, 1>>>(host, 1.0f);
    return 0;
}

static int c_write_past_end(void)
{
    float *p = dev_floats(100, 0.0f);
    write_at<<<1, 1>>>(p, 100); /* in the 256-byte slack: seen after the kernel */
    OK(cudaDeviceSynchronize());
    return 0;
}

static int c_write_far_past_end(void)
{
    float *p = dev_floats(100, 0.0f);
    write_at<<<1, 1>>>(p, 700); /* the inaccessible page after it */
    OK(cudaDeviceSynchronize());
    return 0;
}

static int c_use_after_free(void)
{
    float *p = dev_floats(100, 0.0f);
    OK(cudaFree(p));
    set_value<<<1, 1>>>(p, 1.0f);
    return 0;
}

static int c_memcpy_past_end(void)
{
    float h[101], *p = dev_floats(100, 0.0f);
    cudaMemcpy(h, p, sizeof h, cudaMemcpyDeviceToHost);
    return 0;
}

static int c_memcpy_direction(void)
{
    float h = 0, *p = dev_floats(1, 0.0f);
    cudaMemcpy(&h, p, sizeof h, cudaMemcpyHostToDevice); /* the pointers say device to host */
    return 0;
}

static int c_launch_limits(void)
{
    float *p = dev_floats(1, 0.0f);
    set_value<<<1, 2048>>>(p, 1.0f);
    if (cudaGetLastError() != cudaErrorInvalidConfiguration) return printf("2048 threads: no error\n"), 1;
    set_value<<<dim3(1, 70000), 1>>>(p, 1.0f);
    if (cudaGetLastError() != cudaErrorInvalidConfiguration) return printf("grid.y 70000: no error\n"), 1;
    set_value<<<0, 1>>>(p, 1.0f);
    if (cudaGetLastError() != cudaErrorInvalidConfiguration) return printf("an empty grid: no error\n"), 1;
    if (cudaGetLastError() != cudaSuccess) return printf("the error stuck\n"), 1;
    return 0;
}

/* never-written shared memory reads as NaN in every block, not the last block's values */
static int c_shared_poisoned(void)
{
    float h[4 * 64], *p = dev_floats(4 * 64, 0.0f);
    read_shared_first<<<4, 64>>>(p);
    OK(cudaMemcpy(h, p, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4 * 64; i++)
        if (h[i] == h[i]) return printf("element %d read %g from shared memory nobody wrote\n", i, h[i]), 1;
    return 0;
}

/* blocks run in a shuffled order */
static int c_blocks_shuffled(void)
{
    int h[64], *order, *next, in_order = 1;
    OK(cudaMalloc(&order, sizeof h));
    OK(cudaMalloc(&next, sizeof(int)));
    OK(cudaMemset(next, 0, sizeof(int)));
    block_order<<<64, 1>>>(order, next);
    OK(cudaMemcpy(h, order, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++) in_order &= h[i] == i;
    return in_order ? printf("blocks ran in index order\n"), 1 : 0;
}

/* two non-blocking streams and an event */
static void two_streams(cudaStream_t *a, cudaStream_t *b, cudaEvent_t *ev)
{
    OK(cudaStreamCreateWithFlags(a, cudaStreamNonBlocking));
    OK(cudaStreamCreateWithFlags(b, cudaStreamNonBlocking));
    OK(cudaEventCreate(ev));
}

/* A kernel on stream b reads what one on stream a writes: without an event the host's
   wait for b runs b first (the old value); with cudaStreamWaitEvent the new one. */
static int streams_case(int with_event)
{
    cudaStream_t a, b;
    cudaEvent_t ev;
    float *x = dev_floats(1, 1.0f), *y = dev_floats(1, 0.0f);
    two_streams(&a, &b, &ev);
    set_value<<<1, 1, 0, a>>>(x, 2.0f);
    OK(cudaEventRecord(ev, a));
    if (with_event) OK(cudaStreamWaitEvent(b, ev, 0));
    copy_value<<<1, 1, 0, b>>>(y, x);
    OK(cudaStreamSynchronize(b));
    const float got = get1(y);
    if (with_event && got != 2.0f) return printf("with the event: %g, want 2\n", got), 1;
    if (!with_event && got != 1.0f) return printf("without the event the copy saw %g: not run first\n", got), 1;
    return 0;
}
static int c_streams_unordered(void) { return streams_case(0); }
static int c_streams_ordered(void) { return streams_case(1); }

/* cudaStreamWaitEvent waits for the record at the time of the call, not a later one */
static int c_wait_event_snapshot(void)
{
    cudaStream_t a, b;
    cudaEvent_t ev;
    float *x = dev_floats(1, 1.0f), *y = dev_floats(1, 0.0f);
    two_streams(&a, &b, &ev);
    OK(cudaEventRecord(ev, a));   /* before the write */
    OK(cudaStreamWaitEvent(b, ev, 0));
    set_value<<<1, 1, 0, a>>>(x, 2.0f);
    OK(cudaEventRecord(ev, a));   /* a later record does not move b's wait */
    copy_value<<<1, 1, 0, b>>>(y, x);
    OK(cudaStreamSynchronize(b));
    return get1(y) == 1.0f ? 0 : (printf("b waited for the later record\n"), 1);
}

/* The legacy default stream waits for blocking streams (and they for it), not for
   non-blocking ones. */
static int c_legacy_stream(void)
{
    cudaStream_t blocking, nonblocking;
    float *x = dev_floats(1, 1.0f), *y = dev_floats(1, 0.0f), *z = dev_floats(1, 0.0f);
    OK(cudaStreamCreate(&blocking));
    OK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
    set_value<<<1, 1>>>(x, 2.0f);                   /* legacy stream */
    copy_value<<<1, 1, 0, blocking>>>(y, x);        /* waits for it */
    copy_value<<<1, 1, 0, nonblocking>>>(z, x);     /* does not */
    OK(cudaStreamSynchronize(blocking));
    OK(cudaStreamSynchronize(nonblocking));
    if (get1(y) != 2.0f) return printf("the blocking stream did not wait for the legacy stream\n"), 1;
    if (get1(z) != 1.0f) return printf("the non-blocking stream waited for the legacy stream\n"), 1;
    return 0;
}

/* An async copy from pageable memory reads it at the call; from pinned memory, when
   the copy runs (so a host write before that changes what arrives). */
static int c_pageable_and_pinned(void)
{
    float pageable = 1.0f, *pinned, *a = dev_floats(1, 0.0f), *b = dev_floats(1, 0.0f);
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cudaMallocHost(&pinned, sizeof *pinned));
    *pinned = 1.0f;
    OK(cudaMemcpyAsync(a, &pageable, sizeof pageable, cudaMemcpyHostToDevice, s));
    OK(cudaMemcpyAsync(b, pinned, sizeof *pinned, cudaMemcpyHostToDevice, s));
    pageable = *pinned = 2.0f; /* too early for the pinned copy */
    OK(cudaStreamSynchronize(s));
    if (get1(a) != 1.0f) return printf("the pageable copy read the later value\n"), 1;
    if (get1(b) != 2.0f) return printf("the pinned copy ran before the host wrote again\n"), 1;
    return 0;
}

/* a thread that never called cudaSetDevice works on device 0: reported under
   DDP_EMU_STRICT_DEVICES=1 when the process uses device 1 */
static void *query_event(void *ev)
{
    cudaEventQuery((cudaEvent_t)ev);
    return NULL;
}
static int c_second_device(void)
{
    cudaEvent_t ev;
    pthread_t t;
    OK(cudaSetDevice(1));
    OK(cudaEventCreate(&ev));
    pthread_create(&t, NULL, query_event, ev);
    pthread_join(t, NULL);
    return 0;
}

/* ---- cuBLASLt and CUB ---- */
/* the heuristic declines a bf16 matrix whose rows are not 16-byte aligned */
static int c_lt_declines(void)
{
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res;
    int found = -1;
    const uint32_t al = 256;
    if (cublasLtCreate(&lt) || cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
        cublasLtMatmulPreferenceCreate(&pref))
        return printf("create failed\n"), 1;
    for (int ld = 64; ld <= 65; ld++) {
        cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, 8, 8, ld);
        cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, 8, 8, ld);
        cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, 8, 8, ld);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, d, d, pref, 1, &res, &found);
        if (ld == 64 && (s || found != 1)) return printf("ld 64: declined\n"), 1;
        if (ld == 65 && !(s == CUBLAS_STATUS_NOT_SUPPORTED || found == 0)) return printf("ld 65: accepted\n"), 1;
    }
    return 0;
}

/* an algorithm planned for aligned pointers, run on misaligned ones */
static int c_lt_misaligned(void)
{
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t l;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    const float one = 1, zero = 0;
    void *m;
    OK(cudaMalloc(&m, 64 * 64 * 2 + 64));
    cublasLtCreate(&lt);
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 8, 8, 8);
    if (cublasLtMatmulAlgoGetHeuristic(lt, op, l, l, l, l, pref, 1, &res, &found) || found != 1)
        return printf("no algorithm\n"), 1;
    cublasLtMatmul(lt, op, &one, (char *)m + 2, l, m, l, &zero, m, l, m, l, &res.algo, NULL, 0, 0);
    return 0;
}

static int c_cub_temp_too_small(void)
{
    int *k, *v;
    void *temp;
    size_t need = 0, small;
    OK(cudaMalloc(&k, 4 * 100));
    OK(cudaMalloc(&v, 4 * 100));
    cub::DeviceRadixSort::SortPairs(NULL, need, (const int *)k, k + 50, (const int *)v, v + 50, 50);
    OK(cudaMalloc(&temp, need));
    small = need - 1;
    return cub::DeviceRadixSort::SortPairs(temp, small, (const int *)k, k + 50, (const int *)v, v + 50, 50) ==
           cudaErrorInvalidValue ? 0 : (printf("no error\n"), 1);
}

/* ---- NCCL, one rank ---- */
static ncclComm_t one_rank(int blocking)
{
    ncclUniqueId id;
    ncclComm_t c;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking;
    ncclGetUniqueId(&id);
    ncclResult_t r = ncclCommInitRankConfig(&c, 1, id, 0, &cfg);
    while (r == ncclInProgress) ncclCommGetAsyncError(c, &r);
    if (r != ncclSuccess) { printf("init: %s\n", ncclGetErrorString(r)); exit(1); }
    return c;
}

static int c_nccl_use_after_abort(void)
{
    ncclComm_t c = one_rank(1);
    ncclResult_t r;
    ncclCommAbort(c);
    ncclCommGetAsyncError(c, &r);
    return 0;
}

static ncclComm_t shared_comm;
static void *poll_comm(void *)
{
    ncclResult_t r;
    ncclCommGetAsyncError(shared_comm, &r);
    return NULL;
}
/* two threads inside NCCL calls on one communicator at once (DDP_EMU_NCCL_DELAY_US
   holds each call long enough for them to meet) */
static int c_nccl_two_threads(void)
{
    pthread_t t;
    shared_comm = one_rank(1);
    pthread_create(&t, NULL, poll_comm, NULL);
    poll_comm(NULL);
    pthread_join(t, NULL);
    return 0;
}

/* DDP_EMU_NCCL_INPROGRESS=3: init answers in progress, then three polls do */
static int c_nccl_in_progress(void)
{
    ncclUniqueId id;
    ncclComm_t c;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t r;
    int polls = 0;
    cfg.blocking = 0;
    ncclGetUniqueId(&id);
    if (ncclCommInitRankConfig(&c, 1, id, 0, &cfg) != ncclInProgress) return printf("init did not answer in progress\n"), 1;
    do { ncclCommGetAsyncError(c, &r); polls++; } while (r == ncclInProgress);
    return r == ncclSuccess && polls == 4 ? 0 : (printf("%d polls to %s\n", polls, ncclGetErrorString(r)), 1);
}

/* DDP_EMU_NCCL_ERROR=0:2:3: collective #2 fails with ncclInternalError, as an async error */
static int c_nccl_injected_error(void)
{
    ncclComm_t c = one_rank(1);
    float *x = dev_floats(4, 1.0f);
    ncclResult_t r;
    for (int k = 1; k <= 2; k++)
        if (ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, c, 0) != ncclSuccess) return printf("enqueue failed\n"), 1;
    OK(cudaDeviceSynchronize());
    ncclCommGetAsyncError(c, &r);
    return r == ncclInternalError ? 0 : (printf("async error %s\n", ncclGetErrorString(r)), 1);
}

/* two processes, one rank each, passing different counts */
static int c_nccl_mismatch(void)
{
    ncclUniqueId id;
    int status[2];
    ncclGetUniqueId(&id);
    for (int rank = 0; rank < 2; rank++)
        if (fork() == 0) {
            ncclComm_t c;
            float *x;
            OK(cudaSetDevice(rank));
            x = dev_floats(8, 1.0f);
            if (ncclCommInitRank(&c, 2, id, rank) != ncclSuccess) _exit(1);
            ncclAllReduce(x, x, rank ? 8 : 4, ncclFloat32, ncclSum, c, 0);
            cudaDeviceSynchronize();
            _exit(0);
        }
    for (int i = 0; i < 2; i++) wait(&status[i]);
    return WIFSIGNALED(status[0]) && WIFSIGNALED(status[1]) ? 0 : (printf("a rank did not abort\n"), 1);
}

/* CUDA does not survive a fork: a child of a process that used it gets an error */
static int c_fork_after_cuda(void)
{
    int n = 0, st = 0;
    OK(cudaGetDeviceCount(&n));
    if (fork() == 0) _exit(cudaGetDeviceCount(&n) == cudaErrorInitializationError ? 0 : 1);
    wait(&st);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : (printf("the child used CUDA\n"), 1);
}

static const struct { const char *name; case_fn fn; } cases[] = {
#define CASE(name) {#name, c_##name}
    CASE(divergent_barrier), CASE(barrier_after_exit), CASE(shuffle_partner_exited), CASE(shuffle_under_branch),
    CASE(shuffle_masks_differ), CASE(shuffle_meets_barrier), CASE(shuffle_ok), CASE(host_pointer_arg),
    CASE(write_past_end), CASE(write_far_past_end), CASE(use_after_free), CASE(memcpy_past_end),
    CASE(memcpy_direction), CASE(launch_limits), CASE(shared_poisoned), CASE(blocks_shuffled),
    CASE(streams_unordered), CASE(streams_ordered), CASE(wait_event_snapshot), CASE(legacy_stream),
    CASE(pageable_and_pinned), CASE(second_device), CASE(lt_declines), CASE(lt_misaligned),
    CASE(cub_temp_too_small), CASE(nccl_use_after_abort), CASE(nccl_two_threads), CASE(nccl_in_progress),
    CASE(nccl_injected_error), CASE(nccl_mismatch), CASE(fork_after_cuda), CASE(vector_misaligned_cpp),
    CASE(vector_misaligned_c), CASE(past_launch_bounds), CASE(within_launch_bounds), CASE(too_much_shared), CASE(warps_run_ahead),
    CASE(multiply_add_fused), CASE(math_faithful),
#undef CASE
};

int main(int argc, char **argv)
{
    for (size_t i = 0; argc == 2 && i < sizeof cases / sizeof cases[0]; i++)
        if (strcmp(argv[1], cases[i].name) == 0) {
            const int r = cases[i].fn();
            if (r == 0) printf("ok\n");
            return r;
        }
    fprintf(stderr, "usage: selftest CASE; the cases:");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) fprintf(stderr, " %s", cases[i].name);
    fprintf(stderr, "\n");
    return 2;
}
