/* Lesson 6 exercise: a fixed global batch. To compare 1 rank with W ranks fairly, every
   run must train on the same global batch of 192 samples per step (and so take the
   same number of steps per epoch): with more ranks, each rank takes a smaller share.
       ./examples/lessons/06_speedup/exercise --nproc 3
   Fix per_rank_batch() until the program says "correct". */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <stdio.h>

enum { N = 1920, GLOBAL = 192 };

/* The sampler's batch_size for a global batch of GLOBAL samples. */
static size_t per_rank_batch(const ddp_ctx *ctx)
{
    /* TODO: the sampler's batch size is per rank (note 4 of the template): this gives
       every rank the whole global batch, so W ranks train on W times as much per step. */
    (void)ctx;
    return GLOBAL;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler sampler;
    ddp_sampler_desc sd = {0};
    size_t global;
    int ok, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;
    sd.dataset_size = N;
    sd.batch_size = per_rank_batch(&ctx);
    if (ddp_sampler_init(&sampler, &ctx, &sd) != DDP_OK) return 1;

    /* the first step's samples over all ranks; when GLOBAL does not divide by the
       number of ranks, rounding up gives at most world_size - 1 more */
    global = ddp_sampler_batch(&sampler, 0, 0).global_count;
    ok = global >= GLOBAL && global < GLOBAL + (size_t)ctx.world_size;
    if (ok) {
        ddp_print(&ctx, "correct: %d ranks x %zu samples = a global batch of %zu, %zu steps per epoch\n",
                  ctx.world_size, sd.batch_size, global, sampler.num_batches);
    } else {
        ddp_print(&ctx, "wrong: %d ranks x %zu samples = a global batch of %zu, want %d\n", ctx.world_size,
                  sd.batch_size, global, GLOBAL);
        ddp_print(&ctx, "hint: in per_rank_batch() divide the global batch by ctx->world_size, rounding up: "
                        "(GLOBAL + world_size - 1) / world_size\n");
    }
    ddp_sampler_destroy(&sampler);
    ddp_destroy(&ctx);
    return ok ? 0 : 1;
}
