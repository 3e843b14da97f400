/* train_gpt: a GPT-2 style language model, trained data-parallel with the two headers.

       ./examples/train_gpt --nproc 2                      the short story examples/train_gpt.txt
       ./examples/train_gpt --nproc 4 --data input.txt --steps 500 --save gpt.safetensors

   ddp.h runs the ranks and keeps them in step (rank 0's initial weights broadcast,
   a distributed sampler, bucketed gradient all-reduce that overlaps the backward
   pass, exact global metrics); ddp_kernels.cuh supplies the layers. The file reads
   top to bottom: model (two lists: BLOCK_TENSORS and GPT_ACTIVATIONS), forward,
   backward, the GPU path, data, flags, the training step, setup, main (the loop);
   then the checkpoints, through examples/safetensors.h.

   The model: token + position embedding; per block, pre-LN attention and MLP with
   residuals (ln1 -> qkv -> causal attention -> proj -> +, ln2 -> fc -> GELU -> proj -> +);
   a final layernorm; logits through the token embedding again (tied lm_head).

   N processes train exactly the model one process trains with the same global
   batch. Each sequence's parameter gradient is computed on its own (in fp32, the same
   bits on any rank; the activations' gradients go a micro-batch at a time, row by
   row) and added in double, and the ranks sum those doubles: the sum no longer
   depends on which rank or micro-step a sequence fell on, so 1 x 8, 2 x 4, 4 x 2 and
   1 x 2 with --grad-accum 4 give the same parameters (tests/test_train_gpt.sh). (The
   double sum is exact while a weight's per-sequence gradients span less than about
   2^28 in size; past that a split may, rarely, move the weight's last bit.)

   On GPUs: built with nvcc (make builds examples/train_gpt_gpu) and run with one GPU
   per rank, the model trains on the device (see "the GPU path" below): the _gpu
   kernels over whole micro-batches on one stream, bf16 activations with fp32 master
   weights (--dtype fp32: all fp32), fp32 gradients all-reduced by NCCL in buckets
   while the backward pass runs (--allreduce bf16: as bf16), the same schedule,
   metrics and checkpoint format (a checkpoint moves between CPU and GPU runs). With
   --dtype fp32, GPU results match the CPU path to fp32 rounding, not bit for bit. The
   nvcc build without a visible GPU (or with DDP_BACKEND=cpu) trains on the CPU as the
   gcc build does. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "ddp_kernels.cuh"
#include "safetensors.h" /* st_read, st_write_file: checkpoints */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
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

/* The tensors of one block, in buffer order: enum name, GPT-2 name, shape in units of
   C (rows x columns; 0 columns: a vector), initialisation. */
#define BLOCK_TENSORS(X)                                          \
    X(LN1W, "ln_1.weight", 1, 0, INIT_ONES)                       \
    X(LN1B, "ln_1.bias", 1, 0, INIT_ZEROS)                        \
    X(QKVW, "attn.c_attn.weight", 3, 1, INIT_NORMAL)              \
    X(QKVB, "attn.c_attn.bias", 3, 0, INIT_ZEROS)                 \
    X(ATTPROJW, "attn.c_proj.weight", 1, 1, INIT_RESIDUAL)        \
    X(ATTPROJB, "attn.c_proj.bias", 1, 0, INIT_ZEROS)             \
    X(LN2W, "ln_2.weight", 1, 0, INIT_ONES)                       \
    X(LN2B, "ln_2.bias", 1, 0, INIT_ZEROS)                        \
    X(FCW, "mlp.c_fc.weight", 4, 1, INIT_NORMAL)                  \
    X(FCB, "mlp.c_fc.bias", 4, 0, INIT_ZEROS)                     \
    X(FCPROJW, "mlp.c_proj.weight", 1, 4, INIT_RESIDUAL)          \
    X(FCPROJB, "mlp.c_proj.bias", 1, 0, INIT_ZEROS)
#define X(id, name, rows, cols, init) id,
enum { BLOCK_TENSORS(X) PER_BLOCK };
#undef X

/* GPT-2's initialisation (gpt_init_weights): N(0, 0.02) matrices, the two projections
   into the residual stream scaled by 1/sqrt(2 L) so the stream's variance does not
   grow with depth; zero biases, unit layernorm weights. */
enum { INIT_ZEROS, INIT_ONES, INIT_NORMAL, INIT_RESIDUAL };

static const struct block_tensor_row {
    const char *name;
    int rows, cols, init;
} block_layout[PER_BLOCK] = {
#define X(id, name, rows, cols, init) {name, rows, cols, init},
    BLOCK_TENSORS(X)
#undef X
};

typedef struct tensor {
    char name[48];
    size_t offset, numel;
    int ndim, shape[2]; /* matrices are (out, in), as torch.nn.Linear stores them */
    int init;
} tensor;

/* Activations of a micro-batch, kept for the backward pass, one row each: type, name,
   slices (L: one per block; L + 1 for the residual stream: x[l] enters block l, x[L]
   leaves the last; 1: one for the model), elements of one slice. BT is B T (B: the
   sequences there is room for). ACT is the type of an activation and its gradient:
   float on the CPU, float or bf16 on the GPU (--dtype); statistics and losses stay
   float. */
#define GPT_ACTIVATIONS(X)                                                                   \
    X(int, tokens, 1, BT)                                                                    \
    X(int, targets, 1, BT)                                                                   \
    X(ACT, x, L + 1, BT * C)                                                                 \
    X(ACT, ln1, L, BT * C)                                                                   \
    X(float, ln1_mean, L, BT)                                                                \
    X(float, ln1_rstd, L, BT)                                                                \
    X(ACT, qkv, L, BT * 3 * C)                                                               \
    X(ACT, atty, L, BT * C)                                                                  \
    X(float, lse, L, BT * NH)        /* attention's log-sum-exp per head */                 \
    X(ACT, xmid, L, BT * C)          /* the residual stream between attention and MLP */    \
    X(ACT, ln2, L, BT * C)                                                                   \
    X(float, ln2_mean, L, BT)                                                                \
    X(float, ln2_rstd, L, BT)                                                                \
    X(ACT, fch, L, BT * 4 * C)                                                               \
    X(ACT, fch_gelu, L, BT * 4 * C)                                                          \
    X(ACT, lnf, 1, BT * C)                                                                   \
    X(float, lnf_mean, 1, BT)                                                                \
    X(float, lnf_rstd, 1, BT)                                                                \
    X(ACT, logits, 1, BT * V)        /* training: overwritten by dlogits */                 \
    X(float, losses, 1, BT)                                                                  \
    X(ACT, tmp, 1, BT * C)           /* a projection before its residual add */             \
    X(ACT, dx, 1, BT * C)            /* backward: gradient of the residual stream */        \
    X(ACT, dfch_gelu, 1, DEV * BT * 4 * C) /* backward scratch: the GPU's (the CPU folds the GELU in) */ \
    X(ACT, dfch, 1, BT * 4 * C)                                                              \
    X(ACT, dln, 1, BT * C)                                                                   \
    X(ACT, datty, 1, BT * C)                                                                 \
    X(ACT, dqkv, 1, BT * 3 * C)
#define ACT float
#define ACTIVATION_FIELD(type, name, slices, size) type *name;
/* in a layout function (a, memory, bytes, the shape and DEV, 1 on the device, in scope):
   points a's buffer into memory (NULL: only measures; a buffer of size 0 is NULL), each
   on a 256-byte boundary for the GPU kernels' vector loads, and counts its bytes */
#define ACTIVATION_LAYOUT(type, name, slices, size)                        \
    if (memory) a->name = (size) != 0 ? (type *)(memory + bytes) : (type *)NULL; \
    bytes += ((slices) * (size) * sizeof(type) + 255) / 256 * 256;
/* in a slicing function: s.name moves to block l's slice */
#define ACTIVATION_SLICE(type, name, slices, size) \
    if ((slices) > 1) s.name += (size_t)l * (size);

typedef struct activations {
    GPT_ACTIVATIONS(ACTIVATION_FIELD)
} activations;

/* Points a's buffers into memory (NULL: only measures); returns the bytes they take. */
static size_t layout_activations(activations *a, char *memory, config cfg, size_t B)
{
    const size_t L = (size_t)cfg.layers, C = (size_t)cfg.dim, NH = (size_t)cfg.heads, V = (size_t)cfg.vocab;
    const size_t BT = B * (size_t)cfg.ctx, DEV = 0;
    size_t bytes = 0;
    GPT_ACTIVATIONS(ACTIVATION_LAYOUT)
    return bytes;
}

/* Block l's slices of the per-block activations (the rest as they are); B is the
   sequences the activations have room for. With one block there is only block 0. */
static activations block_slices(const activations *a, config cfg, size_t B, int l)
{
    const size_t L = (size_t)cfg.layers, C = (size_t)cfg.dim, NH = (size_t)cfg.heads, V = (size_t)cfg.vocab;
    const size_t BT = B * (size_t)cfg.ctx, DEV = 0;
    activations s = *a;
    (void)V;
    GPT_ACTIVATIONS(ACTIVATION_SLICE)
    return s;
}

typedef struct gpt {
    config cfg;
    int num_tensors; /* 2 + 12 L + 2 */
    tensor *tensors;
    size_t num_params;
    float *params;
    float *m, *v;     /* AdamW moments, same layout (CPU training: the GPU keeps its own) */
    float *grads;     /* one sequence's gradient while backward runs; then the averaged gradient */
    double *grad_sum; /* sum of this rank's sequence gradients: what the ranks all-reduce */
    int B;            /* sequences the activations have room for */
    activations a;
    void *act_memory; /* all of a's buffers */
} gpt;

static tensor *block_tensor(const gpt *g, int l, int k) { return &g->tensors[2 + l * PER_BLOCK + k]; }
static float *param(const gpt *g, const tensor *t) { return g->params + t->offset; }
static float *param_grad(const gpt *g, const tensor *t) { return g->grads + t->offset; }
#define WTE(g) (&(g)->tensors[0])
#define WPE(g) (&(g)->tensors[1])
#define LNFW(g) (&(g)->tensors[(g)->num_tensors - 2])
#define LNFB(g) (&(g)->tensors[(g)->num_tensors - 1])

/* AdamW as GPT-2 is trained, on the CPU and the GPU alike: betas (0.9, 0.95), eps 1e-8,
   weight decay for the matrices only (none for biases and layernorm weights). */
#define ADAMW_BETAS_EPS 0.9f, 0.95f, 1e-8f
static float weight_decay_of(const tensor *t, float weight_decay) { return t->ndim == 2 ? weight_decay : 0.0f; }

static void add_tensor(gpt *g, const char *name, int rows, int cols, int init)
{
    tensor *t = &g->tensors[g->num_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = g->num_params;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    t->init = init;
    g->num_params += t->numel;
}

/* Lays out the tensors and allocates what a checkpoint holds: parameters and AdamW
   moments. Returns 0 when out of memory. */
static int gpt_create(gpt *g, config cfg, int B)
{
    const int C = cfg.dim;
    int l, k;
    char name[48];
    memset(g, 0, sizeof *g);
    g->cfg = cfg;
    g->B = B;
    g->tensors = (tensor *)calloc(2 + (size_t)PER_BLOCK * cfg.layers + 2, sizeof(tensor));
    if (!g->tensors) return 0;
    add_tensor(g, "wte.weight", cfg.vocab, C, INIT_NORMAL);
    add_tensor(g, "wpe.weight", cfg.ctx, C, INIT_NORMAL);
    for (l = 0; l < cfg.layers; l++)
        for (k = 0; k < PER_BLOCK; k++) {
            snprintf(name, sizeof name, "h.%d.%s", l, block_layout[k].name);
            add_tensor(g, name, block_layout[k].rows * C, block_layout[k].cols * C, block_layout[k].init);
        }
    add_tensor(g, "ln_f.weight", C, 0, INIT_ONES);
    add_tensor(g, "ln_f.bias", C, 0, INIT_ZEROS);

    g->params = (float *)calloc(g->num_params, sizeof(float));
    g->m = (float *)calloc(g->num_params, sizeof(float));
    g->v = (float *)calloc(g->num_params, sizeof(float));
    return g->params && g->m && g->v;
}

/* What training needs on the host. The CPU trains here: the activations of B
   sequences and the gradients. A GPU keeps those on the device (gpu_create), and the
   host holds only the micro-batch's tokens and targets going up, its losses coming
   back, and the one row of logits a sample draws from (all B T rows would be 13 GB at
   GPT-2's batch 64). Returns 0 when out of memory. */
static int gpt_alloc_training(gpt *g, int on_gpu)
{
    const size_t BT = (size_t)g->B * g->cfg.ctx;
    size_t bytes;
    if (on_gpu) {
        if (!(g->act_memory = calloc(1, BT * (2 * sizeof(int) + sizeof(float)) + (size_t)g->cfg.vocab * sizeof(float))))
            return 0;
        g->a.tokens = (int *)g->act_memory;
        g->a.targets = g->a.tokens + BT;
        g->a.losses = (float *)(g->a.targets + BT);
        g->a.logits = g->a.losses + BT;
        return 1;
    }
    bytes = layout_activations(NULL, NULL, g->cfg, (size_t)g->B);
    if (!(g->act_memory = calloc(1, bytes))) return 0;
    layout_activations(&g->a, (char *)g->act_memory, g->cfg, (size_t)g->B);
    g->grads = (float *)calloc(g->num_params, sizeof(float));
    g->grad_sum = (double *)calloc(g->num_params, sizeof(double));
    return g->grads && g->grad_sum;
}

static void gpt_destroy(gpt *g)
{
    void *all[] = {g->tensors, g->params, g->m, g->v, g->grads, g->grad_sum, g->act_memory};
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

/* Each tensor as its init says (INIT_*, above). */
static void gpt_init_weights(gpt *g, uint64_t seed)
{
    int i;
    for (i = 0; i < g->num_tensors; i++) {
        const tensor *t = &g->tensors[i];
        float *p = param(g, t);
        float std = t->init == INIT_RESIDUAL ? 0.02f / sqrtf(2.0f * (float)g->cfg.layers) : 0.02f;
        size_t j;
        for (j = 0; j < t->numel; j++) {
            if (t->init == INIT_ZEROS || t->init == INIT_ONES) {
                p[j] = t->init == INIT_ONES ? 1.0f : 0.0f;
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
static void cpu_forward(gpt *g, int B, int with_targets, int train)
{
    const int L = g->cfg.layers, C = g->cfg.dim, T = g->cfg.ctx, V = g->cfg.vocab, NH = g->cfg.heads;
    const size_t BT = (size_t)B * T, BTC = BT * C, LBTC = (size_t)g->B * T * C;
    activations *a = &g->a;
    float loss;
    int l;
    ddp_embedding_forward_cpu(a->x, a->tokens, param(g, WTE(g)), param(g, WPE(g)), B, T, C);
    for (l = 0; l < L; l++) {
        const activations s = block_slices(a, g->cfg, (size_t)g->B, l); /* s.x enters, s.x + LBTC leaves */
#define P(k) param(g, block_tensor(g, l, k))
        ddp_layernorm_forward_cpu(s.ln1, s.ln1_mean, s.ln1_rstd, s.x, P(LN1W), P(LN1B), B, T, C);
        ddp_matmul_forward_cpu(s.qkv, s.ln1, P(QKVW), P(QKVB), B, T, C, 3 * C);
        ddp_attention_forward_cpu(s.atty, s.lse, s.qkv, B, T, C, NH);
        ddp_matmul_forward_cpu(s.tmp, s.atty, P(ATTPROJW), P(ATTPROJB), B, T, C, C);
        ddp_residual_forward_cpu(s.xmid, s.x, s.tmp, BTC);
        ddp_layernorm_forward_cpu(s.ln2, s.ln2_mean, s.ln2_rstd, s.xmid, P(LN2W), P(LN2B), B, T, C);
        ddp_matmul_forward_cpu(s.fch, s.ln2, P(FCW), P(FCB), B, T, C, 4 * C);
        ddp_gelu_forward_cpu(s.fch_gelu, s.fch, 4 * BTC);
        ddp_matmul_forward_cpu(s.tmp, s.fch_gelu, P(FCPROJW), P(FCPROJB), B, T, 4 * C, C);
        ddp_residual_forward_cpu(s.x + LBTC, s.xmid, s.tmp, BTC);
#undef P
    }
    ddp_layernorm_forward_cpu(a->lnf, a->lnf_mean, a->lnf_rstd, a->x + L * LBTC, param(g, LNFW(g)),
                              param(g, LNFB(g)), B, T, C);
    ddp_matmul_forward_cpu(a->logits, a->lnf, param(g, WTE(g)), NULL, B, T, C, V); /* tied lm_head */
    if (with_targets) /* dloss = B T cancels the mean's 1/(B T): the gradient of the sum */
        ddp_crossentropy_forward_backward_cpu(&loss, a->losses, train ? a->logits : NULL, a->logits, a->targets,
                                              B, T, V, -1, (float)BT);
}

/* --trace: a span on this rank's main row, begun here and closed by ddp_trace_end;
   nothing is recorded without --trace. */
static void span(ddp_ctx *ctx, const char *fmt, ...)
{
    char name[44];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    ddp_trace_begin(ctx, name);
}

/* ---- backward -----------------------------------------------------------------------
   Layer by layer from the top. The gradients of the activations are computed for the
   whole micro-batch at once (every row on its own, so a sequence gets the same bits in
   any batch); a parameter's gradient is computed sequence by sequence instead, in fp32,
   and added into the double sum g->grad_sum as it is made: by the matmul kernel itself
   (ddp_matmul_backward_sum_cpu), or through g->grads (zero before) for layernorm and the
   embeddings (add_sequence_grad). When a layer is done its region of grad_sum
   is final for this micro-step: ddp_grad_ready hands it to the all-reduce, which runs
   while the layers below are still being differentiated. */
static void add_sequence_grad(gpt *g, const tensor *first, const tensor *last)
{
    size_t i, end = last->offset + last->numel;
    for (i = first->offset; i < end; i++) {
        g->grad_sum[i] += g->grads[i];
        g->grads[i] = 0.0f;
    }
}

/* tensors first..last have their final gradient for this micro-step: start their all-reduce */
static ddp_result allreduce_tensors(ddp_grad *sync, const tensor *first, const tensor *last)
{
    return ddp_grad_ready(sync, first->offset, last->offset + last->numel - first->offset);
}

/* A matmul's backward (shapes as ddp_matmul_backward_cpu's): dinp WRITTEN for the B
   sequences together (times gelu'(gelu_inp) where the matmul read a GELU of gelu_inp:
   that GELU's input gradient), then the gradients of weight w and bias (w + 1, or none)
   one sequence at a time, each added into the double sum as it is made
   (ddp_matmul_backward_sum_cpu). */
static void matmul_backward(gpt *g, float *dinp, const float *gelu_inp, const tensor *w, int has_bias,
                            const float *dout, const float *inp, int B, int C, int OC)
{
    const int T = g->cfg.ctx;
    ddp_matmul_backward_input_cpu(dinp, dout, param(g, w), gelu_inp, B, T, C, OC);
    ddp_matmul_backward_sum_cpu(g->grad_sum + w->offset, has_bias ? g->grad_sum + w[1].offset : NULL, dout, inp, B,
                                T, C, OC);
}

/* The same for a layernorm (weight w, bias w + 1). */
static void layernorm_backward(gpt *g, float *dinp, const tensor *w, const float *dout, const float *inp,
                               const float *mean, const float *rstd, int B)
{
    const int T = g->cfg.ctx, C = g->cfg.dim;
    int b;
    ddp_layernorm_backward_cpu(dinp, NULL, NULL, dout, inp, param(g, w), mean, rstd, B, T, C);
    for (b = 0; b < B; b++) {
        const size_t o = (size_t)b * T;
        ddp_layernorm_backward_cpu(NULL, param_grad(g, w), param_grad(g, w + 1), dout + o * C, inp + o * C,
                                   param(g, w), mean + o, rstd + o, 1, T, C);
        add_sequence_grad(g, w, w + 1);
    }
}

static ddp_result cpu_backward(gpt *g, int B, ddp_grad *sync)
{
    const int L = g->cfg.layers, C = g->cfg.dim, T = g->cfg.ctx, V = g->cfg.vocab, NH = g->cfg.heads;
    const size_t BTC = (size_t)B * T * C, LBTC = (size_t)g->B * T * C, fsize = sizeof(float);
    activations *a = &g->a;
    ddp_result r;
    int l, b;
    memset(a->dx, 0, BTC * fsize); /* the residual stream's gradient: the layernorms add into it */

    /* lm_head (tied to wte, no bias) and the final layernorm */
    span(sync->ctx, "backward lm_head, ln_f");
    matmul_backward(g, a->dln, NULL, WTE(g), 0, a->logits, a->lnf, B, C, V);
    layernorm_backward(g, a->dx, LNFW(g), a->dln, a->x + L * LBTC, a->lnf_mean, a->lnf_rstd, B);
    ddp_trace_end(sync->ctx);
    if ((r = allreduce_tensors(sync, LNFW(g), LNFB(g))) != DDP_OK) return r;

    for (l = L - 1; l >= 0; l--) {
        /* dx holds d loss / d (block output), and becomes d loss / d (block input) as the
           residual branches add into it */
        const activations s = block_slices(a, g->cfg, (size_t)g->B, l);
#define W(k) block_tensor(g, l, k)
        span(sync->ctx, "backward block %d", l);
        memset(a->dqkv, 0, 3 * BTC * fsize); /* attention adds into it */
        matmul_backward(g, a->dfch, s.fch, W(FCPROJW), 1, a->dx, s.fch_gelu, B, 4 * C, C); /* through the GELU */
        matmul_backward(g, a->dln, NULL, W(FCW), 1, a->dfch, s.ln2, B, C, 4 * C);
        layernorm_backward(g, a->dx, W(LN2W), a->dln, s.xmid, s.ln2_mean, s.ln2_rstd, B);
        matmul_backward(g, a->datty, NULL, W(ATTPROJW), 1, a->dx, s.atty, B, C, C);
        ddp_attention_backward_cpu(a->dqkv, a->datty, s.qkv, s.atty, s.lse, B, T, C, NH);
        matmul_backward(g, a->dln, NULL, W(QKVW), 1, a->dqkv, s.ln1, B, C, 3 * C);
        layernorm_backward(g, a->dx, W(LN1W), a->dln, s.x, s.ln1_mean, s.ln1_rstd, B);
        ddp_trace_end(sync->ctx);
        if ((r = allreduce_tensors(sync, W(0), W(PER_BLOCK - 1))) != DDP_OK) return r;
#undef W
    }

    span(sync->ctx, "backward embedding");
    for (b = 0; b < B; b++) {
        ddp_embedding_backward_cpu(param_grad(g, WTE(g)), param_grad(g, WPE(g)), a->dx + b * (size_t)T * C,
                                   a->tokens + (size_t)b * T, 1, T, C);
        add_sequence_grad(g, WTE(g), WPE(g));
    }
    ddp_trace_end(sync->ctx);
    return allreduce_tensors(sync, WTE(g), WPE(g));
}

/* ---- the GPU path -------------------------------------------------------------------
   Built with nvcc and given a GPU per rank (ddp_init chose the NCCL backend), the same
   model trains on the device: parameters, AdamW moments, gradients and activations
   live in device memory, allocated once in the host buffers' layout, and every layer
   runs as its _gpu twin from ddp_kernels.cuh on one stream. Unlike the CPU path, each
   launch covers the whole micro-batch (B sequences), and the gradients are summed in
   fp32 in place on the device: ddp_grad all-reduces them (NCCL) while the backward
   pass goes on, and the step divides by the global token count, as the CPU path does
   with its double sum.
   --dtype bf16 (the default on a GPU): activations, their gradients and the weights
   the kernels read are bf16 (tensor-core matmuls, half the memory traffic); the master
   weights, AdamW moments and parameter gradients stay fp32, and after each step the
   weights are rounded from the masters (no loss scaling: bf16 has fp32's range).
   --dtype fp32 keeps everything fp32 (exact fp32 matmuls, no TF32): its results agree
   with the CPU path to fp32 rounding, not bit for bit, without the CPU path's exact
   world-size invariance. --allreduce bf16 rounds each ready region of the fp32
   gradients to bf16 before NCCL sums it (half the bytes on the wire, the sum rounded
   to bf16); the default sends fp32.
   The host model keeps the checkpoint's copy of params, m and v (fp32, refreshed from
   the device before a save) and the tokens of a micro-batch, which go up through
   pinned buffers with cudaMemcpyAsync. Any CUDA failure prints one line naming the
   call and exits. */
typedef struct gpu gpu;
#ifdef __CUDACC__
typedef __nv_bfloat16 bf16;

struct gpu {
    cudaStream_t stream;       /* every kernel, copy and collective of this rank */
    ddp_kernels_ctx k;         /* cuBLASLt handle and scratch */
    int act_bf16;              /* --dtype bf16: activations and the weights the kernels read */
    float *params, *m, *v;     /* device fp32, laid out as the host's: master weights, AdamW moments */
    bf16 *params16;            /* bf16 runs: the weights the kernels read, rounded from params */
    float *grads;              /* device fp32: summed over micro-steps and ranks, then the mean */
    bf16 *grads16;             /* --allreduce bf16: the gradients on their way through NCCL */
    float *scalars;            /* device: [0] mean loss of a micro-batch, [1] grad norm */
    void *act_memory;          /* device: the activations (device_activations), room for B sequences */
    int *h_tokens, *h_targets; /* pinned host (B,T): the micro-batch on its way up */
    float *h_norm;             /* pinned host (1) */
    bf16 *h_logits16;          /* pinned host (V): a row of bf16 logits on its way down */
};

/* The device's activations, of type F (float or bf16), in GPT_ACTIVATIONS' layout. */
#undef ACT
#define ACT F
template <typename F> struct device_activations {
    GPT_ACTIVATIONS(ACTIVATION_FIELD)
};

/* layout_activations and block_slices for them */
template <typename F>
static size_t layout_device(device_activations<F> *a, char *memory, config cfg, size_t B)
{
    const size_t L = (size_t)cfg.layers, C = (size_t)cfg.dim, NH = (size_t)cfg.heads, V = (size_t)cfg.vocab;
    const size_t BT = B * (size_t)cfg.ctx, DEV = 1;
    size_t bytes = 0;
    GPT_ACTIVATIONS(ACTIVATION_LAYOUT)
    return bytes;
}

template <typename F>
static device_activations<F> device_slices(const device_activations<F> *a, config cfg, size_t B, int l)
{
    const size_t L = (size_t)cfg.layers, C = (size_t)cfg.dim, NH = (size_t)cfg.heads, V = (size_t)cfg.vocab;
    const size_t BT = B * (size_t)cfg.ctx, DEV = 1;
    device_activations<F> s = *a;
    (void)V;
    GPT_ACTIVATIONS(ACTIVATION_SLICE)
    return s;
}
#undef ACT
#define ACT float

static void cuda_check(cudaError_t e, const ddp_kernels_ctx *k, const char *call, int line)
{
    if (e == cudaSuccess) return;
    if (k && ddp_kernels_error(k)[0]) /* the launcher's own words: "attention: C=160, NH=1: ..." */
        fprintf(stderr, PROG ": %.*s failed (line %d): %s\n", (int)strcspn(call, "("), call, line, ddp_kernels_error(k));
    else if (k && e == cudaErrorUnknown) /* a launcher's way of saying cuBLASLt failed */
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
/* one of this file's kernels over n elements on this rank's stream */
#define KERNEL(fn, n, ...) \
    (fn<<<(unsigned)(((n) + 255) / 256), 256, 0, d->stream>>>(__VA_ARGS__), CUDA(cudaGetLastError()))

template <typename T> static T *dev_alloc(cudaStream_t stream, size_t n)
{
    void *p;
    CUDA(cudaMalloc(&p, (n ? n : 1) * sizeof(T)));
    CUDA(cudaMemsetAsync(p, 0, (n ? n : 1) * sizeof(T), stream));
    return (T *)p;
}

/* The weights the kernels read, as F: params itself (fp32), or its bf16 copy. */
static float *weights(const gpu *d, float *) { return d->params; }
static bf16 *weights(const gpu *d, bf16 *) { return d->params16; }
template <typename F> static F *dweight(const gpu *d, const tensor *t) { return weights(d, (F *)NULL) + t->offset; }
static float *dgrad(const gpu *d, const tensor *t) { return d->grads + t->offset; }

/* This rank's activations as F */
template <typename F> static device_activations<F> device_acts(const gpt *g, const gpu *d)
{
    device_activations<F> a;
    layout_device(&a, (char *)d->act_memory, g->cfg, (size_t)g->B);
    return a;
}

/* x (n) *= s */
static __global__ void scale_kernel(float *x, size_t n, float s)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

/* out (n) = bf16(in), rounded to nearest */
static __global__ void round_kernel(bf16 *out, const float *in, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(in[i]);
}

/* out (n) = float(in), exact */
static __global__ void widen_kernel(float *out, const bf16 *in, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat162float(in[i]);
}

/* The device copy of the model: this rank's host params go up (ddp_grad_init then
   broadcasts rank 0's; gpu_weights_ready rounds them for a bf16 run), and m and v
   after a --resume. The activations as GPT_ACTIVATIONS lists them. */
static gpu *gpu_create(gpt *g, int resumed, int use_bf16, int allreduce_bf16)
{
    const size_t BT = (size_t)g->B * g->cfg.ctx, P = g->num_params;
    const size_t act_bytes = use_bf16 ? layout_device<bf16>(NULL, NULL, g->cfg, (size_t)g->B)
                                      : layout_device<float>(NULL, NULL, g->cfg, (size_t)g->B);
    gpu *d = (gpu *)calloc(1, sizeof(gpu));
    cudaStream_t s;
    if (!d) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    CUDA(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    s = d->stream;
    cuda_check(ddp_kernels_init(&d->k), &d->k, "ddp_kernels_init", __LINE__);
    d->act_bf16 = use_bf16;
    d->params = dev_alloc<float>(s, P);
    d->m = dev_alloc<float>(s, P);
    d->v = dev_alloc<float>(s, P);
    d->grads = dev_alloc<float>(s, P);
    if (use_bf16) d->params16 = dev_alloc<bf16>(s, P);
    if (allreduce_bf16) d->grads16 = dev_alloc<bf16>(s, P);
    d->scalars = dev_alloc<float>(s, 2);
    d->act_memory = dev_alloc<char>(s, act_bytes);
    CUDA(cudaMallocHost((void **)&d->h_tokens, BT * sizeof(int)));
    CUDA(cudaMallocHost((void **)&d->h_targets, BT * sizeof(int)));
    CUDA(cudaMallocHost((void **)&d->h_norm, sizeof(float)));
    CUDA(cudaMallocHost((void **)&d->h_logits16, (size_t)g->cfg.vocab * sizeof(bf16)));
    CUDA(cudaMemcpyAsync(d->params, g->params, P * sizeof(float), cudaMemcpyHostToDevice, s));
    if (resumed) { /* else the moments start at zero (dev_alloc): the host copy stays untouched until a save */
        CUDA(cudaMemcpyAsync(d->m, g->m, P * sizeof(float), cudaMemcpyHostToDevice, s));
        CUDA(cudaMemcpyAsync(d->v, g->v, P * sizeof(float), cudaMemcpyHostToDevice, s));
    }
    CUDA(cudaStreamSynchronize(s));
    return d;
}

/* After ddp_grad_init's broadcast of the fp32 masters: a bf16 run's weights from them. */
static void gpu_weights_ready(gpt *g, gpu *d)
{
    if (d->act_bf16) KERNEL(round_kernel, g->num_params, d->params16, d->params, g->num_params);
}

static void gpu_destroy(gpu *d)
{
    void *all[] = {d->params, d->m, d->v, d->grads, d->params16, d->grads16, d->scalars, d->act_memory};
    size_t i;
    CUDA(cudaStreamSynchronize(d->stream));
    for (i = 0; i < sizeof all / sizeof all[0]; i++) CUDA(cudaFree(all[i]));
    CUDA(cudaFreeHost(d->h_tokens));
    CUDA(cudaFreeHost(d->h_targets));
    CUDA(cudaFreeHost(d->h_norm));
    CUDA(cudaFreeHost(d->h_logits16));
    ddp_kernels_destroy(&d->k);
    CUDA(cudaStreamDestroy(d->stream));
    free(d);
}

/* ddp_grad on the device, ordered on this rank's stream: the fp32 gradients (or their
   bf16 copy for --allreduce bf16) and the fp32 masters for the broadcast. */
static void gpu_grad_desc(const gpu *d, ddp_grad_desc *gd)
{
    gd->grads = d->grads16 ? (void *)d->grads16 : (void *)d->grads;
    gd->dtype = d->grads16 ? DDP_BF16 : DDP_F32;
    gd->params = d->params;
    gd->param_dtype = DDP_F32;
    gd->stream = d->stream;
}

/* The forward on the device (cpu_forward's twin), from the host's g->a.tokens (and
   targets); with targets the per-token losses come back to g->a.losses, as on the CPU. */
template <typename F> static void gpu_forward_as(gpt *g, gpu *d, int B, int with_targets, int train)
{
    const int L = g->cfg.layers, C = g->cfg.dim, T = g->cfg.ctx, V = g->cfg.vocab, NH = g->cfg.heads;
    const size_t BT = (size_t)B * T, BTC = BT * C, LBTC = (size_t)g->B * T * C;
    device_activations<F> acts = device_acts<F>(g, d), *a = &acts;
    /* the pinned buffers are free: the previous forward ended with a stream sync, or
       (generation) its logits were fetched with one */
    memcpy(d->h_tokens, g->a.tokens, BT * sizeof(int));
    CUDA(cudaMemcpyAsync(a->tokens, d->h_tokens, BT * sizeof(int), cudaMemcpyHostToDevice, d->stream));
    if (with_targets) {
        memcpy(d->h_targets, g->a.targets, BT * sizeof(int));
        CUDA(cudaMemcpyAsync(a->targets, d->h_targets, BT * sizeof(int), cudaMemcpyHostToDevice, d->stream));
    }
    LAUNCH(ddp_embedding_forward_gpu, a->x, a->tokens, dweight<F>(d, WTE(g)), dweight<F>(d, WPE(g)), B, T, C);
#define P(k) dweight<F>(d, block_tensor(g, l, k))
    for (int l = 0; l < L; l++) {
        const device_activations<F> s = device_slices(a, g->cfg, (size_t)g->B, l); /* s.x enters, s.x + LBTC leaves */
        LAUNCH(ddp_layernorm_forward_gpu, s.ln1, s.ln1_mean, s.ln1_rstd, s.x, P(LN1W), P(LN1B), B, T, C);
        LAUNCH(ddp_matmul_forward_gpu, s.qkv, s.ln1, P(QKVW), P(QKVB), B, T, C, 3 * C);
        LAUNCH(ddp_attention_forward_gpu, s.atty, s.lse, s.qkv, B, T, C, NH);
        LAUNCH(ddp_matmul_forward_gpu, s.tmp, s.atty, P(ATTPROJW), P(ATTPROJB), B, T, C, C);
        LAUNCH(ddp_residual_forward_gpu, s.xmid, s.x, s.tmp, BTC);
        LAUNCH(ddp_layernorm_forward_gpu, s.ln2, s.ln2_mean, s.ln2_rstd, s.xmid, P(LN2W), P(LN2B), B, T, C);
        LAUNCH(ddp_matmul_forward_gpu, s.fch, s.ln2, P(FCW), P(FCB), B, T, C, 4 * C);
        LAUNCH(ddp_gelu_forward_gpu, s.fch_gelu, s.fch, 4 * BTC);
        LAUNCH(ddp_matmul_forward_gpu, s.tmp, s.fch_gelu, P(FCPROJW), P(FCPROJB), B, T, 4 * C, C);
        LAUNCH(ddp_residual_forward_gpu, s.x + LBTC, s.xmid, s.tmp, BTC);
    }
#undef P
    LAUNCH(ddp_layernorm_forward_gpu, a->lnf, a->lnf_mean, a->lnf_rstd, a->x + L * LBTC, dweight<F>(d, LNFW(g)),
           dweight<F>(d, LNFB(g)), B, T, C);
    LAUNCH(ddp_matmul_forward_gpu, a->logits, a->lnf, dweight<F>(d, WTE(g)), (F *)NULL, B, T, C, V); /* tied lm_head */
    if (!with_targets) return;
    /* dloss = B T: the gradient of the summed loss, as on the CPU */
    LAUNCH(ddp_crossentropy_forward_backward_gpu, d->scalars, a->losses, train ? a->logits : (F *)NULL, a->logits,
           a->targets, B, T, V, -1, (float)BT);
    CUDA(cudaMemcpyAsync(g->a.losses, a->losses, BT * sizeof(float), cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaStreamSynchronize(d->stream));
}

static void gpu_forward(gpt *g, gpu *d, int B, int with_targets, int train)
{
    if (d->act_bf16) gpu_forward_as<bf16>(g, d, B, with_targets, train);
    else gpu_forward_as<float>(g, d, B, with_targets, train);
}

/* Row `row` of the last forward's logits (sequence 0), as fp32 in the host's one row
   g->a.logits, which it returns. */
static const float *gpu_logits_to_host(gpt *g, gpu *d, int row)
{
    const size_t V = (size_t)g->cfg.vocab;
    float *out = g->a.logits;
    size_t i;
    if (!d->act_bf16) {
        CUDA(cudaMemcpyAsync(out, device_acts<float>(g, d).logits + row * V, V * sizeof(float),
                             cudaMemcpyDeviceToHost, d->stream));
        CUDA(cudaStreamSynchronize(d->stream));
        return out;
    }
    CUDA(cudaMemcpyAsync(d->h_logits16, device_acts<bf16>(g, d).logits + row * V, V * sizeof(bf16),
                         cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaStreamSynchronize(d->stream));
    for (i = 0; i < V; i++) out[i] = __bfloat162float(d->h_logits16[i]);
    return out;
}

/* allreduce_tensors for the device: with --allreduce bf16 the region is rounded into
   grads16 first (only when this micro-step all-reduces). Ordered on the stream after
   the kernels that produced it. */
static ddp_result gpu_ready(gpu *d, ddp_grad *sync, const tensor *first, const tensor *last)
{
    const size_t off = first->offset, n = last->offset + last->numel - off;
    if (d->grads16 && !sync->no_sync) KERNEL(round_kernel, n, d->grads16 + off, d->grads + off, n);
    return allreduce_tensors(sync, first, last);
}

/* The backward on the device (cpu_backward's twin), a layer at a time over the whole
   micro-batch: each layer's parameter gradients are added into d->grads in place, and
   the region is handed to ddp_grad_ready as soon as the layer is done, in the CPU
   path's order. gpu_ready() records the point in the stream: NCCL reduces the bucket
   after the kernels queued so far, while the layers below run. */
template <typename F> static ddp_result gpu_backward_as(gpt *g, gpu *d, int B, ddp_grad *sync)
{
    const int L = g->cfg.layers, C = g->cfg.dim, T = g->cfg.ctx, V = g->cfg.vocab, NH = g->cfg.heads;
    const size_t BTC = (size_t)B * T * C, LBTC = (size_t)g->B * T * C, fsize = sizeof(F);
    device_activations<F> acts = device_acts<F>(g, d), *a = &acts;
    ddp_result r;
    CUDA(cudaMemsetAsync(a->dx, 0, BTC * fsize, d->stream));
    CUDA(cudaMemsetAsync(a->dln, 0, BTC * fsize, d->stream));
    /* lm_head (tied to wte; dlogits are in a->logits) and the final layernorm */
    LAUNCH(ddp_matmul_backward_gpu, a->dln, dgrad(d, WTE(g)), (float *)NULL, a->logits, a->lnf, dweight<F>(d, WTE(g)),
           B, T, C, V);
    LAUNCH(ddp_layernorm_backward_gpu, a->dx, dgrad(d, LNFW(g)), dgrad(d, LNFB(g)), a->dln, a->x + L * LBTC,
           dweight<F>(d, LNFW(g)), a->lnf_mean, a->lnf_rstd, B, T, C);
    if ((r = gpu_ready(d, sync, LNFW(g), LNFB(g))) != DDP_OK) return r;

    for (int l = L - 1; l >= 0; l--) {
        const tensor *first = block_tensor(g, l, 0), *last = block_tensor(g, l, PER_BLOCK - 1);
        const device_activations<F> s = device_slices(a, g->cfg, (size_t)g->B, l);
#define P(k) dweight<F>(d, block_tensor(g, l, k))
#define G(k) dgrad(d, block_tensor(g, l, k))
        CUDA(cudaMemsetAsync(a->dfch_gelu, 0, 4 * BTC * fsize, d->stream));
        CUDA(cudaMemsetAsync(a->dfch, 0, 4 * BTC * fsize, d->stream));
        CUDA(cudaMemsetAsync(a->dln, 0, BTC * fsize, d->stream));
        CUDA(cudaMemsetAsync(a->datty, 0, BTC * fsize, d->stream));
        CUDA(cudaMemsetAsync(a->dqkv, 0, 3 * BTC * fsize, d->stream));
        LAUNCH(ddp_matmul_backward_gpu, a->dfch_gelu, G(FCPROJW), G(FCPROJB), a->dx, s.fch_gelu, P(FCPROJW), B, T,
               4 * C, C);
        LAUNCH(ddp_gelu_backward_gpu, a->dfch, s.fch, a->dfch_gelu, 4 * BTC);
        LAUNCH(ddp_matmul_backward_gpu, a->dln, G(FCW), G(FCB), a->dfch, s.ln2, P(FCW), B, T, C, 4 * C);
        LAUNCH(ddp_layernorm_backward_gpu, a->dx, G(LN2W), G(LN2B), a->dln, s.xmid, P(LN2W), s.ln2_mean, s.ln2_rstd,
               B, T, C);
        LAUNCH(ddp_matmul_backward_gpu, a->datty, G(ATTPROJW), G(ATTPROJB), a->dx, s.atty, P(ATTPROJW), B, T, C, C);
        LAUNCH(ddp_attention_backward_gpu, a->dqkv, a->datty, s.qkv, s.atty, s.lse, B, T, C, NH);
        CUDA(cudaMemsetAsync(a->dln, 0, BTC * fsize, d->stream));
        LAUNCH(ddp_matmul_backward_gpu, a->dln, G(QKVW), G(QKVB), a->dqkv, s.ln1, P(QKVW), B, T, C, 3 * C);
        LAUNCH(ddp_layernorm_backward_gpu, a->dx, G(LN1W), G(LN1B), a->dln, s.x, P(LN1W), s.ln1_mean, s.ln1_rstd, B,
               T, C);
#undef P
#undef G
        if ((r = gpu_ready(d, sync, first, last)) != DDP_OK) return r;
    }
    LAUNCH(ddp_embedding_backward_gpu, dgrad(d, WTE(g)), dgrad(d, WPE(g)), a->dx, a->tokens, B, T, C);
    return gpu_ready(d, sync, WTE(g), WPE(g));
}

static ddp_result gpu_backward(gpt *g, gpu *d, int B, ddp_grad *sync)
{
    return d->act_bf16 ? gpu_backward_as<bf16>(g, d, B, sync) : gpu_backward_as<float>(g, d, B, sync);
}

/* The optimizer step after ddp_grad_finish: the summed gradient (widened from bf16 when
   it crossed NCCL as bf16, unless `reduced` is 0: --bench-no-sync) becomes the mean
   over the global batch's tokens, then norm, clipping and AdamW as on the CPU, on the
   fp32 masters; a bf16 run's weights are rounded from them. Zeroes the gradients for
   the next step; returns the norm before clipping. */
static float gpu_step(gpt *g, gpu *d, float lr, float weight_decay, float clip, int step, double tokens, int reduced)
{
    const size_t N = g->num_params;
    int l;
    if (d->grads16 && reduced) KERNEL(widen_kernel, N, d->grads, d->grads16, N);
    KERNEL(scale_kernel, N, d->grads, N, (float)(1.0 / tokens));
    LAUNCH(ddp_global_norm_gpu, d->scalars + 1, d->grads, N);
    if (clip > 0) LAUNCH(ddp_clip_by_norm_gpu, d->grads, N, clip, d->scalars + 1);
    for (l = 0; l < g->num_tensors; l++) {
        const tensor *t = &g->tensors[l];
        if (d->act_bf16)
            LAUNCH(ddp_adamw_update_gpu, dweight<bf16>(d, t), dgrad(d, t), d->m + t->offset, d->v + t->offset,
                   t->numel, lr, ADAMW_BETAS_EPS, weight_decay_of(t, weight_decay), step + 1, d->params + t->offset);
        else
            LAUNCH(ddp_adamw_update_gpu, dweight<float>(d, t), dgrad(d, t), d->m + t->offset, d->v + t->offset,
                   t->numel, lr, ADAMW_BETAS_EPS, weight_decay_of(t, weight_decay), step + 1, (float *)NULL);
    }
    CUDA(cudaMemsetAsync(d->grads, 0, N * sizeof(float), d->stream));
    CUDA(cudaMemcpyAsync(d->h_norm, d->scalars + 1, sizeof(float), cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaStreamSynchronize(d->stream));
    return *d->h_norm;
}

/* MFU's denominator: the dense peak of this GPU's SXM part in TFLOP/s, bf16 tensor cores
   or fp32 (no TF32) as the run computes; 0 for parts not listed. */
static double gpu_peak_tflops(const gpu *d)
{
    int dev = 0, major = 0, minor = 0;
    CUDA(cudaGetDevice(&dev));
    CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major == 9 && minor == 0) return d->act_bf16 ? 989.4 : 66.9; /* H100, H200 */
    if (major == 8 && minor == 0) return d->act_bf16 ? 312.0 : 19.5; /* A100 */
    return 0.0;
}

/* params (the fp32 masters), m and v to the host model, for a checkpoint */
static void gpu_to_host(gpt *g, gpu *d)
{
    const size_t bytes = g->num_params * sizeof(float);
    CUDA(cudaMemcpyAsync(g->params, d->params, bytes, cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaMemcpyAsync(g->m, d->m, bytes, cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaMemcpyAsync(g->v, d->v, bytes, cudaMemcpyDeviceToHost, d->stream));
    CUDA(cudaStreamSynchronize(d->stream));
}
#undef LAUNCH
#undef KERNEL

/* --device-info: whether this build can train on a GPU here, and if not the real
   cause (a missing driver, one too old for this CUDA, no kernel image for the GPU).
   Returns the exit status: 0 when it can. */
static int device_info(void)
{
    int n = 0, driver = 0, runtime = 0;
    cudaDeviceProp p;
    float *x = NULL;
    cudaError_t e = cudaGetDeviceCount(&n);
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    if (e == cudaSuccess && n == 0) e = cudaErrorNoDevice;
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&p, 0);
    if (e == cudaSuccess) e = cudaMalloc((void **)&x, sizeof(float));
    if (e == cudaSuccess) { /* one of this file's kernels: is there code for this GPU? */
        scale_kernel<<<1, 1>>>(x, 1, 1.0f);
        if ((e = cudaGetLastError()) == cudaSuccess) e = cudaDeviceSynchronize();
    }
    if (x) cudaFree(x);
    if (e != cudaSuccess) {
        char drv[64] = "no CUDA driver is installed";
        if (driver) snprintf(drv, sizeof drv, "the driver supports CUDA %d.%d", driver / 1000, driver % 1000 / 10);
        printf(PROG ": no usable GPU: %s (%s); %s, this build needs CUDA %d.%d\n", cudaGetErrorString(e),
               cudaGetErrorName(e), drv, runtime / 1000, runtime % 1000 / 10);
        return 1;
    }
    printf(PROG ": %d GPU(s); trains on %s (sm_%d%d, %.0f GiB); driver CUDA %d.%d, build CUDA %d.%d\n", n, p.name,
           p.major, p.minor, (double)p.totalGlobalMem / (1 << 30), driver / 1000, driver % 1000 / 10,
           runtime / 1000, runtime % 1000 / 10);
    return 0;
}
#else
/* Without nvcc there is no GPU path: dev stays NULL (main refuses an NCCL backend),
   and these stand-ins never run. */
static gpu *gpu_create(gpt *g, int resumed, int bf16, int allreduce_bf16)
{
    return (void)g, (void)resumed, (void)bf16, (void)allreduce_bf16, NULL;
}
static void gpu_weights_ready(gpt *g, gpu *d) { (void)g, (void)d; }
static void gpu_destroy(gpu *d) { (void)d; }
static void gpu_grad_desc(const gpu *d, ddp_grad_desc *gd) { (void)d, (void)gd; }
static void gpu_forward(gpt *g, gpu *d, int B, int targets, int train)
{
    (void)g, (void)d, (void)B, (void)targets, (void)train;
}
static const float *gpu_logits_to_host(gpt *g, gpu *d, int row) { return (void)g, (void)d, (void)row, NULL; }
static ddp_result gpu_backward(gpt *g, gpu *d, int B, ddp_grad *sync)
{
    return (void)g, (void)d, (void)B, (void)sync, DDP_ERR_BACKEND;
}
static float gpu_step(gpt *g, gpu *d, float lr, float wd, float clip, int step, double tokens, int reduced)
{
    return (void)g, (void)d, (void)lr, (void)wd, (void)clip, (void)step, (void)tokens, (void)reduced, 0.0f;
}
static void gpu_to_host(gpt *g, gpu *d) { (void)g, (void)d; }
static double gpu_peak_tflops(const gpu *d) { return (void)d, 0.0; }
static int device_info(void)
{
    printf(PROG ": built without nvcc: no GPU path (examples/train_gpt_gpu has one)\n");
    return 1;
}
#endif

/* The passes on whichever device trains (dev NULL: the CPU), chosen here and nowhere else */
static void forward(gpt *g, gpu *dev, int B, int with_targets, int train)
{
    if (dev) gpu_forward(g, dev, B, with_targets, train);
    else cpu_forward(g, B, with_targets, train);
}
static ddp_result backward(gpt *g, gpu *dev, int B, ddp_grad *sync)
{
    return dev ? gpu_backward(g, dev, B, sync) : cpu_backward(g, B, sync);
}

/* ---- data ---------------------------------------------------------------------------
   A token stream, split: the first 90% trains, the last 10% validates. Window i of a
   split is tokens [i S, i S + T + 1): inputs are its first T tokens, targets the last
   T. Validation windows have stride S = T: they do not overlap, and every token is
   predicted once. Training windows have stride --stride (default T as well); a small
   stride starts windows at every offset, which a small text needs: with fixed windows
   a model learns each window by heart, position by position, and writes nonsense from
   any other start. */
typedef struct dataset {
    int *tokens;
    size_t n, n_train; /* tokens [0, n_train) train, [n_train, n) validate */
    char source[600];  /* what was read, for the first output line */
    const char *format; /* how it was read: text bytes, or one of the token files */
    int text;           /* the tokens are the file's bytes */
} dataset;

static size_t num_windows(size_t n_tokens, int T, int stride)
{
    return n_tokens > (size_t)T ? (n_tokens - 1 - (size_t)T) / (size_t)stride + 1 : 0;
}

/* Appends the tokens of one file: llm.c token shards (a header of 256 int32: magic
   20240520, version 1, token count; then uint16 tokens), nanoGPT's headerless uint16
   .bin (or .BIN), or any other file as bytes (byte-level tokens). */
static int load_tokens(dataset *d, const char *path, int vocab, char *err, size_t errsize)
{
    size_t size, n, i, ext = strlen(path);
    const int bin = ext >= 4 && path[ext - 4] == '.' && tolower((unsigned char)path[ext - 3]) == 'b' &&
                    tolower((unsigned char)path[ext - 2]) == 'i' && tolower((unsigned char)path[ext - 1]) == 'n';
    unsigned char *buf = st_read_file(path, &size, err, errsize);
    int32_t header[3] = {0, 0, 0};
    const unsigned char *p;
    int *grown;
    int u16 = 0;
    if (!buf) return 0;
    memcpy(header, buf, size < sizeof header ? size : sizeof header);
    if (size >= 4 && header[0] == 20240520) { /* llm.c; a cut one is no text either */
        if (size < 1024) {
            snprintf(err, errsize, "%s: an llm.c token file's header (magic 20240520) but only %zu bytes: its header "
                     "alone is 1024", path, size);
            free(buf);
            return 0;
        }
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
        d->format = "llm.c token shard";
    } else if (bin) { /* nanoGPT */
        if (size % 2) {
            snprintf(err, errsize, "%s: a .bin of uint16 tokens must have an even length, not %zu bytes", path, size);
            free(buf);
            return 0;
        }
        p = buf;
        n = size / 2;
        u16 = 1;
        d->format = "nanoGPT uint16 tokens";
    } else {
        p = buf;
        n = size;
        d->format = "text bytes";
    }
    d->text = !u16;
    if (n == 0) {
        snprintf(err, errsize, "%s: no tokens (%s)", path, size ? "a header only" : "empty file");
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

/* The directory of this program into dir (size bytes): /proc/self/exe's, which also
   knows it when the shell found the program on PATH (argv0 is then a bare name), else
   argv0's (NULL: none). 0 when neither says. */
static int program_dir(const char *argv0, char *dir, size_t size)
{
    const ssize_t n = readlink("/proc/self/exe", dir, size - 1);
    if (n > 0) dir[n] = 0;
    else if (argv0 && strchr(argv0, '/')) snprintf(dir, size, "%s", argv0);
    else return 0;
    if (!strchr(dir, '/')) return 0;
    *strrchr(dir, '/') = 0; /* "/prog": "", and the callers add "/" */
    return 1;
}

/* Without --data: the short story examples/train_gpt.txt, plain words that the
   default model learns to write in a minute (make run); found next to the program,
   else under the current directory. */
static int load_default(dataset *d, const char *argv0, int vocab, char *err, size_t errsize)
{
    char dir[4096], path[3][500];
    int k;
    if (program_dir(argv0, dir, sizeof dir)) snprintf(path[0], sizeof path[0], "%.480s/train_gpt.txt", dir);
    else snprintf(path[0], sizeof path[0], "train_gpt.txt");
    snprintf(path[1], sizeof path[1], "examples/train_gpt.txt");
    snprintf(path[2], sizeof path[2], "train_gpt.txt");
    for (k = 0; k < 3; k++) {
        if (access(path[k], F_OK) != 0) continue; /* not opened here: a FIFO would wait for a writer */
        snprintf(d->source, sizeof d->source, "%.500s", path[k]);
        return load_tokens(d, path[k], vocab, err, errsize);
    }
    snprintf(err, errsize, "no --data given, and no examples/train_gpt.txt next to the program or here");
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
    if (num_windows(d->n / 10, T, T) < 1) {
        snprintf(err, errsize, "%s: %zu tokens are too few for --ctx %d: need %zu (a window of %d in the last 10%%)",
                 d->source, d->n, T, (size_t)10 * (T + 1), T + 1);
        return 0;
    }
    return 1;
}

/* Fills the micro-batch with the windows of the sampler's indices. */
static void fill_batch(gpt *g, const int *split, int stride, const size_t *windows, int B)
{
    const int T = g->cfg.ctx;
    int b, t;
    for (b = 0; b < B; b++) {
        const int *w = split + windows[b] * (size_t)stride;
        for (t = 0; t < T; t++) {
            g->a.tokens[b * T + t] = w[t];
            g->a.targets[b * T + t] = w[t + 1];
        }
    }
}

/* ---- flags --------------------------------------------------------------------------- */
typedef struct options {
    config cfg;
    const char *data, *log, *save, *resume, *prompt, *trace, *compare[3];
    const char *launcher; /* --max-restarts, --local-rank: read by ddp_launch and ddp_init */
    int batch_size, grad_accum, steps, stop_after, warmup, val_every, save_every, sample_len, bucket_kb, nproc;
    int bench_no_sync, bench_matmul, device_info;
    int resume_auto; /* --resume auto: continue --save's file when it belongs to this run */
    int bf16, allreduce_bf16; /* --dtype (-1: bf16 on a GPU) and --allreduce, for the GPU path */
    float lr, min_lr_frac, weight_decay, clip, temperature;
    int top_k, stride;
    uint64_t seed;
    const char *given[64]; /* the flags on the command line (their names), for given() */
    int n_given;
} options;

/* Every flag, once: X(group in --help ("" hides it), name, kind, field of options,
   default ("": none, the field stays 0), what --help shows without a default, lowest
   and highest value of a number, what --help says of it). The defaults are read by
   the same functions as the command line, and --help prints them as written here. */
#define FLAGS(X) \
    X("ranks", "--nproc", int, nproc, "1", "", 1, 256, "processes on this machine, a rank each") \
    X("model", "--layers", int, cfg.layers, "4", "", 1, 64, "") \
    X("model", "--heads", int, cfg.heads, "4", "", 1, 64, "") \
    X("model", "--dim", int, cfg.dim, "128", "", 1, 8192, "") \
    X("model", "--ctx", int, cfg.ctx, "64", "", 1, 8192, "") \
    X("model", "--vocab", int, cfg.vocab, "256", "", 2, 65536, "") \
    X("data", "--data", path, data, "", "FILE", 0, 0, "an llm.c token shard by its header, nanoGPT " \
      "uint16 tokens by a name ending .bin in any case, else text as bytes; default: examples/train_gpt.txt, a " \
      "short story in plain words") \
    X("data", "--stride", int, stride, "", "S", 0, 8192, "training windows start every S tokens; default 1 for " \
      "data up to 1M tokens, else --ctx; validation windows never overlap") \
    X("batch", "--batch-size", int, batch_size, "16", "", 1, 65536, "sequences per rank per micro-step") \
    X("batch", "--grad-accum", int, grad_accum, "1", "", 1, 65536, "micro-steps per step") \
    X("schedule", "--steps", int, steps, "150", "", 1, 100000000, "") \
    X("schedule", "--lr", float, lr, "3e-3", "", 1e-9, 10, "") \
    X("schedule", "--warmup", int, warmup, "40", "", 0, 100000000, "steps; at most --steps - 1") \
    X("schedule", "--min-lr-frac", float, min_lr_frac, "0.1", "", 0, 1, "cosine") \
    X("schedule", "--stop-after", int, stop_after, "", "N", 1, 100000000, "end this run after step N, saved to " \
      "--save's file; --resume goes on") \
    X("schedule", "--weight-decay", float, weight_decay, "0.1", "", 0, 10, "") \
    X("schedule", "--clip", float, clip, "1.0", "", 0, 1e9, "0: off") \
    X("schedule", "--seed", seed, seed, "0", "", 0, 0, "") \
    X("output", "--val-every", int, val_every, "50", "", 0, 100000000, "0: off") \
    X("output", "--log", path, log, "", "FILE.jsonl", 0, 0, "") \
    X("output", "--save", path, save, "", "FILE.safetensors", 0, 0, "") \
    X("output", "--save-every", int, save_every, "", "K", 1, 100000000, "") \
    X("output", "--resume", path, resume, "", "FILE.safetensors", 0, 0, "or --resume auto: continue --save's " \
      "file when it exists and belongs to this run: model, data, seed, batch, schedule, precision") \
    X("output", "--trace", path, trace, "", "FILE.json", 0, 0, "where the time goes, per rank: open it in " \
      "ui.perfetto.dev") \
    X("restarts", "--max-restarts", text, launcher, "", "N", 0, 0, "with --nproc: start the job again after a " \
      "failure, up to N times; with --save-every and --resume auto it goes on where it was saved") \
    X("", "--max_restarts", text, launcher, "", "N", 0, 0, "") \
    X("", "--local-rank", text, launcher, "", "N", 0, 0, "") \
    X("", "--local_rank", text, launcher, "", "N", 0, 0, "") \
    X("sample", "--prompt", text, prompt, "", "TEXT", 0, 0, "text data: its bytes, each below --vocab; default " \
      "\"The \". Token data (no tokenizer here): token ids, --prompt~\"464 2068\"; default its first token") \
    X("sample", "--sample-len", int, sample_len, "300", "", 0, 1000000, "at most; ends at a sentence past half") \
    X("sample", "--temperature", float, temperature, "0.7", "", 0, 100, "0: greedy") \
    X("sample", "--top-k", int, top_k, "10", "", 0, 1000000, "0: all") \
    X("sync", "--bucket-kb", int, bucket_kb, "", "N", 1, 4194304, "gradient bucket size; default 1024 on the " \
      "CPU, 25600 on GPUs, where NCCL wants few large messages: PyTorch's 25 MiB") \
    X("sync", "--bench-no-sync", on, bench_no_sync, "", "", 0, 0, "benchmark only: no gradient all-reduce; " \
      "ranks diverge, and nothing is saved") \
    X("device", "--dtype", dtype, bf16, "", "bf16", 0, 0, "the GPU's default: bf16 activations, fp32 master " \
      "weights; or fp32") \
    X("device", "--allreduce", dtype, allreduce_bf16, "fp32", "", 0, 0, "or bf16: the gradients' type on the " \
      "wire") \
    X("device", "--device-info", on, device_info, "", "", 0, 0, "says whether this build trains on a GPU here, " \
      "or why not; exit 0: it does") \
    X("bench", "--bench-matmul", on, bench_matmul, "", "", 0, 0, "the CPU matmuls' GFLOP/s at this model's " \
      "shapes, forward and backward, all threads: the ceiling examples/bench_train_gpt.py measures against; " \
      "then attention's")

/* The kinds of value: each reads v into *out, 1 if it is good; _takes says whether the
   flag takes a value, _range what a good one is. */
#define int_takes 1
#define int_range(lo, hi) "an integer from " #lo " to " #hi
static int int_flag(const char *v, long lo, long hi, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    *out = (int)x;
    return end != v && !*end && x >= lo && x <= hi;
}

#define float_takes 1
#define float_range(lo, hi) float_range_text(#lo, #hi, (lo) <= 0)
static const char *float_range_text(const char *lo, const char *hi, int zero_in_range)
{
    static char text[160];
    snprintf(text, sizeof text, "a number from %s to %s%s", lo, hi,
             zero_in_range ? ", not so near 0 that fp32 rounds it to 0" : "");
    return text;
}
static int float_flag(const char *v, float lo, float hi, float *out)
{
    char *end;
    float x = strtof(v, &end);
    double d;
    *out = x; /* a value that rounds to 0 in fp32 (--clip 1e-50, 1e-400) would turn a setting off unsaid */
    errno = 0;
    d = strtod(v, NULL);
    return end != v && !*end && x >= lo && x <= hi && (x != 0 || (d == 0 && errno != ERANGE));
}

#define seed_takes 1
#define seed_range(lo, hi) "a non-negative integer"
static int seed_flag(const char *v, int lo, int hi, uint64_t *out)
{
    char *end;
    (void)lo, (void)hi;
    errno = 0;
    *out = strtoull(v, &end, 10);
    return *v >= '0' && *v <= '9' && !*end && errno == 0; /* strtoull takes " -1" as 2^64 - 1 */
}

#define text_takes 1
#define text_range(lo, hi) "text"
static int text_flag(const char *v, int lo, int hi, const char **out)
{
    (void)lo, (void)hi;
    *out = v;
    return 1;
}
#define path_takes 1
#define path_range(lo, hi) "a file name, not empty"
static int path_flag(const char *v, int lo, int hi, const char **out)
{
    (void)lo, (void)hi;
    *out = v;
    return *v != 0;
}

#define dtype_takes 1
#define dtype_range(lo, hi) "fp32 or bf16"
static int dtype_flag(const char *v, int lo, int hi, int *bf16)
{
    (void)lo, (void)hi;
    *bf16 = strcmp(v, "bf16") == 0;
    return *bf16 || strcmp(v, "fp32") == 0;
}

#define on_takes 0
#define on_range(lo, hi) "nothing"
static int on_flag(const char *v, int lo, int hi, int *out)
{
    (void)v, (void)lo, (void)hi;
    *out = 1;
    return 1;
}

/* Prints the words of s from column col, a space between them ('~' prints a space that
   does not break), past column 92 on a new line from column 12; returns the column. */
static int put_words(const char *s, int col)
{
    for (;;) {
        int n = 0;
        while (*s == ' ') s++;
        while (s[n] && s[n] != ' ') n++;
        if (!n) return col;
        if (col >= 12 && col + 1 + n > 92) col = printf("\n%12s", "") - 1;
        else col += printf("%*s", col < 12 ? 12 - col : col > 12, "");
        for (col += n; n--; s++) putchar(*s == '~' ? ' ' : *s);
    }
}

/* --help: the groups in order, each with what it says first and then its flags from FLAGS;
   a flag with words of its own, and the flag after it, start a line */
static void print_usage(void)
{
    static const char *const groups[][2] = {
        {"ranks", ""}, {"model", ""}, {"data", ""}, {"batch", ""}, {"schedule", ""}, {"output", ""},
        {"restarts", ""}, {"sample", ""}, {"sync", ""},
        {"device", "the nvcc build (train_gpt_gpu) trains on the GPUs, one per rank, when it sees them (NCCL "
                   "backend); without one, or with DDP_BACKEND=cpu, on the CPU (fp32)"},
        {"bench", ""},
        {"compare", "train_gpt --compare A.safetensors B.safetensors [PREFIX] (the largest relative difference "
                    "of the tensors whose names start with PREFIX, e.g. opt.m.)"}};
    char word[128];
    int said = 0; /* the last flag printed had words of its own */
    printf("usage: train_gpt [--nproc N] [--flag value | --flag=value ...]\n");
    for (size_t k = 0; k < sizeof groups / sizeof *groups; k++) {
        int col = put_words(groups[k][1], printf("  %s:", groups[k][0]));
#define USAGE(group, name, kind, field, def, meta, lo, hi, help) \
        if (strcmp(group, groups[k][0]) == 0) { \
            if ((said || *help) && col > 12) col = printf("\n%12s", "") - 1; \
            said = *help != 0; \
            const char *shown = sizeof def > 1 ? def : meta; \
            snprintf(word, sizeof word, strchr(shown, ' ') ? "%s \"%s\"" : *shown ? "%s %s" : "%s", name, shown); \
            for (char *c = word; *c; c++) *c = *c == ' ' ? '~' : *c; \
            col = put_words(word, col); \
            if (*help) col = put_words("(" help ")", col); \
        }
        FLAGS(USAGE)
#undef USAGE
        putchar('\n');
    }
}

/* Whether the flag was on the command line (the defaults cannot tell). */
static int given(const options *o, const char *flag)
{
    int i;
    for (i = 0; i < o->n_given && strcmp(o->given[i], flag) != 0; i++) {}
    return i < o->n_given;
}

/* Returns 1 if the flags are good, 0 with the reason in err, -1 for --help. */
static int parse_options(int argc, char **argv, options *o, char *err, size_t errsize)
{
    memset(o, 0, sizeof *o);
    o->bf16 = -1; /* no --dtype: bf16 on a GPU, fp32 on the CPU */
#define DEFAULT(group, name, kind, field, def, meta, lo, hi, help) \
    if (sizeof def > 1 && !kind##_flag(def, lo, hi, &o->field)) { \
        snprintf(err, errsize, "train_gpt's own default for %s is not %s", name, kind##_range(lo, hi)); \
        return 0; \
    }
    FLAGS(DEFAULT)
#undef DEFAULT
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '='), *v = eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
        const char *range = "";
        const size_t n = eq ? (size_t)(eq - a) : strlen(a); /* the flag's name: a, or a up to = */
        int ok = 1, takes = 1;
        /* a flag after one that takes a value is a value left out (--log --bench-no-sync wrote a
           log named --bench-no-sync and dropped the flag); such a value goes after an = */
        const int flag_next = !eq && v && strncmp(v, "--", 2) == 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return -1;
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errsize, "unexpected argument '%s' (train_gpt --help lists the flags)", a);
            return 0;
        }
        if (n == 9 && strncmp(a, "--compare", 9) == 0) {
            if (o->n_given) { /* read, and then not used */
                snprintf(err, errsize, "--compare A B [PREFIX] takes no other flags: %s before it", o->given[0]);
                return 0;
            }
            if (eq || i + 2 >= argc) {
                snprintf(err, errsize, "--compare needs two files after it: --compare A.safetensors B.safetensors");
                return 0;
            }
            o->compare[0] = argv[i + 1];
            o->compare[1] = argv[i + 2];
            o->compare[2] = i + 3 < argc ? argv[i + 3] : "";
            if (strncmp(o->compare[2], "--", 2) == 0) {
                snprintf(err, errsize, "--compare A B [PREFIX] takes no flags: '%s' is not a tensor name's prefix",
                         o->compare[2]);
                return 0;
            }
            if (i + 4 < argc) {
                snprintf(err, errsize, "--compare takes two files and a prefix: '%s' is one too many", argv[i + 4]);
                return 0;
            }
            return 1;
        }
#define PARSE(group, name, kind, field, def, meta, lo, hi, help) \
        else if (n == sizeof name - 1 && strncmp(a, name, n) == 0) { \
            if (o->n_given < (int)(sizeof o->given / sizeof o->given[0])) o->given[o->n_given++] = name; \
            takes = kind##_takes; \
            range = kind##_range(lo, hi); \
            ok = takes && (!v || flag_next) ? -1 : !takes && eq ? -2 : kind##_flag(v, lo, hi, &o->field); \
        }
        if (0) {}
        FLAGS(PARSE)
        else {
            snprintf(err, errsize, "unknown flag '%.*s' (train_gpt --help lists the flags)", (int)n, a);
            return 0;
        }
#undef PARSE
        if (ok == -1 && v) {
            snprintf(err, errsize, "%.*s needs a value, not the flag '%s' (a value that starts with --: %.*s=VALUE)",
                     (int)n, a, v, (int)n, a);
            return 0;
        }
        if (ok < 0) {
            snprintf(err, errsize, "%.*s %s (train_gpt --help lists the flags)", (int)n, a,
                     ok == -1 ? "needs a value" : "takes no value");
            return 0;
        }
        if (!ok) {
            snprintf(err, errsize, "bad value '%s' for %.*s: %s", v, (int)n, a, range);
            return 0;
        }
        i += takes && !eq;
    }
    if (o->bench_matmul || o->device_info) { /* they train nothing: a flag of a run would be dropped unsaid */
        static const char *const shapes[] = {"--layers", "--heads", "--dim", "--ctx", "--vocab", "--batch-size"};
        const char *own = o->bench_matmul ? "--bench-matmul" : "--device-info";
        int k, j, n_ok = o->bench_matmul ? (int)(sizeof shapes / sizeof shapes[0]) : 0; /* --bench-matmul's */
        for (k = 0; k < o->n_given; k++) {
            for (j = 0; j < n_ok && strcmp(o->given[k], shapes[j]) != 0; j++) {}
            if (j == n_ok && strcmp(o->given[k], own) != 0) {
                snprintf(err, errsize, "%s trains nothing, so it takes no %s%s", own, o->given[k], n_ok ?
                         " (only the model's shape: --dim, --ctx, --vocab, --batch-size, --heads, --layers)" : "");
                return 0;
            }
        }
    }
    if (o->cfg.dim % o->cfg.heads) {
        snprintf(err, errsize, "--dim %d is not a multiple of --heads %d", o->cfg.dim, o->cfg.heads);
        return 0;
    }
    /* (first: the checks below would each ask for what this one refuses) */
    if (o->bench_no_sync && (o->save || o->save_every || o->stop_after || (o->resume && !strcmp(o->resume, "auto")))) {
        /* rank 0's weights alone, which --resume auto took for the run's */
        snprintf(err, errsize, "--bench-no-sync trains each rank apart (a benchmark): it saves nothing, so it takes "
                 "no %s", o->save ? "--save" : o->save_every ? "--save-every" : o->stop_after ? "--stop-after"
                                                                                       : "--resume auto");
        return 0;
    }
    /* the learning rate reaches --lr within the run: a short run's default warmup is
       shorter (--steps 3 trained at 3/40 of --lr), and a --warmup as long is refused */
    if (o->warmup >= o->steps) {
        if (given(o, "--warmup")) {
            snprintf(err, errsize, "--warmup %d is not shorter than --steps %d: the learning rate would never reach "
                     "--lr", o->warmup, o->steps);
            return 0;
        }
        o->warmup = o->steps - 1;
    }
    if (o->save_every && !o->save) {
        snprintf(err, errsize, "--save-every needs --save FILE");
        return 0;
    }
    if (o->stop_after && !o->save) { /* it trained, and threw the steps away */
        snprintf(err, errsize, "--stop-after ends a run for --resume to go on from: give --save FILE");
        return 0;
    }
    if (o->resume && strcmp(o->resume, "auto") == 0) { /* a file named auto: --resume ./auto */
        o->resume_auto = 1;
        o->resume = NULL; /* prepare() sets it to --save's file if that exists */
        if (!o->save) {
            snprintf(err, errsize, "--resume auto continues from --save's file: give --save FILE (and --save-every K)");
            return 0;
        }
    }
#ifndef __CUDACC__
    if (o->bf16 == 1 || o->allreduce_bf16) {
        snprintf(err, errsize, "--dtype bf16 and --allreduce bf16 are for the GPU path (train_gpt_gpu): this build "
                 "trains on the CPU in fp32");
        return 0;
    }
#endif
    return 1;
}

/* ---- training ---------------------------------------------------------------------- */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* PyTorch's rates at the same shapes, for --bench-matmul: examples/bench_train_gpt.py
   (beside this binary) measures them with python3 and prints one line per weight, "out in
   fwd dinp dweight" in GFLOP/s, after a line with torch's version. Fills rate[k][3] and
   version; returns 0 with the reason in version when there is no PyTorch to ask. */
static int torch_matmul(const options *o, int threads, double rate[5][3], char *version, size_t size)
{
    char exe[4096], cmd[4300 + 160], line[256];
    FILE *f;
    int k = 0, status;
    if (!program_dir(NULL, exe, sizeof exe) || strchr(exe, '\'')) { /* the path goes into a shell command in quotes */
        snprintf(version, size, "cannot find bench_train_gpt.py beside this binary");
        return 0;
    }
    snprintf(cmd, sizeof cmd, "python3 '%s/bench_train_gpt.py' --torch-matmul --dim %d --ctx %d --batch %d --vocab %d "
             "--threads %d 2>&1", exe, o->cfg.dim, o->cfg.ctx, o->batch_size, o->cfg.vocab, threads);
    if (!(f = popen(cmd, "r"))) {
        snprintf(version, size, "cannot run python3: %s", strerror(errno));
        return 0;
    }
    version[0] = 0;
    while (fgets(line, sizeof line, f)) {
        int oc, ic;
        line[strcspn(line, "\n")] = 0;
        if (k < 5 && sscanf(line, "%d %d %lf %lf %lf", &oc, &ic, &rate[k][0], &rate[k][1], &rate[k][2]) == 5) k++;
        else snprintf(version, size, "%s", line); /* torch's version, or the last word of a failure */
    }
    status = pclose(f);
    if (status != 0 || k != 5) {
        if (!version[0]) snprintf(version, size, "bench_train_gpt.py --torch-matmul failed");
        return 0;
    }
    return 1;
}

/* The bytes this machine has free (MemAvailable and SwapFree), 0 if unknown. */
static double memory_free(void)
{
    char line[256];
    double avail = 0, swap = 0, v;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %lf kB", &v) == 1) avail = v * 1024;
        if (sscanf(line, "SwapFree: %lf kB", &v) == 1) swap = v * 1024;
    }
    fclose(f);
    return avail > 0 ? avail + swap : 0;
}

/* --bench-matmul's rule for timing a product: at least 5 runs, and up to 100 while 0.2 s
   have not passed since start */
static int bench_again(int round, double start)
{
    return round < 5 || (round < 100 && now_s() - start < 0.2);
}

/* --bench-matmul: each weight's forward and backward products (the model's matmul
   shapes, --batch-size x --ctx rows) on the CPU with all threads, as training runs them
   (the weight gradient per sequence, summed in double), beside PyTorch's sgemm
   (MKL/oneDNN) on the same shapes where python3 imports torch; then attention, forward and
   backward, at the model's heads. Each product is timed at
   least 5 times, and up to 100 times while 0.2 s have not passed, the fastest counting:
   on a machine others use, the fastest of many runs is the one they disturbed least. */
static int bench_matmul(const options *o)
{
    const int C = o->cfg.dim, T = o->cfg.ctx, B = o->batch_size, shapes[5][2] = {
        {3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}, {o->cfg.vocab, C}}; /* (out, in): qkv, proj, fc, proj, lm_head */
    static const char *names[5] = {"attn qkv", "attn proj", "mlp fc", "mlp proj", "lm_head"};
    const size_t M = (size_t)B * T, most = (size_t)4 * C > (size_t)o->cfg.vocab ? (size_t)4 * C : (size_t)o->cfg.vocab;
    const double need = (double)(3 * M * most + most * C) * sizeof(float) + (double)most * C * sizeof(double),
                 have = memory_free(); /* (calloc may promise what the first touch cannot have) */
    float *x, *y, *dx, *w;
    double *dw, ours[5][3], theirs[5][3], flops = 0, mine = 0, torch = 0, att[2] = {0, 0};
    char version[256];
    int k, p, round, threads = 1, have_torch;
    if (have > 0 && need > have) {
        fprintf(stderr, PROG ": --bench-matmul at these shapes needs %.1f GiB, more than the %.1f GiB this machine has "
                "free: a smaller --batch-size, --ctx, --dim or --vocab\n", need / (1024.0 * 1024 * 1024),
                have / (1024.0 * 1024 * 1024));
        return 1;
    }
    x = (float *)calloc(3 * M * most + most * C, sizeof(float)); /* then y, dx, w */
    dw = (double *)calloc(most * C, sizeof(double));
    if (!x || !dw) {
        free(x);
        free(dw);
        fprintf(stderr, PROG ": out of memory for --bench-matmul\n");
        return 1;
    }
    y = x + M * most, dx = y + M * most, w = dx + M * most;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    { /* values written, as training's are: calloc's untouched pages all map the one zero
         page, whose reads measured 25% slower on Zen 3 */
        uint32_t r = 1;
        for (size_t i = 0; i < 3 * M * most + most * C; i++) x[i] = (float)((r = r * 1664525u + 1013904223u) >> 8) * 0x1p-24f - 0.5f;
    }
    for (k = 0; k < 5; k++)
        for (p = 0; p < 3; p++) {
            const int OC = shapes[k][0], IC = shapes[k][1];
            const double start = now_s();
            double best = INFINITY;
            for (round = 0; bench_again(round, start); round++) {
                const double t0 = now_s();
                if (p == 0) ddp_matmul_forward_cpu(y, x, w, NULL, B, T, IC, OC);
                else if (p == 1) ddp_matmul_backward_cpu(dx, NULL, NULL, y, x, w, B, T, IC, OC);
                else ddp_matmul_backward_sum_cpu(dw, NULL, y, x, B, T, IC, OC);
                best = fmin(best, now_s() - t0);
            }
            ours[k][p] = 2.0 * (double)M * OC * IC / best / 1e9;
        }
    { /* attention at the model's heads, its inputs from x and y (forward 2 products, backward 5:
         the scores again, then dscores, dq, dk, dv); flops counted causal, T (T + 1) / 2 pairs */
        float *lse = (float *)malloc(sizeof(float) * M * (size_t)o->cfg.heads);
        for (p = 0; p < 2 && lse; p++) {
            const double start = now_s();
            double best = INFINITY;
            for (round = 0; bench_again(round, start); round++) {
                const double t0 = now_s();
                if (p == 0) ddp_attention_forward_cpu(y, lse, x, B, T, C, o->cfg.heads);
                else ddp_attention_backward_cpu(dx, y + M * C, x, y, lse, B, T, C, o->cfg.heads);
                best = fmin(best, now_s() - t0);
            }
            att[p] = (p ? 5.0 : 2.0) * 2.0 * B * ((double)T * (T + 1) / 2) * C / best / 1e9;
        }
        free(lse);
    }
    free(x);
    free(dw);
    have_torch = torch_matmul(o, threads, theirs, version, sizeof version);
    printf("matmul GFLOP/s at this model's shapes (%zu rows: batch %d x ctx %d; forward / input gradient / weight "
           "gradient, ours per sequence summed in double as training does; each the fastest of 5-100 runs in "
           "about 0.2 s), %d thread%s\n", M, B, T, threads, threads == 1 ? "" : "s");
    printf("| weight (out x in) | ddp_kernels.cuh | %s |\n|---|---:|---:|\n", have_torch ? version : "PyTorch");
    for (k = 0; k < 5; k++) {
        const double f = 2.0 * (double)M * shapes[k][0] * shapes[k][1];
        flops += 3 * f;
        for (p = 0; p < 3; p++) {
            mine += f / ours[k][p];
            torch += have_torch ? f / theirs[k][p] : 0;
        }
        printf("| %s %d x %d | %.1f / %.1f / %.1f |", names[k], shapes[k][0], shapes[k][1], ours[k][0], ours[k][1],
               ours[k][2]);
        if (have_torch) printf(" %.1f / %.1f / %.1f |\n", theirs[k][0], theirs[k][1], theirs[k][2]);
        else printf(" - |\n");
    }
    printf("matmul: %.1f GFLOP/s (ddp_kernels.cuh, %d thread%s, %zu rows, dim %d; register tile %s)\n", flops / mine,
           threads, threads == 1 ? "" : "s", M, C, DDP_KERNELS_CPU_TILE);
    if (have_torch)
        printf("matmul: %.1f GFLOP/s (%s sgemm, %d thread%s; ddp_kernels.cuh at %.0f%% of it)\n", flops / torch, version,
               threads, threads == 1 ? "" : "s", 100.0 * torch / mine);
    else
        printf("matmul: PyTorch not measured (%s)\n", version);
    if (att[1] > 0)
        printf("attention: %.1f GFLOP/s forward, %.1f backward (ddp_kernels.cuh, %d thread%s, %d heads of %d, ctx %d; "
               "causal flops: 2 products forward, 5 backward)\n", att[0], att[1], threads, threads == 1 ? "" : "s",
               o->cfg.heads, C / o->cfg.heads, T);
    else
        printf("attention: not measured (out of memory for its log-sum-exps)\n");
    return 0;
}

/* Linear warmup to lr, then cosine decay to lr * min_lr_frac at the last step. */
static float learning_rate(const options *o, int step)
{
    double frac;
    if (step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    frac = o->steps > o->warmup + 1 ? (double)(step - o->warmup) / (o->steps - o->warmup - 1) : 1.0;
    return o->lr * (float)(o->min_lr_frac + (1.0 - o->min_lr_frac) * 0.5 * (1.0 + cos(3.141592653589793 * frac)));
}

/* What decides a run's weights besides the model's shape: a checkpoint written with
   other values belongs to another run, which --resume auto refuses to continue. The
   global batch counts, not how it is split (1 rank x 8 and 2 x 4 train the same
   weights). As text, the way the checkpoint's metadata holds it; "" where not known. */
enum {
    RUN_SEED, RUN_DATA, RUN_BATCH, RUN_STEPS, RUN_LR, RUN_WARMUP, RUN_MIN_LR, RUN_DECAY, RUN_CLIP, RUN_STRIDE,
    RUN_PRECISION, RUN_KEYS
};
static const char *const run_keys[RUN_KEYS][2] = { /* metadata key, how a run sets it */
    {"seed", "--seed"}, {"data", "--data"}, {"global_batch", "global batch (--batch-size x ranks x --grad-accum)"},
    {"steps", "--steps"}, {"lr", "--lr"}, {"warmup", "--warmup"}, {"min_lr_frac", "--min-lr-frac"},
    {"weight_decay", "--weight-decay"}, {"clip", "--clip"}, {"stride", "--stride"},
    {"precision", "precision (--dtype, --allreduce; bf16 by default on a GPU, fp32 on the CPU)"}};
typedef struct run_identity {
    char v[RUN_KEYS][48];
} run_identity;

/* The run: what main sets up once and the training loop uses. */
typedef struct trainer {
    options o;
    dataset data;
    gpt model;
    gpu *dev; /* the model's device copy when training on a GPU, else NULL */
    ddp_ctx ctx;
    ddp_grad sync;
    ddp_sampler train, val;
    size_t train_windows, val_windows, steps_per_epoch, global_batch;
    uint64_t seed;      /* the sampler's: --seed, or the resumed run's */
    run_identity id;    /* this run's, written into every checkpoint */
    run_identity found; /* the --resume checkpoint's */
    int start_step;     /* 0, or the step a --resume checkpoint was written after */
    int stop;           /* the step after which this run ends (--stop-after, else --steps) */
    int ddp_errors;     /* failures ddp.h has already reported (log_ddp) */
    FILE *log;          /* --log, rank 0 */
    int tty;            /* rank 0's stdout is a terminal: one progress line, rewritten */
    int line_open;      /* the progress line awaits its newline */
    double t_start, t_train;
    double t_first;     /* seconds of this run's first step (cuBLASLt plans, page faults) */
} trainer;

/* What one step measured, for log_step. */
typedef struct step_stats {
    double loss, val_loss, tokens, seconds;
    float lr, norm;
    int has_val;
} step_stats;

/* ddp.h's log: its errors go to stderr as by default, and are counted, so that a
   failed call that ddp.h has reported is not reported twice (ddp_reason). */
static void log_ddp(void *user, int level, const char *msg)
{
    fprintf(stderr, "ddp: %s%s\n", level == DDP_LOG_ERROR ? "error: " : "", msg);
    if (level == DDP_LOG_ERROR) ++*(int *)user;
}

/* The reason for a failed ddp.h call in err: empty when ddp.h has printed it already,
   else the call and the code (a failure ddp.h returned without a word). Returns 0. */
static int ddp_reason(const trainer *t, const char *call, ddp_result r, char *err, size_t errsize)
{
    const char *why = *ddp_error(&t->ctx) ? ddp_error(&t->ctx) : ddp_strerror(r);
    if (t->ddp_errors) err[0] = 0;
    else snprintf(err, errsize, "rank %d: %s failed: %s", t->ctx.rank, call, why);
    return 0;
}

/* Mean loss over every validation window, on all ranks together (padding skipped). */
static int evaluate(trainer *t, double *loss, char *err, size_t errsize)
{
    gpt *g = &t->model;
    ddp_metric m;
    ddp_result r;
    size_t b, i;
    memset(&m, 0, sizeof m);
    for (b = 0; b < t->val.num_batches; b++) {
        ddp_batch bt = ddp_sampler_batch(&t->val, 0, b);
        if (!bt.num_real) continue;
        fill_batch(g, t->data.tokens + t->data.n_train, g->cfg.ctx, bt.indices, (int)bt.num_real);
        forward(g, t->dev, (int)bt.num_real, 1, 0);
        for (i = 0; i < bt.num_real * (size_t)g->cfg.ctx; i++) ddp_metric_add(&m, g->a.losses[i], 1);
    }
    if ((r = ddp_metric_reduce(&t->ctx, &m, 1)) != DDP_OK) return ddp_reason(t, "ddp_metric_reduce", r, err, errsize);
    *loss = ddp_metric_mean(&m);
    return 1;
}

/* The optimizer step after ddp_grad_finish (template: optimizer.step()): the summed
   gradient becomes the mean over the global batch's tokens, its norm is clipped, and
   AdamW updates each tensor. Zeroes the sums for the next step; returns the norm
   before clipping. gpu_step is the same on the device. */
static float cpu_step(gpt *g, float lr, float weight_decay, float clip, int step, double tokens)
{
    float norm = 0.0f, *grads = g->grads;
    double *sum = g->grad_sum;
    const double per_token = 1.0 / tokens; /* a multiply per parameter, not a division */
    size_t i, n = g->num_params;
    int l;
    for (i = 0; i < n; i++) { /* the sums zeroed as they are read, for the next step: no second pass */
        grads[i] = (float)(sum[i] * per_token);
        sum[i] = 0.0;
    }
    ddp_global_norm_cpu(&norm, grads, n);
    if (clip > 0) ddp_clip_by_norm_cpu(grads, n, clip, &norm);
    for (l = 0; l < g->num_tensors; l++) {
        const tensor *t = &g->tensors[l];
        ddp_adamw_update_cpu(param(g, t), param_grad(g, t), g->m + t->offset, g->v + t->offset, t->numel, lr,
                             ADAMW_BETAS_EPS, weight_decay_of(t, weight_decay), step + 1);
    }
    memset(grads, 0, n * sizeof(float)); /* the backward pass accumulates into it, as into the sums */
    return norm;
}

/* One optimizer step (template: for data in train_loader: loss = model(data);
   loss.backward(); optimizer.step()). Micro-step k of step s is sampler batch
   (s mod steps_per_epoch) A + k of epoch s / steps_per_epoch: the position depends on
   the step alone, so a resumed run continues the exact data order. Micro-steps before
   the last only accumulate (DDP's no_sync()). */
static int train_step(trainer *t, int step, step_stats *st, char *err, size_t errsize)
{
    const options *o = &t->o;
    gpt *g = &t->model;
    const double t0 = now_s();
    ddp_metric loss;
    ddp_result r;
    size_t i;
    int k;
    memset(st, 0, sizeof *st);
    memset(&loss, 0, sizeof loss);
    st->lr = learning_rate(o, step);
    span(&t->ctx, "step %d", step + 1);
    for (k = 0; k < o->grad_accum; k++) {
        size_t b = (size_t)(step % t->steps_per_epoch) * o->grad_accum + k;
        ddp_batch bt = ddp_sampler_batch(&t->train, (uint64_t)(step / t->steps_per_epoch), b);
        if ((r = ddp_grad_no_sync(&t->sync, k < o->grad_accum - 1 || o->bench_no_sync)) != DDP_OK)
            return ddp_reason(t, "ddp_grad_no_sync", r, err, errsize);
        fill_batch(g, t->data.tokens, o->stride, bt.indices, (int)bt.count);
        span(&t->ctx, "forward");
        forward(g, t->dev, (int)bt.count, 1, 1);
        ddp_trace_end(&t->ctx);
        for (i = 0; i < bt.count * (size_t)g->cfg.ctx; i++) ddp_metric_add(&loss, g->a.losses[i], 1);
        span(&t->ctx, "backward");
        r = backward(g, t->dev, (int)bt.count, &t->sync);
        ddp_trace_end(&t->ctx);
        if (r != DDP_OK) return ddp_reason(t, "ddp_grad_ready", r, err, errsize);
        if ((r = ddp_grad_finish(&t->sync)) != DDP_OK) return ddp_reason(t, "ddp_grad_finish", r, err, errsize);
        st->tokens += (double)bt.global_count * g->cfg.ctx;
    }
    span(&t->ctx, "optimizer");
    st->norm = t->dev ? gpu_step(g, t->dev, st->lr, o->weight_decay, o->clip, step, st->tokens, !o->bench_no_sync)
                      : cpu_step(g, st->lr, o->weight_decay, o->clip, step, st->tokens);
    ddp_trace_end(&t->ctx);
    if ((r = ddp_metric_reduce(&t->ctx, &loss, 1)) != DDP_OK)
        return ddp_reason(t, "ddp_metric_reduce", r, err, errsize);
    ddp_trace_end(&t->ctx); /* the step */
    st->loss = ddp_metric_mean(&loss);
    st->seconds = now_s() - t0;
    t->t_train += st->seconds;
    if (step == t->start_step) t->t_first = st->seconds;
    return 1;
}

/* f's buffer written out, and nothing failed on the way (a full disk, a closed pipe) */
static int written(FILE *f) { return fflush(f) == 0 && !ferror(f); }

/* Rank 0's line per step (and --log's JSON object). On a terminal the line is
   rewritten in place (\r, then erase to the end of the line), and only the steps with
   a validation loss stay; logs and CI get every line. 0 (err says why) when the line or
   --log's file cannot be written (a full disk, a file-size limit): the record would end
   mid-line, the run's status 0. */
static int log_step(trainer *t, int step, const step_stats *st, char *err, size_t errsize)
{
    const double elapsed = now_s() - t->t_start, per_step = elapsed / (step + 1 - t->start_step);
    const double tok_s = st->tokens / st->seconds;
    if (!ddp_is_main(&t->ctx)) return 1;
    printf("%sstep %5d/%d | loss %.6f | lr %.2e | norm %.3f | %.0f tok/s | %.1f s, ETA %.1f s", t->tty ? "\r" : "",
           step + 1, t->o.steps, st->loss, st->lr, st->norm, tok_s, elapsed, per_step * (t->stop - step - 1));
    if (st->has_val) printf(" | val %.6f", st->val_loss);
    t->line_open = t->tty && !st->has_val;
    printf("%s", t->tty ? (t->line_open ? "\033[K" : "\033[K\n") : "\n");
    if (!written(stdout)) { /* the run's record is lost */
        snprintf(err, errsize, "cannot write to standard output at step %d: %s", step + 1, strerror(errno));
        return 0;
    }
    if (t->log) {
        fprintf(t->log, "{\"step\": %d, \"loss\": %.6f, ", step + 1, st->loss);
        if (st->has_val) fprintf(t->log, "\"val_loss\": %.6f, ", st->val_loss);
        fprintf(t->log, "\"lr\": %.6g, \"tokens_per_s\": %.1f, \"world_size\": %d}\n", st->lr, tok_s,
                t->ctx.world_size);
        if (!written(t->log)) {
            snprintf(err, errsize, "cannot write --log %s at step %d: %s", t->o.log, step + 1, strerror(errno));
            return 0;
        }
    }
    return 1;
}

static int descending(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* One token from logits (V): among the top_k most likely (0: all), a draw from
   softmax(logits / temperature); temperature 0 takes the most likely. Token `banned`
   (-1: none) is never taken. scratch holds V floats. */
static int sample_token(const float *logits, int V, float temperature, int top_k, int banned, float *scratch,
                        uint64_t *rng)
{
    float cut = -INFINITY; /* logits below it are not among the top_k */
    double sum = 0, r;
    int i, best = banned == 0;
    for (i = 0; i < V; i++)
        if (i != banned && logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    if (top_k > 0 && top_k < V) {
        memcpy(scratch, logits, (size_t)V * sizeof(float));
        qsort(scratch, (size_t)V, sizeof(float), descending);
        cut = scratch[top_k - 1];
    }
    for (i = 0; i < V; i++)
        if (i != banned && logits[i] >= cut) sum += exp((logits[i] - logits[best]) / temperature);
    r = uniform(rng) * sum;
    for (i = 0; i < V; i++)
        if (i != banned && logits[i] >= cut && (r -= exp((logits[i] - logits[best]) / temperature)) < 0) return i;
    return best;
}

/* The sample's first tokens, from --prompt, into out (NULL: only checked): on text data
   its bytes; on token data, whose tokens are no bytes and which no tokenizer here
   encodes, token ids written as numbers. Without a prompt, "The " on text (where those
   bytes are tokens), else the data's first token. The count (at most the prompt's length,
   or 4), or -1 with the reason in err: the byte of a prompt taken modulo --vocab, or text
   read as token ids, would be another prompt than the one given, unsaid. */
static int prompt_tokens(const options *o, const dataset *d, int *out, char *err, size_t errsize)
{
    const int V = o->cfg.vocab;
    const char *p = o->prompt && *o->prompt ? o->prompt : d->text && V > 'h' ? "The " : NULL;
    int n = 0;
    if (!p) {
        if (out) out[0] = d->tokens[0];
        return 1;
    }
    for (; d->text && p[n]; n++) {
        if ((unsigned char)p[n] >= V) {
            snprintf(err, errsize, "--prompt: its byte %d (at %d) is not below --vocab %d (the prompt's bytes are its "
                     "tokens)", (unsigned char)p[n], n, V);
            return -1;
        }
        if (out) out[n] = (unsigned char)p[n];
    }
    while (!d->text && *p) {
        char *end;
        long id;
        while (*p == ' ') p++;
        if (!*p) break;
        id = strtol(p, &end, 10);
        if (*p < '0' || *p > '9' || (*end && *end != ' ') || id >= V) {
            snprintf(err, errsize, "--prompt '%.100s': the data is %s, so a prompt is token ids below --vocab %d "
                     "(--prompt '464 2068'): there is no tokenizer here to read text", o->prompt, d->format, V);
            return -1;
        }
        if (out) out[n] = (int)id;
        n++;
        p = end;
    }
    if (!n) snprintf(err, errsize, "--prompt '%s' holds no token ids", o->prompt);
    return n ? n : -1;
}

/* Rank 0 continues the prompt, one token at a time, from a seeded generator. Text data's
   bytes (vocab <= 256) print as text: past half of --sample-len the sample ends at the
   end of a sentence, and no byte other than a letter or digit repeats more than three
   times in a row (an undertrained model's runs of dashes or spaces); other tokens print
   as their ids. */
static void generate(gpt *g, gpu *dev, const options *o, const dataset *d)
{
    const int T = g->cfg.ctx, V = g->cfg.vocab, bytes = V <= 256 && d->text;
    int *seq = (int *)calloc((size_t)o->sample_len + (o->prompt ? strlen(o->prompt) : 0) + 5, sizeof(int));
    float *scratch = (float *)malloc((size_t)V * sizeof(float));
    uint64_t rng = o->seed;
    int n = 0, i, k;
    if (!seq || !scratch) {
        fprintf(stderr, PROG ": out of memory for the sample\n");
        free(seq);
        free(scratch);
        return;
    }
    n = prompt_tokens(o, d, seq, NULL, 0); /* checked before training */
    printf("sample (%s, temperature %g, top-k %d):\n", bytes ? "bytes" : "token ids", o->temperature, o->top_k);
    for (i = 0; i < n; i++) {
        if (bytes) putchar(seq[i]);
        else printf("%d ", seq[i]);
    }
    for (k = 0; k < o->sample_len; k++) {
        /* the last T tokens; positions after them are padding the causal mask ignores */
        int start = n > T ? n - T : 0, len = n - start, next, banned = -1;
        const float *logits;
        for (i = 0; i < T; i++) g->a.tokens[i] = i < len ? seq[start + i] : 0;
        forward(g, dev, 1, 0, 0); /* on a device only the row we sample from comes back */
        logits = dev ? gpu_logits_to_host(g, dev, len - 1) : g->a.logits + (size_t)(len - 1) * V;
        if (bytes && n >= 3 && seq[n - 1] == seq[n - 2] && seq[n - 2] == seq[n - 3] && !isalnum(seq[n - 1]))
            banned = seq[n - 1];
        next = sample_token(logits, V, o->temperature, o->top_k, banned, scratch, &rng);
        seq[n++] = next;
        if (!bytes) {
            printf("%d ", next);
            continue;
        }
        putchar(next == '\n' || next == '\t' || (next >= 32 && next < 127) || next >= 128 ? next : '.');
        if (2 * k >= o->sample_len && (next == '.' || next == '!' || next == '?')) break;
    }
    printf("\n");
    free(seq);
    free(scratch);
}

/* ---- setup ------------------------------------------------------------------------------
   (the checkpoint functions are at the end of the file) */
static int save_checkpoint(const gpt *g, const char *path, int step, const run_identity *id, int world_size,
                           char *err, size_t errsize);
static int load_checkpoint(gpt *g, const char *path, uint64_t *seed, int *step, run_identity *found, char *err,
                           size_t errsize);
static int same_run(const run_identity *mine, const run_identity *theirs, const char *path, char *err, size_t errsize);
static int compare_checkpoints(const char *a_path, const char *b_path, const char *prefix);

/* This run's identity from its flags and data (the global batch waits for the world
   size). The data is known by its length and an FNV-1a hash of its tokens. */
static void describe_run(trainer *t)
{
    const options *o = &t->o;
    run_identity *id = &t->id;
    uint64_t h = 14695981039346656037ull;
    size_t i;
    for (i = 0; i < t->data.n; i++) h = (h ^ (uint32_t)t->data.tokens[i]) * 1099511628211ull;
    memset(id, 0, sizeof *id);
    snprintf(id->v[RUN_SEED], sizeof id->v[0], "%llu", (unsigned long long)o->seed);
    snprintf(id->v[RUN_DATA], sizeof id->v[0], "%zu tokens, fnv1a %016llx", t->data.n, (unsigned long long)h);
    snprintf(id->v[RUN_STEPS], sizeof id->v[0], "%d", o->steps);
    st_float(id->v[RUN_LR], sizeof id->v[0], o->lr);
    snprintf(id->v[RUN_WARMUP], sizeof id->v[0], "%d", o->warmup);
    st_float(id->v[RUN_MIN_LR], sizeof id->v[0], o->min_lr_frac);
    st_float(id->v[RUN_DECAY], sizeof id->v[0], o->weight_decay);
    st_float(id->v[RUN_CLIP], sizeof id->v[0], o->clip);
    snprintf(id->v[RUN_STRIDE], sizeof id->v[0], "%d", o->stride);
}

/* --log: rank 0's records, one per step of this run. A run from step 0 starts the file
   empty; a resumed run keeps the records up to the step it resumed after, dropping
   those a stopped attempt wrote past it (and a last line cut short), so that every
   step has exactly one record. */
static FILE *open_log(const char *path, int resumed_after, char *err, size_t errsize)
{
    unsigned char *buf;
    size_t size, end, start;
    FILE *f;
    if (resumed_after > 0 && access(path, F_OK) == 0) {
        if (!(buf = st_read_file(path, &size, err, errsize))) return NULL;
        for (end = size; end > 0; end = start) { /* from the end, line by line: {"step": N, ... */
            char head[32];
            int step = 0;
            for (start = end - 1; start > 0 && buf[start - 1] != '\n'; start--) {}
            snprintf(head, sizeof head, "%.*s", (int)(end - start < sizeof head ? end - start : sizeof head - 1),
                     (const char *)buf + start);
            if (buf[end - 1] == '\n' && !(sscanf(head, "{\"step\": %d", &step) == 1 && step > resumed_after)) break;
        }
        free(buf);
        if (truncate(path, (off_t)end) != 0) {
            snprintf(err, errsize, "cannot truncate --log %s: %s", path, strerror(errno));
            return NULL;
        }
    }
    if (!(f = fopen(path, resumed_after ? "a" : "w"))) {
        snprintf(err, errsize, "cannot open --log %s: %s", path, strerror(errno));
        return NULL;
    }
    return f;
}

/* The outputs can be written, and none is another output or an input (the one pair that
   may be one file: --resume x --save x, a run going on). */
static int check_outputs(const options *o, const char *data, char *err, size_t errsize)
{
    const char *files[][2] = {{"--save", o->save}, {"--log", o->log}, {"--trace", o->trace}, {"--data", data},
                              {"--resume", o->resume}};
    const int outputs = 3, all = 5, save = 0, log = 1, resume = 4;
    for (int i = 0; i < outputs; i++) {
        if (files[i][1] && !st_writable(files[i][0], files[i][1], i != log /* opened in place, not renamed */, err,
                                        errsize))
            return 0;
        for (int j = i + 1; j < all; j++)
            if (!(i == save && j == resume) && st_same_file(files[i][1], files[j][1])) {
                snprintf(err, errsize, "%s and %s are one file (%s): give each its own", files[i][0], files[j][0],
                         files[j][1]);
                return 0;
            }
    }
    return 1;
}

static int nothing_to_train(const trainer *t, char *err, size_t errsize)
{
    snprintf(err, errsize, "nothing to train: %s was written after step %d, and this run ends at step %d",
             t->o.resume, t->start_step, t->stop);
    return -1;
}

/* Whether the ranks of this machine fit in its memory: each holds the weights, AdamW's
   moments and the gradients (fp32, and their double sums), the activations of its
   --batch-size and the data's tokens. Pages are only taken as training first touches
   them, so a run that does not fit started and was killed by the kernel later (3 ranks
   of 11 GB each on 23 GB). The CPU path only (a GPU's memory says so at cudaMalloc).
   0 with the reason in err; 1 where it fits or /proc/meminfo is not there. */
static int fits_in_memory(const trainer *t, int ranks, char *err, size_t errsize)
{
#ifndef __CUDACC__
    const double gib = 1024.0 * 1024 * 1024;
    const size_t P = t->model.num_params;
    const double each = (double)P * (3 * sizeof(float) + sizeof(float) + sizeof(double)) +
                        (double)layout_activations(NULL, NULL, t->o.cfg, (size_t)t->o.batch_size) +
                        (double)t->data.n * sizeof(int);
    const double have = memory_free();
    if (have > 0 && each * ranks > have) {
        snprintf(err, errsize, "%d rank%s of this model need %.1f GiB (%.2f GiB each: weights, AdamW moments, gradients, "
                 "the activations of --batch-size %d, the data), more than the %.1f GiB this machine has free "
                 "(MemAvailable and SwapFree): a smaller --batch-size, --dim or --nproc", ranks, ranks > 1 ? "s" : "",
                 each * ranks / gib, each / gib, t->o.batch_size, have / gib);
        return 0;
    }
#else
    (void)t;
    (void)ranks;
    (void)err;
    (void)errsize;
#endif
    return 1;
}

/* Everything that can be checked before the ranks start, so that a bad file is one
   line, once: the data, the model's memory, --resume, --save. Returns 1 to train, 0
   with the reason in err, -1 when there is nothing to train (said in err). */
static int prepare(trainer *t, const char *argv0, char *err, size_t errsize)
{
    const options *o = &t->o;
    const size_t batch = (size_t)o->batch_size * o->grad_accum * o->nproc;
    if (!load_data(&t->data, o->data, argv0, o->cfg.vocab, o->cfg.ctx, err, errsize)) return 0;
    if (o->sample_len && prompt_tokens(o, &t->data, NULL, err, errsize) < 0) return 0;
    if (!t->o.stride) /* overlapping windows for a small text; a big one's would cost the sampler memory */
        t->o.stride = t->data.n <= 1000000 ? 1 : o->cfg.ctx; /* the data's tokens, as --help says */
    t->train_windows = num_windows(t->data.n_train, o->cfg.ctx, o->stride);
    t->val_windows = num_windows(t->data.n - t->data.n_train, o->cfg.ctx, o->cfg.ctx);
    if (t->train_windows < batch) {
        snprintf(err, errsize, "%s: %zu training windows of %d tokens, fewer than one global batch of %zu",
                 t->data.source, t->train_windows, o->cfg.ctx, batch);
        return 0;
    }
    if (!gpt_create(&t->model, o->cfg, o->batch_size)) {
        snprintf(err, errsize, "out of memory for the model (%zu parameters)", t->model.num_params);
        return 0;
    }
    if (!fits_in_memory(t, o->nproc > 1 ? o->nproc : 1, err, errsize)) return 0;
    t->seed = o->seed;
    describe_run(t); /* what its checkpoints will say, and what every rank must agree on */
    if (o->nproc > 1) /* this process launches the ranks (workers never see --nproc): the world is known */
        snprintf(t->id.v[RUN_BATCH], sizeof t->id.v[0], "%zu", batch);
    if (o->resume_auto && access(o->save, F_OK) == 0) t->o.resume = o->save; /* else from scratch */
    if (o->resume) {
        if (!load_checkpoint(&t->model, o->resume, &t->seed, &t->start_step, &t->found, err, errsize)) return 0;
        /* the launcher refuses another run's file once, before the ranks start; a rank of
           another launcher says so after joining (resume_ours), so the others stop at once */
        if (o->resume_auto && o->nproc > 1 && !same_run(&t->id, &t->found, o->resume, err, errsize)) return 0;
        if (given(o, "--seed") && t->seed != o->seed) { /* the file's data order goes on: --seed would be ignored */
            snprintf(err, errsize, "--seed %llu, but %s's run has seed %llu, and --resume goes on with its data order "
                     "(leave --seed out)", (unsigned long long)o->seed, o->resume, (unsigned long long)t->seed);
            return 0;
        }
        snprintf(t->id.v[RUN_SEED], sizeof t->id.v[0], "%llu", (unsigned long long)t->seed); /* the file's order */
        t->o.seed = t->seed; /* and the sample's generator, as the run that wrote it would seed it */
    }
    if (t->start_step > o->steps) {
        snprintf(err, errsize, "%s was written after step %d, past --steps %d: give its run's --steps to go on",
                 o->resume, t->start_step, o->steps);
        return 0;
    }
    if (!check_outputs(o, o->data ? o->data : t->data.source, err, errsize)) return 0;
    /* --stop-after pauses a run (a job's time limit): the schedule still spans --steps */
    t->stop = o->stop_after && o->stop_after < o->steps ? o->stop_after : o->steps;
    /* (under another launcher --resume auto's file may yet belong to another global batch: start_rank says) */
    if (t->stop <= t->start_step && !o->resume_auto) return nothing_to_train(t, err, errsize);
    return 1;
}

/* A refusal every rank reaches: rank 0 says why (err), the others wait until it has. */
static int refuse(trainer *t, char *err)
{
    if (t->ctx.rank == 0) fprintf(stderr, PROG ": %s\n", err);
    fflush(stderr);
    ddp_barrier(&t->ctx);
    err[0] = 0;
    return 0;
}

/* --resume auto's file, now that the global batch is known, on every rank (each host may
   hold a file of its own): one that belongs to another run is refused by the rank that
   found it, in its words, and every rank stops. Returns 1 if no rank refused, else 0 (err
   empty: said, or the failed collective in err). */
static int resume_ours(trainer *t, char *err, size_t errsize)
{
    ddp_metric m;
    ddp_result r;
    const int mine = t->o.resume_auto && t->o.resume && !same_run(&t->id, &t->found, t->o.resume, err, errsize);
    if (mine) {
        if (t->ctx.rank == 0) fprintf(stderr, PROG ": %s\n", err);
        else fprintf(stderr, PROG ": rank %d: %s\n", t->ctx.rank, err);
        fflush(stderr);
    }
    memset(&m, 0, sizeof m);
    ddp_metric_add(&m, mine, 1);
    if ((r = ddp_metric_reduce(&t->ctx, &m, 1)) != DDP_OK) return ddp_reason(t, "ddp_metric_reduce", r, err, errsize);
    err[0] = 0;
    return m.max == 0;
}

/* Every rank trains the same run: the flags and data that decide the weights (a rank
   started by hand with another --lr would otherwise train apart without a word), and
   from the same step (--resume auto on hosts that do not share --save's file would
   resume on some ranks and start afresh on others). Returns 1 if they do, else 0 (a
   refusal, or the failed collective, in err). */
static int ranks_agree(trainer *t, char *err, size_t errsize)
{
    const options *o = &t->o;
    const config *c = &o->cfg;
    char model[48], saves[32], rest[64], resumed[20] = "none";
    ddp_metric m;
    ddp_result r;
    int k;
    snprintf(model, sizeof model, "%d, %d, %d, %d, %d", c->layers, c->heads, c->dim, c->ctx, c->vocab);
    snprintf(saves, sizeof saves, "%s, %d", o->save ? "a file" : "none", o->save_every);
    snprintf(rest, sizeof rest, "%d, %d, %s, %s", o->val_every, t->stop, o->trace ? "a file" : "none",
             o->bench_no_sync ? "on" : "off"); /* each changes the collectives a step calls */
    if ((r = ddp_agree_on(&t->ctx, "--layers, --heads, --dim, --ctx, --vocab", model)) != DDP_OK ||
        (r = ddp_agree_on(&t->ctx, "--save (rank 0 saves), --save-every", saves)) != DDP_OK ||
        (r = ddp_agree_on(&t->ctx, "--val-every, the last step (--stop-after), --trace (rank 0 writes it), "
                                   "--bench-no-sync", rest)) != DDP_OK)
        return ddp_reason(t, "ddp_agree_on", r, err, errsize);
    for (k = 0; k < RUN_KEYS; k++) /* precision as trained: NCCL would sum mismatched buffers without a word
                                       (--dtype bf16 on one rank and the GPU's default on another agree) */
        if ((r = ddp_agree_on(&t->ctx, run_keys[k][1], t->id.v[k])) != DDP_OK)
            return ddp_reason(t, "ddp_agree_on", r, err, errsize);
    memset(&m, 0, sizeof m);
    ddp_metric_add(&m, t->start_step, 1);
    if ((r = ddp_metric_reduce(&t->ctx, &m, 1)) != DDP_OK) return ddp_reason(t, "ddp_metric_reduce", r, err, errsize);
    if (m.min != m.max) {
        snprintf(err, errsize, "the ranks start after different steps (%.0f to %.0f; rank 0: %d): every rank needs the "
                 "same checkpoint (a file system all hosts share)", m.min, m.max, t->start_step);
        return refuse(t, err);
    }
    /* and from one state: ddp_grad_init gives every rank rank 0's weights, but each would keep
       its own file's AdamW moments and train apart (hosts holding different copies of --resume).
       The values loaded, not the file's bytes: copies written apart may differ in their bytes */
    if (o->resume) {
        const size_t n = t->model.num_params * sizeof(float);
        st_hash h;
        st_hash_start(&h);
        st_hash_add(&h, t->model.params, n);
        st_hash_add(&h, t->model.m, n);
        st_hash_add(&h, t->model.v, n);
        snprintf(resumed, sizeof resumed, "%016llx", (unsigned long long)st_hash_end(&h));
    }
    if ((r = ddp_agree_on(&t->ctx, "--resume's checkpoint (a hash of its weights and AdamW moments)", resumed)) !=
        DDP_OK)
        return ddp_reason(t, "ddp_agree_on", r, err, errsize);
    return 1;
}

/* This rank's side: the process group (template: init_process_group), the model on
   its device, gradient sync (template: DistributedDataParallel(model)), samplers
   (template: DistributedSampler) and the log. Returns 1 to train, 0 with the reason in
   err, -1 when --resume auto finds the run done (rank 0 says so in err). */
static int start_rank(trainer *t, int *argc, char **argv, char *err, size_t errsize)
{
    const options *o = &t->o;
    gpt *g = &t->model;
    ddp_desc desc;
    ddp_grad_desc gd;
    ddp_sampler_desc sd;
    ddp_result r;
    double max_events;
    memset(&desc, 0, sizeof desc);
    desc.argc = argc;
    desc.argv = argv;
    desc.log = log_ddp;
    desc.log_user = &t->ddp_errors;
    if ((r = ddp_init(&t->ctx, &desc)) != DDP_OK) { /* no context to ask: ddp.h has said why, or the code does */
        if (t->ddp_errors) err[0] = 0;
        else snprintf(err, errsize, "ddp_init failed: %s", ddp_strerror(r));
        return 0;
    }
#ifdef _OPENMP
    /* ranks share the cores: spinning threads of several ranks on one core crawl. The
       share is OMP_NUM_THREADS when it holds a count (an empty one would give every
       rank all the cores), else the cores divided among this host's ranks. */
    omp_set_num_threads(ddp_thread_share(&t->ctx));
#endif
    t->global_batch = (size_t)o->batch_size * t->ctx.world_size * o->grad_accum;
    t->steps_per_epoch = t->train_windows / t->global_batch;
    if (t->steps_per_epoch == 0) { /* another launcher's world size than --nproc */
        snprintf(err, errsize, "%zu training windows, fewer than one global batch of %zu", t->train_windows,
                 t->global_batch);
        return 0;
    }
    snprintf(t->id.v[RUN_BATCH], sizeof t->id.v[0], "%zu", t->global_batch);
    { /* known once the backend is: the GPU path (NCCL) trains in --dtype, the CPU in fp32 */
        const int gpu_path = t->ctx.backend == DDP_BACKEND_NCCL;
        snprintf(t->id.v[RUN_PRECISION], sizeof t->id.v[0], "%s, all-reduce %s", gpu_path && o->bf16 ? "bf16" : "fp32",
                 gpu_path && o->allreduce_bf16 ? "bf16" : "fp32");
    }
    if (!resume_ours(t, err, errsize) || !ranks_agree(t, err, errsize)) return 0;
    if (t->stop <= t->start_step) { /* --resume auto found this run done */
        if (t->ctx.rank != 0) err[0] = 0;
        else nothing_to_train(t, err, errsize);
        return -1;
    }

    /* Without --resume every rank draws its own weights; ddp_grad_init broadcasts rank
       0's, so all ranks start equal. The gradient sum is what the ranks reduce: sum,
       not average, because the loss is the mean over the global batch's tokens and the
       step divides by their count. */
    if (!o->resume) gpt_init_weights(g, o->seed + (uint64_t)t->ctx.rank);
    if (t->ctx.backend == DDP_BACKEND_NCCL && g->cfg.dim / g->cfg.heads > 128) {
        snprintf(err, errsize, "--dim %d over --heads %d is a head size of %d: the GPU's attention takes at most 128 "
                 "(the CPU kernels take any: DDP_BACKEND=cpu)", g->cfg.dim, g->cfg.heads, g->cfg.dim / g->cfg.heads);
        return 0;
    }
    if (t->ctx.backend == DDP_BACKEND_NCCL &&
        !(t->dev = gpu_create(g, o->resume != NULL, o->bf16 != 0, o->allreduce_bf16))) {
        snprintf(err, errsize, "the NCCL backend needs the GPU path: build with nvcc, or set DDP_BACKEND=cpu");
        return 0;
    }
    if (!t->dev && (o->bf16 == 1 || o->allreduce_bf16)) { /* the nvcc build without a GPU; rank 0 says so */
        if (t->ctx.rank == 0)
            snprintf(err, errsize, "--dtype bf16 and --allreduce bf16 are for the GPU path: no GPU is in use (backend "
                     "%s), and the CPU trains in fp32", ddp_backend_name(t->ctx.backend));
        else
            err[0] = 0;
        return 0;
    }
    if (!gpt_alloc_training(g, t->dev != NULL)) {
        snprintf(err, errsize, "rank %d: out of memory for the activations and gradients", t->ctx.rank);
        return 0;
    }
    memset(&gd, 0, sizeof gd);
    gd.grads = g->grad_sum;
    gd.count = g->num_params;
    gd.dtype = DDP_F64;
    gd.sum = 1;
    /* buckets: 1 MiB on the CPU (as before); on GPUs ddp.h's 25 MiB, PyTorch's: NCCL moves
       few large buckets far faster than many small ones (GPT-2 124M: 19, not 475) */
    gd.bucket_bytes = o->bucket_kb ? (size_t)o->bucket_kb << 10 : t->dev ? 0 : (size_t)1 << 20;
    gd.params = g->params;
    gd.param_dtype = DDP_F32;
    if (t->dev) gpu_grad_desc(t->dev, &gd); /* fp32 device gradients, summed in place */
    if ((r = ddp_grad_init(&t->sync, &t->ctx, &gd)) != DDP_OK) return ddp_reason(t, "ddp_grad_init", r, err, errsize);
    if (t->dev) gpu_weights_ready(g, t->dev);

    /* One sampler over the training windows: drop_last (no padding), and every step a
       full global batch, so one rank with batch G and N ranks with G/N see the same
       windows (train_step picks the batch of each micro-step). */
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = t->train_windows;
    sd.batch_size = (size_t)o->batch_size;
    sd.seed = t->seed;
    sd.drop_last = 1;
    sd.drop_last_batch = 1;
    if ((r = ddp_sampler_init(&t->train, &t->ctx, &sd)) != DDP_OK)
        return ddp_reason(t, "ddp_sampler_init", r, err, errsize);
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = t->val_windows;
    sd.batch_size = (size_t)o->batch_size;
    sd.no_shuffle = 1;
    if ((r = ddp_sampler_init(&t->val, &t->ctx, &sd)) != DDP_OK)
        return ddp_reason(t, "ddp_sampler_init", r, err, errsize);

    /* --trace: from here on; ddp.h adds its collectives (buckets on their own row). Room
       for the whole run (a micro-step records about 10 + --layers events, validation a
       few), at most 300000 events per rank (19 MB; the save gathers all ranks' on every
       rank): past them ddp_trace_save says the trace ends early. */
    max_events = 1000.0 + (double)(t->stop - t->start_step) * o->grad_accum * (20 + 2 * o->cfg.layers);
    if (o->trace && (r = ddp_trace_start(&t->ctx, (size_t)fmin(3e5, max_events))) != DDP_OK)
        return ddp_reason(t, "ddp_trace_start", r, err, errsize);
    /* progress in place only where the user watches: stdout is this process's own
       terminal (Open MPI gives every rank a pty, even when mpirun writes to a file) */
    t->tty = ddp_is_main(&t->ctx) && isatty(fileno(stdout)) && tcgetpgrp(fileno(stdout)) != -1;
    if (ddp_is_main(&t->ctx) && o->log && !(t->log = open_log(o->log, t->start_step, err, errsize))) return 0;
    return 1;
}

/* Rank 0's first lines: what trains on what. */
static void print_setup(const trainer *t)
{
    const options *o = &t->o;
    const ddp_ctx *ctx = &t->ctx;
#ifdef __CUDACC__
    if (!t->dev)
        ddp_print(ctx, "note: no GPU in use (backend %s): training with the CPU kernels\n",
                  ddp_backend_name(ctx->backend));
    else
        ddp_print(ctx, "device: %s activations, fp32 master weights and AdamW state, %s gradient all-reduce\n",
                  t->dev->act_bf16 ? "bf16" : "fp32", o->allreduce_bf16 ? "bf16" : "fp32");
#endif
    ddp_print(ctx, "model: %d layers, %d heads, dim %d, ctx %d, vocab %d: %.2f M parameters\n", o->cfg.layers,
              o->cfg.heads, o->cfg.dim, o->cfg.ctx, o->cfg.vocab, (double)t->model.num_params / 1e6);
    ddp_print(ctx, "data: %s: %zu tokens (%s), %zu train windows (stride %d), %zu validation windows%s\n",
              t->data.source, t->data.n, t->data.format, t->train_windows, o->stride, t->val_windows,
              o->data ? "" : " (no --data: the example's short story)");
    ddp_print(ctx, "ranks: %d (%s backend), global batch %zu sequences = %d per rank x %d ranks x %d accum, "
              "%zu tokens per step, %zu steps per epoch\n", ctx->world_size, ddp_backend_name(ctx->backend),
              t->global_batch, o->batch_size, ctx->world_size, o->grad_accum, t->global_batch * o->cfg.ctx,
              t->steps_per_epoch);
    if (o->resume) ddp_print(ctx, "resumed from %s after step %d\n", o->resume, t->start_step);
    if (o->resume && !o->resume_auto) { /* a run of its own from there: what it changes is said (auto refuses it) */
        char changed[1200] = "";
        size_t n = 0;
        int k;
        for (k = 0; k < RUN_KEYS && n < sizeof changed; k++)
            if (*t->id.v[k] && *t->found.v[k] && strcmp(t->id.v[k], t->found.v[k]) != 0)
                n += (size_t)snprintf(changed + n, sizeof changed - n, "%s%s %s -> %s", n ? "; " : "", run_keys[k][1],
                                      t->found.v[k], t->id.v[k]);
        if (*changed) ddp_print(ctx, "note: this run changes %s's: %s\n", o->resume, changed);
    }
    if (ddp_restart_count() > 0) /* ddp's launcher or torchrun started the job again */
        ddp_print(ctx, "restart %d of the job: %s\n", ddp_restart_count(),
                  o->resume ? "going on from the checkpoint" : o->resume_auto ? "no checkpoint yet, from step 0" :
                  "from step 0 (--resume auto would go on from --save's file)");
}

static ddp_result finish(trainer *t) /* ddp_destroy's verdict: a rank missing at the end fails the job */
{
    if (t->log) fclose(t->log);
    ddp_grad_destroy(&t->sync);
    if (t->dev) gpu_destroy(t->dev);
    ddp_sampler_destroy(&t->train);
    ddp_sampler_destroy(&t->val);
    gpt_destroy(&t->model);
    free(t->data.tokens);
    return ddp_destroy(&t->ctx);
}

/* ---- main ---------------------------------------------------------------------------- */
static int fail(const char *why) /* one line (empty: ddp.h has said it), non-zero status */
{
    if (*why) fprintf(stderr, PROG ": %s\n", why);
    return 1;
}

/* what may help a run that diverged: clipping, unless it is on already */
static const char *diverged_hint(const trainer *t)
{
    return t->o.clip > 0 ? "a lower --lr" : "a lower --lr, or --clip 1,";
}

/* A NaN or infinite loss (every rank has the same, reduced) ends the run: rank 0 says
   so, and the barrier keeps the others until it has. */
static int diverged(trainer *t, int step, const step_stats *st)
{
    if (t->line_open) printf("\n");
    if (ddp_is_main(&t->ctx)) {
        const char *what = !isfinite(st->loss)   ? "training loss"
                           : !isfinite(st->norm) ? "gradient norm"
                                                 : "validation loss";
        const double value = !isfinite(st->loss) ? st->loss : !isfinite(st->norm) ? st->norm : st->val_loss;
        fprintf(stderr, PROG ": step %d: the %s is %g: training diverged (%s may help)\n", step + 1, what, value,
                diverged_hint(t));
        fflush(stderr);
    }
    ddp_barrier(&t->ctx);
    return 1;
}

/* Before a save: an update that went wrong (the loss was computed before it) leaves
   the last good checkpoint as it is; rank 0 says so. 1 if weights and moments are finite. */
static int finite_state(trainer *t, int step)
{
    const float *arrays[3] = {t->model.params, t->model.m, t->model.v};
    static const char *const what[3] = {"a weight", "Adam's first moment", "Adam's second moment"};
    size_t e;
    int k;
    for (k = 0; k < 3; k++)
        for (e = 0; e < t->model.num_params; e++)
            if (!isfinite(arrays[k][e])) {
                if (t->line_open) printf("\n");
                if (ddp_is_main(&t->ctx)) {
                    fprintf(stderr, PROG ": step %d: %s is %g after the update: training diverged, %s not written (%s "
                            "may help)\n", step + 1, what[k], (double)arrays[k][e], t->o.save, diverged_hint(t));
                    fflush(stderr);
                }
                ddp_barrier(&t->ctx);
                return 0;
            }
    return 1;
}

int main(int argc, char **argv)
{
    trainer t;
    char err[1200];
    int status, step;
    memset(&t, 0, sizeof t);
    signal(SIGXFSZ, SIG_IGN); /* past ulimit -f a save fails (EFBIG) and says so; the signal killed the run */
    status = parse_options(argc, argv, &t.o, err, sizeof err);
    if (status < 0) {
        print_usage();
        return 0;
    }
    if (status == 0) {
        fail(err);
        return 2; /* a usage error */
    }
    if (t.o.compare[0]) return compare_checkpoints(t.o.compare[0], t.o.compare[1], t.o.compare[2]);
    if (t.o.device_info) return device_info();
    if (t.o.bench_matmul) return bench_matmul(&t.o);
    status = prepare(&t, argv[0], err, sizeof err);
    if (status <= 0) {
        if (status < 0) printf(PROG ": %s\n", err);
        gpt_destroy(&t.model);
        free(t.data.tokens);
        return status < 0 ? 0 : fail(err);
    }

    /* "--nproc N": this process becomes the launcher of N ranks and returns here */
    status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) {
        gpt_destroy(&t.model);
        free(t.data.tokens);
        return status;
    }
    status = start_rank(&t, &argc, argv, err, sizeof err);
    if (status == 0) return fail(err);
    if (status < 0) { /* nothing to train, rank 0 says */
        if (*err) printf(PROG ": %s\n", err);
        return finish(&t) == DDP_OK ? 0 : 1;
    }
    print_setup(&t);

    t.t_start = now_s();
    for (step = t.start_step; step < t.stop; step++) {
        step_stats st;
        if (!train_step(&t, step, &st, err, sizeof err)) return fail(err);
        if (t.o.val_every && ((step + 1) % t.o.val_every == 0 || step + 1 == t.o.steps)) { /* not at a pause */
            span(&t.ctx, "validation");
            if (!evaluate(&t, &st.val_loss, err, sizeof err)) return fail(err);
            ddp_trace_end(&t.ctx);
            st.has_val = 1;
        }
        if (!isfinite(st.loss) || !isfinite(st.norm) || !isfinite(st.val_loss)) return diverged(&t, step, &st);
        if (!log_step(&t, step, &st, err, sizeof err)) return fail(err);
        /* template: if rank == 0: torch.save(...) */
        if (t.o.save && ((t.o.save_every && (step + 1) % t.o.save_every == 0) || step + 1 == t.stop)) {
            if (t.dev) gpu_to_host(&t.model, t.dev); /* the same file as a CPU run's */
            if (!finite_state(&t, step)) return 1; /* every rank holds the same weights: all stop */
            if (ddp_is_main(&t.ctx) &&
                !save_checkpoint(&t.model, t.o.save, step + 1, &t.id, t.ctx.world_size, err, sizeof err))
                return fail(err);
        }
    }
    if (t.line_open) printf("\n");
    if (t.o.trace) {
        ddp_result r = ddp_trace_save(&t.ctx, t.o.trace);
        if (r != DDP_OK) return fail(ddp_reason(&t, "ddp_trace_save", r, err, sizeof err) ? "" : err);
        ddp_print(&t.ctx, "trace: %s (open it in ui.perfetto.dev or chrome://tracing)\n", t.o.trace);
    }
    ddp_print(&t.ctx, "trained %d steps in %.1f s: %.0f tokens/s over %d ranks\n", t.stop - t.start_step, t.t_train,
              t.t_train > 0 ? (double)(t.stop - t.start_step) * t.global_batch * t.o.cfg.ctx / t.t_train : 0.0,
              t.ctx.world_size);
    if (t.dev && t.stop - t.start_step > 1) { /* model FLOPs (6 N + 12 L T C per token) after the first step */
        const config c = t.o.cfg;
        const double flops = 6.0 * ((double)c.layers * 12 * c.dim * c.dim + (double)c.vocab * c.dim) +
                             12.0 * c.layers * c.ctx * c.dim;
        const double tok_s = (t.stop - t.start_step - 1) * (double)t.global_batch * c.ctx / (t.t_train - t.t_first);
        const double tflops = tok_s * flops / 1e12 / t.ctx.world_size, peak = gpu_peak_tflops(t.dev);
        ddp_print(&t.ctx, "after step 1: %.0f tokens/s, %.1f TFLOP/s per GPU", tok_s, tflops);
        if (peak > 0) ddp_print(&t.ctx, ", MFU %.1f%% of the %.0f TFLOP/s %s peak", 100 * tflops / peak, peak,
                                t.o.bf16 ? "bf16" : "fp32");
        ddp_print(&t.ctx, "\n");
    }
    if (ddp_is_main(&t.ctx) && t.o.sample_len) generate(&t.model, t.dev, &t.o, &t.data);
    if (!written(stdout)) { /* the summary or the sample, lost */
        snprintf(err, sizeof err, "cannot write to standard output: %s", strerror(errno));
        finish(&t);
        return fail(err);
    }
    return finish(&t) == DDP_OK ? 0 : 1;
}

/* ---- checkpoints: safetensors (examples/safetensors.h) -------------------------------
   Every parameter under its GPT-2 name, AdamW's moments as opt.m.<name> and
   opt.v.<name>, and in __metadata__ the step, the model's shape and the run's
   identity (seed, data, batch, schedule: run_keys). Loads with
   safetensors.torch.load_file (weights are (out, in) as in torch.nn.Linear; HF's GPT-2
   Conv1D stores them transposed). Written by rank 0 to a new file beside FILE, flushed,
   fsync'ed, named FILE.tmp (FILE.tmp.XXXXXX where that name is taken: never a file this
   save did not make) and renamed over FILE, so FILE is always whole. On Linux the new
   file has no name until it is whole (O_TMPFILE): a rank killed mid-save leaves nothing
   behind; where the file system cannot, it is FILE.tmp* from the start, and a save
   killed mid-write leaves that file (no later save removes it). */
static const char *const checkpoint_prefix[3] = {"", "opt.m.", "opt.v."};

static int save_checkpoint(const gpt *g, const char *path, int step, const run_identity *id, int world_size,
                           char *err, size_t errsize)
{
    const void *arrays[3] = {g->params, g->m, g->v};
    const size_t bytes = g->num_params * sizeof(float), sizes[3] = {bytes, bytes, bytes};
    st_text h;
    int i, k, ok;
    memset(&h, 0, sizeof h);
    st_put(&h, "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"%d\",\"layers\":\"%d\","
               "\"heads\":\"%d\",\"dim\":\"%d\",\"ctx\":\"%d\",\"vocab\":\"%d\",\"world_size\":\"%d\","
               "\"lm_head\":\"tied to wte.weight\"",
           step, g->cfg.layers, g->cfg.heads, g->cfg.dim, g->cfg.ctx, g->cfg.vocab, world_size);
    for (k = 0; k < RUN_KEYS; k++) st_put(&h, ",\"%s\":\"%s\"", run_keys[k][0], id->v[k]);
    st_put(&h, "}");
    for (k = 0; k < 3; k++)
        for (i = 0; i < g->num_tensors; i++) {
            const tensor *t = &g->tensors[i];
            size_t begin = k * bytes + t->offset * sizeof(float);
            st_put(&h, ",\"%s%s\":{\"dtype\":\"F32\",\"shape\":[%d", checkpoint_prefix[k], t->name, t->shape[0]);
            if (t->ndim == 2) st_put(&h, ",%d", t->shape[1]);
            st_put(&h, "],\"data_offsets\":[%zu,%zu]}", begin, begin + t->numel * sizeof(float));
        }
    st_put(&h, "}");
    ok = st_write_file(path, &h, arrays, sizes, 3, err, errsize);
    free(h.s);
    return ok;
}

/* Fills params, m and v from a checkpoint of the same model (same tensor names and
   shapes, finite values), the step it was written after and its run's identity.
   Returns 0 with the reason in err. */
static int load_checkpoint(gpt *g, const char *path, uint64_t *seed, int *step, run_identity *found, char *err,
                           size_t errsize)
{
    float *arrays[3] = {g->params, g->m, g->v};
    const int want[5] = {g->cfg.layers, g->cfg.heads, g->cfg.dim, g->cfg.ctx, g->cfg.vocab};
    static const char *const keys[5] = {"layers", "heads", "dim", "ctx", "vocab"};
    st_file f;
    char name[128];
    int i, k, have;
    if (!st_read(&f, path, err, errsize)) return 0;
    for (k = 0; k < 5; k++)
        if (!st_meta_int(&f, keys[k], 0, INT_MAX, &have) || have != want[k]) {
            snprintf(err, errsize, "%s: written for --%s %s, this run has --%s %d", path, keys[k],
                     *st_meta(&f, keys[k]) ? st_meta(&f, keys[k]) : "(missing)", keys[k], want[k]);
            goto fail;
        }
    if (!st_meta_int(&f, "step", 0, INT_MAX, step)) {
        snprintf(err, errsize, "%s: metadata step '%s' is not a step count", path, st_meta(&f, "step"));
        goto fail;
    }
    if (!seed_flag(st_meta(&f, "seed"), 0, 0, seed) || (st_meta(&f, "seed")[0] == '0' && st_meta(&f, "seed")[1])) {
        snprintf(err, errsize, "%s: metadata seed '%s' is not a seed", path, st_meta(&f, "seed"));
        goto fail;
    }
    for (k = 0; k < RUN_KEYS; k++) snprintf(found->v[k], sizeof found->v[0], "%s", st_meta(&f, run_keys[k][0]));
    for (k = 0; k < 3; k++)
        for (i = 0; i < g->num_tensors; i++) {
            const tensor *t = &g->tensors[i];
            const st_tensor *s;
            size_t e;
            snprintf(name, sizeof name, "%s%s", checkpoint_prefix[k], t->name);
            if (!(s = st_find(&f, name))) {
                snprintf(err, errsize, "%s: tensor %s is missing", path, name);
                goto fail;
            }
            if (strcmp(s->dtype, "F32") != 0 || s->ndim != t->ndim || s->shape[0] != (uint64_t)t->shape[0] ||
                (t->ndim == 2 && s->shape[1] != (uint64_t)t->shape[1])) {
                char has[200];
                snprintf(err, errsize, "%s: tensor %s is %s, this model's is F32 [%d%s%.0d]", path, name,
                         st_describe(s, has, sizeof has), t->shape[0], t->ndim == 2 ? ", " : "", t->shape[1]);
                goto fail;
            }
            memcpy(arrays[k] + t->offset, s->data, t->numel * sizeof(float));
            for (e = 0; e < t->numel; e++)
                if (!isfinite(arrays[k][t->offset + e]) || (k == 2 && arrays[k][t->offset + e] < 0)) {
                    snprintf(err, errsize, "%s: tensor %s holds %g at element %zu (%s)", path, name,
                             (double)arrays[k][t->offset + e], e,
                             k == 2 && isfinite(arrays[k][t->offset + e]) ? "Adam's second moment is never negative"
                                                                         : "a diverged run?");
                    goto fail;
                }
        }
    st_free(&f);
    return 1;
fail:
    st_free(&f);
    return 0;
}

/* --resume auto: the checkpoint's run must be this one (every value this run knows), else
   the first difference in err. */
static int same_run(const run_identity *mine, const run_identity *theirs, const char *path, char *err, size_t errsize)
{
    int k;
    for (k = 0; k < RUN_KEYS; k++) /* (a file from before precision was recorded: any) */
        if (*mine->v[k] && strcmp(mine->v[k], theirs->v[k]) != 0 && (k != RUN_PRECISION || *theirs->v[k])) {
            snprintf(err, errsize, "%s belongs to another run: its %s is %s, this run's is %s (--resume auto goes on "
                     "with its own run only: give another --save, or remove the file)", path, run_keys[k][1],
                     *theirs->v[k] ? theirs->v[k] : "not recorded", mine->v[k]);
            return 0;
        }
    return 1;
}

/* Element e of a tensor of any safetensors dtype, as a double (64-bit integers past
   2^53 round, which only makes a difference look smaller than 1 in 2^53). */
static double st_value(const st_tensor *t, size_t e)
{
    const unsigned char *p = t->data + e * st_dtype_size(t->dtype);
    const char *d = t->dtype;
    union { double f64; float f32; int64_t i64; uint64_t u64; int32_t i32; uint32_t u32; int16_t i16; uint16_t u16; } v;
    memcpy(&v, p, st_dtype_size(d));
    if (!strcmp(d, "F64")) return v.f64;
    if (!strcmp(d, "F32")) return v.f32;
    if (!strcmp(d, "I64")) return (double)v.i64;
    if (!strcmp(d, "U64")) return (double)v.u64;
    if (!strcmp(d, "I32")) return v.i32;
    if (!strcmp(d, "U32")) return v.u32;
    if (!strcmp(d, "I16")) return v.i16;
    if (!strcmp(d, "U16")) return v.u16;
    if (!strcmp(d, "I8")) return (int8_t)*p;
    if (!strcmp(d, "U8") || !strcmp(d, "BOOL")) return *p;
    if (!strcmp(d, "BF16")) {
        uint32_t u = (uint32_t)v.u16 << 16;
        memcpy(&v.f32, &u, 4);
        return v.f32;
    }
    { /* F16: sign, 5 exponent bits (bias 15), 10 fraction bits */
        int ex = (v.u16 >> 10) & 31, fr = v.u16 & 1023;
        double m = ex == 31 ? (fr ? NAN : INFINITY) : ex ? ldexp(1024 + fr, ex - 25) : ldexp(fr, -24);
        return v.u16 & 0x8000 ? -m : m;
    }
}

/* --compare A B [PREFIX]: the largest difference between same-named tensors (those
   whose names start with PREFIX; each the same dtype and shape in both files),
   relative to the tensor's largest magnitude in either file (all zeros in A is no
   infinite difference). The tests use it to show that runs
   agree, so a NaN or infinity in either file is a difference it reports (and exits 1),
   never 0. */
static int compare_checkpoints(const char *a_path, const char *b_path, const char *prefix)
{
    st_file a, b;
    char err[1200], nonfinite[300] = "";
    double worst = 0.0;
    char worst_name[sizeof a.t->name] = ""; /* a copy: the files are freed before it is printed */
    int i, d, ok = 1, compared = 0;
    if (!st_read(&a, a_path, err, sizeof err)) return fail(err);
    if (!st_read(&b, b_path, err, sizeof err)) {
        st_free(&a);
        return fail(err);
    }
    { /* as many named PREFIX... in each (then every one of A's found in B is all of B's) */
        int na = 0, nb = 0;
        for (i = 0; i < a.n; i++) na += strncmp(a.t[i].name, prefix, strlen(prefix)) == 0;
        for (i = 0; i < b.n; i++) nb += strncmp(b.t[i].name, prefix, strlen(prefix)) == 0;
        if (na != nb) {
            snprintf(err, sizeof err, "%s has %d tensors%s%s%s, %s has %d", a_path, na,
                     *prefix ? " whose names start with '" : "", prefix, *prefix ? "'" : "", b_path, nb);
            ok = 0;
        }
    }
    for (i = 0; i < a.n && ok; i++) {
        const st_tensor *ta = &a.t[i], *tb = st_find(&b, ta->name);
        double diff = 0.0, scale = 0.0; /* diff: half the largest difference (1e308 - -1e308 is no inf) */
        size_t e;
        int same_shape = tb && ta->ndim == tb->ndim && strcmp(ta->dtype, tb->dtype) == 0;
        if (strncmp(ta->name, prefix, strlen(prefix)) != 0) continue;
        compared++;
        for (d = 0; same_shape && d < ta->ndim; d++) same_shape = ta->shape[d] == tb->shape[d];
        if (!same_shape) {
            char da[200], db[200];
            if (tb)
                snprintf(err, sizeof err, "tensor %s is %s in %s but %s in %s (tensors compare only with one dtype and shape)",
                         ta->name, st_describe(ta, da, sizeof da), a_path, st_describe(tb, db, sizeof db), b_path);
            else
                snprintf(err, sizeof err, "tensor %s of %s is missing from %s", ta->name, a_path, b_path);
            ok = 0;
            break;
        }
        for (e = 0; e < ta->numel; e++) {
            double x = st_value(ta, e), y = st_value(tb, e);
            if ((!isfinite(x) || !isfinite(y)) && !*nonfinite)
                snprintf(nonfinite, sizeof nonfinite, "%s element %zu is %g in %s and %g in %s", ta->name, e, x, a_path,
                         y, b_path);
            diff = fmax(diff, fabs(0.5 * x - 0.5 * y));
            scale = fmax(scale, fmax(fabs(x), fabs(y)));
        }
        if (diff > 0 && 2.0 * (diff / scale) > worst) { /* (diff > 0: scale > 0) */
            worst = 2.0 * (diff / scale);
            snprintf(worst_name, sizeof worst_name, "%s", ta->name);
        }
    }
    st_free(&a);
    st_free(&b);
    if (ok && !compared) {
        snprintf(err, sizeof err, "%s has no tensor whose name starts with '%s'", a_path, prefix);
        ok = 0;
    }
    if (!ok) return fail(err);
    if (*nonfinite) {
        printf("max_rel_diff inf over %d tensors: not finite: %s\n", compared, nonfinite);
        return 1;
    }
    printf("max_rel_diff %.3e over %d tensors%s%s\n", worst, compared, *worst_name ? ", worst " : "", worst_name);
    return 0;
}
