/* Lesson 4: gradient synchronisation, and overlapping it with the backward pass.
       ./examples/lessons/04_gradsync/gradsync --nproc 2 --trace examples/lessons/04_gradsync/trace.json
   A linear model y = w . x with LAYERS x P weights (the "layers" are slices of w, as a
   network's layers are slices of its gradient buffer). Each rank computes the gradient
   of its own samples; ddp_grad sums it over the ranks, one bucket per layer, starting
   each bucket's all-reduce as soon as backward has finished that layer. --trace writes
   a Chrome trace (open it in ui.perfetto.dev) with a row per rank: draw_trace.py turns
   it into trace.png. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../device.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { LAYERS = 6, P = 1 << 15, D = LAYERS * P, N = 96, BATCH = 4, EPOCHS = 2 };

/* Sample i's feature j, in [-1, 1] / sqrt(D / 3) so that |x| is about 1: computed,
   not stored (a hash of i and j), so every rank has the same data set for free. */
static float feature(uint32_t i, uint32_t j)
{
    uint32_t h = i * 0x9e3779b1u ^ j * 0x85ebca77u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return ((float)(h >> 8) / 8388608.0f - 1.0f) * 0.0095680f; /* sqrt(3 / D) */
}

static float target(uint32_t i) /* the label: y = w_true . x with w_true[j] = cos(j) */
{
    float y = 0;
    uint32_t j;
    for (j = 0; j < D; j++) y += cosf((float)j) * feature(i, j);
    return y;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler sampler;
    ddp_sampler_desc sd = {0};
    ddp_grad sync;
    ddp_grad_desc gd = {0};
    static float w[D], g[D];
    float *dev_grad, err[BATCH], y[N];
    const char *trace = NULL;
    int epoch, layer, i, status;
    for (i = 1; i < argc; i++)
        if (strcmp(argv[i], "--trace") == 0 && i + 1 < argc) trace = argv[++i];
        else if (!lesson_launch_flag(argc, argv, &i)) return 2;
    if ((status = ddp_launch(&argc, argv)) != DDP_WORKER) return status;
    for (i = 0; i < N; i++) y[i] = target((uint32_t)i);
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;
    sd.dataset_size = N;
    sd.batch_size = BATCH;
    if (ddp_sampler_init(&sampler, &ctx, &sd) != DDP_OK) return 1;

    /* template: DistributedDataParallel(model). The gradient lives where the collective
       runs (the GPU with NCCL); ddp_grad_init also gives every rank rank 0's weights. */
    dev_grad = (float *)dev_alloc(&ctx, sizeof g);
    for (i = 0; i < D; i++) w[i] = 0.01f * (float)(ctx.rank + 1); /* different on purpose */
    gd.grads = dev_grad;
    gd.count = D;
    gd.sum = 1;                      /* the sum; the step divides by the global batch */
    gd.bucket_bytes = P * sizeof(float); /* one bucket per layer (PyTorch: 25 MB) */
    gd.params = w;                   /* host memory works too: ddp.h copies it over */
    if (ddp_grad_init(&sync, &ctx, &gd) != DDP_OK) return 1;
    ddp_print(&ctx, "%d weights in %zu buckets, every rank starts from rank 0's\n", D, sync.num_buckets);

    for (epoch = 0; epoch < EPOCHS; epoch++) {
        ddp_metric loss = {0, 0, 0, 0, 0};
        size_t b, s;
        if (trace && epoch == EPOCHS - 1 && ddp_trace_start(&ctx, 0) != DDP_OK) return 1;
        for (b = 0; b < sampler.num_batches; b++) {
            ddp_batch bt = ddp_sampler_batch(&sampler, (uint64_t)epoch, b);
            ddp_trace_begin(&ctx, "forward");
            for (s = 0; s < bt.num_real; s++) {
                float out = 0;
                uint32_t j;
                for (j = 0; j < D; j++) out += w[j] * feature((uint32_t)bt.indices[s], j);
                err[s] = out - y[bt.indices[s]];
                ddp_metric_add(&loss, 0.5 * err[s] * err[s], 1);
            }
            ddp_trace_end(&ctx);
            /* template: loss.backward(). Last layer first; each finished layer goes to
               the GPU and to ddp_grad_ready, whose bucket's all-reduce starts at once
               and runs while the next layer's gradient is computed. */
            for (layer = LAYERS - 1; layer >= 0; layer--) {
                char name[32];
                uint32_t j;
                snprintf(name, sizeof name, "backward layer %d", layer);
                ddp_trace_begin(&ctx, name);
                for (j = (uint32_t)layer * P; j < (uint32_t)(layer + 1) * P; j++) {
                    g[j] = 0;
                    for (s = 0; s < bt.num_real; s++) g[j] += err[s] * feature((uint32_t)bt.indices[s], j);
                }
                dev_upload(&ctx, dev_grad + layer * P, g + layer * P, P * sizeof(float));
                ddp_trace_end(&ctx);
                if (ddp_grad_ready(&sync, (size_t)layer * P, P) != DDP_OK) return 1;
            }
            /* waits for the buckets still in flight: the only time lost to communication */
            if (ddp_grad_finish(&sync) != DDP_OK) return 1;
            dev_download(&ctx, g, dev_grad, sizeof g);
            ddp_trace_begin(&ctx, "optimizer");
            for (i = 0; i < D; i++) w[i] -= 0.5f * g[i] / (float)bt.global_count; /* template: optimizer.step() */
            ddp_trace_end(&ctx);
        }
        if (ddp_metric_reduce(&ctx, &loss, 1) != DDP_OK) return 1;
        ddp_print(&ctx, "epoch %d loss %.6f\n", epoch, ddp_metric_mean(&loss));
    }
    if (trace && ddp_trace_save(&ctx, trace) != DDP_OK) return 1;
    if (trace) ddp_print(&ctx, "wrote %s: open it in ui.perfetto.dev, or run draw_trace.py\n", trace);
    ddp_grad_destroy(&sync);
    dev_free(&ctx, dev_grad);
    ddp_sampler_destroy(&sampler);
    return ddp_destroy(&ctx) == DDP_OK ? 0 : 1; /* a rank missing at the end fails the job */
}
