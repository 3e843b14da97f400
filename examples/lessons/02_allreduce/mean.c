/* Lesson 2: all-reduce, and why the mean of the ranks' means is not the mean.
       ./examples/lessons/02_allreduce/mean --nproc 3
   Rank r holds r + 1 "losses" (ranks rarely hold equally many: the last batch of an
   epoch is short, and padding is not data). Three ways to average them over the job. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../device.h"
#include <stdio.h>

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    double host[2], *dev, sum = 0, count, mean_of_means, exact;
    ddp_metric loss = {0, 0, 0, 0, 0};
    int i, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    /* my losses: rank r has r + 1 samples, each with loss 10 r + i */
    count = ctx.rank + 1;
    for (i = 0; i < ctx.rank + 1; i++) {
        sum += 10.0 * ctx.rank + i;
        ddp_metric_add(&loss, 10.0 * ctx.rank + i, 1);
    }
    ddp_log(&ctx, "%g sample%s, my mean %g\n", count, count == 1 ? "" : "s", sum / count);

    /* all-reduce (全归约): every rank gives a buffer, every rank gets the element-wise
       sum of all of them. NCCL reduces GPU memory, so the buffer goes to my device. */
    dev = (double *)dev_alloc(&ctx, sizeof host);

    /* 1. the template: all_reduce(my mean) / world_size. Each rank weighs the same,
       however many samples it has: wrong whenever the counts differ (note 6). */
    host[0] = sum / count;
    dev_upload(&ctx, dev, host, sizeof(double));
    if (ddp_all_reduce(&ctx, dev, dev, 1, DDP_F64, DDP_SUM, NULL) != DDP_OK) return 1;
    dev_download(&ctx, host, dev, sizeof(double));
    mean_of_means = host[0] / ctx.world_size;

    /* 2. exact: all-reduce the sum and the count together (one collective), divide. */
    host[0] = sum;
    host[1] = count;
    dev_upload(&ctx, dev, host, sizeof host);
    if (ddp_all_reduce(&ctx, dev, dev, 2, DDP_F64, DDP_SUM, NULL) != DDP_OK) return 1;
    dev_download(&ctx, host, dev, sizeof host);
    exact = host[0] / host[1];

    /* 3. the same with ddp.h's metric: a (sum, count) pair, reduced in one call */
    if (ddp_metric_reduce(&ctx, &loss, 1) != DDP_OK) return 1;

    ddp_print(&ctx, "mean of the ranks' means: %.4f  (the template)\n", mean_of_means);
    ddp_print(&ctx, "sum / count:              %.4f  (%g samples)\n", exact, host[1]);
    ddp_print(&ctx, "ddp_metric_mean:          %.4f\n", ddp_metric_mean(&loss));
    dev_free(&ctx, dev);
    return ddp_destroy(&ctx) == DDP_OK ? 0 : 1; /* a rank missing at the end fails the job */
}
