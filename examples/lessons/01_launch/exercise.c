/* Lesson 1 exercise: split the work. N items, numbered 0 .. N-1, are shared by the
   ranks: each rank takes one contiguous piece and every item must be taken by exactly
   one rank, whatever the number of ranks (try 3: N does not divide by it).
       ./examples/lessons/01_launch/exercise --nproc 3
   Fix my_piece() until the program says "correct". */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <stdio.h>

enum { N = 10 };

/* This rank's items are [*begin, *end). */
static void my_piece(const ddp_ctx *ctx, int *begin, int *end)
{
    /* TODO: every rank takes the same first piece; give rank r its own piece. */
    *begin = 0;
    *end = N / ctx->world_size;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    int32_t taken[N] = {0}; /* how many ranks took item i */
    int i, begin, end, ok, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    my_piece(&ctx, &begin, &end);
    ddp_log(&ctx, "items [%d, %d)\n", begin, end);
    for (i = begin; i < end && i >= 0 && i < N; i++) taken[i] = 1;
    /* the sum over ranks counts, for each item, the ranks that took it */
    if (ddp_all_reduce(&ctx, taken, taken, N, DDP_I32, DDP_SUM, NULL) != DDP_OK) return 1;

    for (ok = 1, i = 0; i < N; i++) ok = ok && taken[i] == 1;
    if (ok) {
        ddp_print(&ctx, "correct: each of the %d items was taken by exactly one of %d ranks\n", N, ctx.world_size);
    } else {
        ddp_print(&ctx, "wrong: ranks that took items 0 .. %d:", N - 1);
        for (i = 0; i < N; i++) ddp_print(&ctx, " %d", taken[i]);
        ddp_print(&ctx, " (want 1 each)\n");
        ddp_print(&ctx, "hint: rank r should take items [r * N / world_size, (r + 1) * N / world_size): "
                        "fix my_piece() using ctx->rank\n");
    }
    ddp_destroy(&ctx);
    return ok ? 0 : 1;
}
