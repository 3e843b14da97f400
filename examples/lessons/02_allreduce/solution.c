/* Lesson 2, solved: the accuracy of the whole job. Rank r saw 100 (r + 1) samples and
   got `correct` of them right. Compute the accuracy over all samples of all ranks.
       ./examples/lessons/02_allreduce/exercise --nproc 3
   Solved: sum the counts over the ranks first, divide once. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <math.h>
#include <stdio.h>

/* Accuracy in % over every rank's samples; the same on every rank. */
static double global_accuracy(ddp_ctx *ctx, double correct, double seen)
{
    double n[2];
    n[0] = correct;
    n[1] = seen;
    if (ddp_all_reduce(ctx, n, n, 2, DDP_F64, DDP_SUM, NULL) != DDP_OK) return -1;
    return 100 * n[0] / n[1];
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    double seen, correct, want, got, all = 0, right = 0;
    int r, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    seen = 100.0 * (ctx.rank + 1);
    correct = seen - 10.0 * (ctx.rank + 1) * (ctx.rank + 1); /* later ranks err more */
    for (r = 0; r < ctx.world_size; r++) { /* the answer, from what every rank holds */
        all += 100.0 * (r + 1);
        right += 100.0 * (r + 1) - 10.0 * (r + 1) * (r + 1);
    }
    want = 100 * right / all;
    got = global_accuracy(&ctx, correct, seen);

    if (fabs(got - want) < 1e-9) {
        ddp_print(&ctx, "correct: accuracy %.4f %% over %g samples of %d ranks\n", got, all, ctx.world_size);
    } else {
        ddp_print(&ctx, "wrong: accuracy %.4f %%, want %.4f %% (%g of %g samples right)\n", got, want, right, all);
        ddp_print(&ctx, "hint: all-reduce the two numbers correct and seen together (a double[2], DDP_SUM), "
                        "then divide: 100 * correct / seen\n");
    }
    ddp_destroy(&ctx);
    return fabs(got - want) < 1e-9 ? 0 : 1;
}
