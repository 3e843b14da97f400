/* train_gpt: a GPT-2 style language model, trained data-parallel with the two headers.

       ./examples/train_gpt --nproc 2                      the repository's own text
       ./examples/train_gpt --nproc 4 --data input.txt --steps 500 --save gpt.safetensors

   ddp.h runs the ranks and keeps them in step (rank 0's initial weights broadcast,
   a distributed sampler, bucketed gradient all-reduce that overlaps the backward
   pass, exact global metrics); ddp_kernels.cuh supplies the layers. The file reads
   top to bottom: model, forward, backward, data, checkpoints, training loop, main.

   The model: token + position embedding; per block, pre-LN attention and MLP with
   residuals (ln1 -> qkv -> causal attention -> proj -> +, ln2 -> fc -> GELU -> proj -> +);
   a final layernorm; logits through the token embedding again (tied lm_head).

   N processes train exactly the model one process trains with the same global
   batch. Each sequence's gradient is computed on its own (in fp32, the same bits on
   any rank) and added in double, and the ranks sum those doubles: the sum no longer
   depends on which rank or micro-step a sequence fell on, so 1 x 8, 2 x 4, 4 x 2 and
   1 x 2 with --grad-accum 4 give the same parameters (tests/test_train_gpt.sh).

   On GPUs: built with nvcc (make builds examples/train_gpt_gpu) and run with one GPU
   per rank, the model trains on the device (see "the GPU path" below): the _gpu
   kernels over whole micro-batches on one stream, fp32 gradients all-reduced by NCCL
   in buckets while the backward pass runs, the same schedule, metrics and
   checkpoint format (a checkpoint moves between CPU and GPU runs). GPU results match
   the CPU path to fp32 rounding, not bit for bit. The nvcc build without a visible
   GPU (or with DDP_BACKEND=cpu) trains on the CPU exactly as the gcc build does. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "ddp_kernels.cuh"
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PROG "train_gpt"

/* ---- the model ---------------------------------------------------------------------
   All parameters in one flat buffer, tensor after tensor in this order: wte, wpe,
   block 0 ... block L-1, ln_f. The backward pass finishes ln_f first, then the blocks
   from the last, then the embeddings (wte last: the tied lm_head and the embedding
   both add to it), so the regions become final from the end of the buffer towards
   its start -- the order in which ddp.h reduces its buckets. */
typedef struct config {
    int layers, heads, dim, ctx, vocab;
} config;

/* the tensors of one block, in buffer order */
enum { LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, PER_BLOCK };
static const char *const block_names[PER_BLOCK] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
    "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
    "mlp.c_proj.weight", "mlp.c_proj.bias"};

typedef struct tensor {
    char name[48];
    size_t offset, numel;
    int ndim, shape[2]; /* matrices are (out, in), as torch.nn.Linear stores them */
} tensor;

/* Activations of a micro-batch of B sequences, kept for the backward pass. Per block
   arrays hold all blocks one after another. */
typedef struct activations {
    int *tokens, *targets;        /* (B,T) */
    float *x;                     /* (L+1,B,T,C) residual stream entering each block; x[L] leaves the last */
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *xmid;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C), (B,T) */
    float *logits, *losses;       /* (B,T,V) (training: overwritten by dlogits), (B,T) */
    float *tmp;                   /* (B,T,C) a projection before its residual add */
    /* backward: gradient of the residual stream, and one sequence's scratch */
    float *dx;                    /* (B,T,C) */
    float *dfch_gelu, *dfch, *dln, *datty, *dqkv;
} activations;

typedef struct gpt {
    config cfg;
    int num_tensors; /* 2 + 12 L + 2 */
    tensor *tensors;
    size_t num_params;
    float *params, *m, *v; /* AdamW moments, same layout */
    float *grads;          /* one sequence's gradient while backward runs; then the averaged gradient */
    double *grad_sum;      /* sum of this rank's sequence gradients: what the ranks all-reduce */
    int B;                 /* sequences the activations have room for */
    activations a;
} gpt;

static tensor *block_tensor(const gpt *g, int l, int k) { return &g->tensors[2 + l * PER_BLOCK + k]; }
static float *param(const gpt *g, const tensor *t) { return g->params + t->offset; }
static float *grad(const gpt *g, const tensor *t) { return g->grads + t->offset; }
#define WTE(g) (&(g)->tensors[0])
#define WPE(g) (&(g)->tensors[1])
#define LNFW(g) (&(g)->tensors[(g)->num_tensors - 2])
#define LNFB(g) (&(g)->tensors[(g)->num_tensors - 1])

static void add_tensor(gpt *g, const char *name, int rows, int cols)
{
    tensor *t = &g->tensors[g->num_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = g->num_params;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    g->num_params += t->numel;
}

static float *floats(size_t n, int *ok)
{
    float *p = (float *)calloc(n ? n : 1, sizeof(float));
    if (!p) *ok = 0;
    return p;
}

/* Lays out the tensors and allocates parameters, optimizer state and the activations
   of B sequences. Returns 0 when out of memory. */
static int gpt_create(gpt *g, config cfg, int B)
{
    const int L = cfg.layers, C = cfg.dim, T = cfg.ctx, V = cfg.vocab, NH = cfg.heads;
    const size_t BT = (size_t)B * T, BTC = BT * C;
    activations *a = &g->a;
    int l, k, ok = 1;
    char name[48];
    memset(g, 0, sizeof *g);
    g->cfg = cfg;
    g->B = B;
    g->tensors = (tensor *)calloc(2 + (size_t)PER_BLOCK * L + 2, sizeof(tensor));
    if (!g->tensors) return 0;
    add_tensor(g, "wte.weight", V, C);
    add_tensor(g, "wpe.weight", T, C);
    for (l = 0; l < L; l++) {
        static const int rows[PER_BLOCK] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1}; /* times C */
        for (k = 0; k < PER_BLOCK; k++) {
            int matrix = k == QKVW || k == ATTPROJW || k == FCW || k == FCPROJW;
            snprintf(name, sizeof name, "h.%d.%s", l, block_names[k]);
            add_tensor(g, name, rows[k] * C, matrix ? (k == FCPROJW ? 4 * C : C) : 0);
        }
    }
    add_tensor(g, "ln_f.weight", C, 0);
    add_tensor(g, "ln_f.bias", C, 0);

    g->params = floats(g->num_params, &ok);
    g->m = floats(g->num_params, &ok);
    g->v = floats(g->num_params, &ok);
    g->grads = floats(g->num_params, &ok);
    g->grad_sum = (double *)calloc(g->num_params, sizeof(double));
    a->tokens = (int *)calloc(BT, sizeof(int));
    a->targets = (int *)calloc(BT, sizeof(int));
    if (!g->grad_sum || !a->tokens || !a->targets) ok = 0;
    a->x = floats((size_t)(L + 1) * BTC, &ok);
    a->ln1 = floats(L * BTC, &ok);
    a->ln1_mean = floats(L * BT, &ok);
    a->ln1_rstd = floats(L * BT, &ok);
    a->qkv = floats(L * 3 * BTC, &ok);
    a->atty = floats(L * BTC, &ok);
    a->lse = floats((size_t)L * B * NH * T, &ok);
    a->xmid = floats(L * BTC, &ok);
    a->ln2 = floats(L * BTC, &ok);
    a->ln2_mean = floats(L * BT, &ok);
    a->ln2_rstd = floats(L * BT, &ok);
    a->fch = floats(L * 4 * BTC, &ok);
    a->fch_gelu = floats(L * 4 * BTC, &ok);
    a->lnf = floats(BTC, &ok);
    a->lnf_mean = floats(BT, &ok);
    a->lnf_rstd = floats(BT, &ok);
    a->logits = floats(BT * V, &ok);
    a->losses = floats(BT, &ok);
    a->tmp = floats(BTC, &ok);
    a->dx = floats(BTC, &ok);
    a->dfch_gelu = floats((size_t)4 * T * C, &ok);
    a->dfch = floats((size_t)4 * T * C, &ok);
    a->dln = floats((size_t)T * C, &ok);
    a->datty = floats((size_t)T * C, &ok);
    a->dqkv = floats((size_t)3 * T * C, &ok);
    return ok;
}

static void gpt_destroy(gpt *g)
{
    activations *a = &g->a;
    void *all[] = {g->tensors, g->params, g->m, g->v, g->grads, g->grad_sum, a->tokens, a->targets, a->x,
                   a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty, a->lse, a->xmid, a->ln2, a->ln2_mean,
                   a->ln2_rstd, a->fch, a->fch_gelu, a->lnf, a->lnf_mean, a->lnf_rstd, a->logits, a->losses,
                   a->tmp, a->dx, a->dfch_gelu, a->dfch, a->dln, a->datty, a->dqkv};
    size_t i;
    for (i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    memset(g, 0, sizeof *g);
}

/* splitmix64: the same numbers on every platform */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double uniform(uint64_t *s) { return ((double)(next_u64(s) >> 11) + 0.5) / 9007199254740992.0; }

/* GPT-2's initialisation: N(0, 0.02) matrices, the two projections into the residual
   stream scaled by 1/sqrt(2 L) so the stream's variance does not grow with depth;
   zero biases, unit layernorm weights. */
static void gpt_init_weights(gpt *g, uint64_t seed)
{
    int i;
    for (i = 0; i < g->num_tensors; i++) {
        const tensor *t = &g->tensors[i];
        float *p = param(g, t);
        size_t j;
        int is_ln_weight = strstr(t->name, "ln_") && strstr(t->name, ".weight");
        float std = strstr(t->name, "c_proj.weight") ? 0.02f / sqrtf(2.0f * (float)g->cfg.layers) : 0.02f;
        for (j = 0; j < t->numel; j++) {
            if (t->ndim == 1) {
                p[j] = is_ln_weight ? 1.0f : 0.0f;
            } else { /* Box-Muller */
                double u1 = uniform(&seed), u2 = uniform(&seed);
                p[j] = std * (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
            }
        }
    }
}

/* ---- forward ------------------------------------------------------------------------
   B sequences of T tokens (a->tokens). Every layer treats rows independently, so a
   sequence's activations are the same bits whatever else is in the batch. With
   targets, the per-token losses go to a->losses; `train` also leaves dlogits (of the
   summed loss: softmax - onehot) in a->logits for the backward pass. */
static void gpt_forward(gpt *g, int B, int with_targets, int train)
{
    const int L = g->cfg.layers, C = g->cfg.dim, T = g->cfg.ctx, V = g->cfg.vocab, NH = g->cfg.heads;
    const size_t BT = (size_t)B * T, BTC = BT * C, LBT = (size_t)g->B * T, LBTC = LBT * C;
    activations *a = &g->a;
    float loss;
    int l;
    ddp_embedding_forward_cpu(a->x, a->tokens, param(g, WTE(g)), param(g, WPE(g)), B, T, C);
    for (l = 0; l < L; l++) {
        /* block l's slices; blocks are LBTC apart (room for g->B sequences) */
        float *x = a->x + l * LBTC, *xout = a->x + (l + 1) * LBTC;
        float *ln1 = a->ln1 + l * LBTC, *ln1_mean = a->ln1_mean + l * LBT, *ln1_rstd = a->ln1_rstd + l * LBT;
        float *qkv = a->qkv + l * 3 * LBTC, *atty = a->atty + l * LBTC, *lse = a->lse + l * LBT * NH;
        float *xmid = a->xmid + l * LBTC, *ln2 = a->ln2 + l * LBTC;
        float *ln2_mean = a->ln2_mean + l * LBT, *ln2_rstd = a->ln2_rstd + l * LBT;
        float *fch = a->fch + l * 4 * LBTC, *fch_gelu = a->fch_gelu + l * 4 * LBTC;
        ddp_layernorm_forward_cpu(ln1, ln1_mean, ln1_rstd, x, param(g, block_tensor(g, l, LN1W)),
                                  param(g, block_tensor(g, l, LN1B)), B, T, C);
        ddp_matmul_forward_cpu(qkv, ln1, param(g, block_tensor(g, l, QKVW)), param(g, block_tensor(g, l, QKVB)), B, T,
                               C, 3 * C);
        ddp_attention_forward_cpu(atty, lse, qkv, B, T, C, NH);
        ddp_matmul_forward_cpu(a->tmp, atty, param(g, block_tensor(g, l, ATTPROJW)),
                               param(g, block_tensor(g, l, ATTPROJB)), B, T, C, C);
        ddp_residual_forward_cpu(xmid, x, a->tmp, BTC);
        ddp_layernorm_forward_cpu(ln2, ln2_mean, ln2_rstd, xmid, param(g, block_tensor(g, l, LN2W)),
                                  param(g, block_tensor(g, l, LN2B)), B, T, C);
        ddp_matmul_forward_cpu(fch, ln2, param(g, block_tensor(g, l, FCW)), param(g, block_tensor(g, l, FCB)), B, T,
                               C, 4 * C);
        ddp_gelu_forward_cpu(fch_gelu, fch, 4 * BTC);
        ddp_matmul_forward_cpu(a->tmp, fch_gelu, param(g, block_tensor(g, l, FCPROJW)),
                               param(g, block_tensor(g, l, FCPROJB)), B, T, 4 * C, C);
        ddp_residual_forward_cpu(xout, xmid, a->tmp, BTC);
    }
    ddp_layernorm_forward_cpu(a->lnf, a->lnf_mean, a->lnf_rstd, a->x + L * LBTC, param(g, LNFW(g)),
                              param(g, LNFB(g)), B, T, C);
    ddp_matmul_forward_cpu(a->logits, a->lnf, param(g, WTE(g)), NULL, B, T, C, V); /* tied lm_head */
    if (with_targets) /* dloss = B T cancels the mean's 1/(B T): the gradient of the sum */
        ddp_crossentropy_forward_backward_cpu(&loss, a->losses, train ? a->logits : NULL, a->logits, a->targets,
                                              B, T, V, -1, (float)BT);
}

/* ---- backward -----------------------------------------------------------------------
   Layer by layer from the top, and within a layer sequence by sequence: each
   sequence's parameter gradient lands in g->grads (fp32, zero before) and is moved
   into the double sum g->grad_sum at once. When a layer is done for every sequence
   its region of grad_sum is final for this micro-step: ddp_grad_ready hands it to the
   all-reduce, which runs while the layers below are still being differentiated. */
static void flush(gpt *g, const tensor *first, const tensor *last)
{
    size_t i, end = last->offset + last->numel;
    for (i = first->offset; i < end; i++) {
        g->grad_sum[i] += g->grads[i];
        g->grads[i] = 0.0f;
    }
}

static ddp_result ready(ddp_grad *sync, const tensor *first, const tensor *last)
{
    return ddp_grad_ready(sync, first->offset, last->offset + last->numel - first->offset);
}

static ddp_result gpt_backward(gpt *g, int B, ddp_grad *sync)
{
    const int L = g->cfg.layers, C = g->cfg.dim, T = g->cfg.ctx, V = g->cfg.vocab, NH = g->cfg.heads;
    const size_t TC = (size_t)T * C, LBT = (size_t)g->B * T, LBTC = LBT * C;
    activations *a = &g->a;
    ddp_result r;
    int l, b;
    memset(a->dx, 0, (size_t)B * TC * sizeof(float));

    /* lm_head (tied to wte) and the final layernorm */
    for (b = 0; b < B; b++) {
        memset(a->dln, 0, TC * sizeof(float));
        ddp_matmul_backward_cpu(a->dln, grad(g, WTE(g)), NULL, a->logits + (size_t)b * T * V, a->lnf + b * TC,
                                param(g, WTE(g)), 1, T, C, V);
        ddp_layernorm_backward_cpu(a->dx + b * TC, grad(g, LNFW(g)), grad(g, LNFB(g)), a->dln,
                                   a->x + L * LBTC + b * TC, param(g, LNFW(g)), a->lnf_mean + b * T,
                                   a->lnf_rstd + b * T, 1, T, C);
        flush(g, WTE(g), WTE(g));
        flush(g, LNFW(g), LNFB(g));
    }
    if ((r = ready(sync, LNFW(g), LNFB(g))) != DDP_OK) return r;

    for (l = L - 1; l >= 0; l--) {
        const tensor *first = block_tensor(g, l, 0), *last = block_tensor(g, l, PER_BLOCK - 1);
#define P(k) param(g, block_tensor(g, l, k))
#define G(k) grad(g, block_tensor(g, l, k))
        for (b = 0; b < B; b++) {
            /* sequence b of block l; dx holds d loss / d (block output), and becomes
               d loss / d (block input) as the residual branches add into it */
            const size_t s = l * LBTC + b * TC, st = l * LBT + (size_t)b * T;
            float *dx = a->dx + b * TC;
            memset(a->dfch_gelu, 0, 4 * TC * sizeof(float));
            memset(a->dfch, 0, 4 * TC * sizeof(float));
            memset(a->dln, 0, TC * sizeof(float));
            memset(a->datty, 0, TC * sizeof(float));
            memset(a->dqkv, 0, 3 * TC * sizeof(float));
            ddp_matmul_backward_cpu(a->dfch_gelu, G(FCPROJW), G(FCPROJB), dx, a->fch_gelu + 4 * s, P(FCPROJW), 1, T,
                                    4 * C, C);
            ddp_gelu_backward_cpu(a->dfch, a->fch + 4 * s, a->dfch_gelu, 4 * TC);
            ddp_matmul_backward_cpu(a->dln, G(FCW), G(FCB), a->dfch, a->ln2 + s, P(FCW), 1, T, C, 4 * C);
            ddp_layernorm_backward_cpu(dx, G(LN2W), G(LN2B), a->dln, a->xmid + s, P(LN2W), a->ln2_mean + st,
                                       a->ln2_rstd + st, 1, T, C);
            ddp_matmul_backward_cpu(a->datty, G(ATTPROJW), G(ATTPROJB), dx, a->atty + s, P(ATTPROJW), 1, T, C, C);
            ddp_attention_backward_cpu(a->dqkv, a->datty, a->qkv + 3 * s, a->atty + s, a->lse + st * NH, 1, T, C, NH);
            memset(a->dln, 0, TC * sizeof(float));
            ddp_matmul_backward_cpu(a->dln, G(QKVW), G(QKVB), a->dqkv, a->ln1 + s, P(QKVW), 1, T, C, 3 * C);
            ddp_layernorm_backward_cpu(dx, G(LN1W), G(LN1B), a->dln, a->x + s, P(LN1W), a->ln1_mean + st,
                                       a->ln1_rstd + st, 1, T, C);
            flush(g, first, last);
        }
#undef P
#undef G
        if ((r = ready(sync, first, last)) != DDP_OK) return r;
    }

    for (b = 0; b < B; b++) {
        ddp_embedding_backward_cpu(grad(g, WTE(g)), grad(g, WPE(g)), a->dx + b * TC, a->tokens + (size_t)b * T, 1,
                                   T, C);
        flush(g, WTE(g), WPE(g));
    }
    return ready(sync, WTE(g), WPE(g));
}

/* ---- the GPU path -------------------------------------------------------------------
   Built with nvcc and given a GPU per rank (ddp_init chose the NCCL backend), the same
   model trains on the device: parameters, AdamW moments, gradients and activations
   live in device memory, allocated once in the host buffers' layout, and every layer
   runs as its _gpu twin from ddp_kernels.cuh on one stream. Unlike the CPU path, each
   launch covers the whole micro-batch (B sequences), and the gradients are summed in
   fp32 in place on the device: ddp_grad all-reduces those device buffers (NCCL) while
   the backward pass goes on, and the step divides by the global token count, as the
   CPU path does with its double sum. Results agree with the CPU path to fp32 rounding,
   not bit for bit, and do not have the CPU path's exact world-size invariance.
   This first version keeps everything in fp32 (exact fp32 matmuls, no TF32): the
   kernels also take bf16 activations with fp32 master weights (ddp_floatX), which is
   the next step for speed. The host model keeps the checkpoint's copy of params, m
   and v (refreshed from the device before a save) and the tokens of a micro-batch,
   which go up through pinned buffers with cudaMemcpyAsync. Any CUDA failure prints
   one line naming the call and exits. */
typedef struct gpu gpu;
#ifdef __CUDACC__
struct gpu {
    cudaStream_t stream;      /* every kernel, copy and collective of this rank */
    ddp_kernels_ctx k;        /* cuBLASLt handle and scratch */
    float *params, *m, *v;    /* device, laid out as the host's */
    float *grads;             /* device: summed over micro-steps and ranks, then the mean */
    float *scalars;           /* device: [0] mean loss of a micro-batch, [1] grad norm */
    activations a;            /* device, room for B sequences; backward scratch for all B */
    int *h_tokens, *h_targets; /* pinned host (B,T): the micro-batch on its way up */
    float *h_norm;            /* pinned host (1) */
};

static void cuda_check(cudaError_t e, const ddp_kernels_ctx *k, const char *call, int line)
{
    if (e == cudaSuccess) return;
    if (k && e == cudaErrorUnknown) /* a launcher's way of saying cuBLASLt failed */
        fprintf(stderr, PROG ": %.*s failed (line %d): cuBLASLt status %d\n", (int)strcspn(call, "("), call, line,
                (int)k->cublas_status);
    else
        fprintf(stderr, PROG ": %.*s failed (line %d): %s\n", (int)strcspn(call, "("), call, line,
                cudaGetErrorString(e));
    exit(1);
}
#define CUDA(call) cuda_check((call), NULL, #call, __LINE__)
/* a ddp_kernels.cuh launcher on this rank's stream: LAUNCH(ddp_gelu_forward_gpu, out, inp, N) */
#define LAUNCH(fn, ...) cuda_check(fn(&d->k, __VA_ARGS__, d->stream), &d->k, #fn, __LINE__)

static float *dev_floats(cudaStream_t stream, size_t n)
{
    float *p;
    CUDA(cudaMalloc((void **)&p, (n ? n : 1) * sizeof(float)));
    CUDA(cudaMemsetAsync(p, 0, (n ? n : 1) * sizeof(float), stream));
    return p;
}

static int *dev_ints(cudaStream_t stream, size_t n)
{
    int *p;
    CUDA(cudaMalloc((void **)&p, (n ? n : 1) * sizeof(int)));
    CUDA(cudaMemsetAsync(p, 0, (n ? n : 1) * sizeof(int), stream));
    return p;
}

static float *dparam(const gpu *d, const tensor *t) { return d->params + t->offset; }
static float *dgrad(const gpu *d, const tensor *t) { return d->grads + t->offset; }

/* x (n) *= s */
static __global__ void scale_kernel(float *x, size_t n, float s)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

/* The device copy of the model: this rank's host params, m and v go up (ddp_grad_init
   then broadcasts rank 0's parameters). Sizes as in gpt_create, except that the
   backward scratch holds B sequences instead of one. */
static gpu *gpu_create(gpt *g)
{
    const int L = g->cfg.layers, C = g->cfg.dim, T = g->cfg.ctx, V = g->cfg.vocab, NH = g->cfg.heads, B = g->B;
    const size_t BT = (size_t)B * T, BTC = BT * C, P = g->num_params;
    gpu *d = (gpu *)calloc(1, sizeof(gpu));
    activations *a;
    cudaStream_t s;
    if (!d) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    a = &d->a;
    CUDA(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    s = d->stream;
    cuda_check(ddp_kernels_init(&d->k), &d->k, "ddp_kernels_init", __LINE__);
    d->params = dev_floats(s, P);
    d->m = dev_floats(s, P);
    d->v = dev_floats(s, P);
    d->grads = dev_floats(s, P);
    d->scalars = dev_floats(s, 2);
    a->tokens = dev_ints(s, BT);
    a->targets = dev_ints(s, BT);
    a->x = dev_floats(s, (size_t)(L + 1) * BTC);
    a->ln1 = dev_floats(s, L * BTC);
    a->ln1_mean = dev_floats(s, L * BT);
    a->ln1_rstd = dev_floats(s, L * BT);
    a->qkv = dev_floats(s, L * 3 * BTC);
    a->atty = dev_floats(s, L * BTC);
    a->lse = dev_floats(s, L * BT * NH);
    a->xmid = dev_floats(s, L * BTC);
    a->ln2 = dev_floats(s, L * BTC);
    a->ln2_mean = dev_floats(s, L * BT);
    a->ln2_rstd = dev_floats(s, L * BT);
    a->fch = dev_floats(s, L * 4 * BTC);
    a->fch_gelu = dev_floats(s, L * 4 * BTC);
    a->lnf = dev_floats(s, BTC);
    a->lnf_mean = dev_floats(s, BT);
    a->lnf_rstd = dev_floats(s, BT);
    a->logits = dev_floats(s, BT * V);
    a->losses = dev_floats(s, BT);
    a->tmp = dev_floats(s, BTC);
    a->dx = dev_floats(s, BTC);
    a->dfch_gelu = dev_floats(s, 4 * BTC);
    a->dfch = dev_floats(s, 4 * BTC);
    a->dln = dev_floats(s, BTC);
    a->datty = dev_floats(s, BTC);
    a->dqkv = dev_floats(s, 3 * BTC);
    CUDA(cudaMallocHost((void **)&d->h_tokens, BT * sizeof(int)));
    CUDA(cudaMallocHost((void **)&d->h_targets, BT * sizeof(int)));
    CUDA(cudaMallocHost((void **)&d->h_norm, sizeof(float)));
    CUDA(cudaMemcpyAsync(d->params, g->params, P * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA(cudaMemcpyAsync(d->m, g->m, P * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA(cudaMemcpyAsync(d->v, g->v, P * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA(cudaStreamSynchronize(s));
    return d;
}

static void gpu_destroy(gpu *d)
{
    activations *a = &d->a;
    void *all[] = {d->params, d->m, d->v, d->grads, d->scalars, a->tokens, a->targets, a->x, a->ln1, a->ln1_mean,
                   a->ln1_rstd, a->qkv, a->atty, a->lse, a->xmid, a->ln2, a->ln2_mean, a->ln2_rstd, a->fch,
                   a->fch_gelu, a->lnf, a->lnf_mean, a->lnf_rstd, a->logits, a->losses, a->tmp, a->dx,
                   a->dfch_gelu, a->dfch, a->dln, a->datty, a->dqkv};
    size_t i;
    CUDA(cudaStreamSynchronize(d->stream));
    for (i = 0; i < sizeof all / sizeof all[0]; i++) CUDA(cudaFree(all[i]));
    CUDA(cudaFreeHost(d->h_tokens));
    CUDA(cudaFreeHost(d->h_targets));
    CUDA(cudaFreeHost(d->h_norm));
    ddp_kernels_destroy(&d->k);
    CUDA(cudaStreamDestroy(d->stream));
    free(d);
}

/* ddp_grad on the device: fp32 gradients and parameters (for the broadcast), ordered
   on this rank's stream. */
static void gpu_grad_desc(const gpu *d, ddp_grad_desc *gd)
{
    gd->grads = d->grads;
    gd->dtype = DDP_F32;
    gd->params = d->params;
    gd->param_dtype = DDP_F32;
    gd->stream = d->stream;
}

/* gpt_forward on the device, from the host's g->a.tokens (and targets); with targets
   the per-token losses come back to g->a.losses, as gpt_forward leaves them. */
static void gpu_forward(gpt *g, gpu *d, int B, int with_targets, int train)
{
    const int L = g->cfg.layers, C = g->cfg.dim, T = g->cfg.ctx, V = g->cfg.vocab, NH = g->cfg.heads;
    const size_t BT = (size_t)B * T, BTC = BT * C, LBT = (size_t)g->B * T, LBTC = LBT * C;
    activations *a = &d->a;
    int l;
    /* the pinned buffers are free: the previous forward ended with a stream sync, or
       (generation) its logits were fetched with one */
    memcpy(d->h_tokens, g->a.tokens, BT * sizeof(int));
    CUDA(cudaMemcpyAsync(a->tokens, d->h_tokens, BT * sizeof(int), cudaMemcpyHostToDevice, d->stream));
    if (with_targets) {
        memcpy(d->h_targets, g->a.targets, BT * sizeof(int));
        CUDA(cudaMemcpyAsync(a->targets, d->h_targets, BT * sizeof(int), cudaMemcpyHostToDevice, d->stream));
    }
    LAUNCH(ddp_embedding_forward_gpu, a->x, a->tokens, dparam(d, WTE(g)), dparam(d, WPE(g)), B, T, C);
#define P(k) dparam(d, block_tensor(g, l, k))
    for (l = 0; l < L; l++) {
        float *x = a->x + l * LBTC, *xout = a->x + (l + 1) * LBTC;
        float *ln1 = a->ln1 + l * LBTC, *ln1_mean = a->ln1_mean + l * LBT, *ln1_rstd = a->ln1_rstd + l * LBT;
        float *qkv = a->qkv + l * 3 * LBTC, *atty = a->atty + l * LBTC, *lse = a->lse + l * LBT * NH;
        float *xmid = a->xmid + l * LBTC, *ln2 = a->ln2 + l * LBTC;
        float *ln2_mean = a->ln2_mean + l * LBT, *ln2_rstd = a->ln2_rstd + l * LBT;
        float *fch = a->fch + l * 4 * LBTC, *fch_gelu = a->fch_gelu + l * 4 * LBTC;
        LAUNCH(ddp_layernorm_forward_gpu, ln1, ln1_mean, ln1_rstd, x, P(LN1W), P(LN1B), B, T, C);
        LAUNCH(ddp_matmul_forward_gpu, qkv, ln1, P(QKVW), P(QKVB), B, T, C, 3 * C);
        LAUNCH(ddp_attention_forward_gpu, atty, lse, qkv, B, T, C, NH);
        LAUNCH(ddp_matmul_forward_gpu, a->tmp, atty, P(ATTPROJW), P(ATTPROJB), B, T, C, C);
        LAUNCH(ddp_residual_forward_gpu, xmid, x, a->tmp, BTC);
        LAUNCH(ddp_layernorm_forward_gpu, ln2, ln2_mean, ln2_rstd, xmid, P(LN2W), P(LN2B), B, T, C);
        LAUNCH(ddp_matmul_forward_gpu, fch, ln2, P(FCW), P(FCB), B, T, C, 4 * C);
        LAUNCH(ddp_gelu_forward_gpu, fch_gelu, fch, 4 * BTC);
        LAUNCH(ddp_matmul_forward_gpu, a->tmp, fch_gelu, P(FCPROJW), P(FCPROJB), B, T, 4 * C, C);
        LAUNCH(ddp_residual_forward_gpu, xout, xmid, a->tmp, BTC);
    }
#undef P
    LAUNCH(ddp_layernorm_forward_gpu, a->lnf, a->lnf_mean, a->lnf_rstd, a->x + L * LBTC, dparam(d, LNFW(g)),
           dparam(d, LNFB(g)), B, T, C);
    LAUNCH(ddp_matmul_forward_gpu, a->logits, a->lnf, dparam(d, WTE(g)), NULL, B, T, C, V); /* tied lm_head */
    if (!with_targets) return;
    /* dloss = B T: the gradient of the summed loss, as on the CPU */
    LAUNCH(ddp_crossentropy_forward_backward_gpu, d->scalars, a->losses, train ? a->logits : NULL, a->logits,
           a->targets, B, T, V, -1, (float)BT);
    CUDA(cudaMemcpyAsync(g->a.losses, a->losses, BT * sizeof(float), cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaStreamSynchronize(d->stream));
}

/* Row `row` of the last forward's logits (sequence 0) to the host's g->a.logits. */
static void gpu_logits_to_host(gpt *g, gpu *d, int row)
{
    const size_t V = (size_t)g->cfg.vocab;
    CUDA(cudaMemcpyAsync(g->a.logits + row * V, d->a.logits + row * V, V * sizeof(float), cudaMemcpyDeviceToHost,
                         d->stream));
    CUDA(cudaStreamSynchronize(d->stream));
}

/* gpt_backward on the device, a layer at a time over the whole micro-batch: each
   layer's parameter gradients are added into d->grads in place, and the region is
   handed to ddp_grad_ready as soon as the layer is done, in the CPU path's order.
   ready() records the point in the stream: NCCL reduces the bucket after the kernels
   queued so far, while the layers below run. */
static ddp_result gpu_backward(gpt *g, gpu *d, int B, ddp_grad *sync)
{
    const int L = g->cfg.layers, C = g->cfg.dim, T = g->cfg.ctx, V = g->cfg.vocab, NH = g->cfg.heads;
    const size_t BTC = (size_t)B * T * C, LBT = (size_t)g->B * T, LBTC = LBT * C, fsize = sizeof(float);
    activations *a = &d->a;
    ddp_result r;
    int l;
    CUDA(cudaMemsetAsync(a->dx, 0, BTC * fsize, d->stream));
    CUDA(cudaMemsetAsync(a->dln, 0, BTC * fsize, d->stream));
    /* lm_head (tied to wte; dlogits are in a->logits) and the final layernorm */
    LAUNCH(ddp_matmul_backward_gpu, a->dln, dgrad(d, WTE(g)), NULL, a->logits, a->lnf, dparam(d, WTE(g)), B, T, C, V);
    LAUNCH(ddp_layernorm_backward_gpu, a->dx, dgrad(d, LNFW(g)), dgrad(d, LNFB(g)), a->dln, a->x + L * LBTC,
           dparam(d, LNFW(g)), a->lnf_mean, a->lnf_rstd, B, T, C);
    if ((r = ready(sync, LNFW(g), LNFB(g))) != DDP_OK) return r;

    for (l = L - 1; l >= 0; l--) {
        const tensor *first = block_tensor(g, l, 0), *last = block_tensor(g, l, PER_BLOCK - 1);
        const size_t s = l * LBTC, st = l * LBT; /* block l's slices of the activations */
#define P(k) dparam(d, block_tensor(g, l, k))
#define G(k) dgrad(d, block_tensor(g, l, k))
        CUDA(cudaMemsetAsync(a->dfch_gelu, 0, 4 * BTC * fsize, d->stream));
        CUDA(cudaMemsetAsync(a->dfch, 0, 4 * BTC * fsize, d->stream));
        CUDA(cudaMemsetAsync(a->dln, 0, BTC * fsize, d->stream));
        CUDA(cudaMemsetAsync(a->datty, 0, BTC * fsize, d->stream));
        CUDA(cudaMemsetAsync(a->dqkv, 0, 3 * BTC * fsize, d->stream));
        LAUNCH(ddp_matmul_backward_gpu, a->dfch_gelu, G(FCPROJW), G(FCPROJB), a->dx, a->fch_gelu + 4 * s, P(FCPROJW),
               B, T, 4 * C, C);
        LAUNCH(ddp_gelu_backward_gpu, a->dfch, a->fch + 4 * s, a->dfch_gelu, 4 * BTC);
        LAUNCH(ddp_matmul_backward_gpu, a->dln, G(FCW), G(FCB), a->dfch, a->ln2 + s, P(FCW), B, T, C, 4 * C);
        LAUNCH(ddp_layernorm_backward_gpu, a->dx, G(LN2W), G(LN2B), a->dln, a->xmid + s, P(LN2W), a->ln2_mean + st,
               a->ln2_rstd + st, B, T, C);
        LAUNCH(ddp_matmul_backward_gpu, a->datty, G(ATTPROJW), G(ATTPROJB), a->dx, a->atty + s, P(ATTPROJW), B, T, C,
               C);
        LAUNCH(ddp_attention_backward_gpu, a->dqkv, a->datty, a->qkv + 3 * s, a->atty + s, a->lse + st * NH, B, T, C,
               NH);
        CUDA(cudaMemsetAsync(a->dln, 0, BTC * fsize, d->stream));
        LAUNCH(ddp_matmul_backward_gpu, a->dln, G(QKVW), G(QKVB), a->dqkv, a->ln1 + s, P(QKVW), B, T, C, 3 * C);
        LAUNCH(ddp_layernorm_backward_gpu, a->dx, G(LN1W), G(LN1B), a->dln, a->x + s, P(LN1W), a->ln1_mean + st,
               a->ln1_rstd + st, B, T, C);
#undef P
#undef G
        if ((r = ready(sync, first, last)) != DDP_OK) return r;
    }
    LAUNCH(ddp_embedding_backward_gpu, dgrad(d, WTE(g)), dgrad(d, WPE(g)), a->dx, a->tokens, B, T, C);
    return ready(sync, WTE(g), WPE(g));
}

/* The optimizer step after ddp_grad_finish: the summed gradient becomes the mean over
   the global batch's tokens, then norm, clipping and AdamW as on the CPU. Zeroes the
   gradients for the next step; returns the norm before clipping. */
static float gpu_step(gpt *g, gpu *d, float lr, float weight_decay, float clip, int step, double tokens)
{
    const size_t N = g->num_params;
    int l;
    scale_kernel<<<(unsigned)((N + 255) / 256), 256, 0, d->stream>>>(d->grads, N, (float)(1.0 / tokens));
    CUDA(cudaGetLastError());
    LAUNCH(ddp_global_norm_gpu, d->scalars + 1, d->grads, N);
    if (clip > 0) LAUNCH(ddp_clip_by_norm_gpu, d->grads, N, clip, d->scalars + 1);
    for (l = 0; l < g->num_tensors; l++) { /* no decay for biases and layernorm weights */
        const tensor *t = &g->tensors[l];
        LAUNCH(ddp_adamw_update_gpu, dparam(d, t), dgrad(d, t), d->m + t->offset, d->v + t->offset,
               t->numel, lr, 0.9f, 0.95f, 1e-8f, t->ndim == 2 ? weight_decay : 0.0f, step + 1, (float *)NULL);
    }
    CUDA(cudaMemsetAsync(d->grads, 0, N * sizeof(float), d->stream));
    CUDA(cudaMemcpyAsync(d->h_norm, d->scalars + 1, sizeof(float), cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaStreamSynchronize(d->stream));
    return *d->h_norm;
}

/* params, m and v to the host model, for a checkpoint */
static void gpu_to_host(gpt *g, gpu *d)
{
    const size_t bytes = g->num_params * sizeof(float);
    CUDA(cudaMemcpyAsync(g->params, d->params, bytes, cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaMemcpyAsync(g->m, d->m, bytes, cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaMemcpyAsync(g->v, d->v, bytes, cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaStreamSynchronize(d->stream));
}
#undef LAUNCH
#else
/* Without nvcc there is no GPU path: dev stays NULL (main refuses an NCCL backend),
   and these stand-ins never run. */
static gpu *gpu_create(gpt *g) { return (void)g, NULL; }
static void gpu_destroy(gpu *d) { (void)d; }
static void gpu_grad_desc(const gpu *d, ddp_grad_desc *gd) { (void)d, (void)gd; }
static void gpu_forward(gpt *g, gpu *d, int B, int targets, int train)
{
    (void)g, (void)d, (void)B, (void)targets, (void)train;
}
static void gpu_logits_to_host(gpt *g, gpu *d, int row) { (void)g, (void)d, (void)row; }
static ddp_result gpu_backward(gpt *g, gpu *d, int B, ddp_grad *sync)
{
    return (void)g, (void)d, (void)B, (void)sync, DDP_ERR_BACKEND;
}
static float gpu_step(gpt *g, gpu *d, float lr, float wd, float clip, int step, double tokens)
{
    return (void)g, (void)d, (void)lr, (void)wd, (void)clip, (void)step, (void)tokens, 0.0f;
}
static void gpu_to_host(gpt *g, gpu *d) { (void)g, (void)d; }
#endif

/* ---- data ---------------------------------------------------------------------------
   A token stream, split: the first 90% trains, the last 10% validates. Window i of a
   split is tokens [i T, i T + T + 1): inputs are its first T tokens, targets the last
   T (stride T, so windows do not overlap and every token is predicted once an epoch). */
typedef struct dataset {
    int *tokens;
    size_t n, n_train; /* tokens [0, n_train) train, [n_train, n) validate */
    char source[600];  /* what was read, for the first output line */
} dataset;

static size_t num_windows(size_t n_tokens, int T) { return n_tokens > (size_t)T ? (n_tokens - 1) / (size_t)T : 0; }

static unsigned char *read_file(const char *path, size_t *size, char *err, size_t errsize)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    long n;
    if (!f) {
        snprintf(err, errsize, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(err, errsize, "%s: cannot read (not a regular file?)", path);
        fclose(f);
        return NULL;
    }
    buf = (unsigned char *)malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        snprintf(err, errsize, "%s: %s", path, buf ? "read failed" : "out of memory");
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* Appends the tokens of one file: llm.c token shards (a header of 256 int32: magic
   20240520, version 1, token count; then uint16 tokens), nanoGPT's headerless uint16
   .bin, or any other file as bytes (byte-level tokens). */
static int load_tokens(dataset *d, const char *path, int vocab, char *err, size_t errsize)
{
    size_t size, n, i, ext = strlen(path);
    unsigned char *buf = read_file(path, &size, err, errsize);
    int32_t header[3] = {0, 0, 0};
    const unsigned char *p;
    int *grown;
    int u16 = 0;
    if (!buf) return 0;
    if (size >= sizeof header) memcpy(header, buf, sizeof header);
    if (size >= 1024 && header[0] == 20240520) { /* llm.c */
        if (header[1] != 1) {
            snprintf(err, errsize, "%s: llm.c token file of version %d; only version 1 is known", path, header[1]);
            free(buf);
            return 0;
        }
        if (header[2] < 0 || size != 1024 + 2 * (size_t)header[2]) {
            snprintf(err, errsize, "%s: the header promises %d tokens (%zu bytes) but the file has %zu bytes", path,
                     header[2], 1024 + 2 * (size_t)(header[2] < 0 ? 0 : header[2]), size);
            free(buf);
            return 0;
        }
        p = buf + 1024;
        n = (size_t)header[2];
        u16 = 1;
    } else if (ext >= 4 && strcmp(path + ext - 4, ".bin") == 0) { /* nanoGPT */
        if (size % 2) {
            snprintf(err, errsize, "%s: a .bin of uint16 tokens must have an even length, not %zu bytes", path, size);
            free(buf);
            return 0;
        }
        p = buf;
        n = size / 2;
        u16 = 1;
    } else {
        p = buf;
        n = size;
    }
    if (n == 0) {
        snprintf(err, errsize, "%s: no tokens (empty file)", path);
        free(buf);
        return 0;
    }
    grown = (int *)realloc(d->tokens, (d->n + n) * sizeof(int));
    if (!grown) {
        snprintf(err, errsize, "%s: out of memory", path);
        free(buf);
        return 0;
    }
    d->tokens = grown;
    for (i = 0; i < n; i++) {
        int t = u16 ? p[2 * i] | p[2 * i + 1] << 8 : p[i]; /* uint16 files are little-endian */
        if (t >= vocab) {
            snprintf(err, errsize, "%s: token %d at position %zu is not below --vocab %d", path, t, i, vocab);
            free(buf);
            return 0;
        }
        d->tokens[d->n + i] = t;
    }
    d->n += n;
    free(buf);
    return 1;
}

/* Without --data: the repository's own text, found next to the executable
   (dirname(argv[0])/..), else in the current directory. */
static int load_default(dataset *d, const char *argv0, int vocab, char *err, size_t errsize)
{
    static const char *const files[] = {"ddp.h", "ddp_kernels.cuh", "README.md"};
    char dir[400], path[440], names[64];
    const char *slash = strrchr(argv0, '/');
    int k, i;
    for (k = 0; k < 2; k++) {
        if (k == 0) snprintf(dir, sizeof dir, "%.*s..", slash ? (int)(slash - argv0 + 1) : 0, argv0);
        else snprintf(dir, sizeof dir, ".");
        d->n = 0;
        names[0] = 0;
        for (i = 0; i < 3; i++) {
            FILE *f;
            snprintf(path, sizeof path, "%s/%s", dir, files[i]);
            if (!(f = fopen(path, "rb"))) continue;
            fclose(f);
            if (!load_tokens(d, path, vocab, err, errsize)) return 0;
            if (names[0]) strcat(names, " + ");
            strcat(names, files[i]);
        }
        if (d->n) {
            snprintf(d->source, sizeof d->source, "%s in %s", names, dir);
            return 1;
        }
    }
    snprintf(err, errsize, "no --data given, and no ddp.h next to the program or in the current directory");
    return 0;
}

/* Loads --data (or the default text) and checks that both splits hold a window. */
static int load_data(dataset *d, const char *path, const char *argv0, int vocab, int T, char *err, size_t errsize)
{
    memset(d, 0, sizeof *d);
    if (path) {
        if (!load_tokens(d, path, vocab, err, errsize)) return 0;
        snprintf(d->source, sizeof d->source, "%s", path);
    } else if (!load_default(d, argv0, vocab, err, errsize)) {
        return 0;
    }
    d->n_train = d->n - d->n / 10;
    if (num_windows(d->n / 10, T) < 1) {
        snprintf(err, errsize, "%s: %zu tokens are too few for --ctx %d: need %zu (a window of %d in the last 10%%)",
                 d->source, d->n, T, (size_t)10 * (T + 1), T + 1);
        return 0;
    }
    return 1;
}

/* Fills the micro-batch with the windows of the sampler's indices. */
static void fill_batch(gpt *g, const int *split, const size_t *windows, int B)
{
    const int T = g->cfg.ctx;
    int b, t;
    for (b = 0; b < B; b++) {
        const int *w = split + windows[b] * (size_t)T;
        for (t = 0; t < T; t++) {
            g->a.tokens[b * T + t] = w[t];
            g->a.targets[b * T + t] = w[t + 1];
        }
    }
}

/* ---- checkpoints: safetensors ---------------------------------------------------------
   An 8-byte little-endian header length N, N bytes of JSON (padded with spaces to a
   multiple of 8), then the raw data. Every parameter under its GPT-2 name, AdamW's
   moments as opt.m.<name> and opt.v.<name>, and in __metadata__ the step, seed and
   model shape. Loads with safetensors.torch.load_file (weights are (out, in) as in
   torch.nn.Linear; HF's GPT-2 Conv1D stores them transposed). Written by rank 0 to
   FILE.tmp, flushed, fsync'ed and renamed, so FILE is always whole. */
typedef struct text {
    char *s;
    size_t len, cap;
    int ok;
} text;

static void put(text *t, const char *fmt, ...)
{
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !t->ok) {
        t->ok = 0;
        return;
    }
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = 2 * (t->len + (size_t)n + 1);
        char *s = (char *)realloc(t->s, cap);
        if (!s) {
            t->ok = 0;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

static int save_checkpoint(const gpt *g, const char *path, int step, uint64_t seed, int world_size)
{
    static const char *const prefix[3] = {"", "opt.m.", "opt.v."};
    const float *arrays[3] = {g->params, g->m, g->v};
    const size_t bytes = g->num_params * sizeof(float);
    char tmp[4200];
    text h;
    uint64_t hlen;
    unsigned char len8[8];
    FILE *f;
    int i, k, ok;
    memset(&h, 0, sizeof h);
    h.ok = 1;
    put(&h, "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"%d\",\"seed\":\"%llu\",\"layers\":\"%d\",\"heads\":\"%d\","
            "\"dim\":\"%d\",\"ctx\":\"%d\",\"vocab\":\"%d\",\"world_size\":\"%d\",\"lm_head\":\"tied to wte.weight\"}",
        step, (unsigned long long)seed, g->cfg.layers, g->cfg.heads, g->cfg.dim, g->cfg.ctx, g->cfg.vocab, world_size);
    for (k = 0; k < 3; k++)
        for (i = 0; i < g->num_tensors; i++) {
            const tensor *t = &g->tensors[i];
            size_t begin = k * bytes + t->offset * sizeof(float);
            put(&h, ",\"%s%s\":{\"dtype\":\"F32\",\"shape\":[%d", prefix[k], t->name, t->shape[0]);
            if (t->ndim == 2) put(&h, ",%d", t->shape[1]);
            put(&h, "],\"data_offsets\":[%zu,%zu]}", begin, begin + t->numel * sizeof(float));
        }
    put(&h, "}");
    while (h.ok && h.len % 8) put(&h, " ");
    if (!h.ok) return 0;
    hlen = h.len;
    for (i = 0; i < 8; i++) len8[i] = (unsigned char)(hlen >> (8 * i));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "wb"))) {
        free(h.s);
        return 0;
    }
    /* the data is written as this machine stores floats: little-endian on x86 and ARM */
    ok = fwrite(len8, 8, 1, f) == 1 && fwrite(h.s, 1, h.len, f) == h.len;
    for (k = 0; k < 3; k++) ok = ok && fwrite(arrays[k], sizeof(float), g->num_params, f) == g->num_params;
    ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    ok = ok && rename(tmp, path) == 0;
    if (!ok) remove(tmp);
    free(h.s);
    return ok;
}

/* A parsed safetensors file: the header's tensors and metadata, and the data. */
typedef struct st_tensor {
    char name[96], dtype[16];
    int ndim;
    uint64_t shape[8], begin, end;
} st_tensor;

typedef struct st_file {
    unsigned char *bytes;
    const unsigned char *data;
    size_t size, data_size;
    st_tensor *t;
    int n, cap;
    char meta_key[32][32], meta_val[32][128];
    int n_meta;
} st_file;

/* A JSON reader for exactly what a safetensors header holds: one object of objects
   whose values are strings and arrays of integers. */
typedef struct json {
    const char *p, *end;
} json;

static int json_eat(json *j, char c)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r')) j->p++;
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

static int json_string(json *j, char *out, size_t cap)
{
    size_t n = 0;
    if (!json_eat(j, '"')) return 0;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\') { /* the simple escapes; \u never occurs in our names */
            if (j->p >= j->end) return 0;
            c = *j->p++;
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c == '"' || c == '\\' || c == '/' ? c : 0;
            if (!c) return 0;
        }
        if (n + 1 >= cap) return 0;
        out[n++] = c;
    }
    out[n] = 0;
    return j->p++ < j->end;
}

static int json_ints(json *j, uint64_t *v, int max, int *n)
{
    *n = 0;
    if (!json_eat(j, '[')) return 0;
    if (json_eat(j, ']')) return 1;
    do {
        uint64_t x = 0;
        int digits = 0;
        json_eat(j, ' ');
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9' && digits < 19) x = 10 * x + (uint64_t)(*j->p++ - '0'), digits++;
        if (!digits || *n >= max) return 0;
        v[(*n)++] = x;
    } while (json_eat(j, ','));
    return json_eat(j, ']');
}

static int st_parse_tensor(json *j, st_tensor *t)
{
    char key[32];
    uint64_t off[2];
    int n, seen = 0;
    if (!json_eat(j, '{')) return 0;
    do {
        if (!json_string(j, key, sizeof key) || !json_eat(j, ':')) return 0;
        if (strcmp(key, "dtype") == 0 && json_string(j, t->dtype, sizeof t->dtype)) seen |= 1;
        else if (strcmp(key, "shape") == 0 && json_ints(j, t->shape, 8, &t->ndim)) seen |= 2;
        else if (strcmp(key, "data_offsets") == 0 && json_ints(j, off, 2, &n) && n == 2) seen |= 4;
        else return 0;
    } while (json_eat(j, ','));
    t->begin = off[0];
    t->end = off[1];
    return seen == 7 && json_eat(j, '}');
}

static void st_free(st_file *f)
{
    free(f->bytes);
    free(f->t);
    memset(f, 0, sizeof *f);
}

/* Reads and checks the whole file: header syntax, every tensor inside the data. */
static int st_load(st_file *f, const char *path, char *err, size_t errsize)
{
    uint64_t hlen = 0;
    json j;
    char key[96];
    int i;
    memset(f, 0, sizeof *f);
    if (!(f->bytes = read_file(path, &f->size, err, errsize))) return 0;
    for (i = 0; i < 8 && f->size >= 8; i++) hlen |= (uint64_t)f->bytes[i] << (8 * i);
    if (f->size < 8 || hlen < 2 || hlen > f->size - 8) {
        snprintf(err, errsize, "%s: not a safetensors file (truncated or bad header length)", path);
        st_free(f);
        return 0;
    }
    f->data = f->bytes + 8 + hlen;
    f->data_size = f->size - 8 - hlen;
    j.p = (const char *)f->bytes + 8;
    j.end = j.p + hlen;
    if (!json_eat(&j, '{')) goto corrupt;
    do {
        if (!json_string(&j, key, sizeof key) || !json_eat(&j, ':')) goto corrupt;
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_eat(&j, '{')) goto corrupt;
            if (json_eat(&j, '}')) continue;
            do {
                if (f->n_meta == 32 || !json_string(&j, f->meta_key[f->n_meta], sizeof f->meta_key[0]) ||
                    !json_eat(&j, ':') || !json_string(&j, f->meta_val[f->n_meta], sizeof f->meta_val[0]))
                    goto corrupt;
                f->n_meta++;
            } while (json_eat(&j, ','));
            if (!json_eat(&j, '}')) goto corrupt;
        } else {
            st_tensor *t;
            if (f->n == f->cap) {
                int cap = f->cap ? 2 * f->cap : 64;
                st_tensor *grown = (st_tensor *)realloc(f->t, (size_t)cap * sizeof *grown);
                if (!grown) goto corrupt;
                f->t = grown;
                f->cap = cap;
            }
            t = &f->t[f->n++];
            memset(t, 0, sizeof *t);
            memcpy(t->name, key, sizeof t->name);
            if (!st_parse_tensor(&j, t)) goto corrupt;
            if (t->end < t->begin || t->end > f->data_size) {
                snprintf(err, errsize, "%s: tensor %s lies outside the data (truncated file?)", path, t->name);
                st_free(f);
                return 0;
            }
        }
    } while (json_eat(&j, ','));
    if (json_eat(&j, '}')) return 1;
corrupt:
    snprintf(err, errsize, "%s: corrupt safetensors header", path);
    st_free(f);
    return 0;
}

static const char *st_meta(const st_file *f, const char *key)
{
    int i;
    for (i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_key[i], key) == 0) return f->meta_val[i];
    return "";
}

static const st_tensor *st_find(const st_file *f, const char *name)
{
    int i;
    for (i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

static int st_numel(const st_tensor *t, size_t *numel)
{
    int i;
    *numel = 1;
    for (i = 0; i < t->ndim; i++) *numel *= (size_t)t->shape[i];
    return strcmp(t->dtype, "F32") == 0 && t->end - t->begin == *numel * sizeof(float);
}

/* Fills params, m and v from a checkpoint of the same model; returns the step it
   was written after, or -1 with the reason in err. */
static int load_checkpoint(gpt *g, const char *path, uint64_t *seed, char *err, size_t errsize)
{
    static const char *const prefix[3] = {"", "opt.m.", "opt.v."};
    float *arrays[3] = {g->params, g->m, g->v};
    const int want[5] = {g->cfg.layers, g->cfg.heads, g->cfg.dim, g->cfg.ctx, g->cfg.vocab};
    static const char *const keys[5] = {"layers", "heads", "dim", "ctx", "vocab"};
    st_file f;
    char name[128];
    int i, k, step;
    if (!st_load(&f, path, err, errsize)) return -1;
    for (k = 0; k < 5; k++)
        if (atoi(st_meta(&f, keys[k])) != want[k]) {
            snprintf(err, errsize, "%s: written for --%s %s, this run has --%s %d", path, keys[k],
                     *st_meta(&f, keys[k]) ? st_meta(&f, keys[k]) : "(missing)", keys[k], want[k]);
            st_free(&f);
            return -1;
        }
    for (k = 0; k < 3; k++)
        for (i = 0; i < g->num_tensors; i++) {
            const tensor *t = &g->tensors[i];
            const st_tensor *s;
            size_t numel;
            snprintf(name, sizeof name, "%s%s", prefix[k], t->name);
            if (!(s = st_find(&f, name)) || !st_numel(s, &numel) || numel != t->numel) {
                snprintf(err, errsize, "%s: tensor %s is %s", path, name, s ? "of another shape or dtype" : "missing");
                st_free(&f);
                return -1;
            }
            memcpy(arrays[k] + t->offset, f.data + s->begin, numel * sizeof(float));
        }
    step = atoi(st_meta(&f, "step"));
    *seed = strtoull(st_meta(&f, "seed"), NULL, 10);
    st_free(&f);
    return step;
}

/* --compare A B: the largest difference between same-named tensors, relative to the
   tensor's largest magnitude. The tests use it to show that runs agree. */
static int compare_checkpoints(const char *a_path, const char *b_path)
{
    st_file a, b;
    char err[600];
    double worst = 0.0;
    const char *worst_name = "";
    int i, ok = 1;
    if (!st_load(&a, a_path, err, sizeof err)) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    if (!st_load(&b, b_path, err, sizeof err)) {
        fprintf(stderr, PROG ": %s\n", err);
        st_free(&a);
        return 1;
    }
    for (i = 0; i < a.n && ok; i++) {
        const st_tensor *ta = &a.t[i], *tb = st_find(&b, ta->name);
        size_t na, nb, e;
        double diff = 0.0, scale = 0.0;
        if (!tb || !st_numel(ta, &na) || !st_numel(tb, &nb) || na != nb) {
            fprintf(stderr, PROG ": tensor %s is missing from %s or differs in shape or dtype\n", ta->name, b_path);
            ok = 0;
            break;
        }
        for (e = 0; e < na; e++) {
            float x, y;
            memcpy(&x, a.data + ta->begin + 4 * e, 4);
            memcpy(&y, b.data + tb->begin + 4 * e, 4);
            diff = fmax(diff, fabs((double)x - y));
            scale = fmax(scale, fabs((double)x));
        }
        if (diff > 0 && (scale == 0 || diff / scale > worst)) {
            worst = scale > 0 ? diff / scale : INFINITY;
            worst_name = ta->name;
        }
    }
    if (ok && a.n != b.n) {
        fprintf(stderr, PROG ": %s has %d tensors, %s has %d\n", a_path, a.n, b_path, b.n);
        ok = 0;
    }
    if (ok) printf("max_rel_diff %.3e over %d tensors%s%s\n", worst, a.n, *worst_name ? ", worst " : "", worst_name);
    st_free(&a);
    st_free(&b);
    return ok ? 0 : 1;
}

/* ---- flags --------------------------------------------------------------------------- */
typedef struct options {
    config cfg;
    const char *data, *log, *save, *resume, *prompt, *compare[2];
    int batch_size, grad_accum, steps, stop_after, warmup, val_every, save_every, sample_len, bucket_kb, nproc;
    int bench_no_sync;
    float lr, min_lr_frac, weight_decay, clip, temperature;
    uint64_t seed;
} options;

static const char usage[] =
    "usage: train_gpt [--nproc N] [flags]\n"
    "  model:    --layers 4 --heads 4 --dim 128 --ctx 64 --vocab 256\n"
    "  data:     --data FILE (text as bytes, llm.c .bin shard, nanoGPT uint16 .bin;\n"
    "            default: the repository's ddp.h, ddp_kernels.cuh, README.md)\n"
    "  batch:    --batch-size 8 (sequences per rank per micro-step) --grad-accum 1\n"
    "  schedule: --steps 150 --lr 1e-3 --warmup 15 --min-lr-frac 0.1 (cosine)\n"
    "            --stop-after N (end this run after step N; --resume goes on)\n"
    "            --weight-decay 0.1 --clip 1.0 (0: off) --seed 0\n"
    "  output:   --val-every 50 (0: off) --log FILE.jsonl --save FILE.safetensors\n"
    "            --save-every K --resume FILE.safetensors\n"
    "  sample:   --prompt \"The \" --sample-len 200 --temperature 0.8 (0: greedy)\n"
    "  sync:     --bucket-kb 1024 (gradient bucket size)\n"
    "            --bench-no-sync (benchmark only: no gradient all-reduce; ranks diverge)\n"
    "  compare:  train_gpt --compare A.safetensors B.safetensors (max relative difference)\n"
    "  device:   the nvcc build (train_gpt_gpu) trains on the GPUs, one per rank, when it\n"
    "            sees them (NCCL backend, fp32); without one, or with DDP_BACKEND=cpu, on the CPU\n";

static int int_flag(const char *v, long lo, long hi, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    *out = (int)x;
    return end != v && !*end && x >= lo && x <= hi;
}

static int float_flag(const char *v, float lo, float hi, float *out)
{
    char *end;
    float x = strtof(v, &end);
    *out = x;
    return end != v && !*end && x >= lo && x <= hi;
}

/* Returns 1 if the flags are good, 0 after printing one line, -1 for --help. */
static int parse_options(int argc, char **argv, options *o)
{
    int i;
    memset(o, 0, sizeof *o);
    o->cfg.layers = 4;
    o->cfg.heads = 4;
    o->cfg.dim = 128;
    o->cfg.ctx = 64;
    o->cfg.vocab = 256;
    o->batch_size = 8;
    o->grad_accum = 1;
    o->steps = 150;
    o->lr = 1e-3f;
    o->warmup = 15;
    o->min_lr_frac = 0.1f;
    o->weight_decay = 0.1f;
    o->clip = 1.0f;
    o->val_every = 50;
    o->prompt = "The ";
    o->sample_len = 200;
    o->temperature = 0.8f;
    o->bucket_kb = 1024;
    o->nproc = 1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL, *range = NULL;
        int ok = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return -1;
        if (strncmp(a, "--local_rank=", 13) == 0 || strncmp(a, "--local-rank=", 13) == 0) continue;
        if (strcmp(a, "--bench-no-sync") == 0) {
            o->bench_no_sync = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, PROG ": unexpected argument '%s' (train_gpt --help lists the flags)\n", a);
            return 0;
        }
        if (!v) {
            fprintf(stderr, PROG ": %s needs a value (train_gpt --help lists the flags)\n", a);
            return 0;
        }
#define INT(flag, field, lo, hi) else if (strcmp(a, flag) == 0) ok = int_flag(v, lo, hi, &o->field), range = "an integer from " #lo " to " #hi
#define FLT(flag, field, lo, hi) else if (strcmp(a, flag) == 0) ok = float_flag(v, lo, hi, &o->field), range = "a number from " #lo " to " #hi
        if (strcmp(a, "--local_rank") == 0 || strcmp(a, "--local-rank") == 0) {}
        INT("--nproc", nproc, 1, 256);
        INT("--layers", cfg.layers, 1, 64);
        INT("--heads", cfg.heads, 1, 64);
        INT("--dim", cfg.dim, 1, 8192);
        INT("--ctx", cfg.ctx, 1, 8192);
        INT("--vocab", cfg.vocab, 2, 65536);
        INT("--batch-size", batch_size, 1, 65536);
        INT("--grad-accum", grad_accum, 1, 65536);
        INT("--steps", steps, 1, 100000000);
        INT("--stop-after", stop_after, 1, 100000000);
        INT("--warmup", warmup, 0, 100000000);
        INT("--val-every", val_every, 0, 100000000);
        INT("--save-every", save_every, 1, 100000000);
        INT("--sample-len", sample_len, 0, 1000000);
        INT("--bucket-kb", bucket_kb, 1, 4194304);
        FLT("--lr", lr, 1e-9, 10);
        FLT("--min-lr-frac", min_lr_frac, 0, 1);
        FLT("--weight-decay", weight_decay, 0, 10);
        FLT("--clip", clip, 0, 1e9);
        FLT("--temperature", temperature, 0, 100);
        else if (strcmp(a, "--seed") == 0) {
            char *end;
            o->seed = strtoull(v, &end, 10);
            ok = end != v && !*end && *v != '-';
            range = "a non-negative integer";
        } else if (strcmp(a, "--data") == 0) o->data = v;
        else if (strcmp(a, "--log") == 0) o->log = v;
        else if (strcmp(a, "--save") == 0) o->save = v;
        else if (strcmp(a, "--resume") == 0) o->resume = v;
        else if (strcmp(a, "--prompt") == 0) o->prompt = v;
        else if (strcmp(a, "--compare") == 0) {
            if (i + 2 >= argc) {
                fprintf(stderr, PROG ": --compare needs two files\n");
                return 0;
            }
            o->compare[0] = v;
            o->compare[1] = argv[i + 2];
            return 1;
        } else {
            fprintf(stderr, PROG ": unknown flag '%s' (train_gpt --help lists the flags)\n", a);
            return 0;
        }
#undef INT
#undef FLT
        if (!ok) {
            fprintf(stderr, PROG ": bad value '%s' for %s: %s\n", v, a, range);
            return 0;
        }
        i++;
    }
    if (o->cfg.dim % o->cfg.heads) {
        fprintf(stderr, PROG ": --dim %d is not a multiple of --heads %d\n", o->cfg.dim, o->cfg.heads);
        return 0;
    }
    if (o->save_every && !o->save) {
        fprintf(stderr, PROG ": --save-every needs --save FILE\n");
        return 0;
    }
    return 1;
}

/* ---- training ---------------------------------------------------------------------- */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Linear warmup to lr, then cosine decay to lr * min_lr_frac at the last step. */
static float learning_rate(const options *o, int step)
{
    double frac;
    if (step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    frac = o->steps > o->warmup + 1 ? (double)(step - o->warmup) / (o->steps - o->warmup - 1) : 1.0;
    return o->lr * (float)(o->min_lr_frac + (1.0 - o->min_lr_frac) * 0.5 * (1.0 + cos(3.141592653589793 * frac)));
}

/* Mean loss over every validation window, on all ranks together (padding skipped). */
static int evaluate(ddp_ctx *ctx, gpt *g, gpu *dev, const dataset *d, ddp_sampler *val, double *loss)
{
    const int T = g->cfg.ctx;
    ddp_metric m;
    size_t b;
    int i;
    memset(&m, 0, sizeof m);
    for (b = 0; b < val->num_batches; b++) {
        ddp_batch bt = ddp_sampler_batch(val, 0, b);
        if (!bt.num_real) continue;
        fill_batch(g, d->tokens + d->n_train, bt.indices, (int)bt.num_real);
        if (dev) gpu_forward(g, dev, (int)bt.num_real, 1, 0);
        else gpt_forward(g, (int)bt.num_real, 1, 0);
        for (i = 0; i < (int)bt.num_real * T; i++) ddp_metric_add(&m, g->a.losses[i], 1);
    }
    if (ddp_metric_reduce(ctx, &m, 1) != DDP_OK) return 0;
    *loss = ddp_metric_mean(&m);
    return 1;
}

/* Rank 0 continues the prompt, one token at a time, from a seeded generator. */
static void generate(gpt *g, gpu *dev, const options *o)
{
    const int T = g->cfg.ctx, V = g->cfg.vocab;
    int *seq = (int *)calloc((size_t)o->sample_len + strlen(o->prompt) + 1, sizeof(int));
    uint64_t rng = o->seed;
    int n = 0, i, k;
    if (!seq) return;
    for (i = 0; o->prompt[i]; i++) seq[n++] = (unsigned char)o->prompt[i] % V;
    if (!n) seq[n++] = '\n' % V;
    printf("sample (%s, temperature %g):\n%s", V <= 256 ? "bytes" : "token ids", o->temperature,
           V <= 256 ? o->prompt : "");
    for (k = 0; k < o->sample_len; k++) {
        /* the last T tokens; positions after them are padding the causal mask ignores */
        int start = n > T ? n - T : 0, len = n - start, next = 0;
        const float *logits;
        for (i = 0; i < T; i++) g->a.tokens[i] = i < len ? seq[start + i] : 0;
        if (dev) { /* the device's forward; only the row we sample from comes back */
            gpu_forward(g, dev, 1, 0, 0);
            gpu_logits_to_host(g, dev, len - 1);
        } else {
            gpt_forward(g, 1, 0, 0);
        }
        logits = g->a.logits + (size_t)(len - 1) * V;
        for (i = 1; i < V; i++) next = logits[i] > logits[next] ? i : next;
        if (o->temperature > 0) { /* softmax(logits / temperature), then one draw */
            double sum = 0, r;
            for (i = 0; i < V; i++) sum += exp((logits[i] - logits[next]) / o->temperature);
            r = uniform(&rng) * sum;
            for (i = 0; i < V - 1; i++)
                if ((r -= exp((logits[i] - logits[next]) / o->temperature)) < 0) break;
            next = i;
        }
        seq[n++] = next;
        if (V <= 256) putchar(next == '\n' || next == '\t' || (next >= 32 && next < 127) || next >= 128 ? next : '.');
        else printf("%d ", next);
    }
    printf("\n");
    free(seq);
}

/* ---- main ---------------------------------------------------------------------------- */
static int fail(const char *what) /* one line, every rank: which rank failed and why */
{
    fprintf(stderr, PROG ": %s\n", what);
    return 1;
}

int main(int argc, char **argv)
{
    options o;
    dataset data;
    gpt model;
    gpu *dev = NULL; /* the model's device copy when training on a GPU */
    ddp_ctx ctx;
    ddp_desc desc;
    ddp_grad sync;
    ddp_grad_desc gd;
    ddp_sampler train, val;
    ddp_sampler_desc sd;
    FILE *log = NULL;
    char err[1200];
    size_t train_windows, val_windows, steps_per_epoch, global_batch, i;
    double t_start, t_train = 0;
    int status, step, start_step = 0, stop, l;
    ddp_result r;
    uint64_t seed;

    status = parse_options(argc, argv, &o);
    if (status < 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (status == 0) return 2;
    if (o.compare[0]) return compare_checkpoints(o.compare[0], o.compare[1]);

    /* Read and check the data before starting ranks: a bad file is one line, once. */
    if (!load_data(&data, o.data, argv[0], o.cfg.vocab, o.cfg.ctx, err, sizeof err)) return fail(err);
    train_windows = num_windows(data.n_train, o.cfg.ctx);
    val_windows = num_windows(data.n - data.n_train, o.cfg.ctx);
    if (train_windows < (size_t)o.batch_size * o.grad_accum * o.nproc) {
        snprintf(err, sizeof err, "%s: %zu training windows of %d tokens, fewer than one global batch of %zu",
                 data.source, train_windows, o.cfg.ctx, (size_t)o.batch_size * o.grad_accum * o.nproc);
        return fail(err);
    }
    if (!gpt_create(&model, o.cfg, o.batch_size)) return fail("out of memory for the model");
    seed = o.seed;
    if (o.resume && (start_step = load_checkpoint(&model, o.resume, &seed, err, sizeof err)) < 0) return fail(err);

    /* "--nproc N": this process becomes the launcher of N ranks and returns here */
    status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;

    memset(&desc, 0, sizeof desc);
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1; /* the reason is on stderr */
#ifdef _OPENMP
    /* ranks share the cores: spinning threads of several ranks on one core crawl */
    if (!getenv("OMP_NUM_THREADS"))
        omp_set_num_threads(omp_get_num_procs() / ctx.local_world_size > 1 ? omp_get_num_procs() / ctx.local_world_size : 1);
#endif
    global_batch = (size_t)o.batch_size * ctx.world_size * o.grad_accum;
    steps_per_epoch = train_windows / global_batch;
    if (steps_per_epoch == 0) {
        if (ddp_is_main(&ctx)) fprintf(stderr, PROG ": fewer training windows than one global batch\n");
        return 1;
    }

    /* template: DistributedDataParallel(model). Without --resume every rank draws its
       own weights; ddp_grad_init broadcasts rank 0's, so all ranks start equal. The
       gradient sum is what the ranks reduce: sum, not average, because the loss is the
       mean over the global batch's tokens and the step divides by their count. */
    if (!o.resume) gpt_init_weights(&model, o.seed + (uint64_t)ctx.rank);
    if (ctx.backend == DDP_BACKEND_NCCL && !(dev = gpu_create(&model)))
        return fail("the NCCL backend needs the GPU path: build with nvcc, or set DDP_BACKEND=cpu");
    memset(&gd, 0, sizeof gd);
    gd.grads = model.grad_sum;
    gd.count = model.num_params;
    gd.dtype = DDP_F64;
    gd.sum = 1;
    gd.bucket_bytes = (size_t)o.bucket_kb << 10;
    gd.params = model.params;
    gd.param_dtype = DDP_F32;
    if (dev) gpu_grad_desc(dev, &gd); /* fp32 device gradients, summed in place */
    if (ddp_grad_init(&sync, &ctx, &gd) != DDP_OK) return 1;

    /* One sampler over the training windows: drop_last (no padding), and every step a
       full global batch, so one rank with batch G and N ranks with G/N see the same
       windows. Micro-step k of step s is sampler batch (s mod steps_per_epoch) A + k of
       epoch s / steps_per_epoch: the position depends on the step alone, so a resumed
       run continues the exact data order. */
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = train_windows;
    sd.batch_size = (size_t)o.batch_size;
    sd.seed = seed;
    sd.drop_last = 1;
    sd.drop_last_batch = 1;
    if (ddp_sampler_init(&train, &ctx, &sd) != DDP_OK) return 1;
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = val_windows;
    sd.batch_size = (size_t)o.batch_size;
    sd.no_shuffle = 1;
    if (ddp_sampler_init(&val, &ctx, &sd) != DDP_OK) return 1;

    if (ddp_is_main(&ctx) && o.log && !(log = fopen(o.log, "a"))) {
        snprintf(err, sizeof err, "cannot open --log %s: %s", o.log, strerror(errno));
        return fail(err);
    }
#ifdef __CUDACC__
    if (!dev) ddp_print(&ctx, "note: no GPU in use (backend %s): training with the CPU kernels\n",
                        ddp_backend_name(ctx.backend));
#endif
    ddp_print(&ctx, "model: %d layers, %d heads, dim %d, ctx %d, vocab %d: %.2f M parameters\n", o.cfg.layers,
              o.cfg.heads, o.cfg.dim, o.cfg.ctx, o.cfg.vocab, (double)model.num_params / 1e6);
    ddp_print(&ctx, "data: %s: %zu tokens, %zu train windows, %zu validation windows%s\n", data.source, data.n,
              train_windows, val_windows, o.data ? "" : " (no --data: the repository's own text)");
    ddp_print(&ctx, "ranks: %d (%s backend), global batch %zu sequences = %d per rank x %d ranks x %d accum, "
              "%zu tokens per step, %zu steps per epoch\n", ctx.world_size, ddp_backend_name(ctx.backend), global_batch,
              o.batch_size, ctx.world_size, o.grad_accum, global_batch * o.cfg.ctx, steps_per_epoch);
    if (o.resume) ddp_print(&ctx, "resumed from %s after step %d\n", o.resume, start_step);

    /* --stop-after pauses a run (a job's time limit): the schedule still spans --steps */
    stop = o.stop_after && o.stop_after < o.steps ? o.stop_after : o.steps;
    t_start = now_s();
    for (step = start_step; step < stop; step++) {
        const double t0 = now_s();
        double tokens = 0.0, val_loss = 0.0, step_time;
        float lr = learning_rate(&o, step), norm = 0.0f;
        ddp_metric loss;
        int k, has_val = 0;
        memset(&loss, 0, sizeof loss);
        memset(model.grad_sum, 0, model.num_params * sizeof(double));

        /* template: for data in train_loader: loss = model(data); loss.backward().
           Micro-steps before the last only accumulate (DDP's no_sync()). */
        for (k = 0; k < o.grad_accum; k++) {
            size_t b = (size_t)(step % steps_per_epoch) * o.grad_accum + k;
            ddp_batch bt = ddp_sampler_batch(&train, (uint64_t)(step / steps_per_epoch), b);
            if (ddp_grad_no_sync(&sync, k < o.grad_accum - 1 || o.bench_no_sync) != DDP_OK) return 1;
            fill_batch(&model, data.tokens, bt.indices, (int)bt.count);
            if (dev) gpu_forward(&model, dev, (int)bt.count, 1, 1);
            else gpt_forward(&model, (int)bt.count, 1, 1);
            for (i = 0; i < bt.count * o.cfg.ctx; i++) ddp_metric_add(&loss, model.a.losses[i], 1);
            r = dev ? gpu_backward(&model, dev, (int)bt.count, &sync) : gpt_backward(&model, (int)bt.count, &sync);
            if (r != DDP_OK || ddp_grad_finish(&sync) != DDP_OK) return 1;
            tokens += (double)bt.global_count * o.cfg.ctx;
        }
        if (dev) { /* the same step on the device */
            norm = gpu_step(&model, dev, lr, o.weight_decay, o.clip, step, tokens);
        } else {
            /* the mean gradient over the global batch's tokens, then clip its norm */
            for (i = 0; i < model.num_params; i++) model.grads[i] = (float)(model.grad_sum[i] / tokens);
            ddp_global_norm_cpu(&norm, model.grads, model.num_params);
            if (o.clip > 0) ddp_clip_by_norm_cpu(model.grads, model.num_params, o.clip, &norm);
            /* template: optimizer.step(). AdamW per tensor: no decay for biases and
               layernorm weights (the 1-D tensors) */
            for (l = 0; l < model.num_tensors; l++) {
                const tensor *t = &model.tensors[l];
                ddp_adamw_update_cpu(param(&model, t), grad(&model, t), model.m + t->offset, model.v + t->offset,
                                     t->numel, lr, 0.9f, 0.95f, 1e-8f, t->ndim == 2 ? o.weight_decay : 0.0f, step + 1);
            }
            memset(model.grads, 0, model.num_params * sizeof(float)); /* the backward pass accumulates into it */
        }
        if (ddp_metric_reduce(&ctx, &loss, 1) != DDP_OK) return 1;
        step_time = now_s() - t0;
        t_train += step_time;

        if (o.val_every && ((step + 1) % o.val_every == 0 || step + 1 == stop)) {
            if (!evaluate(&ctx, &model, dev, &data, &val, &val_loss)) return 1;
            has_val = 1;
        }
        if (ddp_is_main(&ctx)) {
            double elapsed = now_s() - t_start, per_step = elapsed / (step + 1 - start_step);
            double tok_s = tokens / step_time;
            printf("step %5d/%d | loss %.6f | lr %.2e | norm %.3f | %.0f tok/s | %.1f s, ETA %.1f s", step + 1, o.steps,
                   ddp_metric_mean(&loss), lr, norm, tok_s, elapsed, per_step * (stop - step - 1));
            if (has_val) printf(" | val %.6f", val_loss);
            printf("\n");
            fflush(stdout);
            if (log) {
                fprintf(log, "{\"step\": %d, \"loss\": %.6f, ", step + 1, ddp_metric_mean(&loss));
                if (has_val) fprintf(log, "\"val_loss\": %.6f, ", val_loss);
                fprintf(log, "\"lr\": %.6g, \"tokens_per_s\": %.1f, \"world_size\": %d}\n", lr, tok_s, ctx.world_size);
                fflush(log);
            }
            if (o.save && ((o.save_every && (step + 1) % o.save_every == 0) || step + 1 == stop)) {
                if (dev) gpu_to_host(&model, dev); /* the same file as a CPU run's */
                if (!save_checkpoint(&model, o.save, step + 1, seed, ctx.world_size)) {
                    snprintf(err, sizeof err, "cannot write checkpoint %s: %s", o.save, strerror(errno));
                    return fail(err);
                }
            }
        }
    }
    ddp_print(&ctx, "trained %d steps in %.1f s: %.0f tokens/s over %d ranks\n", stop - start_step, t_train,
              t_train > 0 ? (double)(stop - start_step) * global_batch * o.cfg.ctx / t_train : 0.0, ctx.world_size);
    if (ddp_is_main(&ctx) && o.sample_len) generate(&model, dev, &o);

    if (log) fclose(log);
    ddp_grad_destroy(&sync);
    if (dev) gpu_destroy(dev);
    ddp_sampler_destroy(&train);
    ddp_sampler_destroy(&val);
    gpt_destroy(&model);
    free(data.tokens);
    ddp_destroy(&ctx);
    return 0;
}
