/* train_classifier: the PyTorch DDP template (seed/000, "pytorch单机多卡并行训练代码模板"),
   ported to C one concept at a time. Comments marked "template:" name the line each
   part replaces.

   A one-hidden-layer MLP learns four Gaussian blobs in the plane. Each rank trains on
   its share of every global batch, the gradients are summed over the ranks, and every
   rank takes the same SGD step, so N processes train the very same model as one:

       ./examples/train_classifier --nproc 1 --batch-size 32 --epochs 3
       ./examples/train_classifier --nproc 4 --batch-size 8 --epochs 3   (same numbers)

   template: python -m torch.distributed.launch --nproc_per_node=4 xxx.py
   here:     ./examples/train_classifier --nproc 4   (or torchrun, mpirun, srun: see ddp.h)

   Its PyTorch twin, examples/lessons/05_metrics/train_classifier.py, is the template
   itself made runnable: --init-out FILE writes this program's initial weights and data
   as safetensors, the twin loads them, and both print the same numbers per epoch.

   Built with nvcc and run where a GPU is visible, the ranks talk over NCCL. The model
   itself stays on the CPU (it is 228 numbers): the gradient is copied to the GPU one
   layer at a time, as the backward pass produces it, and NCCL sums it there. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "safetensors.h" /* st_put, st_write_file: --init-out */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

/* ---- the model: x (D) -> relu(W1 x + b1) (H) -> W2 h + b2 (K logits) ------------- */
enum { D = 2, H = 32, K = 4 };
/* all parameters in one flat buffer, so the gradient is one buffer too (what DDP's
   buckets are made of); the last layer is at the end, where the backward pass starts */
enum { W1 = 0, B1 = W1 + H * D, W2 = B1 + H, B2 = W2 + K * H, NPARAM = B2 + K };

/* Forward pass for one sample: fills h (H) and prob (K); returns the loss -log p[y]. */
static float forward(const float *p, const float *x, int y, float *h, float *prob)
{
    float logit[K], top, sum = 0;
    int j, k, d;
    for (j = 0; j < H; j++) {
        float a = p[B1 + j];
        for (d = 0; d < D; d++) a += p[W1 + j * D + d] * x[d];
        h[j] = a > 0 ? a : 0;
    }
    for (k = 0; k < K; k++) {
        float a = p[B2 + k];
        for (j = 0; j < H; j++) a += p[W2 + k * H + j] * h[j];
        logit[k] = a;
    }
    top = logit[0];
    for (k = 1; k < K; k++) top = logit[k] > top ? logit[k] : top;
    for (k = 0; k < K; k++) sum += prob[k] = expf(logit[k] - top);
    for (k = 0; k < K; k++) prob[k] /= sum;
    return -logf(prob[y] < 1e-30f ? 1e-30f : prob[y]); /* a NaN stays one: the epoch's check sees it */
}

static int argmax(const float *prob)
{
    int k, best = 0;
    for (k = 1; k < K; k++)
        if (prob[k] > prob[best]) best = k;
    return best;
}

/* Backward of the last layer for one sample: adds d loss / d (W2, b2) to g and
   writes d loss / d h to dh. The sums are in double so that the order in which
   samples and ranks are added changes nothing in float (the test checks that
   1 x 32 and 4 x 8 give the same numbers). */
static void backward_layer2(const float *p, const float *h, const float *prob, int y, double *g, float *dh)
{
    int j, k;
    for (j = 0; j < H; j++) dh[j] = 0;
    for (k = 0; k < K; k++) {
        float dlogit = prob[k] - (k == y ? 1.0f : 0.0f);
        for (j = 0; j < H; j++) {
            g[W2 + k * H + j] += dlogit * h[j];
            dh[j] += p[W2 + k * H + j] * dlogit;
        }
        g[B2 + k] += dlogit;
    }
}

static void backward_layer1(const float *x, const float *h, const float *dh, double *g)
{
    int j, d;
    for (j = 0; j < H; j++) {
        float da = h[j] > 0 ? dh[j] : 0; /* relu */
        for (d = 0; d < D; d++) g[W1 + j * D + d] += da * x[d];
        g[B1 + j] += da;
    }
}

/* ---- data: four Gaussian blobs, the same on every rank (no file to read) ---------- */
typedef struct dataset {
    size_t n;
    float *x; /* n x D */
    int *y;   /* n */
} dataset;

static double uniform(uint64_t *s) /* splitmix64: deterministic on every platform */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return ((double)((z ^ (z >> 31)) >> 11) + 0.5) / 9007199254740992.0;
}

static int make_blobs(dataset *ds, size_t n, uint64_t seed)
{
    size_t i;
    ds->n = n;
    ds->x = (float *)malloc(n * D * sizeof *ds->x);
    ds->y = (int *)malloc(n * sizeof *ds->y);
    if (!ds->x || !ds->y) return 0;
    for (i = 0; i < n; i++) {
        int c = (int)(uniform(&seed) * K) % K;
        double r = sqrt(-2 * log(uniform(&seed))), t = 6.283185307179586 * uniform(&seed);
        double angle = 1.5707963267948966 * c + 0.7853981633974483;
        ds->x[i * D + 0] = (float)(2.5 * cos(angle) + 0.8 * r * cos(t));
        ds->x[i * D + 1] = (float)(2.5 * sin(angle) + 0.8 * r * sin(t));
        ds->y[i] = c;
    }
    return 1;
}

/* ---- the gradient's home for the collective ----------------------------------------
   CPU backend: the host buffer itself. NCCL: a device copy, filled region by region. */
typedef struct grad_buffer {
    double *host;
    double *dev; /* NULL on the CPU backend */
    ddp_grad sync;
} grad_buffer;

static ddp_result grad_ready(grad_buffer *gb, size_t offset, size_t count)
{
#ifdef __CUDACC__
    if (gb->dev &&
        cudaMemcpy(gb->dev + offset, gb->host + offset, count * sizeof(double), cudaMemcpyHostToDevice) != cudaSuccess)
        return DDP_ERR_BACKEND;
#endif
    return ddp_grad_ready(&gb->sync, offset, count);
}

static ddp_result grad_finish(grad_buffer *gb)
{
    ddp_result r = ddp_grad_finish(&gb->sync);
#ifdef __CUDACC__
    if (r == DDP_OK && gb->dev &&
        cudaMemcpy(gb->host, gb->dev, NPARAM * sizeof(double), cudaMemcpyDeviceToHost) != cudaSuccess)
        r = DDP_ERR_BACKEND;
#endif
    return r;
}

/* template: DistributedDataParallel(model) broadcasts rank 0's weights and hooks
   the gradient all-reduce into backward. Here: ddp_grad_init does both jobs' setup. */
static ddp_result grad_init(grad_buffer *gb, ddp_ctx *ctx, float *params)
{
    ddp_grad_desc desc;
    ddp_result r;
    void *dev_params = NULL;
    memset(gb, 0, sizeof *gb);
    gb->host = (double *)calloc(NPARAM, sizeof(double));
    if (!gb->host) return DDP_ERR_NOMEM;
    memset(&desc, 0, sizeof desc);
    desc.grads = gb->host;
    desc.count = NPARAM;
    desc.dtype = DDP_F64;
    desc.sum = 1;          /* the sum over ranks; the step divides by the batch size */
    desc.params = params;  /* rank 0's initial weights go to every rank */
    desc.param_count = NPARAM;
    desc.param_dtype = DDP_F32;
#ifdef __CUDACC__
    if (ctx->backend == DDP_BACKEND_NCCL) { /* NCCL reduces device memory */
        if (cudaMalloc((void **)&gb->dev, NPARAM * sizeof(double)) != cudaSuccess ||
            cudaMalloc(&dev_params, NPARAM * sizeof(float)) != cudaSuccess ||
            cudaMemcpy(dev_params, params, NPARAM * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
            return DDP_ERR_BACKEND;
        desc.grads = gb->dev;
        desc.params = dev_params;
    }
#endif
    r = ddp_grad_init(&gb->sync, ctx, &desc);
#ifdef __CUDACC__
    if (dev_params) {
        if (r == DDP_OK && cudaMemcpy(params, dev_params, NPARAM * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
            r = DDP_ERR_BACKEND;
        cudaFree(dev_params);
    }
#endif
    (void)dev_params;
    return r;
}

static void grad_destroy(grad_buffer *gb)
{
    ddp_grad_destroy(&gb->sync);
#ifdef __CUDACC__
    if (gb->dev) cudaFree(gb->dev);
#endif
    free(gb->host);
}

/* ---- files: safetensors (examples/safetensors.h) ----------------------------------------
   Weights as torch.nn.Linear stores them ((out, in), under the names of the PyTorch
   twin's state_dict), then, for --init-out, both data sets, so that the twin starts
   exactly where this program starts. Written atomically (a new file, fsync, named
   FILE.tmp or FILE.tmp.XXXXXX, rename), so a crash never leaves half a file; on Linux
   the new file has no name until it is whole (O_TMPFILE), so a crash mid-write leaves
   no FILE.tmp behind either (st_write_file). */
static const char *const tensor_names[8] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                            "train.x",    "train.y",  "val.x",      "val.y"};
static const int weight_at[4] = {W1, B1, W2, B2};
static const size_t weight_shape[4][2] = {{H, D}, {H, 0}, {K, H}, {K, 0}}; /* 0: a tensor of one dimension */

/* The first n tensors (4: the weights; 8: and the data) with metadata ("key":"value",...). */
static int save_tensors(const char *path, const char *metadata, int n, const float *params, const dataset *train,
                        const dataset *val)
{
    const void *arrays[8] = {params + W1, params + B1, params + W2, params + B2, train->x, train->y, val->x, val->y};
    const size_t data_shape[4][2] = {{train->n, D}, {train->n, 0}, {val->n, D}, {val->n, 0}};
    size_t bytes[8];
    st_text h = {NULL, 0, 0, 0};
    char err[1400]; /* room for the path */
    size_t begin = 0;
    int i, ok;
    st_put(&h, "{\"__metadata__\":{\"format\":\"pt\"%s%s}", *metadata ? "," : "", metadata);
    for (i = 0; i < n; i++) {
        const size_t *shape = i < 4 ? weight_shape[i] : data_shape[i - 4];
        bytes[i] = shape[0] * (shape[1] ? shape[1] : 1) * 4; /* float32 and int32 */
        st_put(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%zu", tensor_names[i], i == 5 || i == 7 ? "I32" : "F32",
               shape[0]);
        if (shape[1]) st_put(&h, ",%zu", shape[1]);
        st_put(&h, "],\"data_offsets\":[%zu,%zu]}", begin, begin + bytes[i]);
        begin += bytes[i];
    }
    st_put(&h, "}");
    ok = st_write_file(path, &h, arrays, bytes, n, err, sizeof err);
    if (!ok) fprintf(stderr, "train_classifier: %s\n", err);
    free(h.s);
    return ok;
}

/* ---- the run's identity, for --resume auto -------------------------------------------
   What decides the weights (the data is fixed): a checkpoint written with other values
   belongs to another run. The global batch counts, not how the ranks split it. */
enum { RUN_KEYS = 4 };
static const char *const run_keys[RUN_KEYS][2] = { /* metadata key, how a run sets it */
    {"seed", "--seed"}, {"global_batch", "global batch (--batch-size x ranks)"}, {"lr", "--lr"}, {"epochs", "--epochs"}};
typedef struct run_identity {
    char v[RUN_KEYS][32];
} run_identity;

/* rank 0 at the end of epoch `epochs_done`: the weights, the epochs done and the run */
static int save_checkpoint(const char *path, const float *params, int epochs_done, const run_identity *run,
                           const dataset *train, const dataset *val)
{
    char meta[400];
    int k, n = snprintf(meta, sizeof meta, "\"epoch\":\"%d\"", epochs_done);
    for (k = 0; k < RUN_KEYS; k++)
        n += snprintf(meta + n, sizeof meta - (size_t)n, ",\"%s\":\"%s\"", run_keys[k][0], run->v[k]);
    return save_tensors(path, meta, 4, params, train, val);
}

/* --resume auto on rank 0: the weights and epochs done from `path` when it exists and
   this run wrote it (0 epochs when it does not exist); -1 after one line on stderr. */
static int load_checkpoint(const char *path, float *params, const run_identity *run, int epochs)
{
    st_file f;
    char err[1500];
    size_t e;
    int i, k, epoch;
    if (access(path, F_OK) != 0) return 0;
    if (!st_read(&f, path, err, sizeof err)) goto refuse;
    for (k = 0; k < RUN_KEYS; k++)
        if (strcmp(st_meta(&f, run_keys[k][0]), run->v[k]) != 0) {
            snprintf(err, sizeof err, "%s belongs to another run: its %s is %s, this run's is %s (--resume auto goes "
                     "on with its own run only: give another --out, or remove the file)", path, run_keys[k][1],
                     *st_meta(&f, run_keys[k][0]) ? st_meta(&f, run_keys[k][0]) : "not recorded", run->v[k]);
            goto refuse;
        }
    if (!st_meta_int(&f, "epoch", 0, epochs, &epoch)) {
        snprintf(err, sizeof err, "%s: metadata epoch '%s' is not a count from 0 to --epochs %d", path,
                 st_meta(&f, "epoch"), epochs);
        goto refuse;
    }
    for (i = 0; i < 4; i++) {
        const st_tensor *t = st_find(&f, tensor_names[i]);
        if (!t || strcmp(t->dtype, "F32") != 0 || t->ndim != 1 + (weight_shape[i][1] > 0) ||
            t->shape[0] != weight_shape[i][0] || (t->ndim == 2 && t->shape[1] != weight_shape[i][1])) {
            snprintf(err, sizeof err, "%s: tensor %s is missing or not F32 [%zu%s%.0zu]", path, tensor_names[i],
                     weight_shape[i][0], weight_shape[i][1] ? ", " : "", weight_shape[i][1]);
            goto refuse;
        }
        memcpy(params + weight_at[i], t->data, t->numel * sizeof(float));
        for (e = 0; e < t->numel; e++)
            if (!isfinite(params[weight_at[i] + e])) {
                snprintf(err, sizeof err, "%s: %s holds %g at element %zu", path, tensor_names[i],
                         (double)params[weight_at[i] + e], e);
                goto refuse;
            }
    }
    st_free(&f);
    return epoch;
refuse:
    st_free(&f);
    fprintf(stderr, "train_classifier: %s\n", err);
    return -1;
}

/* ---- flags ----------------------------------------------------------------------- */
typedef struct options {
    int epochs, batch_size;
    float lr;
    uint64_t seed;
    const char *out, *init_out;
    int save_every, resume_auto; /* --save-every K epochs, --resume auto */
    int help;
} options;

static const char usage[] =
    "usage: train_classifier [--nproc N] [--epochs N] [--batch-size N] [--lr X] [--seed N] [--out FILE]\n"
    "                        [--save-every K] [--resume auto] [--max-restarts N] [--init-out FILE] [--help]\n"
    "  --nproc N          start N ranks (or launch with torchrun --no-python, mpirun, srun)\n"
    "  --epochs N         passes over the 2001 training samples (5)\n"
    "  --batch-size N     samples per rank and step, as in the template; the global batch\n"
    "                     is N x ranks (32)\n"
    "  --lr X             SGD learning rate (0.1)\n"
    "  --seed N           initial weights and the sampler's shuffle (0)\n"
    "  --out FILE         rank 0 saves the trained weights there (model.safetensors)\n"
    "  --save-every K     and every K epochs, with the epochs done\n"
    "  --resume auto      go on from --out's file when it exists and this run wrote it\n"
    "                     (the same seed, global batch, lr and --epochs)\n"
    "  --max-restarts N   with --nproc: start the job again after a failure, up to N times\n"
    "  --init-out FILE    rank 0 also saves the initial weights and the data as safetensors,\n"
    "                     for the PyTorch twin (examples/lessons/05_metrics/train_classifier.py)\n"
    "  a value follows its flag or an = (--lr 0.05, --lr=0.05)\n";

/* Returns 0 after printing one line on a bad flag; --help sets o->help. A value follows its flag or an =
   (--lr 0.05, --lr=0.05). --nproc and --local_rank belong to ddp_launch and ddp_init (--max-restarts too);
   they are skipped here. */
static int parse_options(int argc, char **argv, options *o)
{
    /* every flag, each between spaces: any other is unknown, and a known one without its value is said as such */
    static const char flags[] = " --nproc --local_rank --local-rank --max-restarts --max_restarts --epochs "
                                "--batch-size --lr --seed --out --init-out --save-every --resume ";
    char err[1200], key[40];
    int i;
    o->epochs = 5;
    o->batch_size = 32;
    o->lr = 0.1f;
    o->seed = 0;
    o->out = "model.safetensors"; /* template: torch.save(..., "model.pth") */
    o->init_out = NULL;
    o->save_every = o->resume_auto = 0;
    o->help = 0;
    for (i = 1; i < argc; i++) {
        const char *eq = strchr(argv[i], '='), *v = eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
        char a[32], *end = NULL; /* the flag: argv[i], or argv[i] up to = */
        const char *want = "a whole number from 1 to 1000000"; /* what a bad value is told */
        int bad = 0;
        snprintf(a, sizeof a, "%.*s", eq ? (int)(eq - argv[i]) : (int)strlen(argv[i]), argv[i]);
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            o->help = 1;
            return 1;
        }
        snprintf(key, sizeof key, " %s ", a);
        if (strncmp(a, "--", 2) != 0 || !strstr(flags, key)) {
            fprintf(stderr, "train_classifier: unknown %s '%s' (train_classifier --help lists the flags)\n",
                    strncmp(a, "--", 2) != 0 ? "argument" : "flag", argv[i]);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "train_classifier: %s needs a value (train_classifier --help lists the flags)\n", a);
            return 0;
        }
        if (!eq && strncmp(v, "--", 2) == 0) { /* a value left out (--out --epochs 1 took "--epochs" as the file) */
            fprintf(stderr, "train_classifier: %s needs a value, not the flag '%s' (a value that starts with --: "
                    "%s=VALUE)\n", a, v, a);
            return 0;
        }
        if (strcmp(a, "--nproc") == 0 || strcmp(a, "--local_rank") == 0 || strcmp(a, "--local-rank") == 0 ||
            strcmp(a, "--max-restarts") == 0 || strcmp(a, "--max_restarts") == 0) {
        } else if (strcmp(a, "--epochs") == 0) {
            long x = strtol(v, &end, 10);
            bad = *end || x < 1 || x > 1000000; /* 0 trains nothing, and would save the initial weights as a model */
            o->epochs = (int)x;
        } else if (strcmp(a, "--batch-size") == 0) {
            long x = strtol(v, &end, 10);
            bad = *end || x < 1 || x > 1000000;
            o->batch_size = (int)x;
        } else if (strcmp(a, "--lr") == 0) {
            o->lr = strtof(v, &end);
            bad = *end || !(o->lr > 0) || !isfinite(o->lr);
            want = "a finite number above 0";
        } else if (strcmp(a, "--seed") == 0) {
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            bad = *end || *v < '0' || *v > '9' || errno == ERANGE; /* strtoull takes " -1" as 2^64 - 1 */
            want = "a whole number from 0 to 2^64 - 1";
        } else if (strcmp(a, "--out") == 0) {
            o->out = v;
        } else if (strcmp(a, "--init-out") == 0) {
            o->init_out = v;
        } else if (strcmp(a, "--save-every") == 0) {
            long x = strtol(v, &end, 10);
            bad = *end || x < 1 || x > 1000000;
            o->save_every = (int)x;
        } else if (strcmp(a, "--resume") == 0) {
            o->resume_auto = 1;
            bad = strcmp(v, "auto") != 0; /* the checkpoint is --out's */
            want = "only auto: it goes on from --out's file (--out FILE --resume auto)";
        }
        if (bad || (end && end == v)) {
            fprintf(stderr, "train_classifier: bad value '%s' for %s: %s\n", v, a, want);
            return 0;
        }
        i += !eq;
    }
    if (!st_writable("--out", o->out, 1, err, sizeof err) ||
        (o->init_out && !st_writable("--init-out", o->init_out, 1, err, sizeof err))) {
        fprintf(stderr, "train_classifier: %s\n", err);
        return 0;
    }
    if (st_same_file(o->init_out, o->out)) {
        fprintf(stderr, "train_classifier: --out and --init-out are one file (%s): give each its own\n", o->out);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    options opt;
    ddp_ctx ctx;
    ddp_desc desc;
    dataset train, val;
    ddp_sampler train_sampler, val_sampler;
    ddp_sampler_desc sd;
    grad_buffer grad;
    float params[NPARAM], *h = NULL, *prob = NULL, *dh = NULL; /* per-sample activations of one batch */
    uint64_t init = 0;
    run_identity run;
    int32_t start = 0; /* epochs already done (--resume auto) */
    int epoch, i, status;

    signal(SIGXFSZ, SIG_IGN); /* past ulimit -f a save fails (EFBIG) and says so; the signal killed the run */
    if (!parse_options(argc, argv, &opt)) return 2;
    if (opt.help) {
        fputs(usage, stdout);
        return 0;
    }
    /* template: the launch command. "--nproc N" turns this process into the launcher */
    status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    status = 1; /* until the end is reached */

    /* template: parser.add_argument('--local_rank'); dist.init_process_group('nccl', ...);
       torch.cuda.set_device(args.local_rank). ddp_init reads the rank from whatever
       launched us, picks NCCL when there is a GPU, and binds this rank to GPU local_rank
       (or to the only GPU it sees, where the launcher gave each rank its own). */
    memset(&desc, 0, sizeof desc);
    memset(&train, 0, sizeof train); /* everything below is freed at `done`, made or not */
    memset(&val, 0, sizeof val);
    memset(&grad, 0, sizeof grad);
    memset(&train_sampler, 0, sizeof train_sampler);
    memset(&val_sampler, 0, sizeof val_sampler);
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1; /* the reason is on stderr, as for every failure below */

    /* The same data on every rank; the sampler decides who looks at what. */
    if (!make_blobs(&train, 2001, 1) || !make_blobs(&val, 1001, 2)) {
        fprintf(stderr, "train_classifier: out of memory for the data\n");
        goto done;
    }

    /* template: model = ...; model = DistributedDataParallel(model.cuda(local_rank)).
       Every rank draws its own weights from --seed + rank: ddp_grad_init replaces them
       by rank 0's, as DDP's constructor does. (No model.module here: the model is the
       flat `params` array, wrapped by nothing.) */
    init = opt.seed + (uint64_t)ctx.rank;
    for (i = 0; i < NPARAM; i++) /* uniform weights of scale 1/sqrt(fan_in), zero biases */
        params[i] = (i < B1 ? 0.7f : i >= W2 && i < B2 ? 0.18f : 0.0f) * (float)(2 * uniform(&init) - 1);

    /* --resume auto (a job started again, torchrun's habit): rank 0 reads --out's file if
       this run wrote it; its weights reach every rank through ddp_grad_init's broadcast
       below, the epochs done through one more. Only rank 0 touches files, as in the
       template, so the other hosts need no copy. */
    snprintf(run.v[0], sizeof run.v[0], "%llu", (unsigned long long)opt.seed);
    snprintf(run.v[1], sizeof run.v[1], "%d", opt.batch_size * ctx.world_size);
    st_float(run.v[2], sizeof run.v[2], opt.lr);
    snprintf(run.v[3], sizeof run.v[3], "%d", opt.epochs);
    /* The template trusts that every rank got the same flags; a rank started by hand with
       another --lr would train apart without a word. ddp_agree_on names it instead. */
    for (i = 0; i < RUN_KEYS; i++)
        if (ddp_agree_on(&ctx, run_keys[i][1], run.v[i]) != DDP_OK) goto done;
    /* and --resume auto, which adds a broadcast (it met the others' next collective unnamed) */
    if (ddp_agree_on(&ctx, "--resume auto", opt.resume_auto ? "on" : "off") != DDP_OK) goto done;
    /* the initial weights, rank 0's as drawn, before a resumed run reads its trained ones
       over them (--init-out held the trained weights then: the twin would not match) */
    if (opt.init_out && ddp_is_main(&ctx) && !save_tensors(opt.init_out, "", 8, params, &train, &val)) goto done;
    if (opt.resume_auto) {
        if (ddp_is_main(&ctx)) start = load_checkpoint(opt.out, params, &run, opt.epochs);
        if (ddp_broadcast(&ctx, &start, 1, DDP_I32, 0, NULL) != DDP_OK || start < 0) goto done;
        if (start > 0) ddp_print(&ctx, "resumed from %s after epoch %d\n", opt.out, (int)start - 1);
    }
    if (grad_init(&grad, &ctx, params) != DDP_OK) goto done;

    /* template: train_sampler = DistributedSampler(train_dataset);
       DataLoader(train_dataset, batch_size=..., sampler=train_sampler).
       --batch-size is per rank, as in the template (note 4): the global batch is
       batch_size x world_size. */
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = train.n;
    sd.batch_size = (size_t)opt.batch_size;
    sd.seed = opt.seed;
    if (ddp_sampler_init(&train_sampler, &ctx, &sd) != DDP_OK) goto done;
    sd.dataset_size = val.n;
    sd.no_shuffle = 1; /* validation needs no shuffling */
    if (ddp_sampler_init(&val_sampler, &ctx, &sd) != DDP_OK) goto done;

    h = (float *)malloc((size_t)opt.batch_size * H * sizeof *h);
    dh = (float *)malloc((size_t)opt.batch_size * H * sizeof *dh);
    prob = (float *)malloc((size_t)opt.batch_size * K * sizeof *prob);
    if (!h || !dh || !prob) {
        fprintf(stderr, "train_classifier: out of memory for a batch of %d\n", opt.batch_size);
        goto done;
    }

    for (epoch = start; epoch < opt.epochs; epoch++) {
        /* loss and accuracy as (sum, count) of real samples: exact after the reduce */
        ddp_metric m[4]; /* train loss, train accuracy, val loss, val accuracy */
        size_t b;
        memset(m, 0, sizeof m);

        /* template: train_sampler.set_epoch(epoch). Here the epoch is an argument of
           every batch lookup, so the shuffle cannot silently repeat (note 3). */
        for (b = 0; b < train_sampler.num_batches; b++) {
            ddp_batch bt = ddp_sampler_batch(&train_sampler, (uint64_t)epoch, b);
            size_t s;
            /* template: data = data.cuda(local_rank); outputs = model(data). Samples
               past num_real are the sampler's padding: they are skipped, so the global
               batch is exactly the one a single process would see (note 5). */
            for (s = 0; s < bt.num_real; s++) {
                size_t idx = bt.indices[s];
                float loss = forward(params, &train.x[idx * D], train.y[idx], &h[s * H], &prob[s * K]);
                ddp_metric_add(&m[0], loss, 1);
                ddp_metric_add(&m[1], argmax(&prob[s * K]) == train.y[idx], 1);
            }
            /* template: optimizer.zero_grad(); loss.backward(). The backward pass goes
               from the last layer to the first; each finished layer is handed to the
               all-reduce at once, so communication overlaps the rest of the backward. */
            memset(grad.host, 0, NPARAM * sizeof(double));
            for (s = 0; s < bt.num_real; s++)
                backward_layer2(params, &h[s * H], &prob[s * K], train.y[bt.indices[s]], grad.host, &dh[s * H]);
            if (grad_ready(&grad, W2, NPARAM - W2) != DDP_OK) goto done;
            for (s = 0; s < bt.num_real; s++)
                backward_layer1(&train.x[bt.indices[s] * D], &h[s * H], &dh[s * H], grad.host);
            if (grad_ready(&grad, W1, W2 - W1) != DDP_OK || grad_finish(&grad) != DDP_OK) goto done;
            /* template: optimizer.step(). The loss is the mean over the global batch,
               so its gradient is the summed gradient over global_count samples (the
               last batch is smaller; PyTorch's average of rank means would be off). */
            for (i = 0; i < NPARAM; i++)
                params[i] -= opt.lr * (float)(grad.host[i] / (double)bt.global_count);
        }

        /* template: with torch.no_grad(): model.eval(); for ... in val_dataloader */
        for (b = 0; b < val_sampler.num_batches; b++) {
            ddp_batch bt = ddp_sampler_batch(&val_sampler, (uint64_t)epoch, b);
            size_t s;
            for (s = 0; s < bt.num_real; s++) {
                size_t idx = bt.indices[s];
                float loss = forward(params, &val.x[idx * D], val.y[idx], h, prob);
                ddp_metric_add(&m[2], loss, 1);
                ddp_metric_add(&m[3], argmax(prob) == val.y[idx], 1);
            }
        }

        /* template: train_loss / each_dist_train_data_num; dist.all_reduce(...);
           / world_size; acc / len(dataset) * 100 (notes 5 and 6). One collective
           gives every rank the exact global sums and counts. */
        if (ddp_metric_reduce(&ctx, m, 4) != DDP_OK) goto done;
        if (!isfinite(ddp_metric_mean(&m[0])) || !isfinite(ddp_metric_mean(&m[2]))) { /* every rank has the sums */
            if (ddp_is_main(&ctx))
                fprintf(stderr, "train_classifier: the loss is not finite in epoch %d (train %g, val %g): a smaller "
                        "--lr\n", epoch, ddp_metric_mean(&m[0]), ddp_metric_mean(&m[2]));
            goto done;
        }
        /* template: if dist.get_rank() == 0: print(...) (note 7) */
        ddp_print(&ctx, "epoch %d train_loss %.6f train_acc %.6f val_loss %.6f val_acc %.6f\n", epoch,
                  ddp_metric_mean(&m[0]), ddp_metric_percent(&m[1]), ddp_metric_mean(&m[2]),
                  ddp_metric_percent(&m[3]));
        /* --save-every: a checkpoint to go on from if the job is stopped (see below) */
        if (ddp_is_main(&ctx) && opt.save_every && (epoch + 1) % opt.save_every == 0 && epoch + 1 < opt.epochs &&
            !save_checkpoint(opt.out, params, epoch + 1, &run, &train, &val))
            goto done;
    }

    /* template: if dist.get_rank() == 0: torch.save(model.module.state_dict(), ...).
       Every rank holds the same weights; rank 0 writes them. */
    if (ddp_is_main(&ctx) && !save_checkpoint(opt.out, params, opt.epochs, &run, &train, &val)) goto done;
    status = 0;
done:
    free(h);
    free(dh);
    free(prob);
    free(train.x);
    free(train.y);
    free(val.x);
    free(val.y);
    grad_destroy(&grad);
    ddp_sampler_destroy(&train_sampler);
    ddp_sampler_destroy(&val_sampler);
    if (ddp_destroy(&ctx) != DDP_OK) status = 1;
    return status;
}
