/* Lesson 3, solved: the loss of one epoch. The sampler hands each rank its batches;
   the epoch's mean loss must count every sample of the data set exactly once, however
   many ranks there are (the 10 samples do not divide by 3 ranks).
       ./examples/lessons/03_sampler/exercise --nproc 3
   Solved: the padding is skipped. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <math.h>
#include <stdio.h>

enum { N = 10, BATCH = 2 };

static double loss_of(size_t sample) { return (double)sample; } /* a stand-in for a model */

/* Adds this batch's samples to the epoch's loss. */
static void add_batch(ddp_metric *loss, ddp_batch bt)
{
    size_t s;
    /* indices past num_real are padding: repeats that keep the ranks in step */
    for (s = 0; s < bt.num_real; s++) ddp_metric_add(loss, loss_of(bt.indices[s]), 1);
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler sampler;
    ddp_sampler_desc sd = {0};
    ddp_metric loss = {0, 0, 0, 0};
    size_t b;
    int ok, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;
    sd.dataset_size = N;
    sd.batch_size = BATCH;
    if (ddp_sampler_init(&sampler, &ctx, &sd) != DDP_OK) return 1;

    for (b = 0; b < sampler.num_batches; b++) add_batch(&loss, ddp_sampler_batch(&sampler, 0, b));
    if (ddp_metric_reduce(&ctx, &loss, 1) != DDP_OK) return 1;

    /* samples 0 .. N-1 have losses 0 .. N-1: the mean is (N - 1) / 2 */
    ok = loss.count == N && fabs(ddp_metric_mean(&loss) - (N - 1) / 2.0) < 1e-12;
    if (ok) {
        ddp_print(&ctx, "correct: %g samples, mean loss %g\n", loss.count, ddp_metric_mean(&loss));
    } else {
        ddp_print(&ctx, "wrong: %g samples, mean loss %g; want %d samples, mean %g\n", loss.count,
                  ddp_metric_mean(&loss), N, (N - 1) / 2.0);
        ddp_print(&ctx, "hint: only bt.indices[0 .. bt.num_real) are real samples, the rest is padding: "
                        "loop to bt.num_real in add_batch()\n");
    }
    ddp_sampler_destroy(&sampler);
    ddp_destroy(&ctx);
    return ok ? 0 : 1;
}
