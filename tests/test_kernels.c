/* tests/test_kernels.c - the CPU half of ddp_kernels.cuh.
   Every backward is checked against central finite differences of its forward:
   L = sum(out * w) for random w, so dL/dout = w is the dout fed to the backward.
   The forwards run in fp32, so the numerical derivative uses the fourth-order
   stencil (8(L(x+h) - L(x-h)) - (L(x+2h) - L(x-2h))) / 12h, accumulated in double,
   with h = 2^-4: its truncation error is O(h^4) ~ 1e-6 and the fp32 rounding noise
   of L divided by h stays near 1e-5 (observed worst, cross-entropy: 2e-5), well
   inside the 1e-4 bound that a wrong gradient term would break. Inputs are
   multiples of 2^-12, so x +- h and x +- 2h are exact in fp32.
   Gradients are pre-filled with a constant to check that backward adds (+=). */
#include "ddp_kernels.cuh"
#include "tests/test.h"
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* odd sizes on purpose */
enum { B = 2, T = 5, C = 12, NH = 3, V = 7, OC = 9, MAXT = 6 };
#define FD_H (1.0f / 16.0f)
#define PREFILL 0.5f
#define TOL 1e-4

static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
static unsigned rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state >> 32);
}
/* uniform in [-scale, scale], a multiple of scale * 2^-12 */
static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = scale * ((int)(rng_u32() % 8193) - 4096) / 4096.0f;
}
static void fill_const(float *x, size_t n, float c)
{
    for (size_t i = 0; i < n; i++) x[i] = c;
}
static float *alloc(size_t n) { return (float *)calloc(n, sizeof(float)); }

static double weighted_sum(const float *out, const float *w, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)out[i] * w[i];
    return s;
}

/* The scalar loss of one layer, recomputed after each perturbation. */
typedef double (*loss_fn)(void *state);

/* max |analytic - numeric| / max(max |numeric|, 1e-3) over the elements of x;
   analytic was computed on top of PREFILL. */
static double fd_error(loss_fn f, void *state, float *x, const float *analytic, size_t n)
{
    double max_err = 0.0, max_num = 1e-3;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        double L[4];
        const float off[4] = {FD_H, -FD_H, 2 * FD_H, -2 * FD_H};
        for (int k = 0; k < 4; k++) {
            x[i] = x0 + off[k];
            L[k] = f(state);
        }
        x[i] = x0;
        double num = (8.0 * (L[0] - L[1]) - (L[2] - L[3])) / (12.0 * FD_H);
        double err = fabs((analytic[i] - PREFILL) - num);
        if (err > max_err) max_err = err;
        if (fabs(num) > max_num) max_num = fabs(num);
    }
    return max_err / max_num;
}

static void check_grad(const char *name, loss_fn f, void *s, float *x, const float *g, size_t n)
{
    double e = fd_error(f, s, x, g, n);
    CHECK(name, e <= TOL, "relative error %.3g > %.0e", e, TOL);
}

/* ---- embedding ---- */
typedef struct { int tok[B * T]; float wte[V * C], wpe[MAXT * C], out[B * T * C], w[B * T * C]; } emb_s;
static double emb_loss(void *p)
{
    emb_s *s = (emb_s *)p;
    ddp_embedding_forward_cpu(s->out, s->tok, s->wte, s->wpe, B, T, C);
    return weighted_sum(s->out, s->w, B * T * C);
}
static void test_embedding(void)
{
    static emb_s s;
    float *dwte = alloc(V * C), *dwpe = alloc(MAXT * C);
    for (int i = 0; i < B * T; i++) s.tok[i] = (int)(rng_u32() % 4); /* repeats on purpose */
    fill(s.wte, V * C, 1); fill(s.wpe, MAXT * C, 1); fill(s.w, B * T * C, 1);
    fill_const(dwte, V * C, PREFILL); fill_const(dwpe, MAXT * C, PREFILL);
    ddp_embedding_backward_cpu(dwte, dwpe, s.w, s.tok, B, T, C);
    check_grad("kernels.embedding.backward.wte", emb_loss, &s, s.wte, dwte, V * C);
    check_grad("kernels.embedding.backward.wpe", emb_loss, &s, s.wpe, dwpe, MAXT * C);
    free(dwte); free(dwpe);
}

/* ---- layernorm ---- */
typedef struct { float x[B * T * C], wt[C], bias[C], out[B * T * C], mean[B * T], rstd[B * T], w[B * T * C]; } ln_s;
static double ln_loss(void *p)
{
    ln_s *s = (ln_s *)p;
    ddp_layernorm_forward_cpu(s->out, s->mean, s->rstd, s->x, s->wt, s->bias, B, T, C);
    return weighted_sum(s->out, s->w, B * T * C);
}
static void test_layernorm(void)
{
    static ln_s s;
    float *dx = alloc(B * T * C), *dwt = alloc(C), *db = alloc(C);
    fill(s.x, B * T * C, 1); fill(s.wt, C, 1); fill(s.bias, C, 1); fill(s.w, B * T * C, 1);
    fill_const(dx, B * T * C, PREFILL); fill_const(dwt, C, PREFILL); fill_const(db, C, PREFILL);
    ln_loss(&s);
    ddp_layernorm_backward_cpu(dx, dwt, db, s.w, s.x, s.wt, s.mean, s.rstd, B, T, C);
    check_grad("kernels.layernorm.backward.inp", ln_loss, &s, s.x, dx, B * T * C);
    check_grad("kernels.layernorm.backward.weight", ln_loss, &s, s.wt, dwt, C);
    check_grad("kernels.layernorm.backward.bias", ln_loss, &s, s.bias, db, C);
    {   /* each normalized row has mean 0 and variance 1 before the affine part */
        float one[C], zero[C], out[B * T * C], mean[B * T], rstd[B * T];
        double worst = 0.0;
        fill_const(one, C, 1); fill_const(zero, C, 0);
        ddp_layernorm_forward_cpu(out, mean, rstd, s.x, one, zero, B, T, C);
        for (int r = 0; r < B * T; r++) {
            double m = 0, v = 0;
            for (int c = 0; c < C; c++) m += out[r * C + c];
            for (int c = 0; c < C; c++) v += out[r * C + c] * out[r * C + c];
            m /= C; v /= C;
            worst = fmax(worst, fmax(fabs(m), fabs(v - 1.0) * 0.1));
        }
        CHECK("kernels.layernorm.forward.normalized", worst < 1e-4, "row stats off by %g", worst);
    }
    free(dx); free(dwt); free(db);
}

/* ---- matmul ---- */
typedef struct { float x[B * T * C], wt[OC * C], bias[OC], out[B * T * OC], w[B * T * OC]; } mm_s;
static double mm_loss(void *p)
{
    mm_s *s = (mm_s *)p;
    ddp_matmul_forward_cpu(s->out, s->x, s->wt, s->bias, B, T, C, OC);
    return weighted_sum(s->out, s->w, B * T * OC);
}
static void test_matmul(void)
{
    static mm_s s;
    float *dx = alloc(B * T * C), *dwt = alloc(OC * C), *db = alloc(OC);
    fill(s.x, B * T * C, 1); fill(s.wt, OC * C, 1); fill(s.bias, OC, 1); fill(s.w, B * T * OC, 1);
    fill_const(dx, B * T * C, PREFILL); fill_const(dwt, OC * C, PREFILL); fill_const(db, OC, PREFILL);
    ddp_matmul_backward_cpu(dx, dwt, db, s.w, s.x, s.wt, B, T, C, OC);
    check_grad("kernels.matmul.backward.inp", mm_loss, &s, s.x, dx, B * T * C);
    check_grad("kernels.matmul.backward.weight", mm_loss, &s, s.wt, dwt, OC * C);
    check_grad("kernels.matmul.backward.bias", mm_loss, &s, s.bias, db, OC);
    {   /* against a plain triple loop in double, with and without bias */
        double worst = 0.0;
        float out2[B * T * OC];
        ddp_matmul_forward_cpu(s.out, s.x, s.wt, s.bias, B, T, C, OC);
        ddp_matmul_forward_cpu(out2, s.x, s.wt, NULL, B, T, C, OC);
        for (int r = 0; r < B * T; r++)
            for (int o = 0; o < OC; o++) {
                double acc = 0;
                for (int c = 0; c < C; c++) acc += (double)s.x[r * C + c] * s.wt[o * C + c];
                worst = fmax(worst, fabs(s.out[r * OC + o] - (acc + s.bias[o])));
                worst = fmax(worst, fabs(out2[r * OC + o] - acc));
            }
        CHECK("kernels.matmul.forward", worst < 1e-5, "max error %g", worst);
    }
    free(dx); free(dwt); free(db);
}

/* The blocked matmul against a double-precision triple loop on shapes that are not
   multiples of its tiles (and depths past one panel, rows past one task), and its
   bitwise determinism: the same bits with 1, 2 or 3 threads, for a row alone or in a
   batch, and for dweight/dbias accumulated over one call or one call per sequence. */
static int mm_run(float *o[5], const float *x, const float *wt, const float *bias, const float *dout,
                  int M, int C, int OC, int threads)
{
#ifdef _OPENMP
    omp_set_num_threads(threads);
#else
    if (threads > 1) return 0;
#endif
    fill_const(o[1], (size_t)M * C, PREFILL); fill_const(o[2], (size_t)OC * C, PREFILL); fill_const(o[3], OC, PREFILL);
    ddp_matmul_forward_cpu(o[0], x, wt, bias, 1, M, C, OC);
    ddp_matmul_backward_cpu(o[1], o[2], o[3], dout, x, wt, 1, M, C, OC);
    ddp_matmul_forward_cpu(o[4], x, wt, NULL, 1, M, C, OC);
    return 1;
}
/* |got - ref| within the worst-case rounding of an n-term fp32 sum whose terms total mag */
static double mm_excess(float got, double ref, double mag, int n) { return fabs(got - ref) - (n + 2) * 1.2e-7 * mag; }

static void test_matmul_blocked(void)
{
    static const int shapes[][3] = {{1, 1, 1}, {1, 1, 17}, {3, 1, 1}, {7, 19, 1}, {11, 37, 33},
                                    {17, 300, 20}, {6, 16, 300}, {260, 17, 5}, {300, 9, 40}, {30, 20, 270},
                                    {260, 300, 20}, {40, 7, 1030},  /* dweight's a packed (OC >= 1024) */
                                    {300, 9, 1030},                 /* and packed a step at a time (k past a panel) */
                                    {20, 400, 30}, {7, 20, 400}, {400, 20, 9}}; /* past the AVX2 tile's 384-deep panel */
    double worst = 0.0;
    int same_threads = 1, same_rows = 1, same_split = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        const size_t n[5] = {(size_t)M * OC, (size_t)M * C, (size_t)OC * C, (size_t)OC, (size_t)M * OC};
        float *x = alloc((size_t)M * C), *wt = alloc((size_t)OC * C), *bias = alloc(OC), *dout = alloc((size_t)M * OC);
        float *o[5], *p[5];
        for (int k = 0; k < 5; k++) { o[k] = alloc(n[k]); p[k] = alloc(n[k]); }
        fill(x, (size_t)M * C, 1); fill(wt, (size_t)OC * C, 1); fill(bias, OC, 1); fill(dout, (size_t)M * OC, 1);
        mm_run(o, x, wt, bias, dout, M, C, OC, 1);
        for (int r = 0; r < M; r++)
            for (int j = 0; j < OC; j++) {
                double acc = 0, mag = 0;
                for (int c = 0; c < C; c++) {
                    acc += (double)x[r * C + c] * wt[j * C + c];
                    mag += fabs((double)x[r * C + c] * wt[j * C + c]);
                }
                worst = fmax(worst, mm_excess(o[0][r * OC + j], acc + bias[j], mag + fabs(bias[j]), C + 1));
                worst = fmax(worst, mm_excess(o[4][r * OC + j], acc, mag, C));
            }
        for (int r = 0; r < M; r++)
            for (int c = 0; c < C; c++) {
                double acc = PREFILL, mag = PREFILL;
                for (int j = 0; j < OC; j++) {
                    acc += (double)dout[r * OC + j] * wt[j * C + c];
                    mag += fabs((double)dout[r * OC + j] * wt[j * C + c]);
                }
                worst = fmax(worst, mm_excess(o[1][r * C + c], acc, mag, OC + 1));
            }
        for (int j = 0; j < OC; j++) {
            double db = PREFILL, dbmag = PREFILL;
            for (int c = 0; c < C; c++) {
                double acc = PREFILL, mag = PREFILL;
                for (int r = 0; r < M; r++) {
                    acc += (double)dout[r * OC + j] * x[r * C + c];
                    mag += fabs((double)dout[r * OC + j] * x[r * C + c]);
                }
                worst = fmax(worst, mm_excess(o[2][j * C + c], acc, mag, M + 1));
            }
            for (int r = 0; r < M; r++) { db += dout[r * OC + j]; dbmag += fabs(dout[r * OC + j]); }
            worst = fmax(worst, mm_excess(o[3][j], db, dbmag, M + 1));
        }
        for (int threads = 2; threads <= 3; threads++)
            if (mm_run(p, x, wt, bias, dout, M, C, OC, threads))
                for (int k = 0; k < 5; k++) same_threads &= !memcmp(o[k], p[k], n[k] * sizeof(float));
        mm_run(p, x, wt, bias, dout, M, C, OC, 2);
        {   /* the last row alone: forward and dinp as in the batch */
            const int r = M - 1;
            float *drow = alloc(C);
            fill_const(drow, C, PREFILL);
            ddp_matmul_forward_cpu(p[0], x + (size_t)r * C, wt, bias, 1, 1, C, OC);
            ddp_matmul_backward_cpu(drow, p[2], p[3], dout + (size_t)r * OC, x + (size_t)r * C, wt, 1, 1, C, OC);
            same_rows &= !memcmp(p[0], o[0] + (size_t)r * OC, OC * sizeof(float));
            same_rows &= !memcmp(drow, o[1] + (size_t)r * C, C * sizeof(float));
            free(drow);
        }
        {   /* dweight and dbias over the rows in two calls, as the trainer does per sequence */
            const int h = M / 2;
            fill_const(p[2], n[2], PREFILL); fill_const(p[3], n[3], PREFILL);
            ddp_matmul_backward_cpu(p[1], p[2], p[3], dout, x, wt, 1, h, C, OC);
            ddp_matmul_backward_cpu(p[1], p[2], p[3], dout + (size_t)h * OC, x + (size_t)h * C, wt, 1, M - h, C, OC);
            same_split &= !memcmp(p[2], o[2], n[2] * sizeof(float)) && !memcmp(p[3], o[3], n[3] * sizeof(float));
        }
        for (int k = 0; k < 5; k++) { free(o[k]); free(p[k]); }
        free(x); free(wt); free(bias); free(dout);
    }
#ifdef _OPENMP
    omp_set_num_threads(omp_get_num_procs());
#endif
    CHECK("kernels.matmul.blocked.reference", worst <= 0.0, "error exceeds the fp32 bound by %g", worst);
    CHECK("kernels.matmul.blocked.threads", same_threads, "results differ between 1, 2 and 3 threads");
    CHECK("kernels.matmul.blocked.row_alone", same_rows, "a row's result depends on the other rows");
    CHECK("kernels.matmul.blocked.split_rows", same_split, "dweight/dbias differ when the rows come in two calls");
}

/* The per-sequence sum: each sequence's fp32 gradient (ddp_matmul_backward_cpu with B = 1,
   into zeros) added in double, bit for bit, also past one panel of depth (T > DDP__KC: 256;
   384 with AVX2, 128 with AVX-512) and past one block of rows (OC > 255: the panels packed
   once for all blocks), with dout packed (OC >= 1024), tile by tile (C >= 256, B*T past a
   panel, T within one, or within two with AVX-512: ddp__gemm_by_tile), with the input read
   in place (AVX-512: its whole panels, rows less than a page apart: C < 1024) or packed, and
   with one thread as with many. */
static int sum_tiled; /* shapes that went tile by tile with b packed, or read in place (rows past one tile) */
static void matmul_sum_case(int SB, int ST, int SC, int SOC, int *same, int *threads)
{
    sum_tiled += ddp__gemm_by_tile(SC, SB * ST, 1, ST) && SOC > DDP__MR;
    float *dout = alloc((size_t)SB * ST * SOC), *inp = alloc((size_t)SB * ST * SC), *w = alloc(SOC * SC);
    float *dw = alloc(SOC * SC), *db = alloc(SOC);
    double *ew = (double *)calloc(SOC * SC, sizeof(double)), *eb = (double *)calloc(SOC, sizeof(double));
    double *gw = (double *)calloc(SOC * SC, sizeof(double)), *gb = (double *)calloc(SOC, sizeof(double));
    double *hw = (double *)calloc(SOC * SC, sizeof(double)), *hb = (double *)calloc(SOC, sizeof(double));
    fill(dout, (size_t)SB * ST * SOC, 1); fill(inp, (size_t)SB * ST * SC, 2);
    for (int i = 0; i < SOC * SC; i++) ew[i] = gw[i] = hw[i] = 0.5 * i; /* it adds to what is there */
    for (int i = 0; i < SOC; i++) eb[i] = gb[i] = hb[i] = -0.25 * i;
    for (int b = 0; b < SB; b++) {
        memset(dw, 0, SOC * SC * sizeof(float)); memset(db, 0, SOC * sizeof(float));
        ddp_matmul_backward_cpu(NULL, dw, db, dout + (size_t)b * ST * SOC, inp + (size_t)b * ST * SC, w, 1, ST, SC, SOC);
        for (int i = 0; i < SOC * SC; i++) ew[i] += dw[i];
        for (int i = 0; i < SOC; i++) eb[i] += db[i];
    }
    ddp_matmul_backward_sum_cpu(gw, gb, dout, inp, SB, ST, SC, SOC);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    ddp_matmul_backward_sum_cpu(hw, hb, dout, inp, SB, ST, SC, SOC);
#ifdef _OPENMP
    omp_set_num_threads(omp_get_num_procs());
#endif
    for (int i = 0; i < SOC * SC; i++) {
        *same &= gw[i] == ew[i];
        *threads &= gw[i] == hw[i];
    }
    for (int i = 0; i < SOC; i++) {
        *same &= gb[i] == eb[i];
        *threads &= gb[i] == hb[i];
    }
    free(dout); free(inp); free(w); free(dw); free(db); free(ew); free(eb); free(gw); free(gb); free(hw); free(hb);
}

static void test_matmul_sum(void)
{
    int same = 1, threads = 1;
    matmul_sum_case(3, 300, 21, 37, &same, &threads);
    matmul_sum_case(2, 40, 19, 270, &same, &threads);
    matmul_sum_case(2, 270, 19, 270, &same, &threads);
    matmul_sum_case(3, 30, 5, 1030, &same, &threads); /* dout packed: strided by a page */
    matmul_sum_case(3, 300, 5, 1030, &same, &threads); /* and packed a run at a time (k past a panel) */
    matmul_sum_case(2, 400, 21, 37, &same, &threads);  /* past the AVX2 tile's panel */
    /* rows of 256 or more, k past a panel and runs within one in every build (it is 128-384
       deep): tile by tile, dout packed; and strided by a page; a run exactly a panel deep;
       k just past a panel */
    matmul_sum_case(4, 100, 260, 37, &same, &threads);
    matmul_sum_case(4, 97, 257, 1030, &same, &threads);
    matmul_sum_case(2, DDP__KC, 256, 13, &same, &threads);
    matmul_sum_case(2, DDP__KC / 2 + 1, 263, 13, &same, &threads);
    matmul_sum_case(3, 200, 270, 40, &same, &threads);  /* runs past an AVX-512 panel, within DDP__KT */
    matmul_sum_case(3, 150, 1030, 13, &same, &threads); /* inputs a page apart: packed */
    matmul_sum_case(3, 150, 40, 37, &same, &threads);   /* a whole panel (AVX-512: in place) and a partial one */
    matmul_sum_case(2, 150, 4, 0, &same, &threads);   /* no outputs, k past a panel: nothing to do, no crash */
    CHECK("kernels.matmul.sum_per_sequence", same && threads, "the double sum %s the per-sequence fp32 gradients; "
          "one thread %s", same ? "matches" : "differs from", threads ? "agrees" : "differs");
    CHECK("kernels.matmul.sum_tile_by_tile", sum_tiled == 6, "%d of the 6 tile-by-tile shapes go tile by tile "
          "with panels %d deep (runs up to %d)", sum_tiled, DDP__KC, DDP__KT);
}

/* The written input gradient: the bits of ddp_matmul_backward_cpu into zeros, then of
   ddp_gelu_backward_cpu into zeros, whatever dinp held (NaN here); shapes one panel deep
   and several (OC past 128), rows and columns off the tile, GELU inputs past its
   saturation (|x| > 9), one thread and three. */
static void matmul_input_case(int IB, int IT, int IC, int IOC, int *same, int *threads)
{
    const size_t n = (size_t)IB * IT * IC;
    float *dout = alloc((size_t)IB * IT * IOC), *w = alloc((size_t)IOC * IC), *pre = alloc(n);
    float *zero = alloc(n), *ref = alloc(n), *got = alloc(n), *got1 = alloc(n);
    fill(dout, (size_t)IB * IT * IOC, 1); fill(w, (size_t)IOC * IC, 1); fill(pre, n, 12); /* gelu inputs in [-12, 12] */
    for (int gelu = 0; gelu < 2; gelu++) {
        memset(zero, 0, n * sizeof(float));
        ddp_matmul_backward_cpu(zero, NULL, NULL, dout, pre, w, IB, IT, IC, IOC);
        memset(ref, 0, n * sizeof(float));
        if (gelu) ddp_gelu_backward_cpu(ref, pre, zero, n);
        else memcpy(ref, zero, n * sizeof(float));
        fill_const(got, n, NAN);
        ddp_matmul_backward_input_cpu(got, dout, w, gelu ? pre : NULL, IB, IT, IC, IOC);
#ifdef _OPENMP
        omp_set_num_threads(1);
#endif
        fill_const(got1, n, NAN);
        ddp_matmul_backward_input_cpu(got1, dout, w, gelu ? pre : NULL, IB, IT, IC, IOC);
#ifdef _OPENMP
        omp_set_num_threads(3);
#endif
        *same &= !memcmp(got, ref, n * sizeof(float));
        *threads &= !memcmp(got, got1, n * sizeof(float));
    }
    free(dout); free(w); free(pre); free(zero); free(ref); free(got); free(got1);
}

static void test_matmul_input(void)
{
    int same = 1, threads = 1;
    matmul_input_case(2, 16, 512, 128, &same, &threads); /* train_gpt's MLP projection, smaller */
    matmul_input_case(3, 37, 45, 29, &same, &threads);   /* off the tile both ways */
    matmul_input_case(1, 50, 70, 300, &same, &threads);  /* deeper than a panel */
    matmul_input_case(1, 30, 40, 400, &same, &threads);  /* and than the AVX2 tile's */
    matmul_input_case(1, 9, 260, 1030, &same, &threads); /* and past a page per row of dout */
    matmul_input_case(2, 5, 33, 0, &same, &threads);     /* no outputs: dinp = 0 */
    ddp_matmul_backward_input_cpu(NULL, NULL, NULL, NULL, 2, 3, 4, 5); /* dinp not needed: nothing read */
#ifdef _OPENMP
    omp_set_num_threads(omp_get_num_procs());
#endif
    CHECK("kernels.matmul.input_written", same && threads, "the written dinp %s the accumulated one into zeros "
          "(and the GELU's backward after it); one thread %s", same ? "matches" : "differs from",
          threads ? "agrees" : "differs");
}

/* ---- attention ---- */
typedef struct { float x[B * T * 3 * C], out[B * T * C], lse[B * NH * T], w[B * T * C]; } att_s;
static double att_loss(void *p)
{
    att_s *s = (att_s *)p;
    ddp_attention_forward_cpu(s->out, s->lse, s->x, B, T, C, NH);
    return weighted_sum(s->out, s->w, B * T * C);
}
static void test_attention(void)
{
    static att_s s;
    static float dx[B * T * 3 * C], x2[B * T * 3 * C], out2[B * T * C], lse2[B * NH * T];
    fill(s.x, B * T * 3 * C, 2); fill(s.w, B * T * C, 1);
    fill_const(dx, B * T * 3 * C, PREFILL);
    att_loss(&s);
    ddp_attention_backward_cpu(dx, s.w, s.x, s.out, s.lse, B, T, C, NH);
    check_grad("kernels.attention.backward", att_loss, &s, s.x, dx, B * T * 3 * C);

    /* causal: changing tokens t >= 3 leaves outputs t < 3 bitwise unchanged */
    memcpy(x2, s.x, sizeof x2);
    for (int b = 0; b < B; b++)
        fill(x2 + (size_t)(b * T + 3) * 3 * C, (size_t)(T - 3) * 3 * C, 2);
    att_loss(&s);
    ddp_attention_forward_cpu(out2, lse2, x2, B, T, C, NH);
    int same = 1, changed = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T * C; i++) {
            int diff = s.out[b * T * C + i] != out2[b * T * C + i];
            if (i < 3 * C) same &= !diff; else changed |= diff;
        }
    CHECK("kernels.attention.forward.causal", same && changed,
          "past outputs %s, future outputs %s", same ? "kept" : "changed", changed ? "changed" : "kept");

    /* softmax rows sum to 1: with every value vector all ones, every output is 1 */
    for (int r = 0; r < B * T; r++) fill_const(x2 + (size_t)r * 3 * C + 2 * C, C, 1);
    ddp_attention_forward_cpu(out2, lse2, x2, B, T, C, NH);
    double worst = 0.0;
    for (int i = 0; i < B * T * C; i++) worst = fmax(worst, fabs(out2[i] - 1.0));
    CHECK("kernels.attention.forward.rows_sum_to_1", worst < 1e-6, "max |out - 1| = %g", worst);

    /* the blocked kernels (several key blocks, a partial query block) against the
       query-by-query ones they fall back to for large heads: heads of 96 (k and v read in
       place), of 24 (packed, as every head size that is not a multiple of 16) and of 32
       (key blocks of 64, their panels 32 wide under the AVX-512 tile, the last one short) */
    static const char *const hsname[3][2] = {{"kernels.attention.blocked_vs_rows.hs96", "kernels.attention.bitwise.hs96"},
                                             {"kernels.attention.blocked_vs_rows.hs24", "kernels.attention.bitwise.hs24"},
                                             {"kernels.attention.blocked_vs_rows.hs32", "kernels.attention.bitwise.hs32"}};
    for (int shape = 0; shape < 3; shape++) {
        const int AB = 2, AT = 300, AC = shape == 1 ? 72 : shape ? 64 : 96, ANH = shape == 1 ? 3 : shape ? 2 : 1;
        const size_t n3 = (size_t)AB * AT * 3 * AC, n = (size_t)AB * AT * AC, nl = (size_t)AB * ANH * AT;
        float *x = alloc(n3), *dy = alloc(n), *o1 = alloc(n), *o2 = alloc(n), *l1 = alloc(nl), *l2 = alloc(nl);
        float *d1 = alloc(n3), *d2 = alloc(n3);
        fill(x, n3, 2); fill(dy, n, 1);
        ddp_attention_forward_cpu(o1, l1, x, AB, AT, AC, ANH);
        ddp__attention_forward_rows(o2, l2, x, AB, AT, AC, ANH);
        ddp_attention_backward_cpu(d1, dy, x, o1, l1, AB, AT, AC, ANH);
        ddp__attention_backward_rows(d2, dy, x, o1, l1, AB, AT, AC, ANH);
        double eo = 0.0, el = 0.0, ed = 0.0, md = 0.0;
        for (size_t i = 0; i < n; i++) eo = fmax(eo, fabs(o1[i] - o2[i]));
        for (size_t i = 0; i < nl; i++) el = fmax(el, fabs(l1[i] - l2[i]));
        for (size_t i = 0; i < n3; i++) { ed = fmax(ed, fabs(d1[i] - d2[i])); md = fmax(md, fabs(d2[i])); }
        CHECK(hsname[shape][0],
              eo < 1e-5 && el < 1e-5 && ed < 1e-5 * md, "max diff out %g lse %g dinp %g (max |dinp| %g)", eo, el, ed,
              md);
        /* bitwise: the second sequence alone as in the batch, and 1 thread as many */
        {
            const size_t s3 = n3 / AB, s1 = n / AB, sl = nl / AB;
            int same_alone, same_threads = 1;
            memset(d2, 0, n3 * sizeof(float));
            ddp_attention_forward_cpu(o2, l2, x + s3, 1, AT, AC, ANH);
            ddp_attention_backward_cpu(d2, dy + s1, x + s3, o2, l2, 1, AT, AC, ANH);
            memset(d1, 0, n3 * sizeof(float));
            ddp_attention_backward_cpu(d1, dy, x, o1, l1, AB, AT, AC, ANH);
            same_alone = !memcmp(o2, o1 + s1, s1 * sizeof(float)) && !memcmp(l2, l1 + sl, sl * sizeof(float)) &&
                         !memcmp(d2, d1 + s3, s3 * sizeof(float));
#ifdef _OPENMP
            omp_set_num_threads(1);
            memset(d2, 0, n3 * sizeof(float));
            ddp_attention_forward_cpu(o2, l2, x, AB, AT, AC, ANH);
            ddp_attention_backward_cpu(d2, dy, x, o2, l2, AB, AT, AC, ANH);
            omp_set_num_threads(omp_get_num_procs());
            same_threads = !memcmp(o2, o1, n * sizeof(float)) && !memcmp(d2, d1, n3 * sizeof(float));
#endif
            CHECK(hsname[shape][1], same_alone && same_threads,
                  "a sequence alone %s, one thread %s", same_alone ? "agrees" : "differs",
                  same_threads ? "agrees" : "differs");
        }
        free(x); free(dy); free(o1); free(o2); free(l1); free(l2); free(d1); free(d2);
    }
}

/* ---- gelu ---- */
#define NE (B * T * C)
typedef struct { float x[NE], out[NE], w[NE]; } gelu_s;
static double gelu_loss(void *p)
{
    gelu_s *s = (gelu_s *)p;
    ddp_gelu_forward_cpu(s->out, s->x, NE);
    return weighted_sum(s->out, s->w, NE);
}
/* The CPU gelu computes tanh through its own exp; it must agree with the tanh formula
   to fp32 rounding over a dense sweep, and saturate where that formula overflows (huge
   |x|, where it gives NaN). The reference runs libm in double: in fp32 the formula's
   1 - tanh^2 cancels to 0 while gelu' is still -2e-7 (x = -5.3), an error of its own
   as large as the tolerance. */
static double gelu_libm(double x) { return 0.5 * x * (1.0 + tanh(DDP__GELU_S * (x + 0.044715 * x * x * x))); }
static double gelu_grad_libm(double x)
{
    double th = tanh(DDP__GELU_S * (x + 0.044715 * x * x * x));
    double du = DDP__GELU_S * (1.0 + 3.0 * 0.044715 * x * x);
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}
#define NSWEEP (24 * 4096 + 1 + 10)
static void test_gelu_libm(void)
{
    static float x[NSWEEP], y[NSWEEP], g[NSWEEP], one[NSWEEP];
    const float huge[10] = {INFINITY, -INFINITY, 3.4e38f, -3.4e38f, 1e20f, -1e20f, 1e5f, -1e5f, 13.0f, -13.0f};
    int n = 0, bad_y = 0, bad_g = 0;
    double worst_exp = 0;
    for (int i = 0; i <= 24 * 4096; i++) x[n++] = -12.0f + i / 4096.0f;
    for (int i = 0; i < 10; i++) x[n++] = huge[i];
    fill_const(one, NSWEEP, 1.0f);
    ddp_gelu_forward_cpu(y, x, NSWEEP);
    ddp_gelu_backward_cpu(g, x, one, NSWEEP);
    for (int i = 0; i < NSWEEP; i++) {
        double ry = gelu_libm(x[i]), rg = gelu_grad_libm(x[i]);
        int ok_y = isfinite(ry) ? fabs(y[i] - ry) <= 2e-7 + 1e-6 * fabs(ry)
                                : (x[i] > 0 ? y[i] == x[i] : fabsf(y[i]) < 1e-27f);
        int ok_g = isfinite(rg) ? fabs(g[i] - rg) <= 2e-7 + 1e-6 * fabs(rg)
                                : (x[i] > 0 ? g[i] == 1.0f : fabsf(g[i]) < 1e-26f);
        if (!ok_y && bad_y++ == 0) printf("  gelu(%g) = %.9g, libm %.9g\n", x[i], y[i], ry);
        if (!ok_g && bad_g++ == 0) printf("  gelu'(%g) = %.9g, libm %.9g\n", x[i], g[i], rg);
    }
    CHECK("kernels.gelu.forward.matches_libm", bad_y == 0, "%d of %d values off", bad_y, NSWEEP);
    CHECK("kernels.gelu.backward.matches_libm", bad_g == 0, "%d of %d values off", bad_g, NSWEEP);
    x[0] = NAN;
    ddp_gelu_forward_cpu(y, x, 1);
    ddp_gelu_backward_cpu(g, x, one, 1);
    CHECK("kernels.gelu.nan_propagates", isnan(y[0]) && isnan(g[0]), "gelu(NaN) = %g, gelu'(NaN) = %g", y[0], g[0]);
    for (float a = -87.0f; a <= 87.0f; a += 1.0f / 1024) {
        double e = exp((double)a), err = fabs(ddp__exp(a) - e) / e;
        worst_exp = err > worst_exp ? err : worst_exp;
    }
    CHECK("kernels.gelu.exp_2ulp", worst_exp <= 0x1p-22, "relative error %g > 2^-22", worst_exp);
}

static void test_gelu(void)
{
    static gelu_s s;
    float dx[NE], y[3];
    const float xs[3] = {-1.0f, 0.0f, 2.0f};
    fill(s.x, NE, 4); fill(s.w, NE, 1); fill_const(dx, NE, PREFILL);
    ddp_gelu_backward_cpu(dx, s.x, s.w, NE);
    check_grad("kernels.gelu.backward", gelu_loss, &s, s.x, dx, NE);
    /* reference values of the tanh form: gelu(-1), gelu(0), gelu(2) */
    ddp_gelu_forward_cpu(y, xs, 3);
    CHECK("kernels.gelu.forward", fabs(y[0] + 0.158808) < 1e-5 && y[1] == 0.0f && fabs(y[2] - 1.954598) < 1e-5,
          "got %.6f %.6f %.6f", y[0], y[1], y[2]);
    test_gelu_libm();
}

/* ---- residual ---- */
typedef struct { float a[NE], b[NE], out[NE], w[NE]; } res_s;
static double res_loss(void *p)
{
    res_s *s = (res_s *)p;
    ddp_residual_forward_cpu(s->out, s->a, s->b, NE);
    return weighted_sum(s->out, s->w, NE);
}
static void test_residual(void)
{
    static res_s s;
    float da[NE], db[NE];
    fill(s.a, NE, 1); fill(s.b, NE, 1); fill(s.w, NE, 1);
    fill_const(da, NE, PREFILL); fill_const(db, NE, PREFILL);
    ddp_residual_backward_cpu(da, db, s.w, NE);
    check_grad("kernels.residual.backward.inp1", res_loss, &s, s.a, da, NE);
    check_grad("kernels.residual.backward.inp2", res_loss, &s, s.b, db, NE);
}

/* ---- cross-entropy ---- */
typedef struct { float logits[B * T * V], losses[B * T], loss; int tgt[B * T]; } ce_s;
static double ce_loss(void *p)
{
    ce_s *s = (ce_s *)p;
    ddp_crossentropy_forward_backward_cpu(&s->loss, s->losses, NULL, s->logits, s->tgt, B, T, V, -1, 1.0f);
    return s->loss;
}
static void test_crossentropy(void)
{
    static ce_s s;
    static float dl[B * T * V];
    fill(s.logits, B * T * V, 3);
    for (int i = 0; i < B * T; i++) s.tgt[i] = (int)(rng_u32() % V);
    s.tgt[1] = s.tgt[7] = -1; /* padding */
    ddp_crossentropy_forward_backward_cpu(&s.loss, s.losses, dl, s.logits, s.tgt, B, T, V, -1, 1.0f);
    for (int i = 0; i < B * T * V; i++) dl[i] += PREFILL; /* dlogits is overwritten, not added */
    check_grad("kernels.crossentropy.backward", ce_loss, &s, s.logits, dl, B * T * V);

    /* softmax rows sum to 1: probs = dlogits * n_valid + onehot (dloss = 1) */
    ddp_crossentropy_forward_backward_cpu(&s.loss, s.losses, dl, s.logits, s.tgt, B, T, V, -1, 1.0f);
    double worst = 0.0, sum_valid = 0.0;
    int zero_ignored = 1;
    for (int i = 0; i < B * T; i++) {
        double ps = 0.0;
        for (int v = 0; v < V; v++) {
            ps += dl[i * V + v] * (B * T - 2) + (v == s.tgt[i]);
            if (s.tgt[i] == -1) zero_ignored &= dl[i * V + v] == 0.0f;
        }
        if (s.tgt[i] != -1) {
            worst = fmax(worst, fabs(ps - 1.0));
            sum_valid += s.losses[i];
        }
    }
    CHECK("kernels.crossentropy.softmax_rows_sum_to_1", worst < 1e-5, "max |sum - 1| = %g", worst);

    /* the ignored rows neither count in the mean nor get a gradient */
    double mean_valid = sum_valid / (B * T - 2);
    CHECK("kernels.crossentropy.ignore_index",
          fabs(s.loss - mean_valid) < 1e-6 && zero_ignored && s.losses[1] == 0.0f && s.losses[7] == 0.0f,
          "loss %.7f, mean over valid %.7f, ignored rows zero: %d", s.loss, mean_valid, zero_ignored);

    /* uniform logits: every row's loss is ln V */
    fill_const(s.logits, B * T * V, 0.25f);
    ce_loss(&s);
    CHECK("kernels.crossentropy.uniform_is_lnV", fabs(s.loss - log((double)V)) < 1e-6,
          "loss %.7f, ln V %.7f", s.loss, log((double)V));

    /* all targets ignored: loss 0, gradient 0, no division by zero */
    for (int i = 0; i < B * T; i++) s.tgt[i] = -1;
    ddp_crossentropy_forward_backward_cpu(&s.loss, s.losses, dl, s.logits, s.tgt, B, T, V, -1, 1.0f);
    CHECK("kernels.crossentropy.all_ignored", s.loss == 0.0f && dl[0] == 0.0f && dl[B * T * V - 1] == 0.0f,
          "loss %g", s.loss);
}

/* ---- AdamW: two steps against values worked out by hand ---- */
static void test_adamw(void)
{
    /* lr 0.1, betas (0.9, 0.999), weight decay 0.1. With a constant gradient g the
       bias-corrected moments are exactly g and g^2, so each step moves a parameter
       by -lr * (sign(g) + wd * p):
         p = 1.0, g = 0.5:  0.89   then 0.89 - 0.1 (1 + 0.089)  = 0.7811
         p = 0.5, g = -2:   0.595  then 0.595 + 0.1 (1 - 0.0595) = 0.68905
       m after two steps: 0.9*0.05 + 0.05 = 0.095;  v: 0.999*0.00025 + 0.00025 = 0.00049975
       (v to fp32 accuracy: 1 - 0.999f is not exactly 0.001) */
    float p[2] = {1.0f, 0.5f}, g[2] = {0.5f, -2.0f}, m[2] = {0, 0}, v[2] = {0, 0};
    ddp_adamw_update_cpu(p, g, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, 1);
    int ok1 = fabs(p[0] - 0.89) < 1e-6 && fabs(p[1] - 0.595) < 1e-6;
    ddp_adamw_update_cpu(p, g, m, v, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, 2);
    CHECK("kernels.adamw.update",
          ok1 && fabs(p[0] - 0.7811) < 1e-6 && fabs(p[1] - 0.68905) < 1e-6 &&
              fabs(m[0] - 0.095) < 1e-7 && fabs(v[0] - 0.00049975) < 1e-4 * 0.00049975,
          "after step 1 ok=%d, step 2 p = %.7f %.7f m = %.7f v = %.9f", ok1, p[0], p[1], m[0], v[0]);
    /* gradients past sqrt(FLT_MAX): v's bias-corrected value is past FLT_MAX, its square root
       is not, and the step is lr * sign(g) as above (it was 0: v * ic2 overflowed to inf) */
    float q[3] = {1.0f, 1.0f, 1.0f}, h[3] = {2e19f, -1e20f, 3e20f}, mq[3] = {0, 0, 0}, vq[3] = {0, 0, 0};
    ddp_adamw_update_cpu(q, h, mq, vq, 3, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    CHECK("kernels.adamw.huge_gradient", fabs(q[0] - 0.999) < 1e-6 && fabs(q[1] - 1.001) < 1e-6 &&
          fabs(q[2] - 0.999) < 1e-6, "p = %.7f %.7f %.7f after gradients 2e19, -1e20, 3e20 (expected 0.999, 1.001, "
          "0.999)", q[0], q[1], q[2]);
}

/* ---- gradient norm and clipping: a 3-4-12-13 right triangle ---- */
static void test_global_norm(void)
{
    float g[4] = {3, 4, 0, -12}, norm = 0;
    ddp_global_norm_cpu(&norm, g, 4);
    CHECK("kernels.global_norm", norm == 13.0f, "norm %g, expected 13", norm);
    ddp_clip_by_norm_cpu(g, 4, 20.0f, &norm);
    CHECK("kernels.clip_by_norm.below_max", g[0] == 3 && g[1] == 4 && g[3] == -12, "grads changed: %g %g %g", g[0], g[1], g[3]);
    ddp_clip_by_norm_cpu(g, 4, 6.5f, &norm);
    CHECK("kernels.clip_by_norm.above_max", fabs(g[0] - 1.5) < 1e-6 && fabs(g[1] - 2) < 1e-6 && fabs(g[3] + 6) < 1e-6,
          "got %g %g %g, expected 1.5 2 -6", g[0], g[1], g[3]);
}

/* ---- accuracy against double precision, and thread-count independence ---- */
static unsigned long long acc_state = 12345;
static double uniform01(void)
{
    acc_state ^= acc_state << 13;
    acc_state ^= acc_state >> 7;
    acc_state ^= acc_state << 17;
    return (double)(acc_state >> 11) / 9007199254740992.0;
}

/* n threads for the next parallel regions; 0: every core again */
static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n ? n : omp_get_num_procs());
#else
    (void)n;
#endif
}

/* A row's mean and 1/std in double, for the layernorm's reference. */
static void ln_reference(const float *x, int n, double *mean, double *inv_std)
{
    double m = 0.0, v = 0.0;
    for (int c = 0; c < n; c++) m += x[c];
    m /= n;
    for (int c = 0; c < n; c++) v += (x[c] - m) * (x[c] - m);
    *mean = m;
    *inv_std = 1.0 / sqrt(v / n + DDP_LAYERNORM_EPS);
}

/* Rows with mean 100 and std 0.1 (C = 768): the row's large mean must not cost the
   spread's digits. One fp32 accumulator gave 8.9e-4 here; the shifted sums 2.9e-7. */
static void test_layernorm_accuracy(void)
{
    enum { R = 16, LC = 768 };
    float *x = alloc(R * LC), *o = alloc(R * LC), *o3 = alloc(R * LC), *w = alloc(LC), *b = alloc(LC);
    float mean[R], rstd[R], mean3[R], rstd3[R];
    double worst = 0.0, worst_mean = 0.0;
    for (int i = 0; i < R * LC; i++) x[i] = (float)(100.0 + 0.1 * 1.7320508 * (2 * uniform01() - 1));
    fill_const(w, LC, 1);
    set_threads(1);
    ddp_layernorm_forward_cpu(o, mean, rstd, x, w, b, 1, R, LC);
    set_threads(3);
    ddp_layernorm_forward_cpu(o3, mean3, rstd3, x, w, b, 1, R, LC);
    set_threads(0);
    for (int r = 0; r < R; r++) {
        const float *xr = x + r * LC;
        double m, s;
        ln_reference(xr, LC, &m, &s);
        for (int c = 0; c < LC; c++) worst = fmax(worst, fabs(o[r * LC + c] - (xr[c] - m) * s));
        worst_mean = fmax(worst_mean, fabs(mean[r] - m));
    }
    CHECK("kernels.layernorm.accuracy.large_mean", worst <= 1e-5 && worst_mean <= 8e-6,
          "max |out - double| = %.3g (bound 1e-5), |mean - double| = %.3g (bound 8e-6, half an ulp at 100)", worst,
          worst_mean);
    CHECK("kernels.layernorm.threads", !memcmp(o, o3, R * LC * sizeof(float)) && !memcmp(mean, mean3, sizeof mean) &&
          !memcmp(rstd, rstd3, sizeof rstd), "results differ between 1 and 3 threads");
    /* an outlier (1e8 among values in [-1, 1]) first in its row, then elsewhere: the
       other outputs (about -0.036) keep their digits either way. When the row's first
       element was the shift, x - 1e8 rounded to 8 and cost them 3.8e-5 (torch: 4e-9). */
    worst = 0.0;
    for (int r = 0; r < 2; r++) {
        float *xr = x + r * LC;
        for (int c = 0; c < LC; c++) xr[c] = (float)(2 * uniform01() - 1);
        xr[r == 0 ? 0 : 5] = 1e8f;
    }
    ddp_layernorm_forward_cpu(o, mean, rstd, x, w, b, 1, 2, LC);
    for (int r = 0; r < 2; r++) {
        const float *xr = x + r * LC;
        double m, s;
        ln_reference(xr, LC, &m, &s);
        for (int c = 0; c < LC; c++) /* the outlier's own output (27.7) as a 768-term fp32 sum allows */
            worst = fmax(worst, fabs(o[r * LC + c] - (xr[c] - m) * s) / (1e-7 + 4e-6 * fabs((xr[c] - m) * s)));
    }
    CHECK("kernels.layernorm.accuracy.outlier", worst <= 1, "max |out - double| is %.3g times 1e-7 + 4e-6 |out|", worst);
    free(x); free(o); free(o3); free(w); free(b);
}

/* V = 50257 (GPT-2's vocabulary), logits uniform in [-8, 8]: the loss and every
   softmax probability against double precision. One fp32 sum of the exponentials
   gave loss 3e-6 and probabilities 5e-5 relative error here; the double sum 1.2e-7
   and 6e-7. */
static void test_crossentropy_accuracy(void)
{
    enum { R = 4, CV = 50257 };
    float *x = alloc((size_t)R * CV), *d = alloc((size_t)R * CV), *d3 = alloc((size_t)R * CV);
    float losses[R], losses3[R], loss, loss3;
    int tgt[R];
    double worst_loss = 0.0, worst_p = 0.0;
    for (size_t i = 0; i < (size_t)R * CV; i++) x[i] = (float)(8.0 * (2 * uniform01() - 1));
    for (int i = 0; i < R; i++) tgt[i] = (int)(uniform01() * CV);
    set_threads(1);
    ddp_crossentropy_forward_backward_cpu(&loss, losses, d, x, tgt, 1, R, CV, -1, 1.0f);
    set_threads(3);
    ddp_crossentropy_forward_backward_cpu(&loss3, losses3, d3, x, tgt, 1, R, CV, -1, 1.0f);
    set_threads(0);
    for (int i = 0; i < R; i++) {
        const float *xr = x + (size_t)i * CV;
        double m = -INFINITY, s = 0.0;
        for (int v = 0; v < CV; v++) m = fmax(m, xr[v]);
        for (int v = 0; v < CV; v++) s += exp((double)xr[v] - m);
        const double ref = log(s) + m - xr[tgt[i]];
        worst_loss = fmax(worst_loss, fabs(losses[i] - ref) / fabs(ref));
        for (int v = 0; v < CV; v++) {
            const double p = exp((double)xr[v] - m) / s / R; /* dlogits = (p - onehot) / n_valid */
            if (v != tgt[i]) worst_p = fmax(worst_p, fabs(d[(size_t)i * CV + v] - p) / p);
        }
    }
    CHECK("kernels.crossentropy.accuracy.loss_V50257", worst_loss <= 4e-7, "relative error %.3g > 4e-7", worst_loss);
    CHECK("kernels.crossentropy.accuracy.softmax_V50257", worst_p <= 2e-6, "relative error %.3g > 2e-6", worst_p);
    CHECK("kernels.crossentropy.threads", loss == loss3 && !memcmp(losses, losses3, sizeof losses) &&
          !memcmp(d, d3, (size_t)R * CV * sizeof(float)), "results differ between 1 and 3 threads");
    /* logits shifted by 1e4 give the same loss (softmax ignores the shift): the log of the
       sum once went into the shift's rounding first (0.29 relative error here) */
    {
        float sx[4] = {2, -5, -6, -7}, sl, sls, sd[4];
        const int st = 0;
        const double exact = log(1 + exp(-7.0) + exp(-8.0) + exp(-9.0));
        double worst_shift = 0.0;
        for (int k = 0; k < 4; k++) {
            const float shift = k == 0 ? 0.0f : k == 1 ? 30.0f : k == 2 ? 1000.0f : 1e4f;
            float xs[4];
            for (int v = 0; v < 4; v++) xs[v] = sx[v] + shift;
            ddp_crossentropy_forward_backward_cpu(&sl, &sls, sd, xs, &st, 1, 1, 4, -1, 1.0f);
            worst_shift = fmax(worst_shift, fabs(sl - exact) / exact);
        }
        CHECK("kernels.crossentropy.accuracy.large_logits", worst_shift <= 1e-6,
              "loss of logits shifted up to 1e4: relative error %.3g > 1e-6", worst_shift);
    }
    /* in place, as the GPU path uses it: dlogits overwrites logits */
    ddp_crossentropy_forward_backward_cpu(&loss3, losses3, x, x, tgt, 1, R, CV, -1, 1.0f);
    CHECK("kernels.crossentropy.in_place", loss == loss3 && !memcmp(d, x, (size_t)R * CV * sizeof(float)),
          "in-place result differs");
    free(x); free(d); free(d3);
}

/* A backward given NULL for an input gradient (the first layer's) computes the same
   parameter gradients and touches nothing else; given NULL parameter gradients, the
   same input gradient. */
static void test_null_dinp(void)
{
    const int N = B * T * C;
    float *x = alloc(N), *dout = alloc((size_t)B * T * OC), *w = alloc((size_t)OC * C), *dx = alloc(N);
    float *dw1 = alloc((size_t)OC * C), *db1 = alloc(OC), *dw2 = alloc((size_t)OC * C), *db2 = alloc(OC);
    float *lw = alloc(C), *lb = alloc(C), *ln = alloc(N), *mean = alloc(B * T), *rstd = alloc(B * T);
    float *ldw1 = alloc(C), *ldb1 = alloc(C), *ldw2 = alloc(C), *ldb2 = alloc(C), *g = alloc(N);
    float *qkv = alloc((size_t)3 * N), *att = alloc(N), *lse = alloc(B * NH * T);
    fill(x, N, 1); fill(dout, (size_t)B * T * OC, 1); fill(w, (size_t)OC * C, 1); fill(lw, C, 1); fill(lb, C, 1);
    fill(g, N, 1); fill(qkv, (size_t)3 * N, 1);
    ddp_matmul_backward_cpu(dx, dw1, db1, dout, x, w, B, T, C, OC);
    ddp_matmul_backward_cpu(NULL, dw2, db2, dout, x, w, B, T, C, OC);
    CHECK("kernels.null_dinp.matmul", !memcmp(dw1, dw2, (size_t)OC * C * sizeof(float)) &&
          !memcmp(db1, db2, OC * sizeof(float)), "dweight or dbias differ without dinp");
    float *dx2 = alloc(N);
    ddp_matmul_backward_cpu(dx2, NULL, NULL, dout, x, w, B, T, C, OC);
    CHECK("kernels.null_dweight.matmul", !memcmp(dx, dx2, N * sizeof(float)), "dinp differs without dweight");
    ddp_layernorm_forward_cpu(ln, mean, rstd, x, lw, lb, B, T, C);
    ddp_layernorm_backward_cpu(dx, ldw1, ldb1, g, x, lw, mean, rstd, B, T, C);
    ddp_layernorm_backward_cpu(NULL, ldw2, ldb2, g, x, lw, mean, rstd, B, T, C);
    CHECK("kernels.null_dinp.layernorm", !memcmp(ldw1, ldw2, C * sizeof(float)) && !memcmp(ldb1, ldb2, C * sizeof(float)),
          "dweight or dbias differ without dinp");
    memcpy(dx2, dx, N * sizeof(float));
    ddp_layernorm_backward_cpu(dx, ldw1, ldb1, g, x, lw, mean, rstd, B, T, C);
    ddp_layernorm_backward_cpu(dx2, NULL, NULL, g, x, lw, mean, rstd, B, T, C);
    CHECK("kernels.null_dweight.layernorm", !memcmp(dx, dx2, N * sizeof(float)), "dinp differs without dweight");
    free(dx2);
    /* the rest have no parameters: NULL is a no-op that must not crash */
    ddp_attention_forward_cpu(att, lse, qkv, B, T, C, NH);
    ddp_attention_backward_cpu(NULL, g, qkv, att, lse, B, T, C, NH);
    ddp_gelu_backward_cpu(NULL, x, g, N);
    memcpy(dx, g, N * sizeof(float));
    ddp_residual_backward_cpu(NULL, dx, g, N);
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= dx[i] == 2 * g[i];
    ddp_residual_backward_cpu(dx, NULL, g, N);
    for (int i = 0; i < N; i++) ok &= dx[i] == 3 * g[i];
    CHECK("kernels.null_dinp.residual", ok, "the non-NULL side is not dinp + dout");
    free(x); free(dout); free(w); free(dx); free(dw1); free(db1); free(dw2); free(db2); free(lw); free(lb); free(ln);
    free(mean); free(rstd); free(ldw1); free(ldb1); free(ldw2); free(ldb2); free(g); free(qkv); free(att); free(lse);
}

/* The GPU attention grid, computed in plain C: heads in x (up to 2^31-1), row tiles in y
   (up to 65535). B*NH past 65535 must fit (it did not when heads were in y). */
static void test_attention_grid(void)
{
    unsigned gx = 0, gy = 0;
    const int many = ddp__att_grid(35000, 2, 3, 64, &gx, &gy) && gx == 70000 && gy == 1;
    const int gpt2 = ddp__att_grid(8, 12, 1024, 64, &gx, &gy) && gx == 96 && gy == 16;
    const int longest = ddp__att_grid(1, 1, 65535L * 64, 64, &gx, &gy) && gy == 65535;
    const int too_long = !ddp__att_grid(1, 1, 65535L * 64 + 1, 64, &gx, &gy);
    const int too_many = !ddp__att_grid(1L << 16, 1L << 15, 1, 64, &gx, &gy);
    CHECK("kernels.attention.gpu_grid", many && gpt2 && longest && too_long && too_many,
          "B*NH=70000 %d, GPT-2 %d, T=65535*64 %d, one more row refused %d, 2^31 heads refused %d", many, gpt2,
          longest, too_long, too_many);
}

/* --digest: one line, a hash of the matmuls' bits (forward, input and weight gradients,
   the per-sequence sum) at shapes that cross the tiles' edges, a panel's depth, a block
   of rows, the packed and the tile-by-tile weight gradient: a build whose multiply-adds
   are fused gives the same line on any tile and instruction set (tests/test_kernels_isa.sh
   compares builds). The rest of the kernels call ddp__exp, whose bits follow the build. */
static unsigned long long digest_add(unsigned long long h, const void *p, size_t bytes)
{
    const unsigned char *c = (const unsigned char *)p;
    for (size_t i = 0; i < bytes; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}
static int matmul_digest(void)
{
    static const int shapes[][4] = {{1, 7, 19, 33}, {2, 37, 300, 20}, {3, 50, 40, 1030}, {4, 100, 400, 9},
                                    {2, 130, 260, 70}, {8, 64, 128, 384}};
    unsigned long long h = 1469598103934665603ull;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int SB = shapes[s][0], ST = shapes[s][1], SC = shapes[s][2], SOC = shapes[s][3];
        const size_t M = (size_t)SB * ST;
        float *x = alloc(M * SC), *wt = alloc((size_t)SOC * SC), *bias = alloc(SOC), *dout = alloc(M * SOC);
        float *out = alloc(M * SOC), *dx = alloc(M * SC), *dw = alloc((size_t)SOC * SC), *db = alloc(SOC);
        double *sw = (double *)calloc((size_t)SOC * SC, sizeof(double)), *sb = (double *)calloc(SOC, sizeof(double));
        float *all[4] = {x, wt, bias, dout};
        const size_t n[4] = {M * SC, (size_t)SOC * SC, (size_t)SOC, M * SOC};
        for (int k = 0; k < 4; k++) /* every bit of the mantissa (fill's products are exact: fused or not alike) */
            for (size_t i = 0; i < n[k]; i++) all[k][i] = (float)rng_u32() / 4294967296.0f - 0.5f;
        ddp_matmul_forward_cpu(out, x, wt, bias, SB, ST, SC, SOC);
        ddp_matmul_backward_cpu(dx, dw, db, dout, x, wt, SB, ST, SC, SOC);
        ddp_matmul_backward_sum_cpu(sw, sb, dout, x, SB, ST, SC, SOC);
        h = digest_add(h, out, M * SOC * sizeof(float));
        h = digest_add(h, dx, M * SC * sizeof(float));
        h = digest_add(h, dw, (size_t)SOC * SC * sizeof(float));
        h = digest_add(h, db, SOC * sizeof(float));
        h = digest_add(h, sw, (size_t)SOC * SC * sizeof(double));
        h = digest_add(h, sb, SOC * sizeof(double));
        free(x); free(wt); free(bias); free(dout); free(out); free(dx); free(dw); free(db); free(sw); free(sb);
    }
    printf("matmul digest %016llx (tile %s)\n", h, DDP_KERNELS_CPU_TILE);
    return 0;
}

int main(int argc, char **argv)
{
    (void)test_skip; /* every CPU check always runs */
    if (argc == 2 && strcmp(argv[1], "--digest") == 0) return matmul_digest();
    test_embedding();
    test_layernorm();
    test_matmul();
    test_matmul_blocked();
    test_matmul_sum();
    test_matmul_input();
    test_attention();
    test_gelu();
    test_residual();
    test_crossentropy();
    test_adamw();
    test_global_norm();
    test_layernorm_accuracy();
    test_crossentropy_accuracy();
    test_null_dinp();
    test_attention_grid();
    TEST_EXIT();
}
