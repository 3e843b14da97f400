/* Lesson 6: measuring the speed-up. The global batch stays at 192 samples whatever the
   number of ranks (strong scaling): with W ranks each computes 192 / W of it, then the
   gradient is all-reduced. Run it with 1, 2, 4 ranks and compare samples/s:
       ./examples/lessons/06_speedup/speedup --nproc 1
       ./examples/lessons/06_speedup/speedup --nproc 2
   speed-up = (samples/s with W ranks) / (samples/s with 1); efficiency = speed-up / W.
   It can not pass the number of cores (or GPUs): ranks that share a core take turns. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../device.h"
#include <stdio.h>
#include <time.h>

enum { D = 1 << 17, N = 1920, GLOBAL = 192, STEPS = 8 };

static float feature(uint32_t i, uint32_t j) /* as in lesson 4: computed, not stored */
{
    uint32_t h = i * 0x9e3779b1u ^ j * 0x85ebca77u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return ((float)(h >> 8) / 8388608.0f - 1.0f) * 0.0047840f; /* sqrt(3 / D) */
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler sampler;
    ddp_sampler_desc sd = {0};
    static float w[D], g[D];
    float *dev;
    double t0, comm = 0;
    size_t b, s;
    uint32_t j;
    int status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    /* the template's batch_size is per rank (note 4): for a fixed global batch, divide */
    sd.dataset_size = N;
    sd.batch_size = (GLOBAL + (size_t)ctx.world_size - 1) / (size_t)ctx.world_size;
    if (ddp_sampler_init(&sampler, &ctx, &sd) != DDP_OK) return 1;
    dev = (float *)dev_alloc(&ctx, sizeof g);

    if (ddp_barrier(&ctx) != DDP_OK) return 1; /* start the clock together */
    t0 = seconds();
    for (b = 0; b < STEPS; b++) {
        ddp_batch bt = ddp_sampler_batch(&sampler, 0, b);
        double c0;
        for (j = 0; j < D; j++) g[j] = 0;
        for (s = 0; s < bt.num_real; s++) { /* forward and backward of y = w . x, label 1 */
            uint32_t i = (uint32_t)bt.indices[s];
            float err = -1;
            for (j = 0; j < D; j++) err += w[j] * feature(i, j);
            for (j = 0; j < D; j++) g[j] += err * feature(i, j);
        }
        c0 = seconds(); /* the time spent communicating, not overlapped here */
        dev_upload(&ctx, dev, g, sizeof g);
        if (ddp_all_reduce(&ctx, dev, dev, D, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
        dev_download(&ctx, g, dev, sizeof g);
        comm += seconds() - c0;
        for (j = 0; j < D; j++) w[j] -= 0.5f * g[j] / (float)bt.global_count;
    }
    t0 = seconds() - t0;
    ddp_print(&ctx, "%d ranks, %zu samples per rank and step: %.1f ms per step (%.1f ms all-reduce), %.0f samples/s\n",
              ctx.world_size, sd.batch_size, 1e3 * t0 / STEPS, 1e3 * comm / STEPS, GLOBAL * STEPS / t0);
    dev_free(&ctx, dev);
    ddp_sampler_destroy(&sampler);
    ddp_destroy(&ctx);
    return 0;
}
