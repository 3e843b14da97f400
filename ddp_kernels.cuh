/* ddp_kernels.cuh - the layers of a GPT-2 style transformer, forward and backward,
   as CUDA kernels with a plain C twin of each, in one header.   v0.2

   WHAT IT IS
   Every layer a small GPT needs to train: token+position embedding, layernorm,
   matmul with bias, causal multi-head self-attention, GELU, residual add, fused
   softmax + cross-entropy, AdamW, and global gradient-norm clipping. Each layer
   comes twice with one argument order:
       ddp_<layer>_<forward|backward>_cpu(args...)            plain C99, fp32
       ddp_<layer>_<forward|backward>_gpu(ctx, args..., stream)  CUDA, returns cudaError_t
   The CPU half needs only libc and libm, so a machine without CUDA builds and trains
   with the same program (add -fopenmp to use every core). The GPU half is compiled
   only by nvcc (it sits under #ifdef __CUDACC__). Everything is static, so the header
   can be included in any number of translation units. Nothing here prints or exits.

   THE CPU FUNCTIONS (the GPU twin of each is the same name ending in _gpu)
       ddp_embedding_forward_cpu    out = wte[tokens] + wpe[t]
       ddp_embedding_backward_cpu   dwte, dwpe += scatter of dout
       ddp_layernorm_forward_cpu    out, mean, rstd of each row
       ddp_layernorm_backward_cpu   dinp, dweight, dbias +=
       ddp_matmul_forward_cpu       out = inp @ weight^T + bias
       ddp_matmul_backward_cpu      dinp, dweight, dbias +=
       ddp_matmul_backward_input_cpu  dinp = dout @ weight, times gelu'(x) if x is given
                                    (CPU only: written, not added; no zeroing, GELU folded in)
       ddp_matmul_backward_sum_cpu  dweight, dbias += in double, each sequence's fp32 gradient
                                    (CPU only: the world-size-invariant sum train_gpt.c uses)
       ddp_attention_forward_cpu    causal multi-head attention on fused qkv; saves lse
       ddp_attention_backward_cpu   dqkv +=
       ddp_gelu_forward_cpu         out = gelu(inp), tanh form
       ddp_gelu_backward_cpu        dinp += gelu'(inp) dout
       ddp_residual_forward_cpu     out = inp1 + inp2
       ddp_residual_backward_cpu    dinp1, dinp2 += dout
       ddp_crossentropy_forward_backward_cpu  mean loss, per-row losses, dlogits
       ddp_adamw_update_cpu         one AdamW step (the GPU twin adds an fp32 master copy)
       ddp_global_norm_cpu          sqrt(sum grads^2)
       ddp_clip_by_norm_cpu         grads *= max_norm / (norm + 1e-6) when that is below 1
   GPU only: ddp_kernels_init, ddp_kernels_destroy, ddp_kernels_error (below).

   INDEX (grep for the tag; each layer's CPU and GPU halves are far apart)
       >>helpers cpu     >>embedding cpu   >>layernorm cpu   >>matmul cpu
       >>attention cpu   >>gelu cpu        >>residual cpu    >>crossentropy cpu
       >>adamw cpu       >>norm cpu
       >>context gpu     >>helpers gpu     >>embedding gpu   >>layernorm gpu
       >>matmul gpu      >>attention gpu   >>gelu gpu        >>residual gpu
       >>crossentropy gpu  >>adamw gpu     >>norm gpu

   HOW TO USE
       #include "ddp_kernels.cuh"
       CPU:  ddp_layernorm_forward_cpu(out, mean, rstd, inp, w, b, B, T, C);
       GPU:  ddp_kernels_ctx k;
             if (ddp_kernels_init(&k) != cudaSuccess)      (cuBLASLt handle + scratch)
                 fprintf(stderr, "%s\n", ddp_kernels_error(&k));
             cudaError_t e = ddp_layernorm_forward_gpu(&k, out, mean, rstd, inp, w, b,
                                                       B, T, C, stream);
             ...                ddp_kernels_destroy(&k);
       cc   -O3 -fopenmp prog.c -lm                                             (CPU only)
       nvcc -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 prog.cu -lcublasLt -lcublas
                            (both halves, for A100 and H100; two -arch flags would build only the last)
   Every GPU launcher takes the context first and the stream last, and is a template
   over the activation type F, float or __nv_bfloat16, deduced from its pointers
   (ddp_floatX is bf16 unless DDP_KERNELS_FP32 is defined, for callers that want one
   type chosen at compile time). All its pointers are device pointers, scalars such
   as the loss and the grad norm included. It returns cudaSuccess or the first
   error; ddp_kernels_error(ctx) then says why in words where the error code cannot
   (no device and the driver/runtime versions, a cuBLAS status and the matmul shape,
   an attention shape out of range); a cuBLAS(Lt) failure returns cudaErrorUnknown
   with its status in ctx->cublas_status. A context serves one stream at a time: its
   scratch buffer is reused by consecutive launches and grows (with a stream sync, so
   not inside a CUDA graph capture) the first time a larger shape needs more; the
   first matmul of each shape plans it (and the first that cuBLASLt declines creates
   a cuBLAS handle), so run one step before capturing a graph.

   CONVENTIONS
   Shapes, row-major, last index fastest:
       B batch, T time (sequence length), C channels, NH heads, hs = C/NH head size,
       V vocabulary, OC output channels of a matmul, N elements of a flat tensor.
   Backward functions ADD (+=) into every gradient they produce, for parameters and
   for activations alike, so the caller zeroes gradients once per step and residual
   branches sum for free. Two exceptions: the cross-entropy, which starts the backward
   pass and overwrites dlogits, and the CPU-only ddp_matmul_backward_input_cpu, which
   writes its dinp (for a gradient with one consumer: nothing to zero). An input
   gradient that is not needed (the first layer's dinp) may be NULL in every backward,
   CPU and GPU; the work for it is skipped. So may the parameter gradients of matmul
   and layernorm (dweight, dbias), for a caller that sums them its own way (train_gpt.c:
   sequence by sequence, with ddp_matmul_backward_sum_cpu, the input gradients over the
   whole batch). On the GPU, parameter gradients (dweight, dbias, dwte, dwpe, and the
   grads AdamW reads) are always float*, whatever F is; activations and their gradients
   are F.

   LOSS ACROSS RANKS
   The cross-entropy's loss and dlogits divide by this rank's count n of valid targets
   (those != ignore_index). When padding makes the counts differ across data-parallel
   ranks, the mean of the ranks' losses is not the global mean, and averaging their
   gradients weights tokens unequally. For the exact global mean with N = the sum of
   n over ranks (all-reduce n with ddp.h, e.g. as a ddp_metric's count):
   - loss: ddp_metric_add(&m, loss, n) on each rank, ddp_metric_reduce, then
     ddp_metric_mean(&m) = sum of all token losses / N;
   - gradients: pass dloss = n / N (or dloss = n and divide the summed gradients by
     N, as train_gpt.c does with its global token count), then SUM the ranks'
     gradients: every token weighs exactly 1/N (a sync that averages over W ranks
     needs dloss = W n / N instead).

   ALGORITHMS
   - embedding: a gather. Its wte gradient is a scatter-add over repeated tokens; the
     GPU sorts (token, position) pairs with a stable radix sort and sums each token's
     rows in position order, so no floating-point atomics are needed.
   - layernorm: two-pass mean and variance per row of values shifted by the row's
     first element (exact for nearby values, so a row with a large mean keeps its
     digits), made again around the mean where that element is an outlier; one warp
     per row on the GPU; mean and 1/std are saved for backward. eps = 1e-5.
   - matmul: out = inp @ weight^T + bias, weight stored (OC,C) as in torch.nn.Linear.
     GPU: cuBLASLt with the bias fused as an epilogue, fp32 accumulation (TF32 only
     if ctx->allow_tf32). The descriptors, layouts and the heuristic's algorithm are
     planned once per shape, type, epilogue and alignment and cached in the context
     (DDP_KERNELS_LT_PLANS, round robin); where cuBLASLt has no algorithm (e.g. bf16
     rows of an unpadded 50257 vocabulary) cublasGemmEx does the product and a small
     kernel adds the bias. CPU: register tiles of 12 rows x 32 columns in AVX-512
     intrinsics, 6 x 16 in AVX2 + FMA ones, else 5 x 16 in C that the compiler vectorizes
     (DDP_KERNELS_CPU_TILE names the one that runs), over panels of the other operand
     packed contiguous (once per call, shared by the threads); the weight gradient's
     transposed operand packed too where its stride is a page, and the next tile's
     output prefetched; each element sums in ascending k whatever the threads, batch,
     tile shape or instruction set. A build for any x86-64 (gcc or clang without
     -march, or below x86-64-v3) carries the AVX2 + FMA tile beside a 6 x 16 one in C
     and takes it where the CPU has both, with the same bits as an AVX2 build (define
     DDP_KERNELS_NO_DISPATCH for the C tile alone; on a CPU without FMA its a*b + c
     gives other last bits).
     Build with -O3 -march=native (and -fno-math-errno, so that AdamW's sqrtf
     vectorizes): the AVX-512 tile, and exp and layernorm in wide vectors.
   - attention: causal softmax(q k^T / sqrt(hs)) v per head, on the fused qkv
     activation (B,T,3C) of the preceding matmul. On the GPU, by default, as products
     on the tensor cores: groups of heads (as many as DDP_KERNELS_ATT_SCRATCH, 512 MiB,
     holds) gathered into (heads,T,hs) panels, strided-batched cublasGemmStridedBatchedEx
     for the fp32 scores and for p v, a softmax kernel between them; the backward
     recomputes the scores and makes dp, dv, dq, dk the same way (products over the
     masked half included: 2.1x the streaming kernels forward, 2.3x backward at GPT-2
     124M, B=8, T=1024 on an H200).
     Where one head's T x T scores would not fit that scratch, and when
     ctx->attention_streaming is set, streaming kernels run instead, tiled in the
     flash-attention way: a block streams key/value tiles through shared memory,
     keeps a running max and sum (online softmax), never writes the (T,T) score
     matrix, and saves each row's log-sum-exp. The backward recomputes probabilities
     from that log-sum-exp: one kernel owns a key tile and accumulates dk and dv,
     another owns a query tile and accumulates dq, so every gradient element is
     written by exactly one thread. Each row is spread over hs/16 threads (rounded up
     to 32, 64, 128) that hold 16 of its dimensions each, so no kernel spills
     registers (tests/test_kernel_regs.sh checks ptxas for sm_80 and sm_90). These
     kernels use CUDA cores (fp32 math), not tensor cores; head sizes up to 128.
     The CPU twins take the same blocks, each product (k q^T and p v, and in the
     backward q k^T, dout v^T, ds k, ds^T q, p^T dout) through the matmul's register
     tile, reading k, v, q and dout where they lie when hs is a multiple of 16.
   - gelu: the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
   - crossentropy: per row the max, then the exponentials (kept in dlogits on the
     CPU) summed in double on the CPU and in per-thread partial sums on the GPU; the
     loss log(sum) + max - logit[target], and dlogits = dloss (softmax - onehot) /
     n_valid, where n_valid counts targets that are not ignore_index (those rows get
     zero loss and zero gradient). Every other target must lie in [0,V). The mean
     loss is reduced in a fixed order.
   - adamw: decoupled weight decay and bias correction, as torch.optim.AdamW.
   - global norm / clip: sqrt of the sum of squares, reduced in a fixed order; clipping
     scales by max_norm / (norm + 1e-6) when that is below 1, as PyTorch does.

   PRECISION AND DETERMINISM
   CPU: fp32 storage and arithmetic; the loss mean, each cross-entropy row's sum of
   exponentials and the grad norm sum in double over a fixed partition, so they do
   not depend on the thread count. Row sums (layernorm, the norm's chunks) go in
   eight lanes in a fixed order; no result depends on the threads, the tile shape or
   which other rows share a call. GPU: activations and weights in F (fp32 or bf16),
   parameter gradients in fp32 (a bf16 "+=" loses small contributions across
   micro-batches); every kernel computes in fp32; layernorm statistics, log-sum-exp,
   losses, AdamW master weights and moments stay fp32.
   Every GPU reduction uses per-block partial sums combined in a fixed order, never
   floating-point atomics, so a rerun of the backward pass is bitwise identical.
   Elementwise and row kernels use 128-bit loads whenever the pointers are 16-byte
   aligned and rows are a multiple of 16 bytes, and scalar loads otherwise.

   DOES NOT
   use tensor cores outside cuBLAS(Lt), fuse layers beyond bias+matmul and
   softmax+cross-entropy, support head sizes above 128, or do dropout.

   HISTORY
   0.2  renamed ddp_global_norm_* / ddp_clip_by_norm_*, AdamW GPU in the CPU order;
        fp32 parameter gradients on the GPU; NULL input gradients; cached cuBLASLt
        plans with a cublasGemmEx fallback; attention without spills, any B*NH;
        ddp_kernels_error; more accurate CPU layernorm and cross-entropy; CPU speed:
        8-row tiles under AVX-512, output prefetch, attention reading k/v in place,
        ddp_matmul_backward_sum_cpu (all sequences in one pass, each task's sum kept side
        by side), the matmul's operands packed once per call (b always, a where strided
        by a page or more), a 6-row tile under AVX2 (intrinsics); new last bits from
        layernorm's vectorized sums
        and the forward attention's 128-key blocks; exp (softmax, gelu) and gelu's
        argument in fused multiply-adds where the CPU has them, exp's polynomial in
        pairs (gelu 25% faster on Zen 1), new last bits there too; AdamW's bias
        corrections as reciprocals (one division per element, both twins); CPU
        attention in blocks of 48 queries (whole register tiles, the same bits); the
        weight gradients' tasks take k a step at a time across all their columns
        (the same bits); the AVX-512 tile 12 rows x 32 columns, two vectors per row
        for each broadcast (the same bits); a build for any x86-64 takes the AVX2
        tile where the CPU has it (train_gpt 2.3-3x as fast built so on Zen 3); the
        GPU's GELU in the CPU twin's form (0.5 x (1 + tanh) cancelled below x = -4 and
        gave NaN past |x| ~ 1.8e19); C = 0 through the GPU's matmul (out = bias),
        layernorm and embedding as on the CPU, and refused by attention in a line; the
        tensor-core attention's softmax on the rounded products it took its max of (a
        fused product gave outputs 4 off at scores of 1e5).
   0.1  first version: CPU twins with finite-difference tests, GPU kernels.
*/
#ifndef DDP_KERNELS_CUH
#define DDP_KERNELS_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* OpenMP pragmas that vanish (without -Wunknown-pragmas noise) when OpenMP is off. */
#ifdef _OPENMP
#include <omp.h>
#define DDP__PRAGMA(...) _Pragma(#__VA_ARGS__)
#define DDP__OMP(...) DDP__PRAGMA(omp __VA_ARGS__)
#else
#define DDP__OMP(...)
#endif

/* ======================================================================== */
/* CPU half: plain C99, fp32.                                               */
/* ======================================================================== */

// >>helpers cpu
/* ---- helpers: dot, axpy, exp, gelu' ------------------------------------- */
/* fmaf where the hardware has it (one rounding and the full multiply-add rate), else a*b+c */
#ifdef FP_FAST_FMAF
#define DDP__FMA(a, b, c) fmaf(a, b, c)
#else
#define DDP__FMA(a, b, c) ((a) * (b) + (c))
#endif

/* Dot product with eight independent partial sums, so the compiler can vectorize it
   without -ffast-math. */
static inline float ddp__dot(const float *a, const float *b, int n)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    for (; i < n; i++) s[0] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* y[0..n) += a * x[0..n) */
static inline void ddp__axpy(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* exp(a) for |a| < 87, within 2 ulp: a = n ln2 + r with |r| <= ln2/2, exp(r) by the
   Cephes expf polynomial, 2^n built in the exponent bits. Unlike libm's expf it is
   branch-free plain arithmetic, so loops calling it vectorize; the price is that
   outside that range the result is meaningless (callers select around it). */
static inline float ddp__exp(float a)
{
    /* adding 1.5*2^23 rounds a/ln2 to an integer n held in the low mantissa bits of t */
    const float t = DDP__FMA(a, 1.44269504088896341f, 12582912.0f), n = t - 12582912.0f;
    const float r = DDP__FMA(-n, -2.12194440e-4f, DDP__FMA(-n, 0.693359375f, a)); /* ln2 split: n*hi exact */
    const float r2 = r * r; /* the polynomial in pairs (Estrin): a chain of 3 multiply-adds, not 6 */
    const float p = DDP__FMA(DDP__FMA(DDP__FMA(1.9875691500e-4f, r, 1.3981999507e-3f), r2,
                                      DDP__FMA(8.3334519073e-3f, r, 4.1665795894e-2f)),
                             r2, DDP__FMA(1.6666665459e-1f, r, 5.0000001201e-1f));
    uint32_t bits;
    float two_n;
    memcpy(&bits, &t, 4);
    bits = (bits - 0x4B400000u + 127u) << 23; /* unsigned: no overflow even for NaN */
    memcpy(&two_n, &bits, 4);
    return (DDP__FMA(p, r2, r) + 1.0f) * two_n;
}

#define DDP__GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define DDP__GELU_C 0.044715f /* the cubic term's coefficient */

/* gelu(x) = 0.5 x (1 + tanh(u)) = x s and gelu'(x) = s + 2 x u' s (1 - s), with
   s = 1 / (1 + e), e = exp(-2u), u = sqrt(2/pi) (x + 0.044715 x^3); 1 - s is taken as
   e s, which does not cancel near s = 1. Beyond |x| = 9 (where |2u| > 66) gelu is x or
   below 2e-28 and gelu' is 1 or below 3e-27 in magnitude, so the results saturate
   there. The formula runs over a block first and the saturation is a second pass: a
   select in the same loop makes gcc branch instead of vectorizing. NaN propagates. */
#define DDP__GELU_BLOCK 256

static inline float ddp__gelu_exp(float x) /* exp(-2u) = exp(x (-2 S C x^2 - 2 S)), S and C above; |x| <= 9 */
{
    return ddp__exp(x * DDP__FMA(-2.0f * DDP__GELU_S * DDP__GELU_C, x * x, -2.0f * DDP__GELU_S));
}

/* g[0..n) = gelu'(x[0..n)), n <= DDP__GELU_BLOCK: the backward's factor, shared by
   ddp_gelu_backward_cpu and the GELU that ddp_matmul_backward_input_cpu folds in, so the
   two give the same bits */
static inline void ddp__gelu_grads(float *g, const float *x, int n)
{
    for (int j = 0; j < n; j++) {
        float e = ddp__gelu_exp(x[j]), s = 1.0f / (1.0f + e);
        float du = DDP__FMA(DDP__GELU_S * 3.0f * DDP__GELU_C, x[j] * x[j], DDP__GELU_S);
        g[j] = s + 2.0f * x[j] * du * s * (e * s);
    }
    for (int j = 0; j < n; j++) g[j] = x[j] < -9.0f ? 0.0f : x[j] > 9.0f ? 1.0f : g[j];
}

// >>embedding cpu
/* ---- embedding ---------------------------------------------------------- */
/* out (B,T,C) = wte[tokens] + wpe[t].  tokens (B,T) in [0,V); wte (V,C); wpe (maxT,C), T <= maxT. */
static inline void ddp_embedding_forward_cpu(float *out, const int *tokens, const float *wte,
                                      const float *wpe, int B, int T, int C)
{
    DDP__OMP(parallel for schedule(static))
    for (int bt = 0; bt < B * T; bt++) {
        const float *e = wte + (size_t)tokens[bt] * C, *p = wpe + (size_t)(bt % T) * C;
        float *o = out + (size_t)bt * C;
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

/* dwte (V,C) +=, dwpe (maxT,C) +=; dout (B,T,C); tokens (B,T). Serial: tokens repeat. */
static inline void ddp_embedding_backward_cpu(float *dwte, float *dwpe, const float *dout,
                                       const int *tokens, int B, int T, int C)
{
    for (int bt = 0; bt < B * T; bt++) {
        const float *d = dout + (size_t)bt * C;
        ddp__axpy(dwte + (size_t)tokens[bt] * C, 1.0f, d, C);
        ddp__axpy(dwpe + (size_t)(bt % T) * C, 1.0f, d, C);
    }
}

// >>layernorm cpu
/* ---- layernorm ---------------------------------------------------------- */
#define DDP_LAYERNORM_EPS 1e-5f

/* sum over c < n of (x[c] - x0 - d)^p for p = 1 or 2, in eight partial sums (so gcc
   vectorizes it and each chain is n/8 terms long). */
static inline float ddp__row_moment(const float *x, float x0, float d, int n, int p)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    if (p == 1)
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) s[k] += (x[i + k] - x0) - d;
    else
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) s[k] += ((x[i + k] - x0) - d) * ((x[i + k] - x0) - d);
    for (; i < n; i++) s[0] += p == 1 ? (x[i] - x0) - d : ((x[i] - x0) - d) * ((x[i] - x0) - d);
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* out (B,T,C); mean, rstd (B,T) saved for backward; inp (B,T,C); weight, bias (C).
   Each row is shifted by its first element x0 before anything is summed: x - x0 is
   exact for values within a factor of two of each other, so a row whose mean is
   large against its spread (mean 100, std 0.1) keeps its digits. The plain fp32 sum
   of 768 such values lost ~3 of them (12x torch's error); out uses (x - x0) - d with
   d = mean - x0, never the rounded mean. Where x0 lies more than 4 standard deviations
   from the mean (an outlier: 1e8 among values of 1 cost the others' digits, 9000x
   torch's error), the sums are made again around x0 + d, the mean rounded to float;
   a first pass for a rough mean on every row instead took 68 us to 89 (B 8, T 128,
   C 128, one thread). */
static inline void ddp_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                                      const float *weight, const float *bias, int B, int T, int C)
{
    DDP__OMP(parallel for schedule(static))
    for (int bt = 0; bt < B * T; bt++) {
        const float *x = inp + (size_t)bt * C;
        float *o = out + (size_t)bt * C;
        float x0 = C > 0 ? x[0] : 0.0f, d = ddp__row_moment(x, x0, 0.0f, C, 1) / C;
        float v = ddp__row_moment(x, x0, d, C, 2);
        if (d * d > 16.0f * (v / C)) { /* x0 far from the mean: around the mean itself */
            x0 += d;
            d = ddp__row_moment(x, x0, 0.0f, C, 1) / C;
            v = ddp__row_moment(x, x0, d, C, 2);
        }
        const float s = 1.0f / sqrtf(v / C + DDP_LAYERNORM_EPS);
        for (int c = 0; c < C; c++) o[c] = ((x[c] - x0) - d) * s * weight[c] + bias[c];
        mean[bt] = x0 + d;
        rstd[bt] = s;
    }
}

/* dinp (B,T,C) += (or NULL: not needed), dweight (C) +=, dbias (C) += (both or neither NULL);
   dout, inp (B,T,C); weight (C); mean, rstd (B,T). */
static inline void ddp_layernorm_backward_cpu(float *dinp, float *dweight, float *dbias,
                                       const float *dout, const float *inp, const float *weight,
                                       const float *mean, const float *rstd, int B, int T, int C)
{
    DDP__OMP(parallel for schedule(static))
    for (int bt = 0; bt < (dinp ? B * T : 0); bt++) {
        const float *x = inp + (size_t)bt * C, *d = dout + (size_t)bt * C;
        float *dx = dinp + (size_t)bt * C;
        const float m = mean[bt], s = rstd[bt];
        float s1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s2[8] = {0, 0, 0, 0, 0, 0, 0, 0}, dn_mean, dn_n_mean;
        int c = 0;
        for (; c + 8 <= C; c += 8) /* eight partial sums, as ddp__row_moment */
            for (int k = 0; k < 8; k++) {
                const float dn = d[c + k] * weight[c + k];
                s1[k] += dn;
                s2[k] += dn * (x[c + k] - m) * s;
            }
        for (; c < C; c++) {
            const float dn = d[c] * weight[c];
            s1[0] += dn;
            s2[0] += dn * (x[c] - m) * s;
        }
        dn_mean = (((s1[0] + s1[1]) + (s1[2] + s1[3])) + ((s1[4] + s1[5]) + (s1[6] + s1[7]))) / C;
        dn_n_mean = (((s2[0] + s2[1]) + (s2[2] + s2[3])) + ((s2[4] + s2[5]) + (s2[6] + s2[7]))) / C;
        for (c = 0; c < C; c++) {
            const float n = (x[c] - m) * s;
            dx[c] += (d[c] * weight[c] - dn_mean - n * dn_n_mean) * s;
        }
    }
    /* parameter gradients: parallel over blocks of 64 channels, each channel's rows summed
       in order (row by row across the block, so that it vectorizes) */
    DDP__OMP(parallel for schedule(static))
    for (int c0 = 0; c0 < (dweight ? C : 0); c0 += 64) {
        const int n = C - c0 < 64 ? C - c0 : 64;
        float dw[64], db[64];
        for (int c = 0; c < n; c++) dw[c] = db[c] = 0.0f;
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = dout + (size_t)bt * C + c0, *x = inp + (size_t)bt * C + c0;
            const float m = mean[bt], s = rstd[bt];
            for (int c = 0; c < n; c++) {
                dw[c] += d[c] * (x[c] - m) * s;
                db[c] += d[c];
            }
        }
        for (int c = 0; c < n; c++) {
            dweight[c0 + c] += dw[c];
            dbias[c0 + c] += db[c];
        }
    }
}

// >>matmul cpu
/* ---- matmul ------------------------------------------------------------- */
/* The forward and both backward products run through one blocked kernel,
   c (M,N) = init + a (M,K) @ b (K,N), with each operand given by its strides. A task
   owns up to DDP__MC rows by DDP__NR columns of c; it takes a DDP__KC-deep slice of those
   columns of b as a contiguous panel (zero past N) that stays in L1, and sweeps a
   register tile of DDP__MR rows down it, so the inner loop is DDP__MR vector
   multiply-adds along the columns per loaded panel row. Where k is deeper than one panel
   (the weight gradients, summed over the batch's rows), a task owns up to DDP__MD rows by
   every column instead, and takes k a step at a time across all its panels: its rows of
   a for a step are read from memory once and from cache by the other panels (a task per
   panel read all of a's k per panel: 1.6-1.8x the forward's time for the same flops on
   an AMD EPYC family 23, against 1.3x so); a weight gradient's sum with long rows walks
   a step tile by tile rather than panel by panel (ddp__gemm_by_tile). The panels are
   packed once per call for all row blocks (into a scratch the call allocates; without it,
   each task packs its own; with the AVX-512 tile a weight gradient reads b's whole panels
   where they lie when b's rows are less than a page apart), and so is a where it is
   strided along k by a page. Each
   element of c is one chain of multiply-adds in ascending k, started from init (bias,
   zero, or c itself) and stored in fp32 between panels, so its bits do not depend on the
   blocking, on which other rows are in the batch, or on how many threads share the tasks. */
#if (defined(__AVX512F__) && !defined(__CUDACC__)) || defined(DDP__AVX512_STANDIN)
/* 12 rows of 32 columns: 24 accumulators and the two vectors of a panel row, each row's a
   broadcast once for its two multiply-adds. 16 rows of one vector took a load per
   multiply-add (17 for 16): 203 of a core's 256 GFLOP/s in the forward on an AMD EPYC
   family 26, where this tile makes 242-250 (14 rows no more). In intrinsics, as gcc's own
   vectorization of the C tile below used 8-wide registers under -march=native on Xeons that
   prefer them. The standin is tests/emu/avx512.h: the same tile on any CPU, for the tests. */
#ifndef DDP__AVX512_STANDIN
#include <immintrin.h>
#endif
#define DDP__MR 12
#define DDP__NR 32
#define DDP__KC 128 /* depth of a panel of b: 16 KB */
/* a weight gradient's steps walked tile by tile up to 256 deep (a panel of 32 KB and a
   tile's a of 12 KB in a 48 KB L1): at ctx 256 on an AMD EPYC family 26, 2 threads, the
   gradients with 384 inputs 2-3% faster than panel by panel, with 1536 inputs 9% */
#define DDP__KT 256
/* a weight gradient's b (the layer's input) read where it lies when its rows are less than
   a page apart, not packed: with 512 inputs 10% faster, with 384 4%, with 128 0-7% on the
   AMD EPYC family 26; rows a page apart or more (1536 inputs) 22% slower, so packed; the
   input gradient's weight, tried the same way, 7-9% slower */
#define DDP__B_IN_PLACE 1
#define DDP__TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DDP__AVX512_TILE
#define DDP_KERNELS_CPU_TILE "12 x 32, AVX-512" /* what the CPU matmuls run on, for benchmarks' reports */
#elif defined(__AVX2__) && defined(__FMA__) && !defined(__CUDACC__)
/* 12 accumulators + 2 panel loads + 1 broadcast: 15 of 16 AVX registers, which gcc
   keeps only when the loop is written in intrinsics (from C it loads the 6 broadcasts
   first and spills); the bits are fmaf's, as everywhere */
#include <immintrin.h>
#define DDP__MR 6
#define DDP__TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DDP__AVX2_TILE
#define DDP_KERNELS_CPU_TILE "6 x 16, AVX2 + FMA"
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__) && !defined(DDP_KERNELS_NO_DISPATCH)
/* A build for any x86-64 (no -march, or one below x86-64-v3: a binary for other machines,
   the tests' -O2): the AVX2 tile (ddp__tile_avx2) and the packing's transposes compiled
   for AVX2 + FMA beside the C tile, and taken where the CPU has both (ddp__cpu_avx2).
   train_gpt --nproc 2 so built ran 2.3x (benchmark shape) and 2.7-3x (large) as fast as
   with the 5-row C tile on an AMD EPYC family 25, 0.97 and 0.98 of -march=native's. The
   multiply-adds are fused, so the matmuls give the AVX2 build's bits; on a CPU without
   FMA the C tile's a*b + c gives others (as a build without -march did before). */
#include <immintrin.h>
#define DDP__MR 6
#define DDP__TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DDP__AVX2_DISPATCH
#define DDP__AVX2_FN __attribute__((target("avx2,fma")))
static inline int ddp__cpu_avx2(void) /* 0: neither; 1: AVX2 + FMA; 2: AVX-512 too (ddp__tile_avx512) */
{
    return !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ? 0
#ifndef DDP__NO_AVX512_DISPATCH /* (the tests' build of the AVX2 tile on a CPU with AVX-512) */
           : __builtin_cpu_supports("avx512f")                               ? 2
#endif
                                                                             : 1;
}
#define DDP_KERNELS_CPU_TILE (ddp__cpu_avx2() == 2 ? "6 x 16, AVX-512, chosen at run time" \
                              : ddp__cpu_avx2() ? "6 x 16, AVX2 + FMA, chosen at run time" \
                                                : "6 x 16, C (no AVX2 + FMA on this CPU)")
#else /* 10 accumulators + 5 broadcasts + 1 load fit 16 AVX registers */
#define DDP__MR 5
#define DDP__TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4)
#define DDP_KERNELS_CPU_TILE "5 x 16, C as the compiler vectorizes it"
#endif
#ifdef DDP__AVX2_DISPATCH
#define DDP__HAVE_AVX2() ddp__cpu_avx2()
#else /* the build's own instructions */
#define DDP__AVX2_FN
#define DDP__HAVE_AVX2() 1
#endif
#ifndef DDP__NR
#define DDP__NR 16 /* columns of a register tile and of a panel: two 8-wide vectors */
#if defined(DDP__AVX2_TILE) || defined(DDP__AVX2_DISPATCH)
#define DDP__KC 384 /* depth of a panel of b: 24 KB (256 on Zen 3: train_gpt 1.07x slower at dim 384) */
#else
#define DDP__KC 256 /* depth of a panel of b: 16 KB */
#endif
#endif
#ifndef DDP__KT
#define DDP__KT DDP__KC /* most k of a step that a weight gradient's tasks walk tile by tile */
#endif
#ifndef DDP__B_IN_PLACE
#define DDP__B_IN_PLACE 0 /* (measured on AVX-512 only) */
#endif
#define DDP__MC 255 /* most rows of a that one task walks per panel: ~128 KB of a in L2 */
#define DDP__MD 96  /* most rows of a task over every panel: a's rows for a step (<= 96 KB) stay in L2 */

/* the tile inlined into each caller, where its strides and flags are constants; a
   prefetch for writing, so that the next tile's rows of c arrive while this one computes
   (c is new memory each layer: waiting on it cost 15% of the forward) */
#if defined(__GNUC__) && !defined(__CUDACC__)
#define DDP__HOT inline __attribute__((always_inline))
#define DDP__PREFETCH_W(p) __builtin_prefetch((p), 1)
#else
#define DDP__HOT inline
#define DDP__PREFETCH_W(p) ((void)(p))
#endif

#if defined(DDP__AVX2_TILE) || defined(DDP__AVX2_DISPATCH)
/* ddp__gemm_tile's registers on AVX2: a whole tile (full) starts from bias or zero (start)
   or c, and ends in c unless it goes to csum (to_c 0); else it starts and ends in acc.
   1: stored in c. Inlined into an AVX2 build's callers; in a build for any x86-64, out of
   line (it cannot be inlined there), called where the CPU has AVX2 and FMA. */
#ifdef DDP__AVX2_DISPATCH
#define DDP__AVX2_TILE_FN inline DDP__AVX2_FN
#else
#define DDP__AVX2_TILE_FN DDP__HOT
#endif
static DDP__AVX2_TILE_FN int ddp__tile_avx2(float acc[DDP__MR][DDP__NR], float *c, size_t ldc, const float *const *a,
                                           size_t ak, const float *bp, size_t ldb, int kc, int full, int start,
                                           const float *bias, int to_c)
{
    __m256 lo[DDP__MR], hi[DDP__MR];
    const float *ar[DDP__MR]; /* the rows' pointers in registers, not read back through a */
#define DDP__ROW(i) ar[i] = a[i];
    DDP__TILE_ROWS(DDP__ROW)
#undef DDP__ROW
    if (full && start) {
        const __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
        const __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
#define DDP__VLOAD(i) lo[i] = b0; hi[i] = b1;
        DDP__TILE_ROWS(DDP__VLOAD)
#undef DDP__VLOAD
    } else if (full) {
#define DDP__VLOAD(i) lo[i] = _mm256_loadu_ps(c + (i) * ldc); hi[i] = _mm256_loadu_ps(c + (i) * ldc + 8);
        DDP__TILE_ROWS(DDP__VLOAD)
#undef DDP__VLOAD
    } else {
#define DDP__VLOAD(i) lo[i] = _mm256_loadu_ps(acc[i]); hi[i] = _mm256_loadu_ps(acc[i] + 8);
        DDP__TILE_ROWS(DDP__VLOAD)
#undef DDP__VLOAD
    }
    for (int k = 0; k < kc; k++) { /* each row: one broadcast, then its two multiply-adds */
        const float *b = bp + k * ldb;
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#define DDP__VMADD(i) { const __m256 xi = _mm256_broadcast_ss(ar[i]); ar[i] += ak; \
                        lo[i] = _mm256_fmadd_ps(xi, b0, lo[i]); hi[i] = _mm256_fmadd_ps(xi, b1, hi[i]); }
        DDP__TILE_ROWS(DDP__VMADD)
#undef DDP__VMADD
    }
    if (full && to_c) {
#define DDP__VSTORE(i) _mm256_storeu_ps(c + (i) * ldc, lo[i]); _mm256_storeu_ps(c + (i) * ldc + 8, hi[i]);
        DDP__TILE_ROWS(DDP__VSTORE)
#undef DDP__VSTORE
        return 1;
    }
#define DDP__VSTORE(i) _mm256_storeu_ps(acc[i], lo[i]); _mm256_storeu_ps(acc[i] + 8, hi[i]);
    DDP__TILE_ROWS(DDP__VSTORE)
#undef DDP__VSTORE
    return 0;
}
#endif

#ifdef DDP__AVX2_DISPATCH
/* ddp__tile_avx2 with one 16-wide vector per row, for a build for any x86-64 on a CPU with
   AVX-512: the panels stay 16 wide, so 6 accumulators, not the 12 that hide a multiply-add's
   latency (-march=native's 12 x 32 tile does); the same chains, so the same bits */
static inline __attribute__((target("avx512f,avx2,fma"))) int
ddp__tile_avx512(float acc[DDP__MR][DDP__NR], float *c, size_t ldc, const float *const *a, size_t ak, const float *bp,
                 size_t ldb, int kc, int full, int start, const float *bias, int to_c)
{
    __m512 v[DDP__MR];
    const float *ar[DDP__MR];
#define DDP__ROW(i) ar[i] = a[i];
    DDP__TILE_ROWS(DDP__ROW)
#undef DDP__ROW
    if (full && start) {
        const __m512 b0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
#define DDP__VLOAD(i) v[i] = b0;
        DDP__TILE_ROWS(DDP__VLOAD)
#undef DDP__VLOAD
    } else if (full) {
#define DDP__VLOAD(i) v[i] = _mm512_loadu_ps(c + (i) * ldc);
        DDP__TILE_ROWS(DDP__VLOAD)
#undef DDP__VLOAD
    } else {
#define DDP__VLOAD(i) v[i] = _mm512_loadu_ps(acc[i]);
        DDP__TILE_ROWS(DDP__VLOAD)
#undef DDP__VLOAD
    }
    for (int k = 0; k < kc; k++) {
        const __m512 b = _mm512_loadu_ps(bp + k * ldb);
#define DDP__VMADD(i) v[i] = _mm512_fmadd_ps(_mm512_set1_ps(*ar[i]), b, v[i]); ar[i] += ak;
        DDP__TILE_ROWS(DDP__VMADD)
#undef DDP__VMADD
    }
    if (full && to_c) {
#define DDP__VSTORE(i) _mm512_storeu_ps(c + (i) * ldc, v[i]);
        DDP__TILE_ROWS(DDP__VSTORE)
#undef DDP__VSTORE
        return 1;
    }
#define DDP__VSTORE(i) _mm512_storeu_ps(acc[i], v[i]);
    DDP__TILE_ROWS(DDP__VSTORE)
#undef DDP__VSTORE
    return 0;
}
#define DDP__TILE_X86(level) ((level) == 2 ? ddp__tile_avx512 : ddp__tile_avx2)
#else
#define DDP__TILE_X86(level) ddp__tile_avx2
#endif

/* c[i*ldc + j] for i < mv, j < nv (<= nr, the panel's width: 16, or DDP__NR where that
   is wider): = bias[j] (0 if NULL) + sum_k a(i,k) bp[k*ldb + j]
   when start, else += that sum; with cs, that result is added to cs[i*lds + j]
   (double: csum's rows) instead of stored in c. a(i,k) = a[i*am + k*ak]
   for the ra (>= mv) rows that may be read, rows past them repeating row ra-1; rows past
   mv and columns past nv are computed (all nr of each row of bp) but not stored.
   The rows are unrolled by hand: gcc keeps the tile in registers only when every index
   into it is a constant. */
static DDP__HOT void ddp__gemm_tile(float *c, size_t ldc, int mv, int nv, const float *a, size_t am, size_t ak,
                                  int ra, const float *bp, size_t ldb, int nr, int kc, int start, const float *bias,
                                  double *cs, size_t lds)
{
    float acc[DDP__MR][DDP__NR], edge[DDP__MR][DDP__NR];
    const float *ar[DDP__MR];
    const int full = mv == DDP__MR && nv == nr;
    for (int i = 0; i < DDP__MR; i++) ar[i] = a + (size_t)(i < ra ? i : ra - 1) * am;
#if defined(DDP__AVX512_TILE)
    if (full) /* a whole tile starts and ends in registers (no vector load of what narrower stores just wrote) */
        ;
    else
#elif defined(DDP__AVX2_TILE) || defined(DDP__AVX2_DISPATCH)
    const int avx2 = DDP__HAVE_AVX2(); /* 1 in an AVX2 build; in a build for any x86-64, this CPU's (2: AVX-512) */
    if (full && avx2) /* as above */
        ;
    else
#endif
    if (start) {
        float b0[DDP__NR];
        for (int j = 0; j < nr; j++) b0[j] = bias && j < nv ? bias[j] : 0.0f;
        for (int i = 0; i < DDP__MR; i++)
            for (int j = 0; j < nr; j++) acc[i][j] = b0[j];
    } else if (full)
        for (int i = 0; i < DDP__MR; i++)
            for (int j = 0; j < nr; j++) acc[i][j] = c[i * ldc + j];
    else {
        for (int i = 0; i < DDP__MR; i++)
            for (int j = 0; j < nr; j++) edge[i][j] = i < mv && j < nv ? c[i * ldc + j] : 0.0f;
        for (int i = 0; i < DDP__MR; i++)
            for (int j = 0; j < nr; j++) acc[i][j] = edge[i][j];
    }
#ifdef DDP__AVX512_TILE
    { /* each row: one broadcast of its a, then its two multiply-adds (one where the panel is
         16 wide: `wide` is a constant where the tile is inlined, so hi then vanishes) */
        __m512 lo[DDP__MR], hi[DDP__MR];
        const int wide = nr > 16;
        if (full && start) {
            const __m512 b0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
            const __m512 b1 = bias && wide ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
#define DDP__VLOAD(i) lo[i] = b0; hi[i] = b1;
            DDP__TILE_ROWS(DDP__VLOAD)
#undef DDP__VLOAD
        } else if (full) {
#define DDP__VLOAD(i) lo[i] = _mm512_loadu_ps(c + (i) * ldc); \
                      hi[i] = wide ? _mm512_loadu_ps(c + (i) * ldc + 16) : lo[i];
            DDP__TILE_ROWS(DDP__VLOAD)
#undef DDP__VLOAD
        } else {
#define DDP__VLOAD(i) lo[i] = _mm512_loadu_ps(acc[i]); hi[i] = wide ? _mm512_loadu_ps(acc[i] + 16) : lo[i];
            DDP__TILE_ROWS(DDP__VLOAD)
#undef DDP__VLOAD
        }
#define DDP__VMADD2(i, x) { const __m512 xi = _mm512_set1_ps(x); \
                            lo[i] = _mm512_fmadd_ps(xi, b0, lo[i]); if (wide) hi[i] = _mm512_fmadd_ps(xi, b1, hi[i]); }
        if (ra == DDP__MR && am == 1) /* the rows side by side (a packed): one pointer */
            for (int k = 0; k < kc; k++) {
                const __m512 b0 = _mm512_loadu_ps(bp + k * ldb), b1 = wide ? _mm512_loadu_ps(bp + k * ldb + 16) : b0;
                const float *x = a + k * ak;
#define DDP__VMADD(i) DDP__VMADD2(i, x[i])
                DDP__TILE_ROWS(DDP__VMADD)
#undef DDP__VMADD
            }
        else if (ra == DDP__MR) { /* rows am apart: three pointers, each for four rows (row + 0, 1, 2, 3 am) */
            const float *x[3] = {a, a + 4 * am, a + 8 * am};
            const size_t am3 = 3 * am;
            for (int k = 0; k < kc; k++) {
                const __m512 b0 = _mm512_loadu_ps(bp + k * ldb), b1 = wide ? _mm512_loadu_ps(bp + k * ldb + 16) : b0;
#define DDP__VMADD(i) DDP__VMADD2(i, x[(i) / 4][(i) % 4 == 3 ? am3 : (i) % 4 * am])
                DDP__TILE_ROWS(DDP__VMADD)
#undef DDP__VMADD
                x[0] += ak; x[1] += ak; x[2] += ak;
            }
        } else
            for (int k = 0; k < kc; k++) {
                const __m512 b0 = _mm512_loadu_ps(bp + k * ldb), b1 = wide ? _mm512_loadu_ps(bp + k * ldb + 16) : b0;
#define DDP__VMADD(i) DDP__VMADD2(i, *ar[i]) ar[i] += ak;
                DDP__TILE_ROWS(DDP__VMADD)
#undef DDP__VMADD
            }
#undef DDP__VMADD2
        if (full && !cs) {
#define DDP__VSTORE(i) _mm512_storeu_ps(c + (i) * ldc, lo[i]); if (wide) _mm512_storeu_ps(c + (i) * ldc + 16, hi[i]);
            DDP__TILE_ROWS(DDP__VSTORE)
#undef DDP__VSTORE
            return;
        }
#define DDP__VSTORE(i) _mm512_storeu_ps(acc[i], lo[i]); if (wide) _mm512_storeu_ps(acc[i] + 16, hi[i]);
        DDP__TILE_ROWS(DDP__VSTORE)
#undef DDP__VSTORE
    }
#else
#if defined(DDP__AVX2_TILE) || defined(DDP__AVX2_DISPATCH)
    if (avx2) {
        if (DDP__TILE_X86(avx2)(acc, c, ldc, ar, ak, bp, ldb, kc, full, start, bias, !cs))
            return;
    } else
#endif
    for (int k = 0; k < kc; k++) {
        const float *b = bp + k * ldb;
        float x[DDP__MR];
#define DDP__LOAD(i) x[i] = *ar[i]; ar[i] += ak;
        DDP__TILE_ROWS(DDP__LOAD)
#undef DDP__LOAD
        for (int j = 0; j < nr; j++) {
            const float bj = b[j];
#define DDP__MADD(i) acc[i][j] = DDP__FMA(x[i], bj, acc[i][j]);
            DDP__TILE_ROWS(DDP__MADD)
#undef DDP__MADD
        }
    }
#endif
    if (cs && full) /* constant bounds, so that the conversion and the adds vectorize */
        for (int i = 0; i < DDP__MR; i++)
            for (int j = 0; j < nr; j++) cs[i * lds + j] += acc[i][j];
    else if (cs) {
        for (int i = 0; i < DDP__MR; i++)
            for (int j = 0; j < nr; j++) edge[i][j] = acc[i][j];
        for (int i = 0; i < mv; i++)
            for (int j = 0; j < nv; j++) cs[i * lds + j] += edge[i][j];
    } else if (full)
        for (int i = 0; i < DDP__MR; i++)
            for (int j = 0; j < nr; j++) c[i * ldc + j] = acc[i][j];
    else {
        for (int i = 0; i < DDP__MR; i++)
            for (int j = 0; j < nr; j++) edge[i][j] = acc[i][j];
        for (int i = 0; i < mv; i++)
            for (int j = 0; j < nv; j++) c[i * ldc + j] = edge[i][j];
    }
}

#if (defined(DDP__AVX512_TILE) && !defined(DDP__AVX512_STANDIN)) || defined(DDP__AVX2_TILE) || \
    defined(DDP__AVX2_DISPATCH)
/* o[e w + j] = s[j ld + e] for j, e < 8 (and by four of them, for j, e < 16): blocks
   transposed in AVX registers. gcc made the plain loops scalar loads and stores (the
   forward's weight packing took 6% of its time on an AMD EPYC family 26); these take
   0.4-0.5 of that time, as AVX-512's 16-wide shuffles did */
static inline DDP__AVX2_FN void ddp__transpose8(float *o, size_t w, const float *s, size_t ld)
{
    __m256 r[8], t[8];
    for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(s + (size_t)j * ld);
    for (int j = 0; j < 8; j += 2) { /* in each 128-bit half: (r0 e0, r1 e0, r0 e1, r1 e1) ... */
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 8; j += 4) { /* four rows of columns c (low half) and c + 4 (high half) */
        r[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
        r[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xee);
        r[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
        r[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xee);
    }
    for (int e = 0; e < 4; e++) { /* rows 0-3 beside rows 4-7 */
        _mm256_storeu_ps(o + (size_t)e * w, _mm256_permute2f128_ps(r[e], r[e + 4], 0x20));
        _mm256_storeu_ps(o + (size_t)(e + 4) * w, _mm256_permute2f128_ps(r[e], r[e + 4], 0x31));
    }
}
static inline DDP__AVX2_FN void ddp__transpose16(float *o, size_t w, const float *s, size_t ld)
{
    ddp__transpose8(o, w, s, ld);
    ddp__transpose8(o + 8, w, s + 8 * ld, ld);
    ddp__transpose8(o + 8 * w, w, s + 8, ld);
    ddp__transpose8(o + 8 * w + 8, w, s + 8 * ld + 8, ld);
}
#define DDP__TRANSPOSE16
#endif

/* The packed panels that ddp__gemm_tile reads (w columns per row of a panel: 16, or
   DDP__NR), zero past the last column. Rows of src as columns: dst[(p depth + d) w + j] =
   src[(w p + j) ld + d] (the forward's weight rows become the columns of its product,
   attention's keys those of a score tile). */
static inline void ddp__pack_rows(float *dst, const float *src, size_t ld, int rows, int depth, int w)
{
    for (int p = 0; p * w < rows; p++)
        for (int g = 0; g < w; g += 16) { /* 16 rows of src at a time */
            float *o = dst + (size_t)p * depth * w + g;
            const int r0 = p * w + g;
            int d = 0;
#ifdef DDP__TRANSPOSE16
            if (rows - r0 >= 16 && DDP__HAVE_AVX2())
                for (; d + 16 <= depth; d += 16)
                    ddp__transpose16(o + (size_t)d * w, (size_t)w, src + (size_t)r0 * ld + d, ld);
#endif
            if (rows - r0 >= 16) /* whole 16 x 16 blocks through a local copy */
                for (; d + 16 <= depth; d += 16) {
                    float t[16][16];
                    for (int j = 0; j < 16; j++)
                        for (int e = 0; e < 16; e++) t[j][e] = src[(size_t)(r0 + j) * ld + d + e];
                    for (int e = 0; e < 16; e++)
                        for (int j = 0; j < 16; j++) o[(size_t)(d + e) * w + j] = t[j][e];
                }
            for (int j = 0; j < 16; j++) {
                const int r = r0 + j;
                for (int e = d; e < depth; e++) o[(size_t)e * w + j] = r < rows ? src[(size_t)r * ld + e] : 0.0f;
            }
        }
}

/* bp (kc, DDP__NR) = b[k*bk + j*bn] for j < nv, zero past nv; loads run along
   whichever of k and j is contiguous */
static inline void ddp__gemm_pack(float *bp, const float *b, size_t bk, size_t bn, int kc, int nv)
{
    if (bk == 1) { /* b's columns are rows in memory (the forward's weight): transposed in blocks */
        ddp__pack_rows(bp, b, bn, nv, kc, DDP__NR);
        return;
    }
    if (nv < DDP__NR)
        for (int i = 0; i < kc * DDP__NR; i++) bp[i] = 0.0f;
    if (bn == 1 && nv == DDP__NR)
        for (int k = 0; k < kc; k++)
            for (int j = 0; j < DDP__NR; j++) bp[k * DDP__NR + j] = b[k * bk + j];
    else
        for (int j = 0; j < nv; j++)
            for (int k = 0; k < kc; k++) bp[k * DDP__NR + j] = b[k * bk + j * bn];
}

/* k per step of ddp__gemm's tasks: a panel's depth, or with csum a run (seg, else all K). */
static inline int ddp__gemm_step(int K, int sum, int seg)
{
    return !sum ? DDP__KC : seg > 0 && seg < K ? seg : K > 0 ? K : 1;
}

/* a packed a step at a time, each thread its own block's rows (at most DDP__MD + MR - 1)
   into a region of its own that stays in L2, where k is deeper than a panel and such a
   region is at most 1 MB; else a packed whole before the tasks. Packed whole, the weight
   gradient's dout went to memory and back once more: on an AMD EPYC family 26 it then ran
   10-20% slower than reading dout in place, page-strided as it is. */
static inline int ddp__gemm_a_by_step(int K, int step)
{
    return K > DDP__KC && (size_t)(DDP__MD + DDP__MR) * (size_t)step <= ((size_t)1 << 18);
}

/* Whether a per-sequence sum's tasks walk their block tile by tile, each tile across every
   panel of a step (a tile's packed rows of a stay in L1, its rows of csum are written in
   runs), rather than panel by panel (a panel of b stays in L1 while the block's tiles walk
   down it, and each panel adds to a column of csum rows N doubles apart): where csum's
   rows are 256 doubles or longer and a step at most DDP__KT deep (a panel, or two with the
   AVX-512 tile, whose panels are half as deep as a 48 KB L1 holds). On an AMD EPYC family 25
   (one thread) the weight gradients with 256-1536 inputs ran 3-34% faster so, and with
   128 inputs as fast or up to 16% slower; the forward and the input gradient, tried the
   same way, were no faster. */
static inline int ddp__gemm_by_tile(int N, int K, int sum, int seg)
{
    return sum && N >= 256 && K > DDP__KC && ddp__gemm_step(K, sum, seg) <= DDP__KT;
}

/* Floats of ddp__gemm's scratch: b packed whole (K, N rounded up to whole panels) when its
   row blocks would each pack the same panels again (M past one block, or past one tile
   where k is deeper than a panel: the block count then follows the threads), then a packed
   when it is strided along k by a page or more (each k a new page, where the hardware
   prefetches nothing; shorter strides read in place were faster than packing, weight
   gradients with 128-512 outputs on Zen 3) or strided along k at all where the tasks go
   tile by tile (rows of a read in place, a step deep and a line apart, leave L1 before
   the tile's next panel), each tile's rows k by k: a step's region for each of `threads`,
   else all of a (M rounded up to whole tiles, K). */
static inline size_t ddp__gemm_b_floats(int M, int N, int K)
{
    const int one_block = M <= (K > DDP__KC ? DDP__MR : DDP__MC);
    return !one_block && N > 0 && K > 0 ? (size_t)K * (size_t)((N + DDP__NR - 1) / DDP__NR) * DDP__NR : 0;
}
static inline size_t ddp__gemm_a_floats(int M, int K, size_t ak, int step, int by_tile, int threads)
{
    if ((ak * sizeof(float) < 4096 && !(by_tile && ak > 1)) || M <= 0 || K <= 0) return 0;
    return ddp__gemm_a_by_step(K, step) ? (size_t)threads * (DDP__MD + DDP__MR) * (size_t)step
                                        : (size_t)K * (size_t)((M + DDP__MR - 1) / DDP__MR) * DDP__MR;
}

/* ddp__gemm's scratch for these shapes (sum, seg: its csum and seg), for a team of at most
   omp_get_max_threads(); or NULL: not needed, or too little memory, and then ddp__gemm
   packs b per task and reads a in place. The bits are the same. */
static inline float *ddp__gemm_scratch(int M, int N, int K, size_t ak, int sum, int seg)
{
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const int step = ddp__gemm_step(K, sum, seg), by_tile = ddp__gemm_by_tile(N, K, sum, seg);
    const size_t n = ddp__gemm_b_floats(M, N, K) + ddp__gemm_a_floats(M, K, ak, step, by_tile, threads);
    return n ? (float *)malloc(n * sizeof(float)) : NULL;
}

/* Rows k0..k1-1 of a (a(m,k) = a[m*am + k*ak], M rows) into every tile of ap: tile i's
   (MR, K) rows k-major at ap + i MR K, rows past M repeating the last. */
static inline void ddp__gemm_pack_a(float *ap, const float *a, size_t am, size_t ak, int M, int K, int k0, int k1)
{
    for (int i = 0; i * DDP__MR < M; i++) /* tile by tile: its rows k0..k1-1 written in one run (the lines */
        for (int k = k0; k < k1; k++)     /* of a they read, a few KB, stay in L1 for the next tile) */
            if (am == 1 && (i + 1) * DDP__MR <= M) /* a whole tile's rows side by side: one short copy */
                memcpy(ap + ((size_t)i * K + k) * DDP__MR, a + (size_t)i * DDP__MR + (size_t)k * ak,
                       DDP__MR * sizeof(float));
            else
                for (int r = 0; r < DDP__MR; r++) {
                    const int m = i * DDP__MR + r < M ? i * DDP__MR + r : M - 1;
                    ap[((size_t)i * K + k) * DDP__MR + r] = a[(size_t)m * am + (size_t)k * ak];
                }
}

/* c (M,N) = (accumulate ? c : bias (N) or 0) + a @ b, with a(i,k) = a[i*am + k*ak] and
   b(k,j) = b[k*bk + j*bn]; or, with csum, csum (M,N) += (double) (a @ b) segment by
   segment: k in runs of seg (K a multiple of it), each run's product in fp32 from zero,
   added to csum in run order, c unused (each task keeps a run's chains between panels of
   b in fp32, as c would, and adds every run of its own elements in order). Call it inside a
   parallel region (or outside one, serially), every thread with the same arguments: its
   tasks are shared out and nobody waits at the end. With scratch (ddp__gemm_scratch's for
   the same shapes, and a team no larger) the team first packs b, and a unless each thread
   packs its rows of a step by step, into it, then waits for all of it. */
static DDP__HOT void ddp__gemm(float *c, const float *a, size_t am, size_t ak, const float *b, size_t bk, size_t bn,
                             const float *bias, int accumulate, int M, int N, int K, double *csum, int seg,
                             float *scratch)
{
    /* row blocks of equal size (in whole tiles), so that the tasks balance; when k is deeper
       than one panel, a task is a block by every panel, walked a step of k at a time, and
       with several threads the blocks are at least twice their number */
    const int deep = K > DDP__KC, tiles = (M + DDP__MR - 1) / DDP__MR, rows = deep ? DDP__MD : DDP__MC;
    int blocks = M > 0 ? (M + rows - 1) / rows : 1;
#ifdef _OPENMP
    const int want = deep && omp_get_num_threads() > 1 ? 2 * omp_get_num_threads() : 0;
    if (blocks < want && tiles > 1) blocks = want < tiles ? want : tiles; /* M = 0: one (empty) block */
#endif
    const int mc = (tiles + blocks - 1) / blocks * DDP__MR, panels = M > 0 ? (N + DDP__NR - 1) / DDP__NR : 0;
    const int per = deep ? panels : 1, across = deep ? 1 : panels, tasks = panels > 0 ? blocks * across : 0;
    const int step = ddp__gemm_step(K, csum != NULL, seg), by_step = ddp__gemm_a_by_step(K, step);
    const int by_tile = ddp__gemm_by_tile(N, K, csum != NULL, seg);
    const int pdepth = by_tile ? step : DDP__KC, depths = (K + pdepth - 1) / pdepth; /* b's packing: panel x depth */
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    const size_t bfl = scratch ? ddp__gemm_b_floats(M, N, K) : 0;
    const size_t afl = scratch ? ddp__gemm_a_floats(M, K, ak, step, by_tile, 1) : 0; /* with by_step: one thread's */
    float *bpk = bfl ? scratch : NULL, *apk = afl ? scratch + bfl + (by_step ? (size_t)tid * afl : 0) : NULL;
    /* with DDP__B_IN_PLACE, a weight gradient's whole panels of b are read where they lie when
       b's rows are less than a page apart (ldb apart, DDP__NR floats of a row per k); a last
       panel that is partial is packed still */
    const int whole = DDP__B_IN_PLACE && csum && bpk && bn == 1 && bk * sizeof(float) < 4096 ? N / DDP__NR : 0;
    const int bjobs = bpk ? (panels - whole) * depths : 0, jobs = bjobs + (apk && !by_step ? (K + 15) / 16 : 0);
    /* b's panel at column n0, from depth k0 (of a step, kd deep, where the tasks go tile by tile: a
       step's panels side by side, in the order a tile walks them; else a panel's every k in a run) */
#define DDP__BPK(n0, k0, kd) (by_tile ? bpk + (size_t)(k0) * panels * DDP__NR + (size_t)(n0) * (kd) \
                                      : bpk + (size_t)(n0) * K + (size_t)(k0) * DDP__NR)
    if (jobs) { /* b by panel and depth; a by 16 rows of k */
        DDP__OMP(for schedule(dynamic))
        for (int t = 0; t < jobs; t++)
            if (t < bjobs) {
                const int n0 = (whole + t / depths) * DDP__NR, k0 = t % depths * pdepth;
                const int kd = K - k0 < pdepth ? K - k0 : pdepth;
                ddp__gemm_pack(DDP__BPK(n0, k0, kd), b + (size_t)k0 * bk + (size_t)n0 * bn, bk, bn, kd,
                               N - n0 < DDP__NR ? N - n0 : DDP__NR);
            } else {
                const int k0 = (t - bjobs) * 16;
                ddp__gemm_pack_a(apk, a, am, ak, M, K, k0, K - k0 < 16 ? K : k0 + 16);
            }
    }
/* where the tiles read b's panel at column n0 from depth k0 (in place, or packed), and its rows' distance */
#define DDP__BAT(n0, k0, kd) ((n0) < whole * DDP__NR ? b + (size_t)(k0) * bk + (n0) : DDP__BPK(n0, k0, kd))
#define DDP__BLD(n0) ((n0) < whole * DDP__NR ? bk : (size_t)DDP__NR)
/* the tile at row m, columns n0 (nv of them), depth k0 (kc deep) of this step, from the panel at bp, rows ldb apart */
#define DDP__GEMM_AT(m, n0, nv, k0, kc, bp, ldb) {                                                                   \
    const size_t ta = (size_t)(((m) - m0) / DDP__MR) * step + (size_t)((k0) - s0); /* in a by_step region */      \
    const int mv = m1 - (m) < DDP__MR ? m1 - (m) : DDP__MR; /* rows stored; packed a has all DDP__MR */              \
    for (int i = (m) + DDP__MR; i < (m) + 2 * DDP__MR && i < m1 && !csum; i++) {                                     \
        DDP__PREFETCH_W(c + (size_t)i * N + (n0));                                                                  \
        DDP__PREFETCH_W(c + (size_t)i * N + (n0) + (nv) - 1);                                                       \
    }                                                                                                                \
    ddp__gemm_tile(csum ? part + (size_t)((m) - m0) * DDP__NR : c + (size_t)(m) * N + (n0),                          \
                   csum ? DDP__NR : (size_t)N, mv, (nv),                                                             \
                   apk && by_step ? apk + ta * DDP__MR                                                               \
                   : apk ? apk + ((size_t)((m) / DDP__MR) * K + (k0)) * DDP__MR                                      \
                       : a + (size_t)(m) * am + (size_t)(k0) * ak,                                                   \
                   apk ? 1 : am, apk ? DDP__MR : ak, apk ? DDP__MR : mv, (bp), (ldb), DDP__NR, (kc),                  \
                   !accumulate && (k0) == (csum ? s0 : 0), bias ? bias + (n0) : NULL,                                 \
                   csum && (k0) + (kc) >= s1 ? csum + (size_t)(m) * N + (n0) : NULL, (size_t)N);                     \
}
    DDP__OMP(for schedule(dynamic) nowait)
    for (int t = 0; t < tasks; t++) {
        float own[DDP__KC * DDP__NR], part[(DDP__MC + DDP__MR) * DDP__NR]; /* a run's rows (mc <= DDP__MC + MR - 1) */
        const int m0 = t / across * mc, m1 = m0 + mc < M ? m0 + mc : M, p0 = t % across * per, p1 = p0 + per;
        for (int s0 = 0; s0 < (K ? K : 1); s0 += step) { /* K == 0 still writes bias */
            const int s1 = s0 + step < K ? s0 + step : K;
            if (apk && by_step) /* this step's rows of a, tile by tile, at apk + (tile step + k - s0) MR */
                ddp__gemm_pack_a(apk, a + (size_t)m0 * am + (size_t)s0 * ak, am, ak, m1 - m0, step, 0, s1 - s0);
            if (by_tile && bpk) { /* (without b packed whole, each task packs a panel at a time: panel by panel) */
                for (int m = m0; m < m1; m += DDP__MR)
                    for (int p = p0; p < p1; p++) {
                        const int n0 = p * DDP__NR, nv = N - n0 < DDP__NR ? N - n0 : DDP__NR;
                        DDP__GEMM_AT(m, n0, nv, s0, s1 - s0, DDP__BAT(n0, s0, s1 - s0), DDP__BLD(n0))
                    }
            } else
                for (int p = p0; p < p1; p++) {
                    const int n0 = p * DDP__NR, nv = N - n0 < DDP__NR ? N - n0 : DDP__NR;
                    for (int k0 = s0; k0 < (K ? s1 : 1); k0 += DDP__KC) {
                        const int kc = s1 - k0 < DDP__KC ? s1 - k0 : DDP__KC;
                        if (!bpk) ddp__gemm_pack(own, b + (size_t)k0 * bk + (size_t)n0 * bn, bk, bn, kc, nv);
                        for (int m = m0; m < m1; m += DDP__MR)
                            DDP__GEMM_AT(m, n0, nv, k0, kc, bpk ? DDP__BAT(n0, k0, kc) : own,
                                         bpk ? DDP__BLD(n0) : (size_t)DDP__NR)
                    }
                }
        }
    }
#undef DDP__GEMM_AT
#undef DDP__BLD
#undef DDP__BAT
#undef DDP__BPK
}

/* out (B,T,OC) = inp (B,T,C) @ weight^T + bias; weight (OC,C); bias (OC) or NULL. */
static inline void ddp_matmul_forward_cpu(float *out, const float *inp, const float *weight,
                                   const float *bias, int B, int T, int C, int OC)
{
    float *scratch = ddp__gemm_scratch(B * T, OC, C, 1, 0, 0);
    DDP__OMP(parallel)
    ddp__gemm(out, inp, (size_t)C, 1, weight, 1, (size_t)C, bias, 0, B * T, OC, C, NULL, 0, scratch);
    free(scratch);
}

/* dinp (B,T,C) +=, dweight (OC,C) +=, dbias (OC) += (each may be NULL: not needed);
   dout (B,T,OC); inp (B,T,C); weight (OC,C). dweight and dbias add the rows in row
   order. The three products share one parallel region. */
static inline void ddp_matmul_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, int B, int T, int C, int OC)
{
    const int BT = B * T;
    float *ds = dinp ? ddp__gemm_scratch(BT, C, OC, 1, 0, 0) : NULL;
    float *ws = dweight ? ddp__gemm_scratch(OC, C, BT, (size_t)OC, 0, 0) : NULL;
    DDP__OMP(parallel)
    {
        if (dinp) ddp__gemm(dinp, dout, (size_t)OC, 1, weight, (size_t)C, 1, NULL, 1, BT, C, OC, NULL, 0, ds);
        if (dweight) ddp__gemm(dweight, dout, 1, (size_t)OC, inp, (size_t)C, 1, NULL, 1, OC, C, BT, NULL, 0, ws);
        if (dbias) {
            DDP__OMP(for schedule(static) nowait)
            for (int o0 = 0; o0 < OC; o0 += 64) {
                const int o1 = o0 + 64 < OC ? o0 + 64 : OC;
                for (int r = 0; r < BT; r++)
                    for (int o = o0; o < o1; o++) dbias[o] += dout[(size_t)r * OC + o];
            }
        }
    }
    free(ds);
    free(ws);
}

/* dinp (B,T,C) = dout @ weight, times gelu'(gelu_inp) elementwise where gelu_inp (B,T,C)
   is given: WRITTEN, not added, unlike every other backward (dinp need not be zeroed),
   for an input gradient with one consumer; with gelu_inp, the input gradient of the GELU
   whose output the matmul read, in place. The bits of ddp_matmul_backward_cpu, then
   ddp_gelu_backward_cpu, into zeroed buffers, without the zeroing and the buffer between:
   train_gpt.c 2.5% faster on Zen 5. dout (B,T,OC); weight (OC,C); dinp (NULL: nothing to
   do) overlaps neither dout nor gelu_inp. CPU only. */
static inline void ddp_matmul_backward_input_cpu(float *dinp, const float *dout, const float *weight,
                                                 const float *gelu_inp, int B, int T, int C, int OC)
{
    const long N = (long)B * T * C;
    if (!dinp) return; /* not needed */
    float *scratch = ddp__gemm_scratch(B * T, C, OC, 1, 0, 0);
    DDP__OMP(parallel)
    {
        ddp__gemm(dinp, dout, (size_t)OC, 1, weight, (size_t)C, 1, NULL, 0, B * T, C, OC, NULL, 0, scratch);
        if (gelu_inp) { /* a pass of its own once the product is whole: done tile by tile inside the
                           product, reading 32 floats of a row 2 KB apart, it cost 4% of training on Zen 5 */
            DDP__OMP(barrier)
            DDP__OMP(for schedule(static))
            for (long i0 = 0; i0 < N; i0 += DDP__GELU_BLOCK) {
                const int n = N - i0 < DDP__GELU_BLOCK ? (int)(N - i0) : DDP__GELU_BLOCK;
                float g[DDP__GELU_BLOCK];
                ddp__gelu_grads(g, gelu_inp + i0, n);
                for (int j = 0; j < n; j++) /* 0 + : a zero comes out +0, as when added into zeros */
                    dinp[i0 + j] = 0.0f + g[j] * dinp[i0 + j];
            }
        }
    }
    free(scratch);
}

/* dweight (OC,C) +=, dbias (OC) += (either may be NULL: not needed), in double: the
   gradient of each of the B sequences on its own (in fp32, its rows in order, the bits of
   ddp_matmul_backward_cpu with B = 1 into zeros) added in sequence order. A sum made so
   does not depend on which sequences share a call, a batch or a rank, up to the order of
   the double additions. dout (B,T,OC); inp (B,T,C). */
static inline void ddp_matmul_backward_sum_cpu(double *dweight, double *dbias, const float *dout, const float *inp,
                                               int B, int T, int C, int OC)
{
    float *scratch = dweight && T > 0 ? ddp__gemm_scratch(OC, C, B * T, (size_t)OC, 1, T) : NULL;
    DDP__OMP(parallel)
    {
        if (dweight && T > 0) /* one product over all B*T rows, summed sequence by sequence */
            ddp__gemm(NULL, dout, 1, (size_t)OC, inp, (size_t)C, 1, NULL, 0, OC, C, B * T, dweight, T, scratch);
        if (dbias) {
            DDP__OMP(for schedule(static) nowait)
            for (int o0 = 0; o0 < OC; o0 += 64) {
                const int o1 = o0 + 64 < OC ? o0 + 64 : OC;
                float s[64];
                for (int b = 0; b < B; b++) {
                    const float *d = dout + (size_t)b * T * OC;
                    for (int o = o0; o < o1; o++) s[o - o0] = 0.0f;
                    for (int r = 0; r < T; r++)
                        for (int o = o0; o < o1; o++) s[o - o0] += d[(size_t)r * OC + o];
                    for (int o = o0; o < o1; o++) dbias[o] += s[o - o0];
                }
            }
        }
    }
    free(scratch);
}

// >>attention cpu
/* ---- attention ---------------------------------------------------------- */
/* Keys are taken in blocks of DDP__ATT_BLOCK: the block's scores go to a small buffer
   first (one dot product per key), then one branch-free loop exponentiates them with
   ddp__exp, which vectorizes, then the values are accumulated in key order. Arguments of
   ddp__exp are clamped to [-80, 80] (scores minus the row max are <= 0; exp(-80) is
   below 2e-35, negligible against the row sum >= 1). Each row is computed on its own in
   a fixed order, so results do not depend on the thread count or on the other rows. */
#define DDP__ATT_BLOCK 128

/* a < -80 ? -80 : a, as its own loop over a block so that gcc vectorizes it (a select
   inside the ddp__exp loop would stop that); NaN is kept. */
static inline void ddp__att_floor(float *s, int n)
{
    for (int j = 0; j < n; j++) s[j] = s[j] < -80.0f ? -80.0f : s[j];
}

static inline void ddp__att_exp(float *s, int n)
{
    for (int j = 0; j < n; j++) s[j] = ddp__exp(s[j]);
}

/* o[0..hs) += sum_j p[j] v_j[0..hs) over v_j = v + j*ld, j < n. Four keys at a time,
   so the chain through o is a quarter as long. */
static inline void ddp__att_accum(float *o, const float *p, const float *v, size_t ld, int n, int hs)
{
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *v0 = v + j * ld, *v1 = v0 + ld, *v2 = v1 + ld, *v3 = v2 + ld;
        const float p0 = p[j], p1 = p[j + 1], p2 = p[j + 2], p3 = p[j + 3];
        for (int d = 0; d < hs; d++) o[d] += (p0 * v0[d] + p1 * v1[d]) + (p2 * v2[d] + p3 * v3[d]);
    }
    for (; j < n; j++) ddp__axpy(o, p[j], v + j * ld, hs);
}

/* The forward query by query, for heads too large for ddp_attention_forward_cpu's buffers. */
static inline void ddp__attention_forward_rows(float *out, float *lse, const float *inp,
                                      int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    DDP__OMP(parallel for schedule(static))
    for (int i = 0; i < B * NH * T; i++) {
        int t = i % T, h = (i / T) % NH, b = i / (T * NH);
        const float *q = inp + ((size_t)b * T + t) * C3 + h * hs;
        const float *kb = inp + (size_t)b * T * C3 + C + h * hs; /* key of token 0 */
        float *o = out + ((size_t)b * T + t) * C + h * hs;
        float s[DDP__ATT_BLOCK];
        float m = -INFINITY, l = 0.0f;
        for (int d = 0; d < hs; d++) o[d] = 0.0f;
        /* softmax over blocks: o and l are rescaled whenever the running max grows */
        for (int j0 = 0; j0 <= t; j0 += DDP__ATT_BLOCK) {
            const int n = t + 1 - j0 < DDP__ATT_BLOCK ? t + 1 - j0 : DDP__ATT_BLOCK;
            float mb = -INFINITY, lb = 0.0f;
            for (int j = 0; j < n; j++) s[j] = ddp__dot(q, kb + (size_t)(j0 + j) * C3, hs) * scale;
            for (int j = 0; j < n; j++) mb = s[j] > mb ? s[j] : mb;
            if (mb > m) {
                if (m != -INFINITY) {
                    float r = m - mb < -80.0f ? 0.0f : ddp__exp(m - mb);
                    l *= r;
                    for (int d = 0; d < hs; d++) o[d] *= r;
                }
                m = mb;
            }
            for (int j = 0; j < n; j++) s[j] -= m;
            ddp__att_floor(s, n);
            ddp__att_exp(s, n);
            for (int j = 0; j < n; j++) lb += s[j];
            l += lb;
            ddp__att_accum(o, s, kb + (size_t)j0 * C3 + C, (size_t)C3, n, hs);
        }
        for (int d = 0; d < hs; d++) o[d] /= l;
        lse[((size_t)b * NH + h) * T + t] = m + logf(l);
    }
}

/* The launch geometry of the GPU attention kernels, plain C so that the CPU tests check
   it: gx = B*NH heads (CUDA allows 2^31-1 blocks in x), gy = row tiles of `rows` (65535
   in y, so T up to 4M at 64 rows per tile). 0 when the shape does not fit. */
static inline int ddp__att_grid(long B, long NH, long T, int rows, unsigned *gx, unsigned *gy)
{
    const long x = B * NH, y = (T + rows - 1) / rows;
    if (B < 0 || NH < 0 || T < 0 || x > 2147483647L || y > 65535) return 0;
    *gx = (unsigned)x;
    *gy = (unsigned)y;
    return 1;
}

#define DDP__ATT_KV 2048 /* floats in each per-block key/value buffer */
/* queries per work item of the forward, per block of the backward: whole register tiles both
   ways (the queries are the tiles' rows in four products, a multiple of 6 and of 12, and their
   columns in the forward's scores, panels of 16): 5% faster than 32 on Zen 1 (AVX2, 6 rows).
   Attention's products take the tile 16 columns wide on every CPU, its panels laid out so. */
#define DDP__ATT_QB 48

/* Keys per block for head size hs: a multiple of 16 (the register tile's width) such that
   a block of keys, padded to 16 dimensions, fits a DDP__ATT_KV buffer; 0 for heads too large. */
static inline int ddp__att_keys(int hs)
{
    const int kb = DDP__ATT_KV / ((hs + 15) / 16 * 16) / 16 * 16;
    return kb < DDP__ATT_BLOCK ? kb : DDP__ATT_BLOCK;
}

/* Columns of src in panels of 16: dst[p stride + r 16 + j] = src[r ld + 16 p + j]. */
static inline void ddp__att_pack_cols(float *dst, size_t stride, const float *src, size_t ld, int rows, int cols)
{
    for (int p = 0; p * 16 < cols; p++)
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < 16; j++)
                dst[p * stride + (size_t)r * 16 + j] = p * 16 + j < cols ? src[r * ld + p * 16 + j] : 0.0f;
}

/* The b of ddp__att_product: panels of w columns, `stride` floats apart, rows ldb apart. */
typedef struct { const float *p; size_t stride, ldb; int w; } ddp__att_b;

/* rows (rows, hs) of src, ld apart, as such a b: src itself when hs is a multiple of 16
   (panels of DDP__NR columns side by side in every row), else packed into buf in panels
   of 16, which holds cap rows per panel. */
static inline ddp__att_b ddp__att_panels(float *buf, const float *src, size_t ld, int rows, int hs, int cap)
{
    ddp__att_b b = {src, DDP__NR, ld, DDP__NR};
    if (hs % 16 == 0) return b;
    ddp__att_pack_cols(buf, (size_t)cap * 16, src, ld, rows, hs);
    b.p = buf;
    b.stride = (size_t)cap * 16;
    b.ldb = 16;
    b.w = 16;
    return b;
}

/* Attention's products out of line with the AVX-512 tile: inlined into the forward, gcc kept
   two accumulators of the scores' tile on the stack (a store and a load every k), and the
   forward ran 13% (ctx 128, head size 32) to 31% (ctx 256, 64) slower on an AMD EPYC family
   26, one thread. The AVX2 tile, built for that CPU, was 3% faster inlined. */
#if defined(DDP__AVX512_TILE) && defined(__GNUC__) && !defined(__CUDACC__)
#define DDP__ATT_PRODUCT_FN __attribute__((noinline, unused)) /* (unused: no warning where attention is not called) */
#else
#define DDP__ATT_PRODUCT_FN inline
#endif
/* c (m, n) (+)= a (m, kc) @ b (kc, n) through ddp__gemm_tile, with a(i,k) = a[i am + k ak];
   start: c = the product. whole: c has room for whole tiles (m up to a multiple of
   DDP__MR, n up to one of the panels' width), which are then stored whole, in vectors,
   rather than element by element (the extra rows repeat a's last); the m x n product has
   the same bits either way. A panel with more than 16 columns left takes the AVX-512 tile
   32 wide (a broadcast for two multiply-adds: attention 5-20% faster on an AMD EPYC
   family 26 at head sizes 32 and 64), else 16; the bits are the same either way. */
static DDP__ATT_PRODUCT_FN void ddp__att_product(float *c, size_t ldc, const float *a, size_t am, size_t ak,
                                                 ddp__att_b b, int m, int n, int kc, int start, int whole)
{
    for (int i = 0; i < m; i += DDP__MR) {
        const int ra = m - i < DDP__MR ? m - i : DDP__MR, mv = whole ? DDP__MR : ra;
        for (int p = 0; p * b.w < n; p++) {
            const int nv = whole ? b.w : n - p * b.w < b.w ? n - p * b.w : b.w;
            float *ct = c + (size_t)i * ldc + p * b.w;
#if DDP__NR > 16
            if (nv > 16)
                ddp__gemm_tile(ct, ldc, mv, nv, a + (size_t)i * am, am, ak, ra, b.p + p * b.stride, b.ldb, DDP__NR, kc,
                               start, NULL, NULL, 0);
            else
#endif
                ddp__gemm_tile(ct, ldc, mv, nv, a + (size_t)i * am, am, ak, ra, b.p + p * b.stride, b.ldb, 16, kc, start,
                               NULL, NULL, 0);
        }
    }
}

/* out (B,T,C); lse (B,NH,T) log-sum-exp of each softmax row, saved for backward;
   inp (B,T,3C) = [q | k | v] per token, head h at channels h*hs .. h*hs+hs-1 of each.
   Work items are blocks of DDP__ATT_QB queries of one (b,h); keys go in blocks of kb
   (fixed by hs), and each block is two register-tiled products (ddp__gemm_tile, as the
   matmuls) that read k and v where they lie: the scores s = k q^T, key by query, with
   the block's queries packed once as the columns, then out += p v. In between each
   query's online softmax, vectorized across the queries: its max, exp, sum, and zeros
   for the keys it must not see (they add exactly nothing while the values are finite: a
   NaN or infinity in a later key's value reaches the earlier queries of its block as
   0 x NaN, as in a dense masked product; the loss is NaN then anyway). Every query sees
   the same key blocks in the same order whatever the work split. */
static inline void ddp_attention_forward_cpu(float *out, float *lse, const float *inp,
                                      int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C; /* values read in place need no buffer: blocks of DDP__ATT_BLOCK keys */
    const int kb = hs % 16 == 0 && hs <= 128 ? DDP__ATT_BLOCK : ddp__att_keys(hs);
    const int nq = (T + DDP__ATT_QB - 1) / DDP__ATT_QB;
    const float scale = 1.0f / sqrtf((float)hs);
    if (kb < 16) {
        ddp__attention_forward_rows(out, lse, inp, B, T, C, NH);
        return;
    }
    DDP__OMP(parallel for schedule(static))
    for (int i = 0; i < B * NH * nq; i++) {
        const int qb = i % nq, h = (i / nq) % NH, b = i / (nq * NH);
        const int t0 = qb * DDP__ATT_QB, nr = T - t0 < DDP__ATT_QB ? T - t0 : DDP__ATT_QB;
        const float *q0 = inp + (size_t)b * T * C3 + h * hs, *k0 = q0 + C; /* token 0's q, k; v follows k */
        float *o0 = out + ((size_t)b * T + t0) * C + h * hs;                 /* row t0 of this head */
        float s[DDP__ATT_BLOCK * DDP__ATT_QB]; /* s[j QB + r]: key j0 + j, query t0 + r */
        float m[DDP__ATT_QB], l[DDP__ATT_QB], mb[DDP__ATT_QB], lb[DDP__ATT_QB];
        float qp[DDP__ATT_QB * 128], vp[DDP__ATT_KV]; /* the queries as columns (hs, nr); values if packed */
        ddp__pack_rows(qp, q0 + (size_t)t0 * C3, (size_t)C3, nr, hs, 16);
        for (int r = 0; r < nr; r++) {
            for (int d = 0; d < hs; d++) o0[(size_t)r * C + d] = 0.0f;
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        for (int j0 = 0; j0 < t0 + nr; j0 += kb) {
            const int nb = t0 + nr - j0 < kb ? t0 + nr - j0 : kb;
            const ddp__att_b vb = ddp__att_panels(vp, k0 + (size_t)j0 * C3 + C, (size_t)C3, nb, hs, kb);
            for (int j = 0; j < nb; j += DDP__MR) { /* s = k q^T from the first panel of queries that see key j */
                const int mv = nb - j < DDP__MR ? nb - j : DDP__MR, p = j0 + j > t0 ? (j0 + j - t0) / 16 : 0;
                const ddp__att_b qb = {qp + (size_t)p * hs * 16, (size_t)hs * 16, 16, 16}; /* (less past the diagonal) */
                ddp__att_product(s + j * DDP__ATT_QB + p * 16, DDP__ATT_QB, k0 + (size_t)(j0 + j) * C3, (size_t)C3, 1,
                                 qb, mv, nr - p * 16, hs, 1, 0);
            }
            for (int r = 0; r < nr; r++) mb[r] = -INFINITY;
            for (int j = 0; j < nb; j++) { /* query t0 + r sees key j0 + j when r >= first */
                float *sj = s + j * DDP__ATT_QB;
                const int first = j0 + j > t0 ? j0 + j - t0 : 0;
                for (int r = first; r < nr; r++) {
                    sj[r] *= scale;
                    mb[r] = sj[r] > mb[r] ? sj[r] : mb[r];
                }
            }
            /* softmax over blocks: o and l are rescaled whenever the running max grows */
            for (int r = 0; r < nr; r++)
                if (mb[r] > m[r]) {
                    if (m[r] != -INFINITY) {
                        const float f = m[r] - mb[r] < -80.0f ? 0.0f : ddp__exp(m[r] - mb[r]);
                        l[r] *= f;
                        for (int d = 0; d < hs; d++) o0[(size_t)r * C + d] *= f;
                    }
                    m[r] = mb[r];
                }
            for (int r = 0; r < nr; r++) lb[r] = 0.0f;
            for (int j = 0; j < nb; j++) {
                float *sj = s + j * DDP__ATT_QB;
                const int first = j0 + j > t0 ? j0 + j - t0 : 0;
                for (int r = 0; r < first; r++) sj[r] = 0.0f;
                for (int r = first; r < nr; r++) sj[r] -= m[r];
                ddp__att_floor(sj + first, nr - first);
                ddp__att_exp(sj + first, nr - first);
                for (int r = first; r < nr; r++) lb[r] += sj[r];
            }
            for (int r = 0; r < nr; r++) l[r] += lb[r];
            for (int r = 0; r < nr; r += DDP__MR) { /* o += p v over the keys the tile's last query sees */
                const int mv = nr - r < DDP__MR ? nr - r : DDP__MR, n = t0 + r + mv - j0 < nb ? t0 + r + mv - j0 : nb;
                if (n > 0)
                    ddp__att_product(o0 + (size_t)r * C, (size_t)C, s + r, 1, DDP__ATT_QB, vb, mv, hs, n, 0, 0);
            }
        }
        for (int r = 0; r < nr; r++) {
            float *o = o0 + (size_t)r * C;
            for (int d = 0; d < hs; d++) o[d] /= l[r];
            lse[((size_t)b * NH + h) * T + t0 + r] = m[r] + logf(l[r]);
        }
    }
}

/* The backward query by query, for heads too large for ddp_attention_backward_cpu's buffers. */
static inline void ddp__attention_backward_rows(float *dinp, const float *dout, const float *inp,
                                       const float *out, const float *lse,
                                       int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    /* each (b,h) owns disjoint slices of dinp, so heads run in parallel */
    DDP__OMP(parallel for schedule(static))
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float p[DDP__ATT_BLOCK], ds[DDP__ATT_BLOCK];
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)b * T + t;
            const float *q = inp + row * C3 + h * hs, *dO = dout + row * C + h * hs;
            const float *kb = inp + (size_t)b * T * C3 + C + h * hs; /* key of token 0 */
            float *dq = dinp + row * C3 + h * hs;
            float *dkb = dinp + (size_t)b * T * C3 + C + h * hs;
            /* D = sum_j P_j dP_j = dout . out, the softmax backward's shared term */
            float D = ddp__dot(dO, out + row * C + h * hs, hs), L = lse[(size_t)bh * T + t];
            for (int j0 = 0; j0 <= t; j0 += DDP__ATT_BLOCK) {
                const int n = t + 1 - j0 < DDP__ATT_BLOCK ? t + 1 - j0 : DDP__ATT_BLOCK;
                for (int j = 0; j < n; j++) {
                    const float *k = kb + (size_t)(j0 + j) * C3;
                    p[j] = ddp__dot(q, k, hs);
                    ds[j] = ddp__dot(dO, k + C, hs);
                }
                for (int j = 0; j < n; j++) p[j] = p[j] * scale - L; /* <= 0 up to rounding */
                ddp__att_floor(p, n);
                for (int j = 0; j < n; j++) p[j] = p[j] > 0.0f ? 0.0f : p[j];
                ddp__att_exp(p, n);
                for (int j = 0; j < n; j++) ds[j] = p[j] * (ds[j] - D) * scale;
                ddp__att_accum(dq, ds, kb + (size_t)j0 * C3, (size_t)C3, n, hs);
                for (int j = 0; j < n; j++) {
                    float *dk = dkb + (size_t)(j0 + j) * C3, *dv = dk + C;
                    ddp__axpy(dv, p[j], dO, hs);
                    ddp__axpy(dk, ds[j], q, hs);
                }
            }
        }
    }
}

/* dinp (B,T,3C) += (NULL: nothing to do); dout, out (B,T,C); inp (B,T,3C); lse (B,NH,T)
   from the forward. Each (b,h) owns disjoint slices of dinp, so heads run in parallel.
   Keys go in blocks of kb, packed into panels, with their dk and dv summed in buffers
   and added to dinp at the end; the queries that see a block come DDP__ATT_QB at a time,
   and every product is register-tiled (ddp__gemm_tile): scores q k^T and dp = dout v^T,
   then per row p = exp(s - lse) and ds = p (dp - D), then dq += ds k, dk += ds^T q and
   dv += p^T dout. Keys a query must not see have p = ds = 0: they add exactly nothing
   (while the inputs are finite, as in the forward).
   dq of query t sums over key blocks in order, dk and dv over queries in order. */
static inline void ddp_attention_backward_cpu(float *dinp, const float *dout, const float *inp,
                                       const float *out, const float *lse,
                                       int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C, kb = ddp__att_keys(hs);
    const float scale = 1.0f / sqrtf((float)hs);
    if (!dinp) return;
    /* each thread's p and ds (with room for whole tiles past a block's queries), packed q and dout
       rows (about 100 KiB), and its head's dq and D (T + DDP__MR rows of hs, T), on the heap: on
       the stack they crashed threads of 128 KiB (musl's default, OMP_STACKSIZE=128K) */
    const size_t pds = (DDP__ATT_QB + DDP__MR) * DDP__ATT_BLOCK;
    const size_t each = 2 * pds + 2 * DDP__ATT_QB * 128 + (size_t)(T + DDP__MR) * hs + T;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    float *work = kb < 16 ? NULL : (float *)malloc(sizeof(float) * each * (size_t)threads);
    if (!work) { /* also where that memory cannot be had */
        ddp__attention_backward_rows(dinp, dout, inp, out, lse, B, T, C, NH);
        return;
    }
    DDP__OMP(parallel for schedule(static))
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const float *q0 = inp + (size_t)b * T * C3 + h * hs, *k0 = q0 + C; /* token 0's q, k; v follows k */
        const float *do0 = dout + (size_t)b * T * C + h * hs, *out0 = out + (size_t)b * T * C + h * hs;
        float *dq0 = dinp + (size_t)b * T * C3 + h * hs, *dk0 = dq0 + C;
#ifdef _OPENMP
        float *p = work + each * (size_t)omp_get_thread_num();
#else
        float *p = work;
#endif
        float *ds = p + pds, *qc = ds + pds, *doc = qc + DDP__ATT_QB * 128;
        /* this head's dq, (T, hs) and room for a whole tile past it, read from dinp once and written
           back once (its tiles added into dinp in place, rows 3C apart: the backward 1.5% slower
           at T 128, hs 32); D = sum_j P_j dP_j = dout . out, the softmax backward's shared term,
           once per query */
        float *dq = doc + DDP__ATT_QB * 128, *Dt = dq + (size_t)(T + DDP__MR) * hs;
        for (int t = 0; t < T; t++) {
            memcpy(dq + (size_t)t * hs, dq0 + (size_t)t * C3, sizeof(float) * hs);
            Dt[t] = ddp__dot(do0 + (size_t)t * C, out0 + (size_t)t * C, hs);
        }
        for (int e = T * hs; e < (T + DDP__MR) * hs; e++) dq[e] = 0.0f;
        /* dk and dv with room for a whole tile past a block's keys (hs <= 128 where kb >= 16) */
        float kp[DDP__ATT_KV], vp[DDP__ATT_KV], kc[DDP__ATT_KV], dk[DDP__ATT_KV + DDP__MR * 128],
            dv[DDP__ATT_KV + DDP__MR * 128];
        /* the keys and values as columns, in panels as wide as the tile where a block's keys fill them */
        const int w = kb % DDP__NR == 0 ? DDP__NR : 16;
        for (int j0 = 0; j0 < T; j0 += kb) {
            const int nb = T - j0 < kb ? T - j0 : kb;
            const float *k = k0 + (size_t)j0 * C3;
            const ddp__att_b kt = {kp, (size_t)hs * w, (size_t)w, w}, vt = {vp, (size_t)hs * w, (size_t)w, w};
            ddp__pack_rows(kp, k, (size_t)C3, nb, hs, w);                                /* for s = q k^T */
            ddp__pack_rows(vp, k + C, (size_t)C3, nb, hs, w);                            /* for dp = dout v^T */
            const ddp__att_b kr = ddp__att_panels(kc, k, (size_t)C3, nb, hs, kb);         /* for dq += ds k */
            const int wide = hs % kr.w == 0; /* hs whole panels (q's and dout's as k's): room for whole tiles */
            for (int e = 0; e < (nb + DDP__MR) * hs; e++) dk[e] = dv[e] = 0.0f;
            for (int t0 = j0; t0 < T; t0 += DDP__ATT_QB) {
                const int nr = T - t0 < DDP__ATT_QB ? T - t0 : DDP__ATT_QB;
                for (int r = 0; r < nr; r += DDP__MR) {
                    const int mv = nr - r < DDP__MR ? nr - r : DDP__MR, n = t0 + r + mv - j0 < nb ? t0 + r + mv - j0 : nb;
                    ddp__att_product(p + r * kb, (size_t)kb, q0 + (size_t)(t0 + r) * C3, (size_t)C3, 1, kt, mv, n, hs,
                                     1, 1);
                    ddp__att_product(ds + r * kb, (size_t)kb, do0 + (size_t)(t0 + r) * C, (size_t)C, 1, vt, mv, n, hs,
                                     1, 1);
                }
                for (int r = 0; r < nr; r++) {
                    const size_t t = (size_t)t0 + r;
                    /* in whole vectors: the products wrote whole panels, so the keys up to n8
                       (<= kb) hold scores, of keys this query must not see past n, which end
                       zero below (with the whole tiles, the backward 6% faster at T 128, hs 32) */
                    const int n = (int)t + 1 - j0 < nb ? (int)t + 1 - j0 : nb, n8 = (n + 7) / 8 * 8;
                    const float D = Dt[t], L = lse[(size_t)bh * T + t];
                    float *pr = p + r * kb, *dsr = ds + r * kb;
                    for (int j = 0; j < n8; j++) pr[j] = pr[j] * scale - L; /* <= 0 up to rounding */
                    ddp__att_floor(pr, n8);
                    for (int j = 0; j < n8; j++) pr[j] = pr[j] > 0.0f ? 0.0f : pr[j];
                    ddp__att_exp(pr, n8);
                    for (int j = 0; j < n8; j++) dsr[j] = pr[j] * (dsr[j] - D) * scale;
                    for (int j = n; j < nb; j++) pr[j] = dsr[j] = 0.0f;
                }
                const ddp__att_b qr = ddp__att_panels(qc, q0 + (size_t)t0 * C3, (size_t)C3, nr, hs, DDP__ATT_QB);
                const ddp__att_b dor = ddp__att_panels(doc, do0 + (size_t)t0 * C, (size_t)C, nr, hs, DDP__ATT_QB);
                for (int r = 0; r < nr; r += DDP__MR) { /* dq += ds k */
                    const int mv = nr - r < DDP__MR ? nr - r : DDP__MR, n = t0 + r + mv - j0 < nb ? t0 + r + mv - j0 : nb;
                    /* whole in the last block only: past its rows lies the room past T, past another's the
                       next block's queries */
                    ddp__att_product(dq + (size_t)(t0 + r) * hs, (size_t)hs, ds + r * kb, (size_t)kb, 1, kr, mv, hs, n,
                                     0, wide && t0 + nr == T);
                }
                /* dk += ds^T q, dv += p^T dout, a tile of keys from the block's first query that sees
                   its first key (the queries before add exact zeros): dense, these two products
                   took 37% of the backward at T 128, hs 32, a third of it on queries that see
                   none of the tile's keys */
                for (int i = 0; i < nb && j0 + i < t0 + nr; i += DDP__MR) {
                    const int f = j0 + i > t0 ? j0 + i - t0 : 0;
                    const int mv = nb - i < DDP__MR ? nb - i : DDP__MR;
                    const ddp__att_b qf = {qr.p + (size_t)f * qr.ldb, qr.stride, qr.ldb, qr.w};
                    const ddp__att_b df = {dor.p + (size_t)f * dor.ldb, dor.stride, dor.ldb, dor.w};
                    ddp__att_product(dk + (size_t)i * hs, (size_t)hs, ds + (size_t)f * kb + i, 1, (size_t)kb, qf, mv, hs,
                                     nr - f, 0, wide);
                    ddp__att_product(dv + (size_t)i * hs, (size_t)hs, p + (size_t)f * kb + i, 1, (size_t)kb, df, mv, hs,
                                     nr - f, 0, wide);
                }
            }
            for (int j = 0; j < nb; j++)
                for (int d = 0; d < hs; d++) {
                    dk0[(size_t)(j0 + j) * C3 + d] += dk[j * hs + d];
                    dk0[(size_t)(j0 + j) * C3 + C + d] += dv[j * hs + d];
                }
        }
        for (int t = 0; t < T; t++) memcpy(dq0 + (size_t)t * C3, dq + (size_t)t * hs, sizeof(float) * hs);
    }
    free(work);
}

// >>gelu cpu
/* ---- gelu --------------------------------------------------------------- */
/* (the formula, its saturation and ddp__gelu_grads: >>helpers cpu) */
/* out (N) = gelu(inp (N)); out may be inp. */
static inline void ddp_gelu_forward_cpu(float *out, const float *inp, size_t N)
{
    DDP__OMP(parallel for schedule(static))
    for (long i0 = 0; i0 < (long)N; i0 += DDP__GELU_BLOCK) {
        const int n = (long)N - i0 < DDP__GELU_BLOCK ? (int)((long)N - i0) : DDP__GELU_BLOCK;
        const float *x = inp + i0;
        float y[DDP__GELU_BLOCK];
        for (int j = 0; j < n; j++) y[j] = x[j] / (1.0f + ddp__gelu_exp(x[j]));
        for (int j = 0; j < n; j++) out[i0 + j] = x[j] < -9.0f ? 0.0f : x[j] > 9.0f ? x[j] : y[j];
    }
}

/* dinp (N) += gelu'(inp) * dout (NULL: nothing to do); inp, dout (N). */
static inline void ddp_gelu_backward_cpu(float *dinp, const float *inp, const float *dout, size_t N)
{
    DDP__OMP(parallel for schedule(static))
    for (long i0 = 0; i0 < (dinp ? (long)N : 0); i0 += DDP__GELU_BLOCK) {
        const int n = (long)N - i0 < DDP__GELU_BLOCK ? (int)((long)N - i0) : DDP__GELU_BLOCK;
        const float *x = inp + i0;
        float g[DDP__GELU_BLOCK];
        ddp__gelu_grads(g, x, n);
        for (int j = 0; j < n; j++) dinp[i0 + j] += g[j] * dout[i0 + j];
    }
}

// >>residual cpu
/* ---- residual ----------------------------------------------------------- */
/* out (N) = inp1 (N) + inp2 (N) */
static inline void ddp_residual_forward_cpu(float *out, const float *inp1, const float *inp2, size_t N)
{
    DDP__OMP(parallel for schedule(static))
    for (long i = 0; i < (long)N; i++) out[i] = inp1[i] + inp2[i];
}

/* dinp1 (N) +=, dinp2 (N) += dout (N); either may be NULL (not needed) */
static inline void ddp_residual_backward_cpu(float *dinp1, float *dinp2, const float *dout, size_t N)
{
    if (dinp1) {
        DDP__OMP(parallel for schedule(static))
        for (long i = 0; i < (long)N; i++) dinp1[i] += dout[i];
    }
    if (dinp2) {
        DDP__OMP(parallel for schedule(static))
        for (long i = 0; i < (long)N; i++) dinp2[i] += dout[i];
    }
}

// >>crossentropy cpu
/* ---- fused softmax + cross-entropy -------------------------------------- */
/* Each row's exponentials are computed in blocks with ddp__exp (vectorized; arguments
   floored at -80 and results below that set to 0) and summed in double: one fp32
   accumulator over V = 50257 terms gave 20-30x torch's error in the loss. The
   exponentials are kept in dlogits, so each is computed once. */
#define DDP__CE_BLOCK 256

/* e[j] = exp(x[j] - m) for j < n, x[j] <= m; 0 where x[j] - m < -80 (NaN is kept) */
static inline void ddp__softmax_exp(float *e, const float *x, float m, int n)
{
    for (int j = 0; j < n; j++) e[j] = x[j] - m;
    for (int j = 0; j < n; j++) e[j] = e[j] < -80.0f ? -80.0f : e[j];
    for (int j = 0; j < n; j++) e[j] = ddp__exp(e[j]);
    for (int j = 0; j < n; j++) e[j] = x[j] - m < -80.0f ? 0.0f : e[j];
}

/* loss (1) = mean of losses over targets != ignore_index (0 if there are none);
   losses (B,T) per position, 0 where ignored; dlogits (B,T,V) overwritten with
   dloss * (softmax - onehot) / n_valid, 0 on ignored rows, or NULL for forward only
   (it may alias logits); logits (B,T,V); targets (B,T). */
static inline void ddp_crossentropy_forward_backward_cpu(float *loss, float *losses, float *dlogits,
                                                  const float *logits, const int *targets,
                                                  int B, int T, int V, int ignore_index, float dloss)
{
    const int BT = B * T;
    int n_valid = 0;
    for (int i = 0; i < BT; i++) n_valid += targets[i] != ignore_index;
    const float g = n_valid ? dloss / n_valid : 0.0f;
    DDP__OMP(parallel for schedule(static))
    for (int i = 0; i < BT; i++) {
        const float *x = logits + (size_t)i * V;
        float *dx = dlogits ? dlogits + (size_t)i * V : NULL;
        if (targets[i] == ignore_index) {
            losses[i] = 0.0f;
            if (dx)
                for (int v = 0; v < V; v++) dx[v] = 0.0f;
            continue;
        }
        const int tgt = targets[i];
        const float x_tgt = x[tgt]; /* read before dlogits may overwrite it in place */
        float m = -INFINITY, e[DDP__CE_BLOCK];
        double s = 0.0;
        for (int v = 0; v < V; v++) m = x[v] > m ? x[v] : m;
        for (int v0 = 0; v0 < V; v0 += DDP__CE_BLOCK) {
            const int n = V - v0 < DDP__CE_BLOCK ? V - v0 : DDP__CE_BLOCK;
            double part[4] = {0, 0, 0, 0};
            ddp__softmax_exp(e, x + v0, m, n);
            for (int j = 0; j + 4 <= n; j += 4)
                for (int k = 0; k < 4; k++) part[k] += e[j + k];
            for (int j = n / 4 * 4; j < n; j++) part[0] += e[j];
            s += (part[0] + part[1]) + (part[2] + part[3]);
            if (dx) memcpy(dx + v0, e, (size_t)n * sizeof(float)); /* x + v0 .. is read already */
        }
        losses[i] = (float)(((double)m - x_tgt) + log(s)); /* log(s) added last: at logits of 1e4 it is below their ulp */
        if (dx) {
            const float inv = (float)(1.0 / s);
            for (int v = 0; v < V; v++) dx[v] = g * (dx[v] * inv - (v == tgt));
        }
    }
    double sum = 0.0;
    for (int i = 0; i < BT; i++) sum += losses[i];
    *loss = n_valid ? (float)(sum / n_valid) : 0.0f;
}

// >>adamw cpu
/* ---- AdamW -------------------------------------------------------------- */
/* One step on params (N), using grads (N), first/second moments m, v (N); step t
   counts from 1. torch.optim.AdamW semantics: decoupled decay, bias correction. */
static inline void ddp_adamw_update_cpu(float *params, const float *grads, float *m, float *v, size_t N,
                                 float lr, float beta1, float beta2, float eps,
                                 float weight_decay, int t)
{
    /* the bias corrections as reciprocals: one division per element instead of three (the
       dividers were the loop's bottleneck: 17% faster on Zen 1, with the memory traffic);
       v's (is2) after its square root, as torch takes it: sqrtf(v * ic2) overflowed to inf, a
       step of 0, for gradients past 1.8e19 at t = 1, whose true step is finite */
    const float ic1 = 1.0f / (1.0f - powf(beta1, (float)t)), is2 = 1.0f / sqrtf(1.0f - powf(beta2, (float)t));
    DDP__OMP(parallel for schedule(static))
    for (long i = 0; i < (long)N; i++) {
        float g = grads[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float step = (m[i] * ic1) / (sqrtf(v[i]) * is2 + eps);
        params[i] -= lr * (step + weight_decay * params[i]);
    }
}

// >>norm cpu
/* ---- global gradient norm and clipping ---------------------------------- */
#define DDP__NORM_CHUNKS 64 /* fixed partition, so the sum does not depend on threads */

/* norm (1) = sqrt(sum grads^2); grads (N), all gradients in one buffer. */
static inline void ddp_global_norm_cpu(float *norm, const float *grads, size_t N)
{
    double part[DDP__NORM_CHUNKS], sum = 0.0;
    DDP__OMP(parallel for schedule(static))
    for (int k = 0; k < DDP__NORM_CHUNKS; k++) {
        const size_t lo = N * k / DDP__NORM_CHUNKS, hi = N * (k + 1) / DDP__NORM_CHUNKS;
        double lane[8] = {0.0}, s = 0.0; /* 8 sums in step, so that they vectorize and do not wait on each other */
        size_t i = lo;
        for (; hi - i >= 8; i += 8)
            for (int j = 0; j < 8; j++) lane[j] += (double)grads[i + j] * grads[i + j];
        for (; i < hi; i++) s += (double)grads[i] * grads[i];
        for (int j = 0; j < 8; j++) s += lane[j];
        part[k] = s;
    }
    for (int k = 0; k < DDP__NORM_CHUNKS; k++) sum += part[k];
    *norm = (float)sqrt(sum);
}

/* grads (N) *= max_norm / (norm + 1e-6) when that factor is below 1; norm (1) from
   ddp_global_norm_cpu. */
static inline void ddp_clip_by_norm_cpu(float *grads, size_t N, float max_norm, const float *norm)
{
    float f = max_norm / (*norm + 1e-6f);
    if (f >= 1.0f) return;
    DDP__OMP(parallel for schedule(static))
    for (long i = 0; i < (long)N; i++) grads[i] *= f;
}

/* ======================================================================== */
/* GPU half: CUDA C++, compiled only by nvcc.                               */
/* ======================================================================== */
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cub/device/device_radix_sort.cuh>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The activation type for callers that fix it at compile time. */
#ifdef DDP_KERNELS_FP32
typedef float ddp_floatX;
#else
typedef __nv_bfloat16 ddp_floatX;
#endif

// >>context gpu
/* ---- context: ddp_kernels_init, ddp_kernels_destroy, ddp_kernels_error ---- */
/* One cached cuBLASLt matmul: what it was planned for (key, compared with memcmp, so
   built from a zeroed struct) and the descriptors, layouts and algorithm the heuristic
   chose. state -1 remembers that cuBLASLt had no algorithm (cublasGemmEx runs it). */
typedef struct ddp__lt_key {
    int m, n, k, lda, ldb, ta, tb, bias, compute, tin, tout; /* tin: type of a and b; tout: of d */
    uint32_t al_a, al_b, al_d;                                /* pointer alignments, bytes */
} ddp__lt_key;

typedef struct ddp__lt_plan {
    ddp__lt_key key;
    int state; /* 0 empty, 1 ready, -1 declined by cuBLASLt */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
} ddp__lt_plan;

#define DDP_KERNELS_LT_PLANS 32 /* a GPT uses ~12 shapes (4 matmuls x forward + 2 backward products) */

/* Caller-owned state of the GPU half: create with ddp_kernels_init, free with
   ddp_kernels_destroy. Serves one stream at a time. */
typedef struct ddp_kernels_ctx {
    cublasLtHandle_t lt;
    cublasHandle_t blas;          /* created on first need: matmuls that cuBLASLt declines */
    void *lt_workspace;           /* cuBLASLt workspace, DDP_KERNELS_LT_WORKSPACE bytes */
    size_t lt_workspace_bytes;
    void *scratch;                /* partial sums and sort buffers; grows on demand */
    size_t scratch_bytes;
    int allow_tf32;               /* fp32 matmuls may use TF32 tensor cores (off: exact fp32) */
    int attention_streaming;      /* 1: attention by the streaming kernels even where the products fit */
    cublasStatus_t cublas_status; /* the cuBLAS(Lt) status behind the last cudaErrorUnknown */
    ddp__lt_plan plans[DDP_KERNELS_LT_PLANS]; /* matmul plans by shape, type and epilogue */
    int plans_next;               /* the slot a new plan takes (round robin) */
    char error[256];              /* why the last failure happened; see ddp_kernels_error */
} ddp_kernels_ctx;

#define DDP_KERNELS_LT_WORKSPACE (32u << 20)

/* Returns err after recording why in ctx->error. */
static inline cudaError_t ddp__fail(ddp_kernels_ctx *ctx, cudaError_t err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
    va_end(ap);
    return err;
}

/* "" or the cause of the last failure this context saw, in words: "no CUDA device:
   cudaGetDeviceCount: ..., driver 12.4, runtime 13.0", "cuBLAS matmul m=.. n=.. k=..:
   ...", "attention: C=640, NH=4: needs C % NH == 0 and 1 <= C/NH <= 128". The returned
   cudaError_t says only the kind. */
static inline const char *ddp_kernels_error(const ddp_kernels_ctx *ctx) { return ctx->error; }

static inline void ddp__lt_plan_free(ddp__lt_plan *pl)
{
    if (pl->ld) cublasLtMatrixLayoutDestroy(pl->ld);
    if (pl->lb) cublasLtMatrixLayoutDestroy(pl->lb);
    if (pl->la) cublasLtMatrixLayoutDestroy(pl->la);
    if (pl->op) cublasLtMatmulDescDestroy(pl->op);
    memset(pl, 0, sizeof *pl);
}

static inline void ddp_kernels_destroy(ddp_kernels_ctx *ctx)
{
    for (int i = 0; i < DDP_KERNELS_LT_PLANS; i++) ddp__lt_plan_free(&ctx->plans[i]);
    cudaFree(ctx->lt_workspace);
    cudaFree(ctx->scratch);
    if (ctx->blas) cublasDestroy(ctx->blas);
    if (ctx->lt) cublasLtDestroy(ctx->lt);
    memset(ctx, 0, sizeof *ctx);
}

/* On failure the context holds nothing (destroy is still safe) and ddp_kernels_error
   names the cause, e.g. with no usable GPU "no CUDA device: cudaGetDeviceCount: CUDA
   driver version is insufficient for CUDA runtime version, driver 12.2, runtime 13.0". */
static inline cudaError_t ddp_kernels_init(ddp_kernels_ctx *ctx)
{
    int ndev = 0, drv = 0, rt = 0;
    memset(ctx, 0, sizeof *ctx);
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        cudaGetLastError(); /* the probe's error must not surface in the caller's next call */
        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rt);
        return ddp__fail(ctx, e != cudaSuccess ? e : cudaErrorNoDevice,
                         "no CUDA device: cudaGetDeviceCount: %s, driver %d.%d%s, runtime %d.%d",
                         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", drv / 1000, drv % 1000 / 10,
                         drv == 0 ? " (none installed)" : "", rt / 1000, rt % 1000 / 10);
    }
    ctx->cublas_status = cublasLtCreate(&ctx->lt);
    if (ctx->cublas_status != CUBLAS_STATUS_SUCCESS) {
        cublasStatus_t st = ctx->cublas_status;
        ddp_kernels_destroy(ctx);
        ctx->cublas_status = st;
        return ddp__fail(ctx, cudaErrorUnknown, "cublasLtCreate: %s", cublasLtGetStatusString(st));
    }
    ctx->lt_workspace_bytes = DDP_KERNELS_LT_WORKSPACE;
    if ((e = cudaMalloc(&ctx->lt_workspace, ctx->lt_workspace_bytes)) != cudaSuccess) {
        ddp_kernels_destroy(ctx);
        return ddp__fail(ctx, e, "cudaMalloc of the %u MiB cuBLASLt workspace: %s", DDP_KERNELS_LT_WORKSPACE >> 20,
                         cudaGetErrorString(e));
    }
    return cudaSuccess;
}

// >>helpers gpu
/* ---- helpers ------------------------------------------------------------ */
#define DDP__TRY(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return e_; } while (0)

/* A pointer argument that may be NULL must not take part in template deduction. */
template <class X> struct ddp__same { typedef X type; };

/* Scratch memory of at least bytes, valid until the next launch on this context. */
static inline cudaError_t ddp__scratch(ddp_kernels_ctx *ctx, size_t bytes, cudaStream_t stream, void **p)
{
    if (bytes > ctx->scratch_bytes) {
        DDP__TRY(cudaStreamSynchronize(stream)); /* earlier launches may still use it */
        cudaFree(ctx->scratch);
        ctx->scratch = NULL;
        ctx->scratch_bytes = 0;
        DDP__TRY(cudaMalloc(&ctx->scratch, bytes));
        ctx->scratch_bytes = bytes;
    }
    *p = ctx->scratch;
    return cudaSuccess;
}

static inline bool ddp__aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
static inline unsigned ddp__blocks(size_t n, size_t per_block) { return (unsigned)((n + per_block - 1) / per_block); }

static __device__ __forceinline__ float ddp__f(float x) { return x; }
static __device__ __forceinline__ float ddp__f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename F> static __device__ __forceinline__ F ddp__to(float x);
template <> __device__ __forceinline__ float ddp__to<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 ddp__to<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

/* Elements of F in one 128-bit load. */
template <typename F> struct ddp__pack { static constexpr int n = 16 / sizeof(F); };

/* dst[0..N) = p[i..i+N) as floats, zeros past end; 128-bit loads when vec (which
   promises p + i is 16-byte aligned whenever the whole run is in range). N is a
   multiple of the pack of X: an fp32 gradient read beside a pack of bf16 takes two. */
template <int N, typename X>
static __device__ __forceinline__ void ddp__loadn(float *dst, const X *p, long i, long end, bool vec)
{
    constexpr int n = ddp__pack<X>::n;
    if (vec && i + N <= end) {
#pragma unroll
        for (int c = 0; c < N; c += n) {
            alignas(16) X v[n];
            *reinterpret_cast<int4 *>(v) = *reinterpret_cast<const int4 *>(p + i + c);
#pragma unroll
            for (int k = 0; k < n; k++) dst[c + k] = ddp__f(v[k]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; k++) dst[k] = i + k < end ? ddp__f(p[i + k]) : 0.0f;
    }
}

/* p[i..i+N) = src[0..N), stopping at end. */
template <int N, typename X>
static __device__ __forceinline__ void ddp__storen(X *p, const float *src, long i, long end, bool vec)
{
    constexpr int n = ddp__pack<X>::n;
    if (vec && i + N <= end) {
#pragma unroll
        for (int c = 0; c < N; c += n) {
            alignas(16) X v[n];
#pragma unroll
            for (int k = 0; k < n; k++) v[k] = ddp__to<X>(src[c + k]);
            *reinterpret_cast<int4 *>(p + i + c) = *reinterpret_cast<const int4 *>(v);
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; k++)
            if (i + k < end) p[i + k] = ddp__to<X>(src[k]);
    }
}

/* One pack of F: 16 bytes. */
template <typename F>
static __device__ __forceinline__ void ddp__load(float *dst, const F *p, long i, long end, bool vec)
{
    ddp__loadn<ddp__pack<F>::n>(dst, p, i, end, vec);
}

template <typename F>
static __device__ __forceinline__ void ddp__store(F *p, const float *src, long i, long end, bool vec)
{
    ddp__storen<ddp__pack<F>::n>(p, src, i, end, vec);
}

struct ddp__sum_op { template <class V> __device__ V operator()(V a, V b) const { return a + b; } };
struct ddp__max_op { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };

template <class V, class Op>
static __device__ __forceinline__ V ddp__warp_reduce(V v, Op op)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Reduces v over the block (blockDim.x a multiple of 32); every thread gets the
   same result, combined in the same fixed order. */
template <class V, class Op>
static __device__ V ddp__block_reduce(V v, Op op)
{
    __shared__ V warp_vals[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = ddp__warp_reduce(v, op);
    __syncthreads(); /* a previous call may still be reading warp_vals */
    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();
    v = warp_vals[0];
    for (int w = 1; w < nwarps; w++) v = op(v, warp_vals[w]);
    return v;
}

/* Column sums of a (rows, cols) matrix in two deterministic stages: chunks of rows
   give partial sums, then each column adds its partials in chunk order. */
#define DDP__COL_CHUNKS 256

template <typename F>
static __global__ void ddp__colsum_partial_kernel(float *part, const F *a, int rows, int cols,
                                                  int rows_per_chunk, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * n, r0 = blockIdx.y * rows_per_chunk;
    const int r1 = min(rows, r0 + rows_per_chunk);
    if (c >= cols) return;
    float acc[n] = {}, v[n];
    for (int r = r0; r < r1; r++) {
        ddp__load(v, a + (long)r * cols, c, cols, vec);
#pragma unroll
        for (int k = 0; k < n; k++) acc[k] += v[k];
    }
#pragma unroll
    for (int k = 0; k < n; k++)
        if (c + k < cols) part[(long)blockIdx.y * cols + c + k] = acc[k];
}

/* out (cols) += sum over chunks of part[chunk * stride + c] */
template <typename F>
static __global__ void ddp__colsum_finish_kernel(F *out, const float *part, int chunks, int cols, long stride)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++) s += part[k * stride + c];
    out[c] = ddp__to<F>(ddp__f(out[c]) + s);
}

static inline int ddp__rows_per_chunk(int rows) { return (rows + DDP__COL_CHUNKS - 1) / DDP__COL_CHUNKS; }

// >>embedding gpu
/* ---- embedding ---------------------------------------------------------- */
template <typename F>
static __global__ void ddp__embedding_forward_kernel(F *out, const int *tokens, const F *wte,
                                                     const F *wpe, int T, int C, long N, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * n;
    if (i >= N) return;
    if (vec) { /* C % n == 0: the pack lies in one row */
        const long bt = i / C, c = i % C;
        float a[n], p[n];
        ddp__load(a, wte + (long)tokens[bt] * C, c, C, true);
        ddp__load(p, wpe + (bt % T) * C, c, C, true);
#pragma unroll
        for (int k = 0; k < n; k++) a[k] += p[k];
        ddp__store(out, a, i, N, true);
    } else {
        for (long e = i; e < i + n && e < N; e++) {
            const long bt = e / C, c = e % C;
            out[e] = ddp__to<F>(ddp__f(wte[(long)tokens[bt] * C + c]) + ddp__f(wpe[(bt % T) * C + c]));
        }
    }
}

/* out (B,T,C) = wte[tokens] + wpe[t].  tokens (B,T); wte (V,C); wpe (maxT,C). */
template <typename F>
static inline cudaError_t ddp_embedding_forward_gpu(ddp_kernels_ctx *ctx, F *out, const int *tokens, const F *wte,
                                             const F *wpe, int B, int T, int C, cudaStream_t stream)
{
    (void)ctx;
    constexpr int n = ddp__pack<F>::n;
    const long N = (long)B * T * C;
    const bool vec = C % n == 0 && ddp__aligned16(out) && ddp__aligned16(wte) && ddp__aligned16(wpe);
    if (N == 0) return cudaSuccess;
    ddp__embedding_forward_kernel<<<ddp__blocks(N, 256 * n), 256, 0, stream>>>(out, tokens, wte, wpe, T, C, N, vec);
    return cudaGetLastError();
}

/* dwpe (T,C) fp32 += sum over b of dout (B,T,C); one thread per pack of (t, c) */
template <typename F>
static __global__ void ddp__embedding_dwpe_kernel(float *dwpe, const F *dout, int B, int T, int C, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * n, N = (long)T * C;
    if (i >= N) return;
    float acc[n], v[n];
    ddp__loadn<n>(acc, dwpe, i, N, vec);
    for (int b = 0; b < B; b++) {
        ddp__load(v, dout + (long)b * N, i, N, vec);
#pragma unroll
        for (int k = 0; k < n; k++) acc[k] += v[k];
    }
    ddp__storen<n>(dwpe, acc, i, N, vec);
}

static __global__ void ddp__iota_kernel(int *a, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = i;
}

/* One block per position of the token-sorted order; the block that starts a run of
   equal tokens sums the run's dout rows, in position order, into dwte. */
template <typename F>
static __global__ void ddp__embedding_dwte_kernel(float *dwte, const F *dout, const int *sorted_tokens,
                                                  const int *sorted_pos, int BT, int C, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const int j = blockIdx.x, tok = sorted_tokens[j];
    if (j > 0 && sorted_tokens[j - 1] == tok) return;
    float *row = dwte + (long)tok * C;
    for (int c = threadIdx.x * n; c < C; c += blockDim.x * n) {
        float acc[n], v[n];
        ddp__loadn<n>(acc, row, c, C, vec);
        for (int r = j; r < BT && sorted_tokens[r] == tok; r++) {
            ddp__load(v, dout + (long)sorted_pos[r] * C, c, C, vec);
#pragma unroll
            for (int k = 0; k < n; k++) acc[k] += v[k];
        }
        ddp__storen<n>(row, acc, c, C, vec);
    }
}

/* dwte (V,C) +=, dwpe (maxT,C) += (parameter gradients, fp32); dout (B,T,C); tokens (B,T). */
template <typename F>
static inline cudaError_t ddp_embedding_backward_gpu(ddp_kernels_ctx *ctx, float *dwte, float *dwpe, const F *dout,
                                              const int *tokens, int B, int T, int C, cudaStream_t stream)
{
    constexpr int n = ddp__pack<F>::n;
    const int BT = B * T;
    const bool vec = C % n == 0 && ddp__aligned16(dwte) && ddp__aligned16(dwpe) && ddp__aligned16(dout);
    if (BT == 0 || C == 0) return cudaSuccess; /* (C = 0: empty gradients, an empty grid is no launch) */
    ddp__embedding_dwpe_kernel<<<ddp__blocks((size_t)T * C, 256 * n), 256, 0, stream>>>(dwpe, dout, B, T, C, vec);
    DDP__TRY(cudaGetLastError());

    /* stable radix sort of (token, position): equal tokens stay in position order */
    size_t sort_bytes = 0;
    DDP__TRY(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const int *)NULL, (int *)NULL,
                                             (const int *)NULL, (int *)NULL, BT, 0, 32, stream));
    const size_t ints = ((size_t)3 * BT + 63) / 64 * 64; /* keep the sort buffer 256-byte aligned */
    void *scratch;
    DDP__TRY(ddp__scratch(ctx, ints * sizeof(int) + sort_bytes, stream, &scratch));
    int *pos = (int *)scratch, *sorted_tok = pos + BT, *sorted_pos = sorted_tok + BT;
    ddp__iota_kernel<<<ddp__blocks(BT, 256), 256, 0, stream>>>(pos, BT);
    DDP__TRY(cudaGetLastError());
    DDP__TRY(cub::DeviceRadixSort::SortPairs((int *)scratch + ints, sort_bytes, tokens, sorted_tok,
                                             pos, sorted_pos, BT, 0, 32, stream));
    ddp__embedding_dwte_kernel<<<BT, 128, 0, stream>>>(dwte, dout, sorted_tok, sorted_pos, BT, C, vec);
    return cudaGetLastError();
}

// >>layernorm gpu
/* ---- layernorm ---------------------------------------------------------- */
/* One warp per row; lanes walk the row in packs. */
template <typename F>
static __global__ void ddp__layernorm_forward_kernel(F *out, float *mean, float *rstd, const F *inp,
                                                     const F *weight, const F *bias, int rows, int C, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return; /* the whole warp leaves together */
    const F *x = inp + (long)row * C;
    float v[n], w[n], b[n], s, x0 = ddp__f(x[0]), d = 0.0f; /* the row's shift, as on the CPU: sums of small terms */
    for (int pass = 0; pass < 2; pass++) {
        s = 0.0f;
        for (int c = lane * n; c < C; c += 32 * n) {
            ddp__load(v, x, c, C, vec);
#pragma unroll
            for (int k = 0; k < n; k++) s += c + k < C ? v[k] - x0 : 0.0f;
        }
        d = ddp__warp_reduce(s, ddp__sum_op()) / C; /* mean - x0 */
        s = 0.0f;
        for (int c = lane * n; c < C; c += 32 * n) {
            ddp__load(v, x, c, C, vec);
#pragma unroll
            for (int k = 0; k < n; k++) s += c + k < C ? ((v[k] - x0) - d) * ((v[k] - x0) - d) : 0.0f;
        }
        s = ddp__warp_reduce(s, ddp__sum_op());
        if (!(d * d > 16.0f * (s / C))) break; /* (the whole warp: d and s are its sums) */
        x0 += d; /* x0 an outlier, more than 4 standard deviations out: around the mean, as on the CPU */
    }
    const float r = rsqrtf(s / C + DDP_LAYERNORM_EPS);
    for (int c = lane * n; c < C; c += 32 * n) {
        ddp__load(v, x, c, C, vec);
        ddp__load(w, weight, c, C, vec);
        ddp__load(b, bias, c, C, vec);
#pragma unroll
        for (int k = 0; k < n; k++) v[k] = ((v[k] - x0) - d) * r * w[k] + b[k];
        ddp__store(out + (long)row * C, v, c, C, vec);
    }
    if (lane == 0) {
        mean[row] = x0 + d;
        rstd[row] = r;
    }
}

/* out (B,T,C); mean, rstd (B,T) fp32; inp (B,T,C); weight, bias (C). */
template <typename F>
static inline cudaError_t ddp_layernorm_forward_gpu(ddp_kernels_ctx *ctx, F *out, float *mean, float *rstd, const F *inp,
                                             const F *weight, const F *bias, int B, int T, int C, cudaStream_t stream)
{
    (void)ctx;
    const int rows = B * T;
    const bool vec = C % ddp__pack<F>::n == 0 && ddp__aligned16(out) && ddp__aligned16(inp) &&
                     ddp__aligned16(weight) && ddp__aligned16(bias);
    if (rows == 0 || C == 0) return cudaSuccess; /* the kernel reads x[0] of each row */
    ddp__layernorm_forward_kernel<<<ddp__blocks(rows, 8), 256, 0, stream>>>(out, mean, rstd, inp, weight, bias, rows, C, vec);
    return cudaGetLastError();
}

template <typename F>
static __global__ void ddp__layernorm_backward_kernel(F *dinp, const F *dout, const F *inp, const F *weight,
                                                      const float *mean, const float *rstd, int rows, int C, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const F *x = inp + (long)row * C, *d = dout + (long)row * C;
    const float m = mean[row], r = rstd[row];
    float xv[n], dv[n], wv[n], gv[n], s1 = 0.0f, s2 = 0.0f;
    for (int c = lane * n; c < C; c += 32 * n) {
        ddp__load(xv, x, c, C, vec);
        ddp__load(dv, d, c, C, vec);
        ddp__load(wv, weight, c, C, vec);
#pragma unroll
        for (int k = 0; k < n; k++) { /* padding has dv = 0 */
            s1 += dv[k] * wv[k];
            s2 += dv[k] * wv[k] * (xv[k] - m) * r;
        }
    }
    const float dn_mean = ddp__warp_reduce(s1, ddp__sum_op()) / C;
    const float dn_n_mean = ddp__warp_reduce(s2, ddp__sum_op()) / C;
    for (int c = lane * n; c < C; c += 32 * n) {
        ddp__load(xv, x, c, C, vec);
        ddp__load(dv, d, c, C, vec);
        ddp__load(wv, weight, c, C, vec);
        ddp__load(gv, dinp + (long)row * C, c, C, vec);
#pragma unroll
        for (int k = 0; k < n; k++)
            gv[k] += (dv[k] * wv[k] - dn_mean - (xv[k] - m) * r * dn_n_mean) * r;
        ddp__store(dinp + (long)row * C, gv, c, C, vec);
    }
}

/* part (chunks, 2, C): per chunk of rows, sum of dout * normalized and of dout */
template <typename F>
static __global__ void ddp__layernorm_param_partial_kernel(float *part, const F *dout, const F *inp,
                                                           const float *mean, const float *rstd,
                                                           int rows, int C, int rows_per_chunk, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * n, r0 = blockIdx.y * rows_per_chunk;
    const int r1 = min(rows, r0 + rows_per_chunk);
    if (c >= C) return;
    float dw[n] = {}, db[n] = {}, xv[n], dv[n];
    for (int r = r0; r < r1; r++) {
        ddp__load(xv, inp + (long)r * C, c, C, vec);
        ddp__load(dv, dout + (long)r * C, c, C, vec);
        const float m = mean[r], s = rstd[r];
#pragma unroll
        for (int k = 0; k < n; k++) {
            dw[k] += dv[k] * (xv[k] - m) * s;
            db[k] += dv[k];
        }
    }
    float *p = part + (long)blockIdx.y * 2 * C;
#pragma unroll
    for (int k = 0; k < n; k++)
        if (c + k < C) {
            p[c + k] = dw[k];
            p[C + c + k] = db[k];
        }
}

/* dinp (B,T,C) += (or NULL: not needed), dweight (C) +=, dbias (C) += (fp32; both or neither
   NULL); dout, inp (B,T,C); weight (C); mean, rstd (B,T). */
template <typename F>
static inline cudaError_t ddp_layernorm_backward_gpu(ddp_kernels_ctx *ctx, typename ddp__same<F>::type *dinp,
                                              float *dweight, float *dbias,
                                              const F *dout, const F *inp, const F *weight,
                                              const float *mean, const float *rstd,
                                              int B, int T, int C, cudaStream_t stream)
{
    constexpr int n = ddp__pack<F>::n;
    const int rows = B * T, rpc = ddp__rows_per_chunk(rows);
    const bool vec = C % n == 0 && ddp__aligned16(dinp) && ddp__aligned16(dout) && ddp__aligned16(inp) &&
                     ddp__aligned16(weight);
    if (rows == 0 || C == 0) return cudaSuccess; /* (C = 0: empty gradients, as the forward's empty output) */
    const int chunks = (rows + rpc - 1) / rpc;
    void *part;
    DDP__TRY(ddp__scratch(ctx, (size_t)chunks * 2 * C * sizeof(float), stream, &part));
    if (dinp) {
        ddp__layernorm_backward_kernel<<<ddp__blocks(rows, 8), 256, 0, stream>>>(dinp, dout, inp, weight, mean, rstd,
                                                                                 rows, C, vec);
        DDP__TRY(cudaGetLastError());
    }
    if (!dweight) return cudaSuccess;
    dim3 grid(ddp__blocks(C, 128 * n), chunks);
    ddp__layernorm_param_partial_kernel<<<grid, 128, 0, stream>>>((float *)part, dout, inp, mean, rstd, rows, C, rpc, vec);
    DDP__TRY(cudaGetLastError());
    ddp__colsum_finish_kernel<<<ddp__blocks(C, 256), 256, 0, stream>>>(dweight, (float *)part, chunks, C, 2L * C);
    DDP__TRY(cudaGetLastError());
    ddp__colsum_finish_kernel<<<ddp__blocks(C, 256), 256, 0, stream>>>(dbias, (float *)part + C, chunks, C, 2L * C);
    return cudaGetLastError();
}

// >>matmul gpu
/* ---- matmul (cuBLASLt) -------------------------------------------------- */
static inline cudaDataType_t ddp__dtype(const float *) { return CUDA_R_32F; }
static inline cudaDataType_t ddp__dtype(const __nv_bfloat16 *) { return CUDA_R_16BF; }

/* The largest power of two (up to 256) dividing the address, for the heuristic. */
static inline uint32_t ddp__alignment(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p % a) != 0) a /= 2;
    return a;
}

/* The cached plan for key, made on first use: descriptors, layouts and the heuristic's
   algorithm (state 1), or state -1 when cuBLASLt has none for it. bias is the first
   caller's bias pointer (set again by every call). NULL when cuBLASLt itself failed. */
static inline ddp__lt_plan *ddp__lt_plan_for(ddp_kernels_ctx *ctx, const ddp__lt_key *key, const void *bias,
                                             cublasStatus_t *status)
{
    for (int i = 0; i < DDP_KERNELS_LT_PLANS; i++)
        if (ctx->plans[i].state && memcmp(&ctx->plans[i].key, key, sizeof *key) == 0) return &ctx->plans[i];
    ddp__lt_plan *pl = &ctx->plans[ctx->plans_next];
    ctx->plans_next = (ctx->plans_next + 1) % DDP_KERNELS_LT_PLANS;
    ddp__lt_plan_free(pl);
    pl->key = *key;
    const cublasOperation_t opa = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasLtEpilogue_t epi = key->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const cudaDataType_t tin = (cudaDataType_t)key->tin, tout = (cudaDataType_t)key->tout;
    const size_t ws = ctx->lt_workspace_bytes;
    const int m = key->m, n = key->n, k = key->k;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulDescCreate(&pl->op, (cublasComputeType_t)key->compute, CUDA_R_32F);
#define DDP__LT(call) if (s == CUBLAS_STATUS_SUCCESS) s = (call)
    DDP__LT(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    DDP__LT(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    DDP__LT(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias) DDP__LT(cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    DDP__LT(cublasLtMatrixLayoutCreate(&pl->la, tin, key->ta ? k : m, key->ta ? m : k, key->lda));
    DDP__LT(cublasLtMatrixLayoutCreate(&pl->lb, tin, key->tb ? n : k, key->tb ? k : n, key->ldb));
    DDP__LT(cublasLtMatrixLayoutCreate(&pl->ld, tout, m, n, m));
    DDP__LT(cublasLtMatmulPreferenceCreate(&pref));
    DDP__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    DDP__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->al_a,
                                                 sizeof key->al_a));
    DDP__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->al_b,
                                                 sizeof key->al_b));
    DDP__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->al_d,
                                                 sizeof key->al_d));
    DDP__LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->al_d,
                                                 sizeof key->al_d));
    DDP__LT(cublasLtMatmulAlgoGetHeuristic(ctx->lt, pl->op, pl->la, pl->lb, pl->ld, pl->ld, pref, 1, &heur, &found));
#undef DDP__LT
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    /* no algorithm is reported as a status by some versions and as found == 0 by others */
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found == 0)) {
        ddp__lt_plan_free(pl);
        pl->key = *key;
        pl->state = -1;
        return pl;
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        ddp__lt_plan_free(pl);
        *status = s;
        return NULL;
    }
    pl->algo = heur.algo;
    pl->state = 1;
    return pl;
}

/* The same product through cublasGemmEx, which takes any leading dimension and
   alignment (e.g. an unpadded vocabulary of 50257 in bf16) where cuBLASLt has no
   algorithm. Slower, still fp32 accumulation and deterministic. */
static inline cublasStatus_t ddp__blas_matmul(ddp_kernels_ctx *ctx, const ddp__lt_key *key, void *d, const void *a,
                                              const void *b, float beta, cudaStream_t stream)
{
    const float alpha = 1.0f;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (!ctx->blas) s = cublasCreate(&ctx->blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(ctx->blas, stream);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasGemmEx(ctx->blas, key->ta ? CUBLAS_OP_T : CUBLAS_OP_N, key->tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                         key->m, key->n, key->k, &alpha, a, (cudaDataType_t)key->tin, key->lda, b,
                         (cudaDataType_t)key->tin, key->ldb, &beta, d, (cudaDataType_t)key->tout, key->m,
                         (cublasComputeType_t)key->compute, CUBLAS_GEMM_DEFAULT);
    return s;
}

/* Column-major D (m,n) = op(A) op(B) + beta D [+ bias (m)], fp32 accumulation; A, B of
   type F, D and bias of type O (an fp32 weight gradient beside bf16 activations).
   A is stored (m,k) or, transposed, (k,m) with leading dimension lda; B likewise.
   The plan comes from the context's cache. CUBLAS_STATUS_NOT_SUPPORTED means only
   that the bias epilogue was declined: the caller runs it again without the bias. */
template <typename F, typename O>
static cublasStatus_t ddp__lt_matmul(ddp_kernels_ctx *ctx, O *d, const F *a, const F *b, const O *bias,
                                     int m, int n, int k, bool ta, bool tb, int lda, int ldb, float beta,
                                     cudaStream_t stream)
{
    const float alpha = 1.0f;
    ddp__lt_key key;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    memset(&key, 0, sizeof key); /* padding too: keys compare with memcmp */
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ta = ta, key.tb = tb, key.bias = bias != NULL;
    key.compute = sizeof(F) == 4 && ctx->allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    key.tin = ddp__dtype(a), key.tout = ddp__dtype(d);
    key.al_a = ddp__alignment(a), key.al_b = ddp__alignment(b), key.al_d = ddp__alignment(d);
    ddp__lt_plan *pl = ddp__lt_plan_for(ctx, &key, bias, &s);
    if (!pl) return s;
    if (pl->state < 0) return bias ? CUBLAS_STATUS_NOT_SUPPORTED : ddp__blas_matmul(ctx, &key, d, a, b, beta, stream);
    if (bias) s = cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(ctx->lt, pl->op, &alpha, a, pl->la, b, pl->lb, &beta, d, pl->ld, d, pl->ld, &pl->algo,
                           ctx->lt_workspace, ctx->lt_workspace_bytes, stream);
    return s;
}

static inline cudaError_t ddp__lt_error(ddp_kernels_ctx *ctx, cublasStatus_t s, const char *what, int m, int n, int k)
{
    if (s == CUBLAS_STATUS_SUCCESS) return cudaGetLastError();
    ctx->cublas_status = s;
    return ddp__fail(ctx, cudaErrorUnknown, "cuBLAS %s m=%d n=%d k=%d: %s", what, m, n, k, cublasLtGetStatusString(s));
}

/* out (rows, OC) += bias (OC), for shapes whose bias epilogue cuBLASLt declines */
template <typename F>
static __global__ void ddp__add_bias_kernel(F *out, const F *bias, long N, int OC)
{
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = ddp__to<F>(ddp__f(out[i]) + ddp__f(bias[i % OC]));
}

/* out (B,T,OC) = inp (B,T,C) @ weight^T + bias; weight (OC,C); bias (OC) or NULL. */
template <typename F>
static inline cudaError_t ddp_matmul_forward_gpu(ddp_kernels_ctx *ctx, F *out, const F *inp, const F *weight,
                                          const typename ddp__same<F>::type *bias,
                                          int B, int T, int C, int OC, cudaStream_t stream)
{
    /* row-major out (BT,OC) is column-major (OC,BT) = weight^T-as-stored (C,OC)^T x inp (C,BT) */
    const int BT = B * T;
    cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (BT == 0 || OC == 0) return cudaSuccess; /* no output (an empty grid is no launch) */
    if (C == 0) { /* a sum of nothing: out = bias, as torch.nn.Linear(0, OC) (cuBLASLt refuses a k of 0) */
        DDP__TRY(cudaMemsetAsync(out, 0, (size_t)BT * OC * sizeof(F), stream));
        if (bias) ddp__add_bias_kernel<<<ddp__blocks((size_t)BT * OC, 256), 256, 0, stream>>>(out, bias, (long)BT * OC, OC);
        return cudaGetLastError();
    }
    if (bias && ddp__aligned16(bias)) /* the epilogue wants an aligned bias */
        s = ddp__lt_matmul(ctx, out, weight, inp, bias, OC, BT, C, true, false, C, C, 0.0f, stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
        s = ddp__lt_matmul(ctx, out, weight, inp, (const F *)NULL, OC, BT, C, true, false, C, C, 0.0f, stream);
        if (s == CUBLAS_STATUS_SUCCESS && bias)
            ddp__add_bias_kernel<<<ddp__blocks((size_t)BT * OC, 256), 256, 0, stream>>>(out, bias, (long)BT * OC, OC);
    }
    return ddp__lt_error(ctx, s, "matmul forward", OC, BT, C);
}

/* dinp (B,T,C) += (or NULL: not needed); dweight (OC,C) +=, dbias (OC) += (or NULL), fp32
   whatever F is, so that small contributions are not lost to bf16 rounding across
   micro-batches; dout (B,T,OC); inp (B,T,C); weight (OC,C). */
template <typename F>
static inline cudaError_t ddp_matmul_backward_gpu(ddp_kernels_ctx *ctx, typename ddp__same<F>::type *dinp,
                                           float *dweight, float *dbias, const F *dout,
                                           const F *inp, const F *weight, int B, int T, int C, int OC,
                                           cudaStream_t stream)
{
    constexpr int n = ddp__pack<F>::n;
    const int BT = B * T;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (BT == 0 || OC == 0) return cudaSuccess; /* nothing to add (and no rows to chunk) */
    /* dinp^T (C,BT) += weight-as-stored (C,OC) x dout^T (OC,BT) (C = 0: both empty, dbias alone) */
    if (dinp && C) s = ddp__lt_matmul(ctx, dinp, weight, dout, (const F *)NULL, C, BT, OC, false, false, C, OC, 1.0f, stream);
    if (s != CUBLAS_STATUS_SUCCESS) return ddp__lt_error(ctx, s, "matmul backward dinp", C, BT, OC);
    /* dweight^T (C,OC) += inp^T (C,BT) x dout (BT,OC) */
    if (dweight && C)
        s = ddp__lt_matmul(ctx, dweight, inp, dout, (const float *)NULL, C, OC, BT, false, true, C, OC, 1.0f, stream);
    if (s != CUBLAS_STATUS_SUCCESS || !dbias) return ddp__lt_error(ctx, s, "matmul backward dweight", C, OC, BT);
    const int rpc = ddp__rows_per_chunk(BT), chunks = (BT + rpc - 1) / rpc;
    const bool vec = OC % n == 0 && ddp__aligned16(dout);
    void *part;
    DDP__TRY(ddp__scratch(ctx, (size_t)chunks * OC * sizeof(float), stream, &part));
    dim3 grid(ddp__blocks(OC, 128 * n), chunks);
    ddp__colsum_partial_kernel<<<grid, 128, 0, stream>>>((float *)part, dout, BT, OC, rpc, vec);
    DDP__TRY(cudaGetLastError());
    ddp__colsum_finish_kernel<<<ddp__blocks(OC, 256), 256, 0, stream>>>(dbias, (float *)part, chunks, OC, (long)OC);
    return cudaGetLastError();
}

// >>attention gpu
/* ---- attention ---------------------------------------------------------- */
/* A block owns DDP__ATT_BR rows: queries in the forward and the dq kernel, keys in
   the dk/dv kernel. Each row is shared by a group of G = HS/16 adjacent threads:
   thread p of a group holds dimensions p, p+G, ..., p+15G of its row's vectors in
   registers (16 per vector whatever the head size, so nothing spills; one thread
   per row held 2 x 128 floats at HS 128). A dot product is the sum of the group's
   16-term partial sums, combined by xor shuffles so that every thread of the group
   holds the same bits. The other side streams through shared memory DDP__ATT_BC rows
   at a time; all rows of a warp read the same tile row together (a broadcast) and the
   G threads of a group read consecutive words, so no access has a bank conflict.
   Loops over a tile are uniform across the block (the shuffles need every lane);
   causality is a mask. HS is the head size rounded up to 32, 64 or 128; padding
   dimensions hold zeros. The grid is (B*NH, row tiles), see ddp__att_grid. */
#define DDP__ATT_BR 64
#define DDP__ATT_BC 32
#define DDP__ATT_DPT 16 /* dimensions per thread */

/* sum of v over the G-thread group (G divides 32), the same bits in every thread */
template <int G>
static __device__ __forceinline__ float ddp__group_sum(float v)
{
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* tile (DDP__ATT_BC, HS) = rows r0.. of src (stride ld, hs columns), zeros past T and hs */
template <typename F, int HS>
static __device__ __forceinline__ void ddp__att_tile(float *tile, const F *src, long ld, int r0, int T, int hs)
{
    for (int e = threadIdx.x; e < DDP__ATT_BC * HS; e += blockDim.x) {
        const int r = r0 + e / HS, d = e % HS;
        tile[e] = r < T && d < hs ? ddp__f(src[(long)r * ld + d]) : 0.0f;
    }
}

template <typename F, int HS>
static __global__ void __launch_bounds__(DDP__ATT_BR * HS / DDP__ATT_DPT)
ddp__attention_forward_kernel(F *out, float *lse, const F *inp, int T, int C, int NH, float scale)
{
    constexpr int G = HS / DDP__ATT_DPT;
    __shared__ float Ks[DDP__ATT_BC * HS], Vs[DDP__ATT_BC * HS];
    const int hs = C / NH, C3 = 3 * C, p = threadIdx.x % G;
    const int qt = gridDim.y - 1 - blockIdx.y; /* longest rows first */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, t = qt * DDP__ATT_BR + threadIdx.x / G;
    const int last = min(T - 1, qt * DDP__ATT_BR + DDP__ATT_BR - 1);
    const F *base = inp + (long)b * T * C3 + h * hs;
    float q[DDP__ATT_DPT], acc[DDP__ATT_DPT], s[DDP__ATT_BC], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int i = 0; i < DDP__ATT_DPT; i++) {
        const int d = p + G * i;
        q[i] = t < T && d < hs ? ddp__f(base[(long)t * C3 + d]) * scale : 0.0f;
        acc[i] = 0.0f;
    }
    for (int k0 = 0; k0 <= last; k0 += DDP__ATT_BC) {
        __syncthreads(); /* the previous tile is no longer read */
        ddp__att_tile<F, HS>(Ks, base + C, C3, k0, T, hs);
        ddp__att_tile<F, HS>(Vs, base + 2 * C, C3, k0, T, hs);
        __syncthreads();
        const int jn = min(DDP__ATT_BC, last - k0 + 1);
        float mt = m;
#pragma unroll
        for (int j = 0; j < DDP__ATT_BC; j++)
            if (j < jn) {
                float x = 0.0f;
#pragma unroll
                for (int i = 0; i < DDP__ATT_DPT; i++) x += q[i] * Ks[j * HS + p + G * i];
                x = ddp__group_sum<G>(x);
                s[j] = k0 + j <= t ? x : -INFINITY; /* keys k0+j <= t are visible */
                mt = fmaxf(mt, s[j]);
            }
        /* key 0 is visible to every row, so mt is finite from the first tile on */
        const float r = expf(m - mt); /* rescale what was summed under the old max */
        l *= r;
#pragma unroll
        for (int i = 0; i < DDP__ATT_DPT; i++) acc[i] *= r;
#pragma unroll
        for (int j = 0; j < DDP__ATT_BC; j++)
            if (j < jn && k0 + j <= t) {
                const float pj = expf(s[j] - mt);
                l += pj;
#pragma unroll
                for (int i = 0; i < DDP__ATT_DPT; i++) acc[i] += pj * Vs[j * HS + p + G * i];
            }
        m = mt;
    }
    if (t >= T) return;
    F *o = out + ((long)b * T + t) * C + h * hs;
#pragma unroll
    for (int i = 0; i < DDP__ATT_DPT; i++)
        if (p + G * i < hs) o[p + G * i] = ddp__to<F>(acc[i] / l);
    if (p == 0) lse[(long)bh * T + t] = m + logf(l);
}

/* Dd (B,NH,T) = dout . out per head and row, the softmax backward's shared term */
template <typename F>
static __global__ void ddp__attention_dot_kernel(float *Dd, const F *dout, const F *out, int BT, int T, int C, int NH)
{
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x; /* (b, t, h) */
    if (i >= (long)BT * NH) return;
    const int hs = C / NH, h = (int)(i % NH);
    const long bt = i / NH, b = bt / T, t = bt % T;
    const F *a = dout + bt * C + h * hs, *o = out + bt * C + h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; d++) s += ddp__f(a[d]) * ddp__f(o[d]);
    Dd[(b * NH + h) * T + t] = s;
}

/* dk, dv for DDP__ATT_BR keys, streaming the queries that see them. */
template <typename F, int HS>
static __global__ void __launch_bounds__(DDP__ATT_BR * HS / DDP__ATT_DPT)
ddp__attention_backward_kv_kernel(F *dinp, const F *dout, const F *inp, const float *lse, const float *Dd,
                                  int T, int C, int NH, float scale)
{
    constexpr int G = HS / DDP__ATT_DPT;
    __shared__ float Qs[DDP__ATT_BC * HS], dOs[DDP__ATT_BC * HS], Ls[DDP__ATT_BC], Ds[DDP__ATT_BC];
    const int hs = C / NH, C3 = 3 * C, p = threadIdx.x % G;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, k_first = blockIdx.y * DDP__ATT_BR;
    const int j = k_first + threadIdx.x / G;
    const F *base = inp + (long)b * T * C3 + h * hs, *dbase = dout + (long)b * T * C + h * hs;
    float k[DDP__ATT_DPT], v[DDP__ATT_DPT], dk[DDP__ATT_DPT], dv[DDP__ATT_DPT];
#pragma unroll
    for (int i = 0; i < DDP__ATT_DPT; i++) {
        const int d = p + G * i;
        const bool ok = j < T && d < hs;
        k[i] = ok ? ddp__f(base[(long)j * C3 + C + d]) : 0.0f;
        v[i] = ok ? ddp__f(base[(long)j * C3 + 2 * C + d]) : 0.0f;
        dk[i] = dv[i] = 0.0f;
    }
    for (int q0 = k_first; q0 < T; q0 += DDP__ATT_BC) {
        __syncthreads(); /* the previous query tile is no longer read */
        ddp__att_tile<F, HS>(Qs, base, C3, q0, T, hs);
        ddp__att_tile<F, HS>(dOs, dbase, C, q0, T, hs);
        if (threadIdx.x < DDP__ATT_BC) {
            const int i = q0 + threadIdx.x;
            Ls[threadIdx.x] = i < T ? lse[(long)bh * T + i] : 0.0f;
            Ds[threadIdx.x] = i < T ? Dd[(long)bh * T + i] : 0.0f;
        }
        __syncthreads();
        const int in = min(DDP__ATT_BC, T - q0);
        for (int ii = 0; ii < in; ii++) {
            const float *qi = Qs + ii * HS + p, *gi = dOs + ii * HS + p;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < DDP__ATT_DPT; i++) {
                s += qi[G * i] * k[i];
                dp += gi[G * i] * v[i];
            }
            s = ddp__group_sum<G>(s);
            dp = ddp__group_sum<G>(dp);
            if (q0 + ii < j) continue; /* query q0+ii sees key j only from j on (never when j >= T) */
            const float pr = expf(s * scale - Ls[ii]), ds = pr * (dp - Ds[ii]) * scale;
#pragma unroll
            for (int i = 0; i < DDP__ATT_DPT; i++) {
                dv[i] += pr * gi[G * i];
                dk[i] += ds * qi[G * i];
            }
        }
    }
    if (j >= T) return;
    F *g = dinp + ((long)b * T + j) * C3 + h * hs;
#pragma unroll
    for (int i = 0; i < DDP__ATT_DPT; i++) {
        const int d = p + G * i;
        if (d < hs) {
            g[C + d] = ddp__to<F>(ddp__f(g[C + d]) + dk[i]);
            g[2 * C + d] = ddp__to<F>(ddp__f(g[2 * C + d]) + dv[i]);
        }
    }
}

/* dq for DDP__ATT_BR queries, streaming the keys they see. */
template <typename F, int HS>
static __global__ void __launch_bounds__(DDP__ATT_BR * HS / DDP__ATT_DPT)
ddp__attention_backward_q_kernel(F *dinp, const F *dout, const F *inp, const float *lse, const float *Dd,
                                 int T, int C, int NH, float scale)
{
    constexpr int G = HS / DDP__ATT_DPT;
    __shared__ float Ks[DDP__ATT_BC * HS], Vs[DDP__ATT_BC * HS];
    const int hs = C / NH, C3 = 3 * C, p = threadIdx.x % G;
    const int qt = gridDim.y - 1 - blockIdx.y; /* longest rows first */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, q_first = qt * DDP__ATT_BR, t = q_first + threadIdx.x / G;
    const int last = min(T - 1, q_first + DDP__ATT_BR - 1);
    const F *base = inp + (long)b * T * C3 + h * hs, *dbase = dout + (long)b * T * C + h * hs;
    const float L = t < T ? lse[(long)bh * T + t] : 0.0f, D = t < T ? Dd[(long)bh * T + t] : 0.0f;
    float q[DDP__ATT_DPT], g[DDP__ATT_DPT], dq[DDP__ATT_DPT];
#pragma unroll
    for (int i = 0; i < DDP__ATT_DPT; i++) {
        const int d = p + G * i;
        const bool ok = t < T && d < hs;
        q[i] = ok ? ddp__f(base[(long)t * C3 + d]) : 0.0f;
        g[i] = ok ? ddp__f(dbase[(long)t * C + d]) : 0.0f;
        dq[i] = 0.0f;
    }
    for (int k0 = 0; k0 <= last; k0 += DDP__ATT_BC) {
        __syncthreads();
        ddp__att_tile<F, HS>(Ks, base + C, C3, k0, T, hs);
        ddp__att_tile<F, HS>(Vs, base + 2 * C, C3, k0, T, hs);
        __syncthreads();
        const int jn = min(DDP__ATT_BC, last - k0 + 1);
        for (int jj = 0; jj < jn; jj++) {
            const float *kj = Ks + jj * HS + p, *vj = Vs + jj * HS + p;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < DDP__ATT_DPT; i++) {
                s += q[i] * kj[G * i];
                dp += g[i] * vj[G * i];
            }
            s = ddp__group_sum<G>(s);
            dp = ddp__group_sum<G>(dp);
            if (k0 + jj > t) continue; /* key k0+jj is not visible to query t */
            const float ds = expf(s * scale - L) * (dp - D) * scale;
#pragma unroll
            for (int i = 0; i < DDP__ATT_DPT; i++) dq[i] += ds * kj[G * i];
        }
    }
    if (t >= T) return;
    F *o = dinp + ((long)b * T + t) * C3 + h * hs;
#pragma unroll
    for (int i = 0; i < DDP__ATT_DPT; i++)
        if (p + G * i < hs) o[p + G * i] = ddp__to<F>(ddp__f(o[p + G * i]) + dq[i]);
}

/* C % NH == 0, a head size from 1 to 128 and a grid that CUDA can launch, or a reason in ctx */
static inline cudaError_t ddp__att_check(ddp_kernels_ctx *ctx, int B, int T, int C, int NH, dim3 *grid)
{
    unsigned gx = 0, gy = 0;
    if (NH <= 0 || C <= 0 || C % NH != 0 || C / NH > 128)
        return ddp__fail(ctx, cudaErrorInvalidValue, "attention: C=%d, NH=%d: needs C %% NH == 0 and 1 <= C/NH <= 128",
                         C, NH);
    if (!ddp__att_grid(B, NH, T, DDP__ATT_BR, &gx, &gy))
        return ddp__fail(ctx, cudaErrorInvalidValue, "attention: B*NH=%ld x %d row tiles exceeds CUDA's grid",
                         (long)B * NH, (T + DDP__ATT_BR - 1) / DDP__ATT_BR);
    *grid = dim3(gx, gy);
    return cudaSuccess;
}

template <typename F, int HS>
static inline cudaError_t ddp__attention_forward(F *out, float *lse, const F *inp, int T, int C, int NH, dim3 grid,
                                          cudaStream_t stream)
{
    /* 2 x 16 KB static shared memory at HS 128: under the 48 KB a launch gets without opting in */
    ddp__attention_forward_kernel<F, HS><<<grid, DDP__ATT_BR * HS / DDP__ATT_DPT, 0, stream>>>(
        out, lse, inp, T, C, NH, 1.0f / sqrtf((float)(C / NH)));
    return cudaGetLastError();
}

template <typename F, int HS>
static inline cudaError_t ddp__attention_backward(F *dinp, const F *dout, const F *inp, const float *lse,
                                           const float *Dd, int T, int C, int NH, dim3 grid, cudaStream_t stream)
{
    const float scale = 1.0f / sqrtf((float)(C / NH));
    const int threads = DDP__ATT_BR * HS / DDP__ATT_DPT;
    ddp__attention_backward_kv_kernel<F, HS><<<grid, threads, 0, stream>>>(dinp, dout, inp, lse, Dd, T, C, NH, scale);
    DDP__TRY(cudaGetLastError());
    ddp__attention_backward_q_kernel<F, HS><<<grid, threads, 0, stream>>>(dinp, dout, inp, lse, Dd, T, C, NH, scale);
    return cudaGetLastError();
}

/* Attention as products on the tensor cores (the default where a group of heads' T x T
   scores fit DDP_KERNELS_ATT_SCRATCH): heads go in groups; each group's q, k, v (and
   dout) are gathered into (heads, T, hs) panels, and strided-batched cuBLAS products
   make the fp32 scores s = q k^T and, after a softmax kernel writes p (type F, zeros
   above the diagonal), out = p v. The backward recomputes s, takes dp = dout v^T, turns
   both into p and ds = p (dp - D) / sqrt(hs) in one pass, and takes dv = p^T dout,
   dq = ds k, dk = ds^T q in fp32, added to dinp in one rounding. The masked half of
   each product is computed and thrown away; on an H200 at GPT-2 124M, B=8, T=1024
   (bench_kernels) the forward took 624 us against the streaming kernels' 1323, the
   backward 1367 against 3166: the fp32 score passes through memory now dominate. */
#ifndef DDP_KERNELS_ATT_SCRATCH
#define DDP_KERNELS_ATT_SCRATCH (512u << 20) /* bytes of scores and panels per group of heads */
#endif
#define DDP__ATT_GROUP_MAX 32768 /* heads per product: under any batch limit of cuBLAS */

/* dst (heads g of this group, T, hs) = the (T, hs) slice of head h0+g in src (B,T,ld) */
template <typename F>
static __global__ void ddp__att_gather_kernel(F *dst, const F *src, long ld, long h0, long heads, int T, int NH, int hs)
{
    const long n = heads * T * hs;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long d = i % hs, t = i / hs % T, bh = h0 + i / hs / T;
        dst[i] = src[(bh / NH * T + t) * ld + bh % NH * hs + d];
    }
}

/* the reverse for fp32 panels: dst (B,T,ld) slices (+)= src, rounded to F once */
template <typename F>
static __global__ void ddp__att_scatter_kernel(F *dst, const float *src, long ld, long h0, long heads, int T, int NH,
                                               int hs, int add)
{
    const long n = heads * T * hs;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long d = i % hs, t = i / hs % T, bh = h0 + i / hs / T;
        F *o = dst + (bh / NH * T + t) * ld + bh % NH * hs + d;
        *o = ddp__to<F>(add ? ddp__f(*o) + src[i] : src[i]);
    }
}

/* q, k and v of heads h0 .. h0+heads-1 from inp (B,T,3C) into their (heads,T,hs) panels */
template <typename F>
static inline cudaError_t ddp__att_gather_qkv(F *q, F *k, F *v, const F *inp, int C, long h0, long heads, int T, int NH,
                                              int hs, cudaStream_t stream)
{
    const unsigned blocks = ddp__blocks((size_t)(heads * T * hs), 256); /* grid-stride kernels */
    ddp__att_gather_kernel<<<blocks, 256, 0, stream>>>(q, inp, 3L * C, h0, heads, T, NH, hs);
    ddp__att_gather_kernel<<<blocks, 256, 0, stream>>>(k, inp + C, 3L * C, h0, heads, T, NH, hs);
    ddp__att_gather_kernel<<<blocks, 256, 0, stream>>>(v, inp + 2 * C, 3L * C, h0, heads, T, NH, hs);
    return cudaGetLastError();
}

/* One warp per score row (head g, query t): p = softmax of the visible scores times
   scale, zeros for keys after t; lse of head h0+g saved as the streaming kernel does. */
template <typename F>
static __global__ void ddp__att_softmax_kernel(F *P, float *lse, const float *S, long h0, long heads, int T, float scale)
{
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= heads * T) return;
    const int t = (int)(row % T);
    const float *s = S + row * T;
    F *p = P + row * T;
    float m = -INFINITY, l = 0.0f;
    /* scores times scale rounded (__fmul_rn), here and below: with the product fused into
       expf's argument (fma(s, scale, -m)) p was exp of its rounding error, 1.008 for a lone
       key at scores of 1e5 (CPU: exact), and the gradients 1e2-1e3 times off */
    for (int j = lane; j <= t; j += 32) { /* online max and sum, per lane */
        const float x = __fmul_rn(s[j], scale), mn = fmaxf(m, x);
        l = l * expf(m - mn) + expf(x - mn);
        m = mn;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) { /* combine the lanes: the same bits in every lane */
        const float mo = __shfl_xor_sync(0xffffffffu, m, o), lo = __shfl_xor_sync(0xffffffffu, l, o);
        const float mn = fmaxf(m, mo);
        l = (m == -INFINITY ? 0.0f : l * expf(m - mn)) + (mo == -INFINITY ? 0.0f : lo * expf(mo - mn));
        m = mn;
    }
    const float inv = 1.0f / l;
    for (int j = lane; j < T; j += 32) p[j] = ddp__to<F>(j <= t ? expf(__fmul_rn(s[j], scale) - m) * inv : 0.0f);
    if (lane == 0) lse[h0 * T + row] = m + logf(l);
}

/* p = exp(s scale - lse) and ds = p (dp - D) scale for keys j <= t, zeros after; s scale
   rounded as the forward's, and its exponent at most 0 as the CPU twin's */
template <typename F>
static __global__ void ddp__att_softmax_backward_kernel(F *P, F *dS, const float *S, const float *dP, const float *lse,
                                                        const float *Dd, long h0, long heads, int T, float scale)
{
    const long n = heads * T * T;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long row = i / T;
        const int j = (int)(i % T), t = (int)(row % T);
        float p = 0.0f, ds = 0.0f;
        if (j <= t) {
            p = expf(fminf(__fmul_rn(S[i], scale) - lse[h0 * T + row], 0.0f));
            ds = p * (dP[i] - Dd[h0 * T + row]) * scale;
        }
        P[i] = ddp__to<F>(p);
        dS[i] = ddp__to<F>(ds);
    }
}

/* Column-major c (m,n) of type tc, per batch entry = op(a) op(b), both of type F, fp32
   accumulation (TF32 only if ctx->allow_tf32). */
template <typename F>
static inline cudaError_t ddp__att_product(ddp_kernels_ctx *ctx, bool ta, bool tb, int m, int n, int k, const F *a,
                                           int lda, long long sa, const F *b, int ldb, long long sb, void *c,
                                           cudaDataType_t tc, long long sc, long batch, cudaStream_t stream)
{
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (!ctx->blas) s = cublasCreate(&ctx->blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(ctx->blas, stream);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasGemmStridedBatchedEx(ctx->blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n,
                                       k, &alpha, a, ddp__dtype(a), lda, sa, b, ddp__dtype(b), ldb, sb, &beta, c, tc, m,
                                       sc, (int)batch,
                                       sizeof(F) == 4 && ctx->allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT);
    return ddp__lt_error(ctx, s, "attention product", m, n, k);
}

/* Scratch bytes per head of a group: the forward's scores (fp32), p, the q, k, v panels
   and out (fp32); the backward's scores and dp (fp32), p, ds, the q, k, v, dout panels
   and dq, dk, dv (fp32). The pieces are carved in that order. */
template <typename F> static inline size_t ddp__att_head_bytes(int T, int hs, bool backward)
{
    const size_t TT = (size_t)T * T, Th = (size_t)T * hs;
    return backward ? TT * (8 + 2 * sizeof(F)) + Th * (4 * sizeof(F) + 12) : TT * (4 + sizeof(F)) + Th * (3 * sizeof(F) + 4);
}

/* Heads per group for the products (bytes_per_head of scratch each), 0 when not even
   one head's fits DDP_KERNELS_ATT_SCRATCH (or the caller asked for the streaming kernels). */
static inline long ddp__att_group(const ddp_kernels_ctx *ctx, long heads, size_t bytes_per_head)
{
    if (ctx->attention_streaming || bytes_per_head > DDP_KERNELS_ATT_SCRATCH) return 0;
    long g = (long)(DDP_KERNELS_ATT_SCRATCH / bytes_per_head);
    if (g > heads) g = heads;
    return g < DDP__ATT_GROUP_MAX ? g : DDP__ATT_GROUP_MAX;
}

/* The 256-byte aligned pieces of one scratch buffer, in order: returns the next free byte. */
static inline char *ddp__att_carve(char *at, void **piece, size_t bytes)
{
    *piece = at;
    return at + (bytes + 255) / 256 * 256;
}

template <typename F>
static inline cudaError_t ddp__attention_forward_products(ddp_kernels_ctx *ctx, F *out, float *lse, const F *inp,
                                                          int B, int T, int C, int NH, long group, cudaStream_t stream)
{
    const int hs = C / NH;
    const long heads = (long)B * NH, TT = (long)T * T, Th = (long)T * hs;
    const float scale = 1.0f / sqrtf((float)hs);
    void *base, *S, *P, *q, *k, *v, *o;
    DDP__TRY(ddp__scratch(ctx, (size_t)group * ddp__att_head_bytes<F>(T, hs, false) + 6 * 256, stream, &base));
    char *at = (char *)base;
    at = ddp__att_carve(at, &S, (size_t)group * TT * 4);
    at = ddp__att_carve(at, &P, (size_t)group * TT * sizeof(F));
    at = ddp__att_carve(at, &q, (size_t)group * Th * sizeof(F));
    at = ddp__att_carve(at, &k, (size_t)group * Th * sizeof(F));
    at = ddp__att_carve(at, &v, (size_t)group * Th * sizeof(F));
    ddp__att_carve(at, &o, (size_t)group * Th * 4);
    for (long h0 = 0; h0 < heads; h0 += group) {
        const long g = heads - h0 < group ? heads - h0 : group;
        const unsigned blocks = ddp__blocks((size_t)(g * Th), 256); /* grid-stride kernels */
        DDP__TRY(ddp__att_gather_qkv((F *)q, (F *)k, (F *)v, inp, C, h0, g, T, NH, hs, stream));
        /* s (T keys x T queries, column-major) = k^T q per head */
        DDP__TRY(ddp__att_product<F>(ctx, true, false, T, T, hs, (const F *)k, hs, Th, (const F *)q, hs, Th, S,
                                     CUDA_R_32F, TT, g, stream));
        ddp__att_softmax_kernel<<<ddp__blocks((size_t)(g * T), 8), 256, 0, stream>>>((F *)P, lse, (const float *)S, h0,
                                                                                     g, T, scale);
        DDP__TRY(cudaGetLastError());
        /* out^T (hs x T queries) = v^T p^T */
        DDP__TRY(ddp__att_product<F>(ctx, false, false, hs, T, T, (const F *)v, hs, Th, (const F *)P, T, TT, o,
                                     CUDA_R_32F, Th, g, stream));
        ddp__att_scatter_kernel<<<blocks, 256, 0, stream>>>(out, (const float *)o, C, h0, g, T, NH, hs, 0);
        DDP__TRY(cudaGetLastError());
    }
    return cudaSuccess;
}

template <typename F>
static inline cudaError_t ddp__attention_backward_products(ddp_kernels_ctx *ctx, F *dinp, const F *dout, const F *inp,
                                                           const F *out, const float *lse, int B, int T, int C, int NH,
                                                           long group, cudaStream_t stream)
{
    const int hs = C / NH, C3 = 3 * C;
    const long heads = (long)B * NH, TT = (long)T * T, Th = (long)T * hs;
    const float scale = 1.0f / sqrtf((float)hs);
    void *base, *Dd, *S, *dP, *P, *dS, *q, *k, *v, *g_o, *dq, *dk, *dv;
    DDP__TRY(ddp__scratch(ctx, (size_t)heads * T * 4 + (size_t)group * ddp__att_head_bytes<F>(T, hs, true) + 13 * 256,
                          stream, &base));
    char *at = (char *)base;
    at = ddp__att_carve(at, &Dd, (size_t)heads * T * 4);
    at = ddp__att_carve(at, &S, (size_t)group * TT * 4);
    at = ddp__att_carve(at, &dP, (size_t)group * TT * 4);
    at = ddp__att_carve(at, &P, (size_t)group * TT * sizeof(F));
    at = ddp__att_carve(at, &dS, (size_t)group * TT * sizeof(F));
    at = ddp__att_carve(at, &q, (size_t)group * Th * sizeof(F));
    at = ddp__att_carve(at, &k, (size_t)group * Th * sizeof(F));
    at = ddp__att_carve(at, &v, (size_t)group * Th * sizeof(F));
    at = ddp__att_carve(at, &g_o, (size_t)group * Th * sizeof(F));
    at = ddp__att_carve(at, &dq, (size_t)group * Th * 4);
    at = ddp__att_carve(at, &dk, (size_t)group * Th * 4);
    ddp__att_carve(at, &dv, (size_t)group * Th * 4);
    ddp__attention_dot_kernel<<<ddp__blocks((size_t)B * T * NH, 256), 256, 0, stream>>>((float *)Dd, dout, out, B * T, T,
                                                                                        C, NH);
    DDP__TRY(cudaGetLastError());
    for (long h0 = 0; h0 < heads; h0 += group) {
        const long g = heads - h0 < group ? heads - h0 : group;
        const unsigned blocks = ddp__blocks((size_t)(g * Th), 256); /* grid-stride kernels */
        DDP__TRY(ddp__att_gather_qkv((F *)q, (F *)k, (F *)v, inp, C, h0, g, T, NH, hs, stream));
        ddp__att_gather_kernel<<<blocks, 256, 0, stream>>>((F *)g_o, dout, C, h0, g, T, NH, hs);
        DDP__TRY(cudaGetLastError());
        /* s = k^T q and dp = v^T dout (T keys x T queries, column-major) */
        DDP__TRY(ddp__att_product<F>(ctx, true, false, T, T, hs, (const F *)k, hs, Th, (const F *)q, hs, Th, S,
                                     CUDA_R_32F, TT, g, stream));
        DDP__TRY(ddp__att_product<F>(ctx, true, false, T, T, hs, (const F *)v, hs, Th, (const F *)g_o, hs, Th, dP,
                                     CUDA_R_32F, TT, g, stream));
        ddp__att_softmax_backward_kernel<<<ddp__blocks((size_t)(g * TT), 256), 256, 0, stream>>>((F *)P, (F *)dS, (const float *)S,
                                                                     (const float *)dP, lse, (const float *)Dd, h0, g,
                                                                     T, scale);
        DDP__TRY(cudaGetLastError());
        /* dv^T (hs x T keys) = dout^T p; dq^T (hs x T queries) = k^T ds^T; dk^T = q^T ds */
        DDP__TRY(ddp__att_product<F>(ctx, false, true, hs, T, T, (const F *)g_o, hs, Th, (const F *)P, T, TT, dv,
                                     CUDA_R_32F, Th, g, stream));
        DDP__TRY(ddp__att_product<F>(ctx, false, false, hs, T, T, (const F *)k, hs, Th, (const F *)dS, T, TT, dq,
                                     CUDA_R_32F, Th, g, stream));
        DDP__TRY(ddp__att_product<F>(ctx, false, true, hs, T, T, (const F *)q, hs, Th, (const F *)dS, T, TT, dk,
                                     CUDA_R_32F, Th, g, stream));
        ddp__att_scatter_kernel<<<blocks, 256, 0, stream>>>(dinp, (const float *)dq, C3, h0, g, T, NH, hs, 1);
        ddp__att_scatter_kernel<<<blocks, 256, 0, stream>>>(dinp + C, (const float *)dk, C3, h0, g, T, NH, hs, 1);
        ddp__att_scatter_kernel<<<blocks, 256, 0, stream>>>(dinp + 2 * C, (const float *)dv, C3, h0, g, T, NH, hs, 1);
        DDP__TRY(cudaGetLastError());
    }
    return cudaSuccess;
}

/* out (B,T,C); lse (B,NH,T) fp32; inp (B,T,3C) = [q | k | v]. Needs C % NH == 0, 1 <= C/NH <= 128. */
template <typename F>
static inline cudaError_t ddp_attention_forward_gpu(ddp_kernels_ctx *ctx, F *out, float *lse, const F *inp,
                                             int B, int T, int C, int NH, cudaStream_t stream)
{
    dim3 grid;
    DDP__TRY(ddp__att_check(ctx, B, T, C, NH, &grid));
    const int hs = C / NH;
    if (B * T == 0) return cudaSuccess;
    const long group = ddp__att_group(ctx, (long)B * NH, ddp__att_head_bytes<F>(T, hs, false));
    if (group) return ddp__attention_forward_products(ctx, out, lse, inp, B, T, C, NH, group, stream);
    if (hs <= 32) return ddp__attention_forward<F, 32>(out, lse, inp, T, C, NH, grid, stream);
    if (hs <= 64) return ddp__attention_forward<F, 64>(out, lse, inp, T, C, NH, grid, stream);
    return ddp__attention_forward<F, 128>(out, lse, inp, T, C, NH, grid, stream);
}

/* dinp (B,T,3C) += (NULL: nothing to do); dout, out (B,T,C); inp (B,T,3C); lse (B,NH,T)
   from the forward. */
template <typename F>
static inline cudaError_t ddp_attention_backward_gpu(ddp_kernels_ctx *ctx, typename ddp__same<F>::type *dinp,
                                              const F *dout, const F *inp, const F *out, const float *lse,
                                              int B, int T, int C, int NH, cudaStream_t stream)
{
    dim3 grid;
    DDP__TRY(ddp__att_check(ctx, B, T, C, NH, &grid));
    const int hs = C / NH;
    if (B * T == 0 || !dinp) return cudaSuccess;
    const long group = ddp__att_group(ctx, (long)B * NH, ddp__att_head_bytes<F>(T, hs, true));
    if (group) return ddp__attention_backward_products(ctx, dinp, dout, inp, out, lse, B, T, C, NH, group, stream);
    void *Dd;
    DDP__TRY(ddp__scratch(ctx, (size_t)B * NH * T * sizeof(float), stream, &Dd));
    ddp__attention_dot_kernel<<<ddp__blocks((size_t)B * T * NH, 256), 256, 0, stream>>>((float *)Dd, dout, out, B * T, T, C, NH);
    DDP__TRY(cudaGetLastError());
    if (hs <= 32) return ddp__attention_backward<F, 32>(dinp, dout, inp, lse, (float *)Dd, T, C, NH, grid, stream);
    if (hs <= 64) return ddp__attention_backward<F, 64>(dinp, dout, inp, lse, (float *)Dd, T, C, NH, grid, stream);
    return ddp__attention_backward<F, 128>(dinp, dout, inp, lse, (float *)Dd, T, C, NH, grid, stream);
}

// >>gelu gpu
/* ---- gelu --------------------------------------------------------------- */
/* The CPU twin's form (>>helpers cpu): x s with s = 1 / (1 + exp(-2u)), 1 - s as e s, and
   saturated beyond |x| = 9. 0.5 x (1 + tanh(u)) cancels as tanh nears -1 (30% off at
   x = -5, 0 from -6 on), and its x^3 overflows into inf * 0 = NaN past |x| ~ 1.8e19. */
static __device__ __forceinline__ float ddp__gelu_e(float x)
{
    return expf(x * fmaf(-2.0f * DDP__GELU_S * DDP__GELU_C, x * x, -2.0f * DDP__GELU_S));
}

static __device__ __forceinline__ float ddp__gelu(float x)
{
    return x < -9.0f ? 0.0f : x > 9.0f ? x : x / (1.0f + ddp__gelu_e(x));
}

static __device__ __forceinline__ float ddp__gelu_grad(float x)
{
    const float e = ddp__gelu_e(x), s = 1.0f / (1.0f + e);
    const float du = fmaf(DDP__GELU_S * 3.0f * DDP__GELU_C, x * x, DDP__GELU_S);
    return x < -9.0f ? 0.0f : x > 9.0f ? 1.0f : s + 2.0f * x * du * s * (e * s);
}

template <typename F>
static __global__ void ddp__gelu_forward_kernel(F *out, const F *inp, long N, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * n;
    if (i >= N) return;
    float x[n];
    ddp__load(x, inp, i, N, vec);
#pragma unroll
    for (int k = 0; k < n; k++) x[k] = ddp__gelu(x[k]);
    ddp__store(out, x, i, N, vec);
}

template <typename F>
static __global__ void ddp__gelu_backward_kernel(F *dinp, const F *inp, const F *dout, long N, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * n;
    if (i >= N) return;
    float x[n], d[n], g[n];
    ddp__load(x, inp, i, N, vec);
    ddp__load(d, dout, i, N, vec);
    ddp__load(g, dinp, i, N, vec);
#pragma unroll
    for (int k = 0; k < n; k++) g[k] += ddp__gelu_grad(x[k]) * d[k];
    ddp__store(dinp, g, i, N, vec);
}

/* out (N) = gelu(inp (N)) */
template <typename F>
static inline cudaError_t ddp_gelu_forward_gpu(ddp_kernels_ctx *ctx, F *out, const F *inp, size_t N, cudaStream_t stream)
{
    (void)ctx;
    constexpr int n = ddp__pack<F>::n;
    if (N == 0) return cudaSuccess;
    ddp__gelu_forward_kernel<<<ddp__blocks(N, 256 * n), 256, 0, stream>>>(out, inp, (long)N,
                                                                          ddp__aligned16(out) && ddp__aligned16(inp));
    return cudaGetLastError();
}

/* dinp (N) += gelu'(inp) * dout (NULL: nothing to do); inp, dout (N). */
template <typename F>
static inline cudaError_t ddp_gelu_backward_gpu(ddp_kernels_ctx *ctx, typename ddp__same<F>::type *dinp, const F *inp,
                                         const F *dout, size_t N, cudaStream_t stream)
{
    (void)ctx;
    constexpr int n = ddp__pack<F>::n;
    if (N == 0 || !dinp) return cudaSuccess;
    const bool vec = ddp__aligned16(dinp) && ddp__aligned16(inp) && ddp__aligned16(dout);
    ddp__gelu_backward_kernel<<<ddp__blocks(N, 256 * n), 256, 0, stream>>>(dinp, inp, dout, (long)N, vec);
    return cudaGetLastError();
}

// >>residual gpu
/* ---- residual ----------------------------------------------------------- */
template <typename F>
static __global__ void ddp__residual_forward_kernel(F *out, const F *inp1, const F *inp2, long N, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * n;
    if (i >= N) return;
    float a[n], b[n];
    ddp__load(a, inp1, i, N, vec);
    ddp__load(b, inp2, i, N, vec);
#pragma unroll
    for (int k = 0; k < n; k++) a[k] += b[k];
    ddp__store(out, a, i, N, vec);
}

template <typename F>
static __global__ void ddp__residual_backward_kernel(F *dinp1, F *dinp2, const F *dout, long N, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * n;
    if (i >= N) return;
    float d[n], g[n];
    ddp__load(d, dout, i, N, vec);
    if (dinp1) {
        ddp__load(g, dinp1, i, N, vec);
#pragma unroll
        for (int k = 0; k < n; k++) g[k] += d[k];
        ddp__store(dinp1, g, i, N, vec);
    }
    if (dinp2) {
        ddp__load(g, dinp2, i, N, vec);
#pragma unroll
        for (int k = 0; k < n; k++) g[k] += d[k];
        ddp__store(dinp2, g, i, N, vec);
    }
}

/* out (N) = inp1 (N) + inp2 (N) */
template <typename F>
static inline cudaError_t ddp_residual_forward_gpu(ddp_kernels_ctx *ctx, F *out, const F *inp1, const F *inp2, size_t N,
                                            cudaStream_t stream)
{
    (void)ctx;
    constexpr int n = ddp__pack<F>::n;
    if (N == 0) return cudaSuccess;
    const bool vec = ddp__aligned16(out) && ddp__aligned16(inp1) && ddp__aligned16(inp2);
    ddp__residual_forward_kernel<<<ddp__blocks(N, 256 * n), 256, 0, stream>>>(out, inp1, inp2, (long)N, vec);
    return cudaGetLastError();
}

/* dinp1 (N) +=, dinp2 (N) += dout (N); either may be NULL (not needed) */
template <typename F>
static inline cudaError_t ddp_residual_backward_gpu(ddp_kernels_ctx *ctx, typename ddp__same<F>::type *dinp1,
                                             typename ddp__same<F>::type *dinp2, const F *dout, size_t N,
                                             cudaStream_t stream)
{
    (void)ctx;
    constexpr int n = ddp__pack<F>::n;
    if (N == 0 || (!dinp1 && !dinp2)) return cudaSuccess;
    const bool vec = ddp__aligned16(dinp1) && ddp__aligned16(dinp2) && ddp__aligned16(dout);
    ddp__residual_backward_kernel<<<ddp__blocks(N, 256 * n), 256, 0, stream>>>(dinp1, dinp2, dout, (long)N, vec);
    return cudaGetLastError();
}

// >>crossentropy gpu
/* ---- fused softmax + cross-entropy -------------------------------------- */
static __global__ void __launch_bounds__(1024) ddp__count_valid_kernel(int *n_valid, const int *targets, int BT, int ignore_index)
{
    int c = 0;
    for (int i = threadIdx.x; i < BT; i += blockDim.x) c += targets[i] != ignore_index;
    c = ddp__block_reduce(c, ddp__sum_op());
    if (threadIdx.x == 0) *n_valid = c;
}

/* One block per row: max, then sum of exponentials, then loss and dlogits. */
template <typename F>
static __global__ void __launch_bounds__(512) ddp__crossentropy_kernel(float *losses, F *dlogits, const F *logits, const int *targets,
                                                const int *n_valid, int V, int ignore_index, float dloss, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const long row = blockIdx.x;
    const int tgt = targets[row];
    const F *x = logits + row * V;
    F *dx = dlogits ? dlogits + row * V : NULL;
    float v[n];
    if (tgt == ignore_index) {
        if (threadIdx.x == 0) losses[row] = 0.0f;
        for (int k = 0; k < n; k++) v[k] = 0.0f;
        if (dx)
            for (int c = threadIdx.x * n; c < V; c += blockDim.x * n) ddp__store(dx, v, c, V, vec);
        return;
    }
    const float x_tgt = ddp__f(x[tgt]); /* read before dlogits may overwrite it in place */
    float m = -INFINITY, s = 0.0f;
    for (int c = threadIdx.x * n; c < V; c += blockDim.x * n) {
        ddp__load(v, x, c, V, vec);
#pragma unroll
        for (int k = 0; k < n; k++)
            if (c + k < V) m = fmaxf(m, v[k]);
    }
    m = ddp__block_reduce(m, ddp__max_op());
    for (int c = threadIdx.x * n; c < V; c += blockDim.x * n) {
        ddp__load(v, x, c, V, vec);
#pragma unroll
        for (int k = 0; k < n; k++)
            if (c + k < V) s += expf(v[k] - m);
    }
    s = ddp__block_reduce(s, ddp__sum_op());
    if (threadIdx.x == 0) losses[row] = (m - x_tgt) + logf(s); /* as on the CPU: log(s) not lost in m's rounding */
    if (!dx) return;
    const float g = dloss / *n_valid, inv_s = 1.0f / s; /* n_valid >= 1: this row counts */
    for (int c = threadIdx.x * n; c < V; c += blockDim.x * n) {
        ddp__load(v, x, c, V, vec);
#pragma unroll
        for (int k = 0; k < n; k++) v[k] = g * (expf(v[k] - m) * inv_s - (c + k == tgt ? 1.0f : 0.0f));
        ddp__store(dx, v, c, V, vec);
    }
}

static __global__ void __launch_bounds__(1024) ddp__mean_loss_kernel(float *loss, const float *losses, const int *n_valid, int BT)
{
    float s = 0.0f;
    for (int i = threadIdx.x; i < BT; i += blockDim.x) s += losses[i];
    s = ddp__block_reduce(s, ddp__sum_op());
    if (threadIdx.x == 0) *loss = *n_valid ? s / *n_valid : 0.0f;
}

/* loss (1, device) = mean of losses over targets != ignore_index; losses (B,T);
   targets (B,T) in [0,V) or ignore_index;
   dlogits (B,T,V) overwritten (may alias logits) or NULL; logits (B,T,V). */
template <typename F>
static inline cudaError_t ddp_crossentropy_forward_backward_gpu(ddp_kernels_ctx *ctx, float *loss, float *losses,
                                                         typename ddp__same<F>::type *dlogits, const F *logits,
                                                         const int *targets, int B, int T, int V,
                                                         int ignore_index, float dloss, cudaStream_t stream)
{
    const int BT = B * T;
    const bool vec = V % ddp__pack<F>::n == 0 && ddp__aligned16(logits) && (!dlogits || ddp__aligned16(dlogits));
    void *n_valid;
    DDP__TRY(ddp__scratch(ctx, sizeof(int), stream, &n_valid));
    ddp__count_valid_kernel<<<1, 1024, 0, stream>>>((int *)n_valid, targets, BT, ignore_index);
    DDP__TRY(cudaGetLastError());
    if (BT > 0) {
        ddp__crossentropy_kernel<<<BT, 512, 0, stream>>>(losses, dlogits, logits, targets, (const int *)n_valid,
                                                         V, ignore_index, dloss, vec);
        DDP__TRY(cudaGetLastError());
    }
    ddp__mean_loss_kernel<<<1, 1024, 0, stream>>>(loss, losses, (const int *)n_valid, BT);
    return cudaGetLastError();
}

// >>adamw gpu
/* ---- AdamW -------------------------------------------------------------- */
template <typename F>
static __global__ void ddp__adamw_kernel(F *params, float *master, const float *grads, float *m, float *v, long N,
                                         float lr, float beta1, float beta2, float eps, float wd, float ic1, float is2)
{
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float g = grads[i];
    float p = master ? master[i] : ddp__f(params[i]);
    const float mi = beta1 * m[i] + (1.0f - beta1) * g, vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    p -= lr * ((mi * ic1) / (sqrtf(vi) * is2 + eps) + wd * p);
    m[i] = mi;
    v[i] = vi;
    if (master) master[i] = p;
    params[i] = ddp__to<F>(p);
}

/* One step on params (N); grads (N) fp32, as the backward launchers produce them; m, v
   (N) fp32; step t from 1; then the GPU-only master (N): fp32 master copy that params
   mirrors (rounded to F), or NULL to update params directly. Same order as
   ddp_adamw_update_cpu up to t. */
template <typename F>
static inline cudaError_t ddp_adamw_update_gpu(ddp_kernels_ctx *ctx, F *params, const float *grads, float *m, float *v,
                                        size_t N, float lr, float beta1, float beta2, float eps, float weight_decay,
                                        int t, float *master, cudaStream_t stream)
{
    (void)ctx;
    if (N == 0) return cudaSuccess;
    const float ic1 = 1.0f / (1.0f - powf(beta1, (float)t)), is2 = 1.0f / sqrtf(1.0f - powf(beta2, (float)t));
    ddp__adamw_kernel<<<ddp__blocks(N, 256), 256, 0, stream>>>(params, master, grads, m, v, (long)N, lr, beta1,
                                                               beta2, eps, weight_decay, ic1, is2);
    return cudaGetLastError();
}

// >>norm gpu
/* ---- global gradient norm and clipping ---------------------------------- */
#define DDP__NORM_BLOCKS 1024

template <typename F>
static __global__ void ddp__sumsq_kernel(float *part, const F *a, long N, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    float s = 0.0f, x[n];
    for (long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * n; i < N; i += (long)gridDim.x * blockDim.x * n) {
        ddp__load(x, a, i, N, vec);
#pragma unroll
        for (int k = 0; k < n; k++) s += x[k] * x[k];
    }
    s = ddp__block_reduce(s, ddp__sum_op());
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static __global__ void __launch_bounds__(1024) ddp__norm_finish_kernel(float *norm, const float *part, int nparts)
{
    float s = 0.0f;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    s = ddp__block_reduce(s, ddp__sum_op());
    if (threadIdx.x == 0) *norm = sqrtf(s);
}

/* norm (1, device) = sqrt(sum grads^2); grads (N), all gradients in one buffer. */
template <typename F>
static inline cudaError_t ddp_global_norm_gpu(ddp_kernels_ctx *ctx, float *norm, const F *grads, size_t N, cudaStream_t stream)
{
    constexpr int n = ddp__pack<F>::n;
    const unsigned blocks = N ? ddp__blocks(N, 256 * n) : 1;
    const int nparts = blocks < DDP__NORM_BLOCKS ? (int)blocks : DDP__NORM_BLOCKS; /* depends on N only */
    void *part;
    DDP__TRY(ddp__scratch(ctx, nparts * sizeof(float), stream, &part));
    ddp__sumsq_kernel<<<nparts, 256, 0, stream>>>((float *)part, grads, (long)N, ddp__aligned16(grads));
    DDP__TRY(cudaGetLastError());
    ddp__norm_finish_kernel<<<1, 1024, 0, stream>>>(norm, (const float *)part, nparts);
    return cudaGetLastError();
}

template <typename F>
static __global__ void ddp__clip_kernel(F *grads, long N, float max_norm, const float *norm, bool vec)
{
    constexpr int n = ddp__pack<F>::n;
    const float f = max_norm / (*norm + 1e-6f);
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * n;
    if (f >= 1.0f || i >= N) return;
    float x[n];
    ddp__load(x, grads, i, N, vec);
#pragma unroll
    for (int k = 0; k < n; k++) x[k] *= f;
    ddp__store(grads, x, i, N, vec);
}

/* grads (N) *= max_norm / (norm + 1e-6) when below 1; norm (1, device) from ddp_global_norm_gpu. */
template <typename F>
static inline cudaError_t ddp_clip_by_norm_gpu(ddp_kernels_ctx *ctx, F *grads, size_t N, float max_norm, const float *norm,
                                     cudaStream_t stream)
{
    (void)ctx;
    constexpr int n = ddp__pack<F>::n;
    if (N == 0) return cudaSuccess;
    ddp__clip_kernel<<<ddp__blocks(N, 256 * n), 256, 0, stream>>>(grads, (long)N, max_norm, norm, ddp__aligned16(grads));
    return cudaGetLastError();
}

#endif /* __CUDACC__ */

#endif /* DDP_KERNELS_CUH */

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
