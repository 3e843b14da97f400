/* tests/emu/gpt2_corners.cu - the layers whose indices pass 2^31 at GPT-2's training
   shape, B=64 T=1024 C=768 V=50304 (3.3e9 logits), in bf16, run under the CUDA
   emulator's sampled-block mode (DDP_EMU_SAMPLE=1: the corner blocks of every grid,
   the corner rows and columns of every matmul; tests/emu/test_kernels.sh runs it).
   Checked against the CPU twin on the rows that run: the tied lm_head's logits and its
   input gradient for the first and last token, the cross-entropy's losses and
   gradients of the first and last row (the last starts 3.3e9 elements in), and the
   embedding of the first and last token. A 32-bit index on any of these paths lands
   outside the buffers (the emulator's report) or on other rows (a wrong value). A
   GPU could run it too, in full; it checks the same rows there. */
#include "ddp_kernels.cuh"
#include "tests/test.h"
#include <math.h>
#include <vector>

typedef __nv_bfloat16 bf16;
enum { B = 64, T = 1024, C = 768, V = 50304, NC = 16 }; /* NC: first and last columns checked */
static const long BT = (long)B * T;

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    printf("FAIL gpt2_corners.cuda: %s: %s (%s)\n", #call, cudaGetErrorString(e_), ddp_kernels_error(&k)); return 1; } } while (0)

static float hashed(size_t i, unsigned salt) /* in [-1, 1), exact in bf16 */
{
    unsigned h = (unsigned)i * 2654435761u ^ salt * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)((int)(h >> 24) - 128) / 128.0f;
}

static float f(bf16 x) { return __bfloat162float(x); }

/* |got - want| <= tol (max |want| over the row, at least 1) */
static bool close(const std::vector<float> &got, const std::vector<float> &want, double tol, double *worst)
{
    double m = 1, e = 0;
    for (size_t i = 0; i < want.size(); i++) m = fmax(m, fabs(want[i]));
    for (size_t i = 0; i < want.size(); i++) e = fmax(e, isnan(got[i]) ? INFINITY : fabs(got[i] - want[i]) / m);
    *worst = e;
    return e <= tol;
}

/* the checked columns of a row of width n: the first and last NC */
static std::vector<long> corners(long n)
{
    std::vector<long> v;
    for (long i = 0; i < NC; i++) v.push_back(i);
    for (long i = n - NC; i < n; i++) v.push_back(i);
    return v;
}

int main()
{
    ddp_kernels_ctx k;
    if (!test_gpu_ready("gpt2_corners.device")) TEST_EXIT();
    if (ddp_kernels_init(&k) != cudaSuccess) {
        printf("FAIL gpt2_corners.init: %s\n", ddp_kernels_error(&k));
        return 1;
    }
    const long rows[2] = {0, BT - 1};
    double worst = 0;
    /* the weights, whole: the products read all of them */
    std::vector<bf16> hwte((size_t)V * C), hwpe((size_t)T * C);
    for (size_t i = 0; i < hwte.size(); i++) hwte[i] = __float2bfloat16(hashed(i, 1) * 0.5f);
    for (size_t i = 0; i < hwpe.size(); i++) hwpe[i] = __float2bfloat16(hashed(i, 2) * 0.5f);
    bf16 *wte, *wpe, *x, *logits, *dx, *emb;
    int *tokens, *targets;
    float *losses, *loss;
    CK(cudaMalloc(&wte, hwte.size() * sizeof(bf16)));
    CK(cudaMalloc(&wpe, hwpe.size() * sizeof(bf16)));
    CK(cudaMalloc(&x, (size_t)BT * C * sizeof(bf16)));
    CK(cudaMalloc(&dx, (size_t)BT * C * sizeof(bf16)));
    CK(cudaMalloc(&emb, (size_t)BT * C * sizeof(bf16)));
    CK(cudaMalloc(&logits, (size_t)BT * V * sizeof(bf16)));
    CK(cudaMalloc(&tokens, (size_t)BT * sizeof(int)));
    CK(cudaMalloc(&targets, (size_t)BT * sizeof(int)));
    CK(cudaMalloc(&losses, (size_t)BT * sizeof(float)));
    CK(cudaMalloc(&loss, sizeof(float)));
    CK(cudaMemcpy(wte, hwte.data(), hwte.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(wpe, hwpe.data(), hwpe.size() * sizeof(bf16), cudaMemcpyHostToDevice));

    /* the lm_head: logits (BT,V) = x (BT,C) @ wte^T, for the first and last NC tokens */
    std::vector<bf16> xrow(C);
    std::vector<long> xrows = corners(BT);
    for (long r : xrows) {
        for (int c = 0; c < C; c++) xrow[c] = __float2bfloat16(hashed((size_t)r * C + c, 3));
        CK(cudaMemcpy(x + r * C, xrow.data(), C * sizeof(bf16), cudaMemcpyHostToDevice));
    }
    CK(ddp_matmul_forward_gpu(&k, logits, x, wte, (bf16 *)NULL, B, T, C, V, 0));
    {
        std::vector<float> got, want;
        std::vector<bf16> row(V);
        for (long r : rows) {
            CK(cudaMemcpy(row.data(), logits + r * V, V * sizeof(bf16), cudaMemcpyDeviceToHost));
            for (long v : corners(V)) {
                double s = 0;
                for (int c = 0; c < C; c++) s += (double)hashed((size_t)r * C + c, 3) * f(hwte[(size_t)v * C + c]);
                want.push_back((float)s);
                got.push_back(f(row[v]));
            }
        }
        CHECK("gpt2_corners.lm_head_forward", close(got, want, 1e-2, &worst), "relative error %.3g", worst);
    }

    /* the cross-entropy of the first and last rows (the others ignored), in place */
    std::vector<float> lrow[2];
    for (int i = 0; i < 2; i++) {
        std::vector<bf16> row(V);
        lrow[i].resize(V);
        for (int v = 0; v < V; v++) row[v] = __float2bfloat16(hashed((size_t)v, 10 + i) * 4), lrow[i][v] = f(row[v]);
        CK(cudaMemcpy(logits + rows[i] * V, row.data(), V * sizeof(bf16), cudaMemcpyHostToDevice));
    }
    const int tgt[2] = {5, V - 2};
    CK(cudaMemset(targets, 0xff, (size_t)BT * sizeof(int))); /* -1: ignored */
    for (int i = 0; i < 2; i++) CK(cudaMemcpy(targets + rows[i], &tgt[i], sizeof(int), cudaMemcpyHostToDevice));
    CK(ddp_crossentropy_forward_backward_gpu(&k, loss, losses, logits, logits, targets, B, T, V, -1, 1.0f, 0));
    {
        std::vector<float> gl, wl, gg, wg;
        std::vector<bf16> row(V);
        for (int i = 0; i < 2; i++) {
            float l;
            double mx = -INFINITY, s = 0;
            for (int v = 0; v < V; v++) mx = fmax(mx, lrow[i][v]);
            for (int v = 0; v < V; v++) s += exp(lrow[i][v] - mx);
            CK(cudaMemcpy(&l, losses + rows[i], sizeof l, cudaMemcpyDeviceToHost));
            gl.push_back(l);
            wl.push_back((float)(log(s) + mx - lrow[i][tgt[i]]));
            CK(cudaMemcpy(row.data(), logits + rows[i] * V, V * sizeof(bf16), cudaMemcpyDeviceToHost));
            for (int v = 0; v < V; v++) { /* dloss 1 over 2 valid rows */
                gg.push_back(f(row[v]));
                wg.push_back((float)((exp(lrow[i][v] - mx) / s - (v == tgt[i])) / 2));
            }
        }
        CHECK("gpt2_corners.crossentropy_losses", close(gl, wl, 1e-4, &worst), "relative error %.3g", worst);
        CHECK("gpt2_corners.crossentropy_dlogits", close(gg, wg, 1e-2, &worst), "relative error %.3g", worst);
    }

    /* the lm_head's input gradient dx (BT,C) += dlogits (BT,V) @ wte, first and last row */
    CK(cudaMemset(dx, 0, (size_t)BT * C * sizeof(bf16)));
    CK(ddp_matmul_backward_gpu(&k, dx, (float *)NULL, (float *)NULL, logits, x, wte, B, T, C, V, 0));
    {
        std::vector<float> got, want;
        std::vector<bf16> drow(V), row(C);
        for (long r : rows) {
            CK(cudaMemcpy(drow.data(), logits + r * V, V * sizeof(bf16), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(row.data(), dx + r * C, C * sizeof(bf16), cudaMemcpyDeviceToHost));
            for (long c : corners(C)) {
                double s = 0;
                for (int v = 0; v < V; v++) s += (double)f(drow[v]) * f(hwte[(size_t)v * C + c]);
                want.push_back((float)s);
                got.push_back(f(row[c]));
            }
        }
        CHECK("gpt2_corners.lm_head_backward", close(got, want, 1e-2, &worst), "relative error %.3g", worst);
    }

    /* the embedding of the first and last token (the last is the vocabulary's last) */
    {
        std::vector<int> htok((size_t)BT);
        for (long i = 0; i < BT; i++) htok[i] = (int)(hashed((size_t)i, 20) * 0.5f * V + V / 2);
        htok[BT - 1] = V - 1;
        CK(cudaMemcpy(tokens, htok.data(), htok.size() * sizeof(int), cudaMemcpyHostToDevice));
        CK(ddp_embedding_forward_gpu(&k, emb, tokens, wte, wpe, B, T, C, 0));
        std::vector<float> got, want;
        std::vector<bf16> row(C);
        for (long r : rows) {
            CK(cudaMemcpy(row.data(), emb + r * C, C * sizeof(bf16), cudaMemcpyDeviceToHost));
            for (int c = 0; c < C; c++) {
                got.push_back(f(row[c]));
                want.push_back(f(hwte[(size_t)htok[r] * C + c]) + f(hwpe[(size_t)(r % T) * C + c]));
            }
        }
        CHECK("gpt2_corners.embedding_forward", close(got, want, 1e-2, &worst), "relative error %.3g", worst);
    }
    ddp_kernels_destroy(&k);
    TEST_EXIT();
}
