/* Lesson 3: DistributedSampler - who sees which samples, batch by batch, epoch by epoch.
       ./examples/lessons/03_sampler/sampler --nproc 3
   10 samples, a batch of 2 per rank. Rank 0 prints every rank's batches: a sample
   marked * is padding, a repeat that fills the last batch so every rank has as many. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <stdio.h>
#include <stdlib.h>

enum { N = 10, BATCH = 2, EPOCHS = 2 };

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler sampler;
    ddp_sampler_desc sd = {0};
    int64_t mine[BATCH + 1], *all; /* my batch (-1: none) and how much of it is real */
    size_t b;
    int epoch, r, i, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    /* template: DistributedSampler(train_dataset); DataLoader(..., batch_size=B,
       sampler=...). B is per rank (note 4): one step of the job trains on B x world
       samples, so an epoch has fewer steps as ranks are added - that is the speed-up. */
    sd.dataset_size = N;
    sd.batch_size = BATCH;
    sd.seed = 0; /* epoch e shuffles with seed + e, as torch does */
    if (ddp_sampler_init(&sampler, &ctx, &sd) != DDP_OK) return 1;
    all = (int64_t *)malloc(sizeof mine * (size_t)ctx.world_size);
    if (!all) return 1;
    ddp_print(&ctx, "%d samples, %d ranks: %zu per rank (%zu padding in all), %zu batches of %d per rank\n", N,
              ctx.world_size, sampler.num_samples, sampler.total_size - N, sampler.num_batches, BATCH);

    /* template: train_sampler.set_epoch(epoch) (note 3). Forgetting it gives every
       epoch the same order; here the epoch is an argument of every lookup instead. */
    for (epoch = 0; epoch < EPOCHS; epoch++) {
        for (b = 0; b < sampler.num_batches; b++) {
            ddp_batch bt = ddp_sampler_batch(&sampler, (uint64_t)epoch, b);
            for (i = 0; i < BATCH; i++) mine[i] = i < (int)bt.count ? (int64_t)bt.indices[i] : -1;
            mine[BATCH] = (int64_t)bt.num_real;
            /* all-gather: rank r's batch lands at all[r * (BATCH + 1)] on every rank */
            if (ddp_all_gather(&ctx, mine, all, BATCH + 1, DDP_I64, NULL) != DDP_OK) return 1;
            ddp_print(&ctx, "epoch %d batch %zu (%zu real samples):", epoch, b, bt.global_count);
            for (r = 0; r < ctx.world_size; r++) {
                const int64_t *theirs = all + r * (BATCH + 1);
                ddp_print(&ctx, "  rank %d [", r);
                for (i = 0; i < BATCH && theirs[i] >= 0; i++)
                    ddp_print(&ctx, "%s%lld%s", i ? " " : "", (long long)theirs[i], i < theirs[BATCH] ? "" : "*");
                ddp_print(&ctx, "]");
            }
            ddp_print(&ctx, "\n");
        }
    }
    free(all);
    ddp_sampler_destroy(&sampler);
    return ddp_destroy(&ctx) == DDP_OK ? 0 : 1; /* a rank missing at the end fails the job */
}
