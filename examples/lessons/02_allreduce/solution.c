/* Lesson 2, solved: the accuracy of the whole job. Rank r saw 100 (r + 1) samples and
   got `correct` of them right. Compute the accuracy over all samples of all ranks, the
   same on every rank.
   Check it from the repository root (it tries 1, 2, 3, 4, 5 and 7 ranks):
       make lesson-2
   Solved: the counts are summed over the ranks first, and divided once.

   第 2 课答案：整个作业的准确率。rank r 看了 100 (r + 1) 个样本，其中答对 `correct` 个。
   计算全部 rank 的全部样本上的准确率，每个 rank 得到的结果都要相同。
   在仓库根目录运行 make lesson-2 检查（它会用 1、2、3、4、5、7 个 rank 各试一次）。
   答案：先对各 rank 的个数求和，最后只除一次。 */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../exercise.h"
#include <math.h>
#include <stdio.h>

/* Accuracy in % over every rank's samples.  全部 rank 全部样本上的准确率（%）。 */
static double global_accuracy(ddp_ctx *ctx, double correct, double seen)
{
    /* both counts in one all-reduce; 两个个数放在一次全归约里 */
    double n[2];
    n[0] = correct;
    n[1] = seen;
    if (ddp_all_reduce(ctx, n, n, 2, DDP_F64, DDP_SUM, NULL) != DDP_OK) return -1;
    return 100 * n[0] / n[1];
}

/* How far from the answer a right one may be, in points: float arithmetic is off by about
   1e-5, the mean of the ranks' means by a point or more; at %.4f a wrong answer never prints
   as the right one.  正确答案允许的误差（百分点）：float 运算的误差约为 1e-5，各 rank 均值的均值
   则差一个百分点以上；用 %.4f 打印时，错误的答案不会显示成正确答案的样子。 */
#define TOL 1e-3

static double seen_by(int r) { return 100.0 * (r + 1); }
static double right_by(int r) { return seen_by(r) - 10.0 * (r + 1) * (r + 1); } /* later ranks err more */

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    double want, got, *gots, all = 0, right = 0;
    int r, ok, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    for (r = 0; r < ctx.world_size; r++) { /* the answer, from what every rank holds */
        all += seen_by(r);
        right += right_by(r);
    }
    want = 100 * right / all;
    got = global_accuracy(&ctx, right_by(ctx.rank), seen_by(ctx.rank));
    /* every rank's answer, on every rank: the verdict is the job's */
    if (!(gots = (double *)malloc(sizeof got * (size_t)ctx.world_size))) return 1;
    if (ddp_all_gather(&ctx, &got, gots, 1, DDP_F64, NULL) != DDP_OK) return 1;
    for (ok = 1, r = 0; r < ctx.world_size; r++) ok = ok && fabs(gots[r] - want) < TOL;
    if (ok) {
        ddp_print(&ctx, TR("correct: accuracy %.4f %% over %g samples of %d ranks\n",
                           "正确：准确率 %.4f %%，共 %g 个样本、%d 个 rank\n"), got, all, ctx.world_size);
        lesson_one_rank(&ctx, 2);
    } else {
        ddp_print(&ctx, TR("wrong: accuracy %.4f %% on rank 0, want %.4f %% (%g of %g samples right)\n",
                           "错误：rank 0 的准确率为 %.4f %%，应为 %.4f %%（答对 %g 个，共 %g 个样本）\n"), got, want, right, all);
        for (r = 0; r < ctx.world_size; r++)
            ddp_print(&ctx, TR("  rank %d: %g of %g samples right (%.1f %%); global_accuracy() gave %.4f %%%s\n",
                               "  rank %d：答对 %g 个，共 %g 个样本（%.1f %%）；global_accuracy() 得到 %.4f %%%s\n"),
                      r, right_by(r), seen_by(r), 100 * right_by(r) / seen_by(r), gots[r],
                      fabs(gots[r] - want) < TOL ? "" : TR(", wrong", "，不对"));
        lesson_hints(&ctx, 2,
                     TR("in global_accuracy(), every sample must weigh the same: the job's accuracy is the right "
                        "answers of all ranks over the samples of all ranks. The mean of the ranks' percentages "
                        "weighs each rank the same instead (lesson 2: the mean of means).",
                        "看 global_accuracy()：每个样本的分量必须相同，整个作业的准确率是所有 rank 答对的个数除以所有 "
                        "rank 的样本数。对各 rank 的百分比求平均，则是让每个 rank 的分量相同（第 2 课：均值的均值）。"),
                     TR("Reduce the counts, not a ratio: one all-reduce can carry several numbers at once (an "
                        "array), and the division comes after it, once.",
                        "对个数做归约，而不是对比值：一次全归约可以同时带上好几个数（一个数组），除法放在它之后，只做一次。"));
    }
    free(gots);
    if (ddp_destroy(&ctx) != DDP_OK) ok = 0; /* a rank missing at the end fails the job */
    return ok ? 0 : 1;
}
