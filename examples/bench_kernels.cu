/* examples/bench_kernels.cu - how fast is each layer of ddp_kernels.cuh on this GPU?
   First it measures two ceilings: device-to-device copy bandwidth and a large bf16
   GEMM through cuBLASLt. Then it times the forward and backward of every layer at
   GPT-2 124M shapes (B=8, T=1024, C=768, NH=12, V=50304) in bf16: the median of
   several runs after a warmup, with CUDA events. Memory-bound kernels report GB/s
   (the bytes they must move at least) against the copy bandwidth; matmuls and
   attention report TFLOP/s against the GEMM peak. Attention counts the causal half
   of the score matrix only.
       nvcc -arch=sm_90 -O3 -std=c++17 -I. examples/bench_kernels.cu -o examples/bench_kernels -lcublasLt -lcublas */
#include "ddp_kernels.cuh"
#include <algorithm>
#include <stdio.h>
#include <vector>

typedef __nv_bfloat16 bf16;
enum { B = 8, T = 1024, C = 768, NH = 12, V = 50304, BT = B * T };
static const size_t NPARAMS = 124475904; /* GPT-2 124M, vocab padded to 50304 */

#define CHECK_CUDA(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)

/* deterministic pseudo-random fill on the device, uniform in [-scale, scale] */
template <typename F> __global__ void fill_kernel(F *p, size_t n, float scale, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        p[i] = (F)(scale * ((float)(h & 0xFFFFFF) / 8388608.0f - 1.0f));
    }
}
__global__ void fill_int_kernel(int *p, size_t n, int hi, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (int)(((unsigned)i * 2654435761u ^ seed) % (unsigned)hi);
}

static unsigned g_seed = 1;
template <typename F> static F *make(size_t n, float scale)
{
    F *p;
    CHECK_CUDA(cudaMalloc(&p, n * sizeof(F)));
    fill_kernel<<<1024, 256>>>(p, n, scale, g_seed++);
    CHECK_CUDA(cudaGetLastError());
    return p;
}
static int *make_int(size_t n, int hi)
{
    int *p;
    CHECK_CUDA(cudaMalloc(&p, n * sizeof(int)));
    fill_int_kernel<<<1024, 256>>>(p, n, hi, g_seed++);
    CHECK_CUDA(cudaGetLastError());
    return p;
}

/* median time in microseconds of run(), after two warmup calls */
template <typename Run> static double time_us(Run run, int reps = 15)
{
    cudaEvent_t a, b;
    std::vector<float> ms(reps);
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    for (int i = 0; i < 2; i++) CHECK_CUDA(run());
    for (int i = 0; i < reps; i++) {
        CHECK_CUDA(cudaEventRecord(a));
        CHECK_CUDA(run());
        CHECK_CUDA(cudaEventRecord(b));
        CHECK_CUDA(cudaEventSynchronize(b));
        CHECK_CUDA(cudaEventElapsedTime(&ms[i], a, b));
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2] * 1000.0;
}

static double g_copy_gbs, g_gemm_tflops;

static void row_bw(const char *name, const char *shape, double us, double bytes)
{
    const double gbs = bytes / us * 1e-3;
    printf("%-22s %-26s %10.1f %10.1f GB/s    %5.0f%% of copy\n", name, shape, us, gbs, 100.0 * gbs / g_copy_gbs);
}
static void row_flops(const char *name, const char *shape, double us, double flops)
{
    const double tf = flops / us * 1e-6;
    printf("%-22s %-26s %10.1f %10.1f TFLOP/s %5.0f%% of gemm\n", name, shape, us, tf, 100.0 * tf / g_gemm_tflops);
}

int main()
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("bench_kernels: no CUDA device, nothing to measure\n");
        return 0;
    }
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    ddp_kernels_ctx k;
    if (ddp_kernels_init(&k) != cudaSuccess) {
        fprintf(stderr, "ddp_kernels_init: %s\n", ddp_kernels_error(&k));
        return 1;
    }
    const cudaStream_t s = 0;
    const double E = sizeof(bf16), act = (double)BT * C * E; /* one (B,T,C) bf16 tensor */

    /* ---- ceilings ---- */
    {
        const size_t bytes = (size_t)1 << 30;
        void *x, *y;
        CHECK_CUDA(cudaMalloc(&x, bytes));
        CHECK_CUDA(cudaMalloc(&y, bytes));
        double us = time_us([&] { return cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, s); });
        g_copy_gbs = 2.0 * bytes / us * 1e-3;
        cudaFree(x);
        cudaFree(y);
        const int n = 8192;
        bf16 *a = make<bf16>((size_t)n * n, 1), *b = make<bf16>((size_t)n * n, 1), *c = make<bf16>((size_t)n * n, 0);
        us = time_us([&] { return ddp_matmul_forward_gpu(&k, c, a, b, NULL, 1, n, n, n, s); }, 7);
        g_gemm_tflops = 2.0 * n * n * (double)n / us * 1e-6;
        cudaFree(a); cudaFree(b); cudaFree(c);
    }
    printf("%s, bf16, GPT-2 124M shapes B=%d T=%d C=%d NH=%d V=%d\n", prop.name, B, T, C, NH, V);
    printf("ceilings: copy %.0f GB/s (cudaMemcpy D2D, 1 GiB), bf16 GEMM %.0f TFLOP/s (cuBLASLt 8192^3)\n\n",
           g_copy_gbs, g_gemm_tflops);
    printf("%-22s %-26s %10s %15s    %s\n", "kernel", "shape", "time (us)", "achieved", "fraction");

    /* ---- per layer ---- */
    int *tokens = make_int(BT, V), *targets = make_int(BT, V);
    bf16 *wte = make<bf16>((size_t)V * C, 0.02f), *wpe = make<bf16>((size_t)T * C, 0.02f);
    bf16 *x = make<bf16>((size_t)BT * C, 1), *y = make<bf16>((size_t)BT * C, 1), *dx = make<bf16>((size_t)BT * C, 0);
    bf16 *dy = make<bf16>((size_t)BT * C, 1), *dx2 = make<bf16>((size_t)BT * C, 0);
    /* parameter gradients are fp32 whatever the activation type */
    bf16 *lnw = make<bf16>(C, 1), *lnb = make<bf16>(C, 0.1f);
    float *dlnw = make<float>(C, 0), *dlnb = make<float>(C, 0);
    float *dwte = make<float>((size_t)V * C, 0), *dwpe = make<float>((size_t)T * C, 0);
    bf16 *qkv = make<bf16>((size_t)BT * 3 * C, 1), *dqkv = make<bf16>((size_t)BT * 3 * C, 0);
    bf16 *h4 = make<bf16>((size_t)BT * 4 * C, 1), *g4 = make<bf16>((size_t)BT * 4 * C, 1), *dh4 = make<bf16>((size_t)BT * 4 * C, 0);
    bf16 *w = make<bf16>((size_t)4 * C * C, 0.02f), *bias = make<bf16>(4 * C, 0.02f);
    float *dw = make<float>((size_t)4 * C * C, 0), *dbias = make<float>(4 * C, 0);
    bf16 *logits = make<bf16>((size_t)BT * V, 2), *dlogits = make<bf16>((size_t)BT * V, 0);
    float *mean = make<float>(BT, 0), *rstd = make<float>(BT, 1), *lse = make<float>((size_t)B * NH * T, 0);
    float *losses = make<float>(BT, 0), *loss = make<float>(1, 0), *norm = make<float>(1, 0);
    char shape[64];
    double us;

    snprintf(shape, sizeof shape, "(%d,%d,%d)", B, T, C);
    us = time_us([&] { return ddp_embedding_forward_gpu(&k, x, tokens, wte, wpe, B, T, C, s); });
    row_bw("embedding.forward", shape, us, 3 * act);
    us = time_us([&] { return ddp_embedding_backward_gpu(&k, dwte, dwpe, dy, tokens, B, T, C, s); });
    row_bw("embedding.backward", shape, us, 2 * act + 2.0 * T * C * 4 + 2 * act * 4 / E);

    CHECK_CUDA(ddp_layernorm_forward_gpu(&k, y, mean, rstd, x, lnw, lnb, B, T, C, s));
    us = time_us([&] { return ddp_layernorm_forward_gpu(&k, y, mean, rstd, x, lnw, lnb, B, T, C, s); });
    row_bw("layernorm.forward", shape, us, 2 * act);
    us = time_us([&] { return ddp_layernorm_backward_gpu(&k, dx, dlnw, dlnb, dy, x, lnw, mean, rstd, B, T, C, s); });
    row_bw("layernorm.backward", shape, us, 4 * act);

    const struct { const char *name; int IC, OC; } mms[] = {
        {"qkv", C, 3 * C}, {"attproj", C, C}, {"fc", C, 4 * C}, {"fcproj", 4 * C, C}};
    for (const auto &m : mms) {
        char name[40];
        snprintf(shape, sizeof shape, "(%d,%d)x(%d,%d)", BT, m.IC, m.OC, m.IC);
        const double flops = 2.0 * BT * m.IC * m.OC;
        snprintf(name, sizeof name, "matmul.%s.forward", m.name);
        us = time_us([&] { return ddp_matmul_forward_gpu(&k, h4, g4, w, bias, B, T, m.IC, m.OC, s); });
        row_flops(name, shape, us, flops);
        snprintf(name, sizeof name, "matmul.%s.backward", m.name);
        us = time_us([&] { return ddp_matmul_backward_gpu(&k, dh4, dw, dbias, g4, h4, w, B, T, m.IC, m.OC, s); });
        row_flops(name, shape, us, 2 * flops);
    }
    {   /* the tied lm_head: logits (BT,V) = x (BT,C) @ wte^T */
        snprintf(shape, sizeof shape, "(%d,%d)x(%d,%d)", BT, C, V, C);
        const double flops = 2.0 * BT * C * (double)V;
        us = time_us([&] { return ddp_matmul_forward_gpu(&k, logits, x, wte, NULL, B, T, C, V, s); }, 7);
        row_flops("matmul.lm_head.forward", shape, us, flops);
        us = time_us([&] { return ddp_matmul_backward_gpu(&k, dx, dwte, NULL, logits, x, wte, B, T, C, V, s); }, 7);
        row_flops("matmul.lm_head.backward", shape, us, 2 * flops);
    }

    snprintf(shape, sizeof shape, "(%d,%d,%d) NH=%d", B, T, 3 * C, NH);
    const double att_flops = 4.0 * B * NH * (T * (T + 1) / 2.0) * (C / NH); /* QK^T and PV, causal half */
    us = time_us([&] { return ddp_attention_forward_gpu(&k, y, lse, qkv, B, T, C, NH, s); });
    row_flops("attention.forward", shape, us, att_flops);
    us = time_us([&] { return ddp_attention_backward_gpu(&k, dqkv, dy, qkv, y, lse, B, T, C, NH, s); });
    row_flops("attention.backward", shape, us, 2.5 * att_flops);

    const size_t N4 = (size_t)BT * 4 * C;
    snprintf(shape, sizeof shape, "(%d,%d,%d)", B, T, 4 * C);
    us = time_us([&] { return ddp_gelu_forward_gpu(&k, g4, h4, N4, s); });
    row_bw("gelu.forward", shape, us, 2.0 * N4 * E);
    us = time_us([&] { return ddp_gelu_backward_gpu(&k, dh4, h4, g4, N4, s); });
    row_bw("gelu.backward", shape, us, 4.0 * N4 * E);

    snprintf(shape, sizeof shape, "(%d,%d,%d)", B, T, C);
    us = time_us([&] { return ddp_residual_forward_gpu(&k, y, x, dy, (size_t)BT * C, s); });
    row_bw("residual.forward", shape, us, 3 * act);
    us = time_us([&] { return ddp_residual_backward_gpu(&k, dx, dx2, dy, (size_t)BT * C, s); });
    row_bw("residual.backward", shape, us, 5 * act);

    snprintf(shape, sizeof shape, "(%d,%d,%d)", B, T, V);
    us = time_us([&] { return ddp_crossentropy_forward_backward_gpu(&k, loss, losses, dlogits, logits, targets,
                                                                     B, T, V, -1, 1.0f, s); }, 7);
    row_bw("crossentropy.fwd+bwd", shape, us, 2.0 * BT * V * E);

    {
        bf16 *p = make<bf16>(NPARAMS, 0.02f);
        float *g = make<float>(NPARAMS, 0.01f);
        float *master = make<float>(NPARAMS, 0.02f), *m = make<float>(NPARAMS, 0), *v = make<float>(NPARAMS, 0);
        snprintf(shape, sizeof shape, "N=%zu", NPARAMS);
        us = time_us([&] { return ddp_adamw_update_gpu(&k, p, g, m, v, NPARAMS, 6e-4f, 0.9f, 0.95f, 1e-8f,
                                                       0.1f, 1, master, s); }, 7);
        row_bw("adamw.update", shape, us, NPARAMS * (2.0 + 2.0 + 3 * 4.0 + 3 * 4.0 + 4.0));
        us = time_us([&] { return ddp_global_norm_gpu(&k, norm, g, NPARAMS, s); }, 7);
        row_bw("grad_norm", shape, us, NPARAMS * 4.0);
        us = time_us([&] { return ddp_clip_by_norm_gpu(&k, g, NPARAMS, 1e-3f, norm, s); }, 7); /* always clips */
        row_bw("grad_clip", shape, us, NPARAMS * 8.0);
        cudaFree(p); cudaFree(g); cudaFree(master); cudaFree(m); cudaFree(v);
    }
    ddp_kernels_destroy(&k);
    return 0;
}
