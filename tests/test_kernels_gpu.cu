/* tests/test_kernels_gpu.cu - every GPU kernel of ddp_kernels.cuh against its CPU twin.
   Each check runs in fp32 (relative error <= 1e-5) and bf16 (<= 1e-2) on fresh random
   inputs, for three shapes: odd sizes (scalar paths, head size 4), several attention
   tiles with a partial one (head size 64), and head size 128. bf16 inputs are rounded
   first and the CPU twin sees the same rounded values. Outputs are poisoned with 0xFF
   bytes (NaN) before each run; gradients start from random values, so "+=" is checked.
   Every backward also runs twice: the results must be bitwise equal. Parameter
   gradients are fp32 in both modes (the launchers take float* for them).
   Without a GPU, ddp_kernels_init must fail and name the cause; every other check
   prints SKIP with that cause (FAIL under DDP_REQUIRE_GPU=1, see test_gpu_ready).
   tests/test_kernels_gpu WORD runs only the checks whose names contain WORD. */
#include "ddp_kernels.cuh"
#include "tests/test.h"
#include <math.h>
#include <string.h>
#include <vector>

struct Shape { const char *name; int B, T, C, NH, V, OC; };
static const Shape shapes[] = {
    {"odd", 2, 5, 12, 3, 7, 9},
    {"tiles", 2, 150, 192, 3, 333, 200},
    {"hs128", 1, 70, 256, 2, 64, 40},
};

struct Result {
    double err = 0.0;  /* worst relative error over the compared tensors */
    int same = -1;     /* backward rerun bitwise equal: 1 yes, 0 no, -1 not checked */
    const char *why = "";
};

static ddp_kernels_ctx g_ctx;

/* ---- host helpers ---- */
static unsigned long long g_rng = 0x2545F4914F6CDD1Dull;
static unsigned rng_u32()
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (unsigned)(g_rng >> 32);
}
static std::vector<float> rnd(size_t n, float scale)
{
    std::vector<float> v(n);
    for (float &x : v) x = scale * ((float)(rng_u32() % 20001) / 10000.0f - 1.0f);
    return v;
}
static std::vector<int> rnd_int(size_t n, int hi)
{
    std::vector<int> v(n);
    for (int &x : v) x = (int)(rng_u32() % (unsigned)hi);
    return v;
}

static float to_host_float(float x) { return x; }
static float to_host_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename F> static F from_host_float(float x);
template <> float from_host_float<float>(float x) { return x; }
template <> __nv_bfloat16 from_host_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

/* max |gpu - ref| / max(max |ref|, 1e-3); NaN anywhere counts as infinite */
static double relerr(const std::vector<float> &gpu, const std::vector<float> &ref)
{
    double e = 0.0, m = 1e-3;
    for (size_t i = 0; i < ref.size(); i++) {
        if (isnan(gpu[i])) return INFINITY;
        e = fmax(e, fabs((double)gpu[i] - ref[i]));
        m = fmax(m, fabs((double)ref[i]));
    }
    return e / m;
}

/* Device buffers of one check, freed when it ends. */
struct Bufs {
    std::vector<void *> ptrs;
    ~Bufs() { for (void *p : ptrs) cudaFree(p); }
    template <typename F> F *alloc(size_t n) /* poisoned: every byte 0xFF */
    {
        void *p = NULL;
        if (cudaMalloc(&p, n * sizeof(F)) != cudaSuccess) return NULL;
        ptrs.push_back(p);
        cudaMemset(p, 0xFF, n * sizeof(F));
        return (F *)p;
    }
    /* rounds h to F in place, so the CPU twin sees what the GPU sees */
    template <typename F> F *up(std::vector<float> &h)
    {
        std::vector<F> t(h.size());
        for (size_t i = 0; i < h.size(); i++) {
            t[i] = from_host_float<F>(h[i]);
            h[i] = to_host_float(t[i]);
        }
        F *d = alloc<F>(h.size());
        if (d) cudaMemcpy(d, t.data(), t.size() * sizeof(F), cudaMemcpyHostToDevice);
        return d;
    }
    int *up_int(const std::vector<int> &h)
    {
        int *d = alloc<int>(h.size());
        if (d) cudaMemcpy(d, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice);
        return d;
    }
};

/* A device buffer of either type, for checks whose gradients mix F and fp32. */
struct Dev {
    void *p;
    bool bf16;
    Dev(float *q) : p(q), bf16(false) {}
    Dev(__nv_bfloat16 *q) : p(q), bf16(true) {}
};

template <typename F> static cudaError_t reload(F *d, const std::vector<float> &h)
{
    std::vector<F> t(h.size());
    for (size_t i = 0; i < h.size(); i++) t[i] = from_host_float<F>(h[i]);
    return cudaMemcpy(d, t.data(), t.size() * sizeof(F), cudaMemcpyHostToDevice);
}

template <typename F> static cudaError_t down(std::vector<float> &h, const F *d, size_t n)
{
    std::vector<F> t(n);
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(t.data(), d, n * sizeof(F), cudaMemcpyDeviceToHost);
    h.resize(n);
    for (size_t i = 0; i < n; i++) h[i] = to_host_float(t[i]);
    return e;
}

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { r->err = INFINITY; r->why = cudaGetErrorString(e_); return; } } while (0)
#define ALLOCATED(...) do { if (!(__VA_ARGS__)) { r->err = INFINITY; r->why = "cudaMalloc failed"; return; } } while (0)
#define WORST(gpu, ref) (r->err = fmax(r->err, relerr(gpu, ref)))

static cudaError_t reload(Dev d, const std::vector<float> &h)
{
    return d.bf16 ? reload((__nv_bfloat16 *)d.p, h) : reload((float *)d.p, h);
}

static cudaError_t down(std::vector<float> &h, Dev d, size_t n)
{
    return d.bf16 ? down(h, (const __nv_bfloat16 *)d.p, n) : down(h, (const float *)d.p, n);
}

/* Runs a backward from freshly loaded gradients twice; keeps the first result in
   out and records whether the second matched it bit for bit. */
template <typename Run>
static cudaError_t twice(Result *r, Run run, std::vector<Dev> grads, std::vector<std::vector<float>> init,
                         std::vector<std::vector<float>> &out)
{
    std::vector<std::vector<float>> again(grads.size());
    out.assign(grads.size(), std::vector<float>());
    for (int pass = 0; pass < 2; pass++) {
        cudaError_t e = cudaSuccess;
        for (size_t i = 0; i < grads.size() && !e; i++) e = reload(grads[i], init[i]);
        if (!e) e = run();
        for (size_t i = 0; i < grads.size() && !e; i++) e = down(pass ? again[i] : out[i], grads[i], init[i].size());
        if (e) return e;
    }
    int same = 1;
    for (size_t i = 0; i < grads.size(); i++)
        same &= memcmp(out[i].data(), again[i].data(), out[i].size() * sizeof(float)) == 0;
    r->same = r->same != 0 && same; /* a check may call twice() more than once */
    return cudaSuccess;
}

/* ---- checks ---- */
template <typename F> static void t_embedding_fwd(const Shape &s, Result *r)
{
    Bufs m;
    const int BT = s.B * s.T;
    auto wte = rnd((size_t)s.V * s.C, 1), wpe = rnd((size_t)s.T * s.C, 1);
    auto tok = rnd_int(BT, s.V);
    F *dwte = m.up<F>(wte), *dwpe = m.up<F>(wpe), *dout = m.alloc<F>((size_t)BT * s.C);
    int *dtok = m.up_int(tok);
    ALLOCATED(dwte && dwpe && dout && dtok);
    CK(ddp_embedding_forward_gpu(&g_ctx, dout, dtok, dwte, dwpe, s.B, s.T, s.C, 0));
    std::vector<float> ref((size_t)BT * s.C), got;
    ddp_embedding_forward_cpu(ref.data(), tok.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    CK(down(got, dout, ref.size()));
    WORST(got, ref);
}

template <typename F> static void t_embedding_bwd(const Shape &s, Result *r)
{
    Bufs m;
    const int BT = s.B * s.T;
    auto gout = rnd((size_t)BT * s.C, 1), gwte = rnd((size_t)s.V * s.C, 1), gwpe = rnd((size_t)s.T * s.C, 1);
    auto tok = rnd_int(BT, s.V < 13 ? s.V : 13); /* long runs of repeated tokens */
    F *dgout = m.up<F>(gout);
    float *dgwte = m.up<float>(gwte), *dgwpe = m.up<float>(gwpe);
    int *dtok = m.up_int(tok);
    ALLOCATED(dgout && dgwte && dgwpe && dtok);
    std::vector<std::vector<float>> got;
    CK(twice(r, [&] { return ddp_embedding_backward_gpu(&g_ctx, dgwte, dgwpe, dgout, dtok, s.B, s.T, s.C, 0); },
                {dgwte, dgwpe}, {gwte, gwpe}, got));
    ddp_embedding_backward_cpu(gwte.data(), gwpe.data(), gout.data(), tok.data(), s.B, s.T, s.C);
    WORST(got[0], gwte);
    WORST(got[1], gwpe);
}

template <typename F> static void t_layernorm_fwd(const Shape &s, Result *r)
{
    Bufs m;
    const int BT = s.B * s.T;
    auto x = rnd((size_t)BT * s.C, 2), w = rnd(s.C, 1), b = rnd(s.C, 1);
    x[0] = 1e4f; /* the first row's first element an outlier: its sums are made again around its mean */
    F *dx = m.up<F>(x), *dw = m.up<F>(w), *db = m.up<F>(b), *dout = m.alloc<F>((size_t)BT * s.C);
    float *dmean = m.alloc<float>(BT), *drstd = m.alloc<float>(BT);
    ALLOCATED(dx && dw && db && dout && dmean && drstd);
    CK(ddp_layernorm_forward_gpu(&g_ctx, dout, dmean, drstd, dx, dw, db, s.B, s.T, s.C, 0));
    std::vector<float> out((size_t)BT * s.C), mean(BT), rstd(BT), got;
    ddp_layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), s.B, s.T, s.C);
    CK(down(got, dout, out.size())); WORST(got, out);
    CK(down(got, dmean, mean.size())); WORST(got, mean);
    CK(down(got, drstd, rstd.size())); WORST(got, rstd);
}

template <typename F> static void t_layernorm_bwd(const Shape &s, Result *r)
{
    Bufs m;
    const int BT = s.B * s.T;
    const size_t N = (size_t)BT * s.C;
    auto x = rnd(N, 2), w = rnd(s.C, 1), b = rnd(s.C, 1), gout = rnd(N, 1);
    auto gx = rnd(N, 1), gw = rnd(s.C, 1), gb = rnd(s.C, 1);
    std::vector<float> out(N), mean(BT), rstd(BT);
    F *dx = m.up<F>(x), *dw = m.up<F>(w), *dgout = m.up<F>(gout);
    F *dgx = m.up<F>(gx);
    float *dgw = m.up<float>(gw), *dgb = m.up<float>(gb);
    m.up<F>(b); /* rounds b like the others */
    ddp_layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), s.B, s.T, s.C);
    float *dmean = m.up<float>(mean), *drstd = m.up<float>(rstd);
    ALLOCATED(dx && dw && dgout && dgx && dgw && dgb && dmean && drstd);
    std::vector<std::vector<float>> got;
    CK(twice(r, [&] { return ddp_layernorm_backward_gpu(&g_ctx, dgx, dgw, dgb, dgout, dx, dw, dmean, drstd,
                                                            s.B, s.T, s.C, 0); },
                {dgx, dgw, dgb}, {gx, gw, gb}, got));
    /* without dinp (a first layer): the same parameter gradients */
    std::vector<std::vector<float>> got2;
    CK(twice(r, [&] { return ddp_layernorm_backward_gpu(&g_ctx, (F *)NULL, dgw, dgb, dgout, dx, dw, dmean, drstd,
                                                      s.B, s.T, s.C, 0); },
             {dgw, dgb}, {gw, gb}, got2));
    ddp_layernorm_backward_cpu(gx.data(), gw.data(), gb.data(), gout.data(), x.data(), w.data(), mean.data(),
                               rstd.data(), s.B, s.T, s.C);
    WORST(got[0], gx);
    WORST(got[1], gw);
    WORST(got[2], gb);
    WORST(got2[0], gw);
    WORST(got2[1], gb);
}

static int count_plans()
{
    int n = 0;
    for (const ddp__lt_plan &p : g_ctx.plans) n += p.state != 0;
    return n;
}

template <typename F> static void t_matmul_fwd(const Shape &s, Result *r)
{
    Bufs m;
    const int BT = s.B * s.T;
    auto x = rnd((size_t)BT * s.C, 1), w = rnd((size_t)s.OC * s.C, 1), b = rnd(s.OC, 1);
    F *dx = m.up<F>(x), *dw = m.up<F>(w), *db = m.up<F>(b), *dout = m.alloc<F>((size_t)BT * s.OC);
    F *dout2 = m.alloc<F>((size_t)BT * s.OC);
    ALLOCATED(dx && dw && db && dout && dout2);
    CK(ddp_matmul_forward_gpu(&g_ctx, dout, dx, dw, db, s.B, s.T, s.C, s.OC, 0));
    CK(ddp_matmul_forward_gpu(&g_ctx, dout2, dx, dw, NULL, s.B, s.T, s.C, s.OC, 0));
    /* planned once: running both again adds no plan to the context's cache */
    const int plans = count_plans();
    CK(ddp_matmul_forward_gpu(&g_ctx, dout, dx, dw, db, s.B, s.T, s.C, s.OC, 0));
    CK(ddp_matmul_forward_gpu(&g_ctx, dout2, dx, dw, NULL, s.B, s.T, s.C, s.OC, 0));
    if (count_plans() != plans || plans == 0) {
        r->err = INFINITY;
        r->why = "the same shapes made new cuBLASLt plans";
        return;
    }
    std::vector<float> out((size_t)BT * s.OC), out2(out.size()), got;
    ddp_matmul_forward_cpu(out.data(), x.data(), w.data(), b.data(), s.B, s.T, s.C, s.OC);
    ddp_matmul_forward_cpu(out2.data(), x.data(), w.data(), NULL, s.B, s.T, s.C, s.OC);
    CK(down(got, dout, out.size())); WORST(got, out);
    CK(down(got, dout2, out2.size())); WORST(got, out2);
}

template <typename F> static void t_matmul_bwd(const Shape &s, Result *r)
{
    Bufs m;
    const int BT = s.B * s.T;
    auto x = rnd((size_t)BT * s.C, 1), w = rnd((size_t)s.OC * s.C, 1), gout = rnd((size_t)BT * s.OC, 1);
    auto gx = rnd(x.size(), 1), gw = rnd(w.size(), 1), gb = rnd(s.OC, 1);
    F *dx = m.up<F>(x), *dw = m.up<F>(w), *dgout = m.up<F>(gout);
    F *dgx = m.up<F>(gx);
    float *dgw = m.up<float>(gw), *dgb = m.up<float>(gb);
    ALLOCATED(dx && dw && dgout && dgx && dgw && dgb);
    std::vector<std::vector<float>> got, got2;
    CK(twice(r, [&] { return ddp_matmul_backward_gpu(&g_ctx, dgx, dgw, dgb, dgout, dx, dw, s.B, s.T, s.C, s.OC, 0); },
                {dgx, dgw, dgb}, {gx, gw, gb}, got));
    /* without dinp (a first layer): the same parameter gradients */
    CK(twice(r, [&] { return ddp_matmul_backward_gpu(&g_ctx, (F *)NULL, dgw, dgb, dgout, dx, dw, s.B, s.T, s.C, s.OC, 0); },
                {dgw, dgb}, {gw, gb}, got2));
    ddp_matmul_backward_cpu(gx.data(), gw.data(), gb.data(), gout.data(), x.data(), w.data(), s.B, s.T, s.C, s.OC);
    WORST(got[0], gx);
    WORST(got[1], gw);
    WORST(got[2], gb);
    WORST(got2[0], gw);
    WORST(got2[1], gb);
}

/* The tied lm_head at an unpadded GPT-2 vocabulary (50257): bf16 rows of 50257
   elements are not 16-byte aligned, which cuBLASLt may decline; the launchers then
   take cublasGemmEx. The fp32 weight gradient beside bf16 activations too. */
template <typename F> static void t_matmul_vocab(const Shape &, Result *r)
{
    Bufs m;
    const int B = 1, T = 6, C = 64, V = 50257, BT = B * T;
    auto x = rnd((size_t)BT * C, 1), w = rnd((size_t)V * C, 1), gout = rnd((size_t)BT * V, 1);
    auto gx = rnd(x.size(), 1), gw = rnd(w.size(), 1);
    F *dx = m.up<F>(x), *dw = m.up<F>(w), *dgout = m.up<F>(gout), *dout = m.alloc<F>((size_t)BT * V);
    F *dgx = m.up<F>(gx);
    float *dgw = m.up<float>(gw);
    ALLOCATED(dx && dw && dgout && dout && dgx && dgw);
    CK(ddp_matmul_forward_gpu(&g_ctx, dout, dx, dw, NULL, B, T, C, V, 0));
    std::vector<std::vector<float>> got;
    CK(twice(r, [&] { return ddp_matmul_backward_gpu(&g_ctx, dgx, dgw, (float *)NULL, dgout, dx, dw, B, T, C, V, 0); },
             {dgx, dgw}, {gx, gw}, got));
    std::vector<float> out((size_t)BT * V), fwd;
    ddp_matmul_forward_cpu(out.data(), x.data(), w.data(), NULL, B, T, C, V);
    ddp_matmul_backward_cpu(gx.data(), gw.data(), NULL, gout.data(), x.data(), w.data(), B, T, C, V);
    CK(down(fwd, dout, out.size()));
    WORST(fwd, out);
    WORST(got[0], gx);
    WORST(got[1], gw);
}

template <typename F> static void t_attention_fwd(const Shape &s, Result *r)
{
    Bufs m;
    const int BT = s.B * s.T;
    auto x = rnd((size_t)BT * 3 * s.C, 2);
    F *dx = m.up<F>(x), *dout = m.alloc<F>((size_t)BT * s.C);
    float *dlse = m.alloc<float>((size_t)s.B * s.NH * s.T);
    ALLOCATED(dx && dout && dlse);
    CK(ddp_attention_forward_gpu(&g_ctx, dout, dlse, dx, s.B, s.T, s.C, s.NH, 0));
    std::vector<float> out((size_t)BT * s.C), lse((size_t)s.B * s.NH * s.T), got;
    ddp_attention_forward_cpu(out.data(), lse.data(), x.data(), s.B, s.T, s.C, s.NH);
    CK(down(got, dout, out.size())); WORST(got, out);
    CK(down(got, dlse, lse.size())); WORST(got, lse);
}

template <typename F> static void t_attention_bwd(const Shape &s, Result *r)
{
    Bufs m;
    const int BT = s.B * s.T;
    auto x = rnd((size_t)BT * 3 * s.C, 2), gout = rnd((size_t)BT * s.C, 1), gx = rnd(x.size(), 1);
    std::vector<float> out((size_t)BT * s.C), lse((size_t)s.B * s.NH * s.T);
    F *dx = m.up<F>(x), *dgout = m.up<F>(gout), *dgx = m.up<F>(gx);
    ddp_attention_forward_cpu(out.data(), lse.data(), x.data(), s.B, s.T, s.C, s.NH);
    F *dout = m.up<F>(out); /* the backward sees out as stored in F */
    float *dlse = m.up<float>(lse);
    ALLOCATED(dx && dgout && dgx && dout && dlse);
    std::vector<std::vector<float>> got;
    CK(twice(r, [&] { return ddp_attention_backward_gpu(&g_ctx, dgx, dgout, dx, dout, dlse, s.B, s.T, s.C, s.NH, 0); },
                {dgx}, {gx}, got));
    CK(ddp_attention_backward_gpu(&g_ctx, (F *)NULL, dgout, dx, dout, dlse, s.B, s.T, s.C, s.NH, 0)); /* no-op */
    ddp_attention_backward_cpu(gx.data(), gout.data(), x.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH);
    WORST(got[0], gx);
}

/* The same through the streaming kernels, which attention uses where a head's T x T
   scores would not fit DDP_KERNELS_ATT_SCRATCH (the shapes here take the products). */
template <typename F> static void t_attention_fwd_streaming(const Shape &s, Result *r)
{
    g_ctx.attention_streaming = 1;
    t_attention_fwd<F>(s, r);
    g_ctx.attention_streaming = 0;
}

template <typename F> static void t_attention_bwd_streaming(const Shape &s, Result *r)
{
    g_ctx.attention_streaming = 1;
    t_attention_bwd<F>(s, r);
    g_ctx.attention_streaming = 0;
}

/* More heads than grid.y allows (B*NH = 70000 > 65535), head size 4, T = 3: the
   streaming kernels' grid puts heads in x; the products take them in groups of 32768. */
template <typename F> static void t_attention_many_heads(const Shape &, Result *r)
{
    Bufs m;
    const int B = 35000, T = 3, NH = 2, C = 8, BT = B * T;
    auto x = rnd((size_t)BT * 3 * C, 2), gout = rnd((size_t)BT * C, 1), gx = rnd(x.size(), 1);
    F *dx = m.up<F>(x), *dout = m.alloc<F>((size_t)BT * C), *dgout = m.up<F>(gout), *dgx = m.up<F>(gx);
    float *dlse = m.alloc<float>((size_t)B * NH * T);
    ALLOCATED(dx && dout && dgout && dgx && dlse);
    CK(ddp_attention_forward_gpu(&g_ctx, dout, dlse, dx, B, T, C, NH, 0));
    std::vector<float> out((size_t)BT * C), lse((size_t)B * NH * T), got;
    ddp_attention_forward_cpu(out.data(), lse.data(), x.data(), B, T, C, NH);
    CK(down(got, dout, out.size())); WORST(got, out);
    CK(down(got, dlse, lse.size())); WORST(got, lse);
    F *dout_ref = m.up<F>(out);
    float *dlse_ref = m.up<float>(lse);
    ALLOCATED(dout_ref && dlse_ref);
    CK(ddp_attention_backward_gpu(&g_ctx, dgx, dgout, dx, dout_ref, dlse_ref, B, T, C, NH, 0));
    ddp_attention_backward_cpu(gx.data(), gout.data(), x.data(), out.data(), lse.data(), B, T, C, NH);
    CK(down(got, dgx, gx.size())); WORST(got, gx);
}

template <typename F> static void t_attention_many_heads_streaming(const Shape &s, Result *r)
{
    g_ctx.attention_streaming = 1;
    t_attention_many_heads<F>(s, r);
    g_ctx.attention_streaming = 0;
}

template <typename F> static void t_gelu_fwd(const Shape &s, Result *r)
{
    Bufs m;
    const size_t N = (size_t)s.B * s.T * 4 * s.C + 3; /* +3: a ragged tail */
    auto x = rnd(N, 4);
    F *dx = m.up<F>(x), *dout = m.alloc<F>(N);
    ALLOCATED(dx && dout);
    CK(ddp_gelu_forward_gpu(&g_ctx, dout, dx, N, 0));
    std::vector<float> out(N), got;
    ddp_gelu_forward_cpu(out.data(), x.data(), N);
    CK(down(got, dout, N)); WORST(got, out);
}

/* The tails, element by element (relerr scales by the largest value, where these vanish):
   x from -1e20 to inf, gelu and gelu' against the CPU twin, each relative to itself; the
   GPU's 0.5 x (1 + tanh) was 30% off at -5 and 0 from -6, and NaN past |x| ~ 1.8e19. */
template <typename F> static void t_gelu_tails(const Shape &, Result *r)
{
    Bufs m;
    std::vector<float> x;
    for (float v = -12.0f; v <= 12.0f; v += 0.375f) x.push_back(v);
    for (float v : {-INFINITY, -1e20f, -9.0f, -8.9f, -5.0f, -4.0f, 1e20f, INFINITY}) x.push_back(v);
    const size_t N = x.size();
    std::vector<float> one(N, 1.0f), zero(N, 0.0f), out(N), gx(N, 0.0f), got;
    F *dx = m.up<F>(x), *dout = m.alloc<F>(N), *done = m.up<F>(one), *dgx = m.up<F>(zero);
    ALLOCATED(dx && dout && done && dgx);
    CK(ddp_gelu_forward_gpu(&g_ctx, dout, dx, N, 0));
    CK(ddp_gelu_backward_gpu(&g_ctx, dgx, dx, done, N, 0));
    ddp_gelu_forward_cpu(out.data(), x.data(), N);
    ddp_gelu_backward_cpu(gx.data(), x.data(), one.data(), N);
    for (int pass = 0; pass < 2; pass++) {
        const std::vector<float> &ref = pass ? gx : out;
        CK(pass ? down(got, dgx, N) : down(got, dout, N));
        for (size_t i = 0; i < N; i++) {
            const double d = got[i] == ref[i] ? 0.0 : fabs((double)got[i] - ref[i]) / fmax(fabs((double)ref[i]), 1e-38);
            if (isnan(d) || isnan(got[i]) != isnan(ref[i])) r->err = INFINITY; /* inf - inf, or a NaN */
            else r->err = fmax(r->err, d);
        }
    }
}

/* Scores of about 1e5 (inputs x300, head size 8), the tensor-core path: its softmax took
   exp(fma(s, scale, -m)) against a max of the rounded products, exp of the rounding error
   (a lone key weighed 1.008, output 4 off); the CPU twin is exact here. Forward only: the
   backward at such scores is ill-conditioned on the CPU too (0.04 off float64). */
template <typename F> static void t_attention_large_scores(const Shape &, Result *r)
{
    Bufs m;
    const int B = 2, T = 8, C = 16, NH = 2, BT = B * T;
    auto x = rnd((size_t)BT * 3 * C, 300.0f);
    F *dx = m.up<F>(x), *dout = m.alloc<F>((size_t)BT * C);
    float *dlse = m.alloc<float>((size_t)B * NH * T);
    ALLOCATED(dx && dout && dlse);
    CK(ddp_attention_forward_gpu(&g_ctx, dout, dlse, dx, B, T, C, NH, 0));
    std::vector<float> out((size_t)BT * C), lse((size_t)B * NH * T), got;
    ddp_attention_forward_cpu(out.data(), lse.data(), x.data(), B, T, C, NH);
    CK(down(got, dout, out.size())); WORST(got, out);
    CK(down(got, dlse, lse.size())); WORST(got, lse);
}

template <typename F> static void t_gelu_bwd(const Shape &s, Result *r)
{
    Bufs m;
    const size_t N = (size_t)s.B * s.T * 4 * s.C + 3;
    auto x = rnd(N, 4), gout = rnd(N, 1), gx = rnd(N, 1);
    F *dx = m.up<F>(x), *dgout = m.up<F>(gout), *dgx = m.up<F>(gx);
    ALLOCATED(dx && dgout && dgx);
    std::vector<std::vector<float>> got;
    CK(twice(r, [&] { return ddp_gelu_backward_gpu(&g_ctx, dgx, dx, dgout, N, 0); }, {dgx}, {gx}, got));
    CK(ddp_gelu_backward_gpu(&g_ctx, (F *)NULL, dx, dgout, N, 0)); /* NULL: nothing to do */
    ddp_gelu_backward_cpu(gx.data(), x.data(), gout.data(), N);
    WORST(got[0], gx);
}

template <typename F> static void t_residual_fwd(const Shape &s, Result *r)
{
    Bufs m;
    const size_t N = (size_t)s.B * s.T * s.C + 5;
    auto a = rnd(N, 1), b = rnd(N, 1);
    F *da = m.up<F>(a), *db = m.up<F>(b), *dout = m.alloc<F>(N);
    ALLOCATED(da && db && dout);
    CK(ddp_residual_forward_gpu(&g_ctx, dout, da, db, N, 0));
    std::vector<float> out(N), got;
    ddp_residual_forward_cpu(out.data(), a.data(), b.data(), N);
    CK(down(got, dout, N)); WORST(got, out);
}

template <typename F> static void t_residual_bwd(const Shape &s, Result *r)
{
    Bufs m;
    const size_t N = (size_t)s.B * s.T * s.C + 5;
    auto gout = rnd(N, 1), ga = rnd(N, 1), gb = rnd(N, 1);
    F *dgout = m.up<F>(gout), *dga = m.up<F>(ga), *dgb = m.up<F>(gb);
    ALLOCATED(dgout && dga && dgb);
    std::vector<std::vector<float>> got;
    CK(twice(r, [&] { return ddp_residual_backward_gpu(&g_ctx, dga, dgb, dgout, N, 0); }, {dga, dgb}, {ga, gb}, got));
    std::vector<std::vector<float>> got2;
    CK(twice(r, [&] { return ddp_residual_backward_gpu(&g_ctx, (F *)NULL, dgb, dgout, N, 0); }, {dgb}, {gb}, got2));
    ddp_residual_backward_cpu(ga.data(), gb.data(), gout.data(), N);
    WORST(got[0], ga);
    WORST(got[1], gb);
    WORST(got2[0], gb);
}

template <typename F> static void t_crossentropy(const Shape &s, Result *r)
{
    Bufs m;
    const int BT = s.B * s.T;
    auto logits = rnd((size_t)BT * s.V, 4);
    auto tgt = rnd_int(BT, s.V);
    tgt[0] = tgt[BT - 1] = -1; /* padding */
    F *dlogits = m.up<F>(logits), *dgrad = m.alloc<F>(logits.size());
    int *dtgt = m.up_int(tgt);
    float *dlosses = m.alloc<float>(BT), *dloss = m.alloc<float>(1);
    ALLOCATED(dlogits && dgrad && dtgt && dlosses && dloss);
    std::vector<float> grad(logits.size()), losses(BT), loss(1);
    std::vector<std::vector<float>> got;
    CK(twice(r, [&] {
        cudaError_t e = cudaMemset(dgrad, 0xFF, grad.size() * sizeof(F));
        return e ? e : ddp_crossentropy_forward_backward_gpu(&g_ctx, dloss, dlosses, dgrad, dlogits, dtgt, s.B, s.T,
                                                             s.V, -1, 0.5f, 0);
    }, {dlosses, dloss}, {losses, loss}, got));
    std::vector<float> g1, g2;
    CK(down(g1, dgrad, grad.size()));
    ddp_crossentropy_forward_backward_cpu(loss.data(), losses.data(), grad.data(), logits.data(), tgt.data(),
                                          s.B, s.T, s.V, -1, 0.5f);
    WORST(got[0], losses);
    WORST(got[1], loss);
    WORST(g1, grad);
    /* in place: dlogits overwrites logits */
    CK(ddp_crossentropy_forward_backward_gpu(&g_ctx, dloss, dlosses, dlogits, dlogits, dtgt, s.B, s.T, s.V, -1, 0.5f, 0));
    CK(down(g2, dlogits, grad.size()));
    WORST(g2, grad);
}

template <typename F> static void t_adamw(const Shape &s, Result *r)
{
    Bufs m;
    const size_t N = (size_t)s.OC * s.C + 7;
    auto p = rnd(N, 1), g = rnd(N, 1), mo = rnd(N, 0.1f), v = rnd(N, 0.01f);
    for (float &x : v) x = fabsf(x);
    g[0] = 2e19f, g[1] = -5e19f; /* past sqrt(FLT_MAX): a finite step (test_kernels checks the CPU's) */
    F *dp = m.up<F>(p);
    float *dg = m.up<float>(g), *dmaster = m.up<float>(p), *dm = m.up<float>(mo), *dv = m.up<float>(v);
    ALLOCATED(dp && dg && dmaster && dm && dv);
    /* fp32 updates params in place; bf16 keeps an fp32 master copy */
    float *master = sizeof(F) == 4 ? NULL : dmaster;
    for (int t = 1; t <= 2; t++) {
        CK(ddp_adamw_update_gpu(&g_ctx, dp, dg, dm, dv, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, master, 0));
        ddp_adamw_update_cpu(p.data(), g.data(), mo.data(), v.data(), N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    }
    std::vector<float> got;
    CK(down(got, dp, N)); WORST(got, p);
    if (master) { CK(down(got, dmaster, N)); WORST(got, p); }
    CK(down(got, dm, N)); WORST(got, mo);
    CK(down(got, dv, N)); WORST(got, v);
}

template <typename F> static void t_global_norm_clip(const Shape &s, Result *r)
{
    Bufs m;
    const size_t N = (size_t)s.B * s.T * s.C * 37 + 11;
    auto g = rnd(N, 1);
    F *dg = m.up<F>(g);
    float *dnorm = m.alloc<float>(1);
    ALLOCATED(dg && dnorm);
    std::vector<float> norm(1);
    std::vector<std::vector<float>> got;
    CK(twice(r, [&] { return ddp_global_norm_gpu(&g_ctx, dnorm, dg, N, 0); }, {dnorm}, {norm}, got));
    ddp_global_norm_cpu(norm.data(), g.data(), N);
    WORST(got[0], norm);
    const float max_norm = norm[0] / 3; /* clipping happens */
    CK(ddp_clip_by_norm_gpu(&g_ctx, dg, N, max_norm, dnorm, 0));
    ddp_clip_by_norm_cpu(g.data(), N, max_norm, norm.data());
    std::vector<float> gg;
    CK(down(gg, dg, N)); WORST(gg, g);
}

/* An empty batch (B = 0, N = 0) through every launcher: cudaSuccess, and nothing written
   but the mean loss and the norm, as on the CPU (no launch with an empty grid, no division by zero
   rows: ddp_matmul_backward_gpu divided by its rows per chunk, 0, with a bias gradient). */
template <typename F> static void t_empty(const Shape &, Result *r)
{
    Bufs m;
    const int T = 5, C = 16, NH = 2, V = 32, OC = 24;
    const size_t n = 4096; /* every buffer: room for any row the launchers might wrongly touch */
    F *a = m.alloc<F>(n), *b = m.alloc<F>(n), *c = m.alloc<F>(n), *out = m.alloc<F>(n);
    typedef typename ddp__same<F>::type G;
    G *g1 = (G *)m.alloc<F>(n), *g2 = (G *)m.alloc<F>(n);
    float *f1 = m.alloc<float>(n), *f2 = m.alloc<float>(n), *f3 = m.alloc<float>(n), *loss = m.alloc<float>(1);
    float *norm = m.alloc<float>(1);
    int *tok = m.alloc<int>(n);
    ALLOCATED(a && b && c && out && g1 && g2 && f1 && f2 && f3 && loss && norm && tok);
    CK(cudaMemset(tok, 0, n * sizeof(int)));
    CK(cudaMemset(a, 0, n * sizeof(F))); /* finite inputs */
    CK(cudaMemset(b, 0, n * sizeof(F)));
    CK(cudaMemset(c, 0, n * sizeof(F)));
    CK(ddp_embedding_forward_gpu(&g_ctx, out, tok, a, b, 0, T, C, 0));
    CK(ddp_embedding_backward_gpu(&g_ctx, f1, f2, a, tok, 0, T, C, 0));
    CK(ddp_layernorm_forward_gpu(&g_ctx, out, f1, f2, a, b, c, 0, T, C, 0));
    CK(ddp_layernorm_backward_gpu(&g_ctx, g1, f1, f2, a, b, c, f3, f3, 0, T, C, 0));
    CK(ddp_matmul_forward_gpu(&g_ctx, out, a, b, (const G *)c, 0, T, C, OC, 0));
    CK(ddp_matmul_backward_gpu(&g_ctx, g1, f1, f2, a, b, c, 0, T, C, OC, 0));
    CK(ddp_attention_forward_gpu(&g_ctx, out, f1, a, 0, T, C, NH, 0));
    CK(ddp_attention_backward_gpu(&g_ctx, g1, a, b, c, f3, 0, T, C, NH, 0));
    CK(ddp_gelu_forward_gpu(&g_ctx, out, a, 0, 0));
    CK(ddp_gelu_backward_gpu(&g_ctx, g1, a, b, 0, 0));
    CK(ddp_residual_forward_gpu(&g_ctx, out, a, b, 0, 0));
    CK(ddp_residual_backward_gpu(&g_ctx, g1, g2, a, 0, 0));
    CK(ddp_crossentropy_forward_backward_gpu(&g_ctx, loss, f1, g1, a, tok, 0, T, V, -1, 1.0f, 0));
    CK(ddp_adamw_update_gpu(&g_ctx, out, f1, f2, f3, 0, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, (float *)NULL, 0));
    CK(ddp_global_norm_gpu(&g_ctx, norm, a, 0, 0));
    CK(ddp_clip_by_norm_gpu(&g_ctx, out, 0, 1.0f, norm, 0));
    std::vector<float> got;
    const struct { Dev d; const char *name; } untouched[] = {{out, "out"}, {Dev((F *)g1), "dinp"}, {Dev((F *)g2), "dinp2"},
                                                             {f1, "f1"}, {f2, "f2"}, {f3, "f3"}};
    for (const auto &u : untouched) {
        CK(u.d.bf16 ? down(got, (const __nv_bfloat16 *)u.d.p, n) : down(got, (const float *)u.d.p, n));
        for (float x : got)
            if (!isnan(x)) { r->err = INFINITY; r->why = u.name; return; } /* written: no longer the 0xFF poison */
    }
    float l[2] = {-1, -1}, cpu[2] = {-1, -1};
    CK(cudaMemcpy(&l[0], loss, sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&l[1], norm, sizeof(float), cudaMemcpyDeviceToHost));
    ddp_crossentropy_forward_backward_cpu(&cpu[0], NULL, NULL, NULL, NULL, 0, T, V, -1, 1.0f);
    ddp_global_norm_cpu(&cpu[1], NULL, 0);
    if (l[0] != cpu[0] || l[1] != cpu[1]) { r->err = INFINITY; r->why = "the loss or norm of nothing differs from the CPU's"; }
}

/* Zero channels (C = 0): the matmul's out is its bias and dbias still sums dout, as on the
   CPU (cuBLASLt refused a k of 0); the gradients of layernorm and the embedding are empty
   (launched with an empty grid, they failed without a word); attention refuses heads of
   size 0 in a line. */
template <typename F> static void t_zero_width(const Shape &, Result *r)
{
    Bufs m;
    static volatile int zero = 0; /* (a constant 0 let g++ see a gemm of no columns: -Wmaybe-uninitialized) */
    const int B = 2, T = 5, C = zero, OC = 9, NH = 2, BT = B * T;
    auto bias = rnd(OC, 1), dout = rnd((size_t)BT * OC, 1), dbias = rnd(OC, 1);
    std::vector<float> out((size_t)BT * OC, -1.0f), got;
    F *a = m.alloc<F>(16), *dgout = m.up<F>(dout), *dy = m.alloc<F>((size_t)BT * OC);
    typedef typename ddp__same<F>::type G;
    G *db = (G *)m.up<F>(bias);
    float *f = m.alloc<float>(64), *ddb = m.up<float>(dbias);
    int *tok = m.alloc<int>(BT);
    ALLOCATED(a && dgout && dy && db && f && ddb && tok);
    CK(cudaMemset(tok, 0, BT * sizeof(int)));
    CK(ddp_matmul_forward_gpu(&g_ctx, dy, a, a, db, B, T, C, OC, 0));
    ddp_matmul_forward_cpu(out.data(), NULL, NULL, bias.data(), B, T, C, OC);
    CK(down(got, dy, out.size())); WORST(got, out);
    CK(ddp_matmul_forward_gpu(&g_ctx, dy, a, a, (const G *)NULL, B, T, C, OC, 0)); /* no bias: zeros */
    CK(down(got, dy, out.size()));
    for (float x : got) if (x != 0.0f) { r->err = INFINITY; r->why = "out of C = 0 without a bias is not 0"; return; }
    CK(ddp_matmul_backward_gpu(&g_ctx, (G *)a, f, ddb, dgout, a, a, B, T, C, OC, 0));
    ddp_matmul_backward_cpu(NULL, NULL, dbias.data(), dout.data(), NULL, NULL, B, T, C, OC);
    CK(down(got, ddb, OC)); WORST(got, dbias);
    CK(ddp_layernorm_backward_gpu(&g_ctx, (G *)a, f, f, a, a, a, f, f, B, T, C, 0));
    CK(ddp_embedding_backward_gpu(&g_ctx, f, f, a, tok, B, T, C, 0));
    const cudaError_t e = ddp_attention_forward_gpu(&g_ctx, a, f, a, B, T, C, NH, 0);
    if (e != cudaErrorInvalidValue || !strstr(ddp_kernels_error(&g_ctx), "1 <= C/NH <= 128")) {
        r->err = INFINITY; r->why = "attention with heads of size 0 not refused in a line";
    }
}

/* a vocabulary past 512 threads' first sweep: every warp of a row's block holds logits, so a
   warp that writes its part of the sum while others still read the max changes the loss */
template <typename F> static void t_crossentropy_wide(const Shape &, Result *r)
{
    static const Shape wide = {"vocab4099", 1, 6, 12, 3, 4099, 9};
    t_crossentropy<F>(wide, r);
}

/* ---- the table ---- */
typedef void (*check_fn)(const Shape &, Result *);
struct Check { const char *name; check_fn fp32, bf16; };
#define CASE(name, fn) {name, fn<float>, fn<__nv_bfloat16>}
static const Check checks[] = {
    CASE("embedding.forward", t_embedding_fwd),  CASE("embedding.backward", t_embedding_bwd),
    CASE("layernorm.forward", t_layernorm_fwd),  CASE("layernorm.backward", t_layernorm_bwd),
    CASE("matmul.forward", t_matmul_fwd),        CASE("matmul.backward", t_matmul_bwd),
    CASE("attention.forward", t_attention_fwd),  CASE("attention.backward", t_attention_bwd),
    CASE("attention.forward.streaming", t_attention_fwd_streaming),
    CASE("attention.backward.streaming", t_attention_bwd_streaming),
    CASE("gelu.forward", t_gelu_fwd),            CASE("gelu.backward", t_gelu_bwd),
    CASE("residual.forward", t_residual_fwd),    CASE("residual.backward", t_residual_bwd),
    CASE("crossentropy", t_crossentropy),        CASE("adamw", t_adamw),
    CASE("global_norm_clip", t_global_norm_clip),
};
/* checks with their own shapes, run once */
static const Check once[] = {
    CASE("matmul.vocab50257", t_matmul_vocab), CASE("attention.many_heads", t_attention_many_heads),
    CASE("attention.many_heads.streaming", t_attention_many_heads_streaming), CASE("empty_batch", t_empty), CASE("zero_width", t_zero_width),
    CASE("crossentropy.vocab4099", t_crossentropy_wide), CASE("gelu.tails", t_gelu_tails),
    CASE("attention.large_scores", t_attention_large_scores),
};
/* the checks whose backward runs twice, for the determinism lines */
static bool reruns(const char *name)
{
    return strstr(name, "backward") || strstr(name, "vocab") || !strcmp(name, "crossentropy") ||
           !strcmp(name, "global_norm_clip");
}

static const char *g_only; /* a word the check's name must contain, or NULL */
static int g_matched;      /* checks that word picked */

static void run_check(const Check &c, const Shape &s, const char *shape_name, bool run, const char *why)
{
    for (int bf = 0; bf < 2; bf++) {
        char name[160], det[180];
        snprintf(name, sizeof name, "kernels_gpu.%s.%s.%s", c.name, bf ? "bf16" : "fp32", shape_name);
        snprintf(det, sizeof det, "%s.deterministic", name);
        if (g_only && !strstr(name, g_only)) continue;
        g_matched++;
        if (!run) {
            test_skip(name, why);
            if (reruns(c.name)) test_skip(det, why);
            continue;
        }
        Result r;
        const double tol = bf ? 1e-2 : 1e-5;
        (bf ? c.bf16 : c.fp32)(s, &r);
        CHECK(name, r.err <= tol, "relative error %.3g > %.0e %s", r.err, tol, r.why);
        if (reruns(c.name)) CHECK(det, r.same == 1, "second run differs (%d) %s", r.same, r.why);
    }
}

int main(int argc, char **argv)
{
    g_only = argc > 1 ? argv[1] : NULL;
    const bool gpu = test_gpu_ready("kernels_gpu.device") != 0;
    const cudaError_t e = ddp_kernels_init(&g_ctx);
    const bool run = gpu && e == cudaSuccess;
    char why[400];
    snprintf(why, sizeof why, "%s", e == cudaSuccess ? "no usable CUDA device (see kernels_gpu.device)" : ddp_kernels_error(&g_ctx));
    if (gpu)
        CHECK("kernels_gpu.init", e == cudaSuccess && !ddp_kernels_error(&g_ctx)[0], "%s: %s", cudaGetErrorString(e),
              ddp_kernels_error(&g_ctx));
    else /* without a device, init fails and says why, with the versions */
        CHECK("kernels_gpu.init_names_the_cause", e != cudaSuccess && strstr(why, "no CUDA device: cudaGetDeviceCount") &&
              strstr(why, "driver") && strstr(why, "runtime"), "init returned %d, message '%s'", (int)e, why);
    for (const Shape &s : shapes)
        for (const Check &c : checks) run_check(c, s, s.name, run, why);
    for (const Check &c : once) run_check(c, shapes[0], "own_shape", run, why);
    if (g_only) /* a mistyped word passed with nothing checked */
        CHECK("kernels_gpu.filter_picks_checks", g_matched > 0, "no check's name contains '%s'", g_only);
    if (e == cudaSuccess) ddp_kernels_destroy(&g_ctx);
    TEST_EXIT();
}
