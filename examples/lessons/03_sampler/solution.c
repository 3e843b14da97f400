/* Lesson 3, solved: the loss of one epoch. The sampler hands each rank its batches;
   the epoch's mean loss must count every sample of the data set exactly once, however
   many ranks there are (10 samples do not divide by 3 ranks).
   Check it from the repository root (it tries 1, 2, 3, 4, 5 and 7 ranks):
       make lesson-3
   Solved: the padding is skipped.

   第 3 课答案：一个 epoch 的 loss。采样器把各自的 batch 交给每个 rank；不管有几个 rank，这个
   epoch 的平均 loss 都必须把数据集里的每个样本恰好算一次（10 个样本不能被 3 个 rank 整除）。
   在仓库根目录运行 make lesson-3 检查（它会用 1、2、3、4、5、7 个 rank 各试一次）。
   答案：跳过补齐的样本。 */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../exercise.h"
#include <math.h>
#include <stdio.h>

enum { N = 10, BATCH = 2 };

static double loss_of(size_t sample) { return (double)sample; } /* a stand-in for a model */

/* Adds this batch's samples to the epoch's loss.  把这个 batch 的样本加进本 epoch 的 loss。 */
static void add_batch(ddp_metric *loss, ddp_batch bt)
{
    size_t s;
    /* indices past num_real are padding: repeats that keep the ranks in step
       num_real 之后的下标是补齐用的重复样本，只为让各 rank 步调一致 */
    for (s = 0; s < bt.num_real; s++) ddp_metric_add(loss, loss_of(bt.indices[s]), 1);
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler sampler;
    ddp_sampler_desc sd = {0};
    ddp_metric loss = {0, 0, 0, 0, 0};
    double mine[2] = {0, 0}, *all; /* samples this rank counted, and how many of its samples are real */
    size_t b;
    int r, ok, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;
    sd.dataset_size = N;
    sd.batch_size = BATCH;
    if (ddp_sampler_init(&sampler, &ctx, &sd) != DDP_OK) return 1;

    for (b = 0; b < sampler.num_batches; b++) {
        ddp_batch bt = ddp_sampler_batch(&sampler, 0, b);
        add_batch(&loss, bt);
        mine[1] += (double)bt.num_real;
    }
    mine[0] = loss.count;
    if (!(all = (double *)malloc(sizeof mine * (size_t)ctx.world_size))) return 1;
    if (ddp_all_gather(&ctx, mine, all, 2, DDP_F64, NULL) != DDP_OK) return 1;
    if (ddp_metric_reduce(&ctx, &loss, 1) != DDP_OK) return 1;

    /* samples 0 .. N-1 have losses 0 .. N-1: the mean is (N - 1) / 2 */
    ok = loss.count == N && fabs(ddp_metric_mean(&loss) - (N - 1) / 2.0) < 1e-12;
    if (ok) {
        ddp_print(&ctx, TR("correct: %g samples, mean loss %g\n", "正确：%g 个样本，平均 loss 为 %g\n"), loss.count,
                  ddp_metric_mean(&loss));
        lesson_one_rank(&ctx, 3);
    } else {
        ddp_print(&ctx, TR("wrong: %g samples, mean loss %g; want %d samples, mean %g\n",
                           "错误：%g 个样本，平均 loss 为 %g；应为 %d 个样本，平均 %g\n"),
                  loss.count, ddp_metric_mean(&loss), N, (N - 1) / 2.0);
        for (r = 0; r < ctx.world_size; r++)
            if (all[2 * r] != all[2 * r + 1])
                ddp_print(&ctx, TR("  rank %d counted %g samples; the data set gave it %g\n",
                                   "  rank %d 算进了 %g 个样本，数据集分给它的是 %g 个\n"), r, all[2 * r], all[2 * r + 1]);
        lesson_hints(&ctx, 3,
                     TR("in add_batch(): the sampler fills the last batches with repeats so that every rank has "
                        "as many samples (lesson 3, note 5: the samples marked * by the sampler program); "
                        "a repeat is not data.",
                        "看 add_batch()：采样器用重复的样本把最后几个 batch 补满，让每个 rank 的样本数一样多（第 3 课，"
                        "注意事项 5：sampler 程序输出里标 * 的样本）；重复的样本不是数据。"),
                     TR("struct ddp_batch in ddp.h says how many of a batch's indices are real samples; the real "
                        "ones come first.",
                        "ddp.h 里的 struct ddp_batch 说明了一个 batch 的下标中有几个是真样本；真样本排在前面。"));
    }
    free(all);
    ddp_sampler_destroy(&sampler);
    if (ddp_destroy(&ctx) != DDP_OK) ok = 0; /* a rank missing at the end fails the job */
    return ok ? 0 : 1;
}
