/* Lesson 4 exercise: keep the replicas equal. Each rank fits y = w . x (P weights) to
   its own samples with SGD. Data parallelism means every rank takes the step that one
   process would take on the whole global batch, so all ranks hold the same weights.
       ./examples/lessons/04_gradsync/exercise --nproc 3
   Fix sync_gradient() until the program says "correct". */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <math.h>
#include <stdio.h>

enum { P = 8, N = 40, BATCH = 4, STEPS = 3 };

static float feature(size_t i, int j) { return (float)((i * 7 + (size_t)j * 3) % 11) / 11.0f - 0.5f; }
static float label(size_t i) { return (float)(i % 5); }

/* g holds this rank's gradient, summed over its samples; afterwards it must hold the
   sum over every rank's samples. */
static ddp_result sync_gradient(ddp_ctx *ctx, float *g)
{
    /* TODO: each rank still has only its own samples' gradient. */
    (void)ctx;
    (void)g;
    return DDP_OK;
}

/* One SGD step on the batch's samples: w -= lr * (summed gradient) / global count. */
static ddp_result train(ddp_ctx *ctx, ddp_sampler *sampler, float *w, int sync)
{
    size_t b, s;
    int j;
    for (b = 0; b < STEPS; b++) {
        ddp_batch bt = ddp_sampler_batch(sampler, 0, b);
        float g[P] = {0};
        for (s = 0; s < bt.num_real; s++) {
            float err = -label(bt.indices[s]);
            for (j = 0; j < P; j++) err += w[j] * feature(bt.indices[s], j);
            for (j = 0; j < P; j++) g[j] += err * feature(bt.indices[s], j);
        }
        if (sync && sync_gradient(ctx, g) != DDP_OK) return DDP_ERR_BACKEND;
        for (j = 0; j < P; j++) w[j] -= 0.5f * g[j] / (float)bt.global_count;
    }
    return DDP_OK;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler mine, whole;
    ddp_sampler_desc sd = {0};
    float w[P] = {0}, ref[P] = {0}, diff = 0;
    int j, ok, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;
    sd.dataset_size = N;
    sd.batch_size = BATCH;
    if (ddp_sampler_init(&mine, &ctx, &sd) != DDP_OK) return 1;
    /* the reference: one process whose batch is the whole global batch */
    sd.world_size = 1;
    sd.batch_size = BATCH * (size_t)ctx.world_size;
    if (ddp_sampler_init(&whole, &ctx, &sd) != DDP_OK) return 1;

    if (train(&ctx, &mine, w, 1) != DDP_OK || train(&ctx, &whole, ref, 0) != DDP_OK) return 1;
    for (j = 0; j < P; j++) diff = fmaxf(diff, fabsf(w[j] - ref[j]));
    /* every rank's verdict: the job is correct only if all of them are */
    if (ddp_all_reduce(&ctx, &diff, &diff, 1, DDP_F32, DDP_MAX, NULL) != DDP_OK) return 1;
    ok = diff < 1e-5f;
    if (ok) {
        ddp_print(&ctx, "correct: after %d steps every rank holds the weights of one process on the global batch\n",
                  STEPS);
    } else {
        ddp_print(&ctx, "wrong: a rank's weights differ from one process's by %g\n", diff);
        ddp_print(&ctx, "hint: each rank only saw its own samples; in sync_gradient() sum g over the ranks: "
                        "ddp_all_reduce(ctx, g, g, P, DDP_F32, DDP_SUM, NULL)\n");
    }
    ddp_sampler_destroy(&mine);
    ddp_sampler_destroy(&whole);
    ddp_destroy(&ctx);
    return ok ? 0 : 1;
}
