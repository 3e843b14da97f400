/* Lesson 5 exercise: resume from a checkpoint. Rank 0 saved the trained weights (only
   rank 0 writes files: note 7 of the template). On resume every rank must start from
   them, whatever it drew at start-up.
   Check it from the repository root (it tries 1, 2, 3, 4, 5 and 7 ranks):
       make lesson-5
   Edit load_checkpoint() until it says "correct".

   第 5 课练习：从检查点恢复。rank 0 保存了训练好的权重（只有 rank 0 写文件：模板的注意事项 7）。
   恢复时，每个 rank 都必须从这些权重出发，不管它启动时随机得到的是什么。
   在仓库根目录运行 make lesson-5 检查（它会用 1、2、3、4、5、7 个 rank 各试一次）。
   修改 load_checkpoint()，直到它说“正确”。 */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../exercise.h"
#include <math.h>
#include <stdio.h>

enum { P = 6 };

/* What an earlier run saved: drawn afresh by rank 0 for every check, so the other ranks
   can learn it only from rank 0.  之前一次运行保存的权重：每次检查由 rank 0 重新抽取，其他 rank
   只能从 rank 0 那里得到它。 */
static void draw_trained(float *w)
{
    struct timespec t;
    int j, k;
    clock_gettime(CLOCK_REALTIME, &t);
    k = 1 + (int)((t.tv_sec + t.tv_nsec / 1000) % 999); /* 1 to 999, whatever the clock's resolution */
    for (j = 0; j < P; j++) w[j] = 0.25f * (float)j - 0.5f + (float)k;
}

/* Rank 0 reads the weights from f; afterwards every rank must hold them in w.
   rank 0 从 f 读出权重；之后每个 rank 的 w 里都必须是这些权重。 */
static ddp_result load_checkpoint(ddp_ctx *ctx, FILE *f, float *w)
{
    int32_t ok = 1;
    if (ddp_is_main(ctx)) {
        rewind(f);
        ok = fread(w, sizeof(float), P, f) == P;
    }
    /* every rank must know when rank 0 could not read the file */
    if (ddp_broadcast(ctx, &ok, 1, DDP_I32, 0, NULL) != DDP_OK || !ok) return DDP_ERR_SYSTEM;
    /* TODO: rank 0 holds the checkpoint's weights now; the other ranks still hold what they drew.
       TODO：现在 rank 0 拿到了检查点里的权重；其他 rank 手里还是它们自己随机得到的权重。 */
    return DDP_OK;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    float w[P], trained[P], diff = 0, *diffs;
    FILE *f = NULL;
    int j, r, ok, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    if (ddp_is_main(&ctx)) { /* the checkpoint of an earlier run */
        draw_trained(trained);
        if (!(f = tmpfile()) || fwrite(trained, sizeof(float), P, f) != P) return 1;
    }
    for (j = 0; j < P; j++) w[j] = (float)(ctx.rank + 1) * 100; /* fresh weights, different per rank */

    if (load_checkpoint(&ctx, f, w) != DDP_OK) return 1;
    /* the saved weights, on every rank for the check */
    if (ddp_broadcast(&ctx, trained, P, DDP_F32, 0, NULL) != DDP_OK) return 1;
    for (j = 0; j < P; j++) diff = fmaxf(diff, fabsf(w[j] - trained[j]));
    /* every rank's difference from the checkpoint, on every rank */
    if (!(diffs = (float *)malloc(sizeof diff * (size_t)ctx.world_size))) return 1;
    if (ddp_all_gather(&ctx, &diff, diffs, 1, DDP_F32, NULL) != DDP_OK) return 1;
    for (ok = 1, r = 0; r < ctx.world_size; r++) ok = ok && diffs[r] == 0;
    if (ok) {
        ddp_print(&ctx, TR("correct: all %d ranks resume from rank 0's checkpoint\n",
                           "正确：%d 个 rank 全都从 rank 0 的检查点恢复\n"), ctx.world_size);
        lesson_one_rank(&ctx, 5);
    } else {
        ddp_print(&ctx, TR("wrong: these ranks' weights differ from the checkpoint's:",
                           "错误：这些 rank 的权重与检查点里的不同："));
        lesson_print_ranks(&ctx, diffs, 0);
        lesson_hints(&ctx, 5,
                     TR("in load_checkpoint(), only rank 0 reads the file (note 7); when the function returns, "
                        "every rank must hold rank 0's w.",
                        "看 load_checkpoint()：只有 rank 0 读文件（注意事项 7）；函数返回时，每个 rank 都必须拿到 rank 0 "
                        "的 w。"),
                     TR("One collective copies a buffer from one rank to all the others: the `ok` flag above "
                        "already travels that way. The weights are P floats.",
                        "有一种集合通信把一个 rank 的缓冲区复制给其他所有 rank：上面的 `ok` 标志就是这样传过去的。"
                        "权重是 P 个 float。"));
    }
    free(diffs);
    if (f) fclose(f);
    if (ddp_destroy(&ctx) != DDP_OK) ok = 0; /* a rank missing at the end fails the job */
    return ok ? 0 : 1;
}
