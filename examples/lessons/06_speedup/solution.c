/* Lesson 6, solved: a fixed global batch. To compare 1 rank with W ranks fairly, every
   run must train on the same global batch of 192 samples per step (and so take the same
   number of steps per epoch): with more ranks, each rank takes a smaller share. When 192
   does not divide by W, the ranks take a few samples more, never fewer, so that an epoch
   still has as many steps as with 1 rank.
   Check it from the repository root (it tries 1, 2, 3, 4, 5 and 7 ranks):
       make lesson-6
   Solved: each rank takes its share of the global batch, rounded up.

   第 6 课答案：固定的全局 batch。要公平地比较 1 个 rank 和 W 个 rank，每次运行的每一步都必须在
   同样的、192 个样本的全局 batch 上训练（因此每个 epoch 的步数也相同）：rank 越多，每个 rank 分到的越少。
   192 不能被 W 整除时，各 rank 宁可多取几个样本，也不能少取，这样一个 epoch 的步数才和
   1 个 rank 时一样。
   在仓库根目录运行 make lesson-6 检查（它会用 1、2、3、4、5、7 个 rank 各试一次）。
   答案：每个 rank 取全局 batch 中自己的那一份，向上取整。 */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../exercise.h"
#include <stdio.h>

enum { N = 1920, GLOBAL = 192, STEPS = (N + GLOBAL - 1) / GLOBAL }; /* steps per epoch with 1 rank */

/* The sampler's batch_size for a global batch of GLOBAL samples.
   全局 batch 为 GLOBAL 个样本时，采样器的 batch_size。 */
static size_t per_rank_batch(const ddp_ctx *ctx)
{
    /* rounded up, so that no step is added to an epoch; 向上取整，一个 epoch 就不会多出一步 */
    return (GLOBAL + (size_t)ctx->world_size - 1) / (size_t)ctx->world_size;
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

    /* the first step's samples over all ranks: at least GLOBAL, and when GLOBAL does not
       divide by the number of ranks, at most world_size - 1 more */
    global = sampler.batch_size * (size_t)ctx.world_size; /* (the sampler's: 0 means 1) */
    ok = global >= GLOBAL && global < GLOBAL + (size_t)ctx.world_size;
    if (ok) {
        ddp_print(&ctx, TR("correct: %d ranks x %zu samples = a global batch of %zu, %zu steps per epoch\n",
                           "正确：%d 个 rank x %zu 个样本 = %zu 个样本的全局 batch，每个 epoch %zu 步\n"),
                  ctx.world_size, sampler.batch_size, global, sampler.num_batches);
        lesson_one_rank(&ctx, 6);
    } else {
        ddp_print(&ctx, TR("wrong: %d ranks x %zu samples = a global batch of %zu, want %d; %zu steps per epoch, "
                           "1 rank takes %d\n",
                           "错误：%d 个 rank x %zu 个样本 = %zu 个样本的全局 batch，应为 %d 个；每个 epoch %zu 步，"
                           "1 个 rank 时是 %d 步\n"),
                  ctx.world_size, sampler.batch_size, global, GLOBAL, sampler.num_batches, STEPS);
        lesson_hints(&ctx, 6,
                     TR("per_rank_batch() gives the sampler's batch_size, which is per rank (note 4): together "
                        "the ranks must take at least 192 samples per step, and fewer than 192 + world_size.",
                        "per_rank_batch() 给出采样器的 batch_size，它是每个 rank 的（注意事项 4）：所有 rank 每一步合起来"
                        "至少要取 192 个样本，并且少于 192 + world_size 个。"),
                     TR("With 5 or 7 ranks, 192 does not divide evenly. Rounding one way makes every global batch "
                        "a little smaller and adds a step to each epoch (see the steps per epoch above); the other "
                        "way does not.",
                        "用 5 个或 7 个 rank 时，192 不能被 rank 数整除。往一个方向舍入，每个全局 batch 都会小一点，每个 epoch "
                        "也会多出一步（看上面每个 epoch 的步数）；往另一个方向则不会。"));
    }
    ddp_sampler_destroy(&sampler);
    if (ddp_destroy(&ctx) != DDP_OK) ok = 0; /* a rank missing at the end fails the job */
    return ok ? 0 : 1;
}
