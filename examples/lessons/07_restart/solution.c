/* Lesson 7, solved: a checkpoint that resumes the same run. The job is stopped after
   step K (a rank died), started again, and goes on from rank 0's checkpoint; it must
   then end with the bits of a run that never stopped. save_checkpoint() writes what
   the template saves, the model (w and b): a run is more than its model.
   Check it from the repository root (it tries 1, 2, 3, 4, 5 and 7 ranks):
       make lesson-7
   Solved: the momentum and the step are saved, read back and broadcast with w.

   第 7 课答案：能接着跑同一次训练的检查点。作业在第 K 步之后被停下（有个 rank 死了），重新启动后从
   rank 0 的检查点继续；它必须和一次从没停过的运行得到逐位相同的结果。save_checkpoint() 存的是模板存的
   东西：模型（w 和 b）。一次训练不只是它的模型。
   在仓库根目录运行 make lesson-7 检查（它会用 1、2、3、4、5、7 个 rank 各试一次）。
   答案：动量和步数与 w 一起保存、读回并广播。 */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../exercise.h"
#include <math.h>
#include <stdio.h>

enum { N = 101, BATCH = 4, STEPS = 24, K = 11 };

/* A run: the model (w and b), its momentum, and how many steps it has taken (which says
   the epoch and the batch: where the sampler is).
   一次训练：模型（w 和 b）、它的动量，以及已经走了多少步（步数决定了 epoch 和批次：采样器走到了哪里）。 */
typedef struct { float w[2], v[2]; int32_t step; } run;

static float x_of(size_t i) { return (float)i / N; }
static float y_of(size_t i) { return 3 * x_of(i) + 1 + 0.05f * (float)((int)(i * 37 % 11) - 5) / 5; }

/* Steps r up to step `until`: SGD with momentum on the gradient summed over the ranks.
   把 r 训练到第 until 步：用所有 rank 求和后的梯度做带动量的 SGD。 */
static ddp_result train(ddp_ctx *ctx, ddp_sampler *s, run *r, int32_t until)
{
    for (; r->step < until; r->step++) {
        ddp_batch bt = ddp_sampler_batch(s, (uint64_t)r->step / s->num_batches, (size_t)r->step % s->num_batches);
        float g[2] = {0, 0};
        size_t i;
        int k;
        for (i = 0; i < bt.num_real; i++) {
            float x = x_of(bt.indices[i]), err = r->w[0] * x + r->w[1] - y_of(bt.indices[i]);
            g[0] += err * x;
            g[1] += err;
        }
        if (ddp_all_reduce(ctx, g, g, 2, DDP_F32, DDP_SUM, NULL) != DDP_OK) return DDP_ERR_SYSTEM;
        for (k = 0; k < 2; k++) {
            r->v[k] = 0.8f * r->v[k] + g[k] / (float)bt.global_count;
            r->w[k] -= 0.5f * r->v[k];
        }
    }
    return DDP_OK;
}

/* Rank 0 writes the run to f (only rank 0 writes files: note 7 of the template).
   rank 0 把这次训练写进 f（只有 rank 0 写文件：模板的注意事项 7）。 */
static int save_checkpoint(const ddp_ctx *ctx, FILE *f, const run *r)
{
    if (!ddp_is_main(ctx)) return 1;
    rewind(f);
    /* template: torch.save(model.module.state_dict()) keeps the model alone; PyTorch's recipe for
       resuming saves optimizer.state_dict() and the epoch beside it
       模板：torch.save(model.module.state_dict()) 只存模型；PyTorch 恢复训练的做法是把 optimizer.state_dict()
       和 epoch 一起存下 */
    return fwrite(r->w, sizeof(float), 2, f) == 2 && fwrite(r->v, sizeof(float), 2, f) == 2 &&
           fwrite(&r->step, sizeof r->step, 1, f) == 1 && fflush(f) == 0;
}

/* A restarted process: r holds what it starts with (fresh weights, no momentum, step 0).
   Rank 0 reads f; afterwards every rank must hold the saved run.
   重新启动的进程：r 里是它起步时的东西（新的权重、没有动量、第 0 步）。rank 0 读 f；之后每个 rank 都必须
   拿到保存下来的那次训练。 */
static ddp_result load_checkpoint(ddp_ctx *ctx, FILE *f, run *r)
{
    int32_t ok = 1;
    if (ddp_is_main(ctx)) {
        rewind(f);
        ok = fread(r->w, sizeof(float), 2, f) == 2 && fread(r->v, sizeof(float), 2, f) == 2 &&
             fread(&r->step, sizeof r->step, 1, f) == 1;
    }
    /* every rank must know when rank 0 could not read the file */
    if (ddp_broadcast(ctx, &ok, 1, DDP_I32, 0, NULL) != DDP_OK || !ok) return DDP_ERR_SYSTEM;
    if (ddp_broadcast(ctx, r->w, 2, DDP_F32, 0, NULL) != DDP_OK) return DDP_ERR_SYSTEM;
    if (ddp_broadcast(ctx, r->v, 2, DDP_F32, 0, NULL) != DDP_OK) return DDP_ERR_SYSTEM;
    return ddp_broadcast(ctx, &r->step, 1, DDP_I32, 0, NULL);
}

/* How far a's state is from b's: the largest difference of any of its numbers. */
static float distance(const run *a, const run *b)
{
    float d = fabsf((float)(a->step - b->step));
    int k;
    for (k = 0; k < 2; k++) d = fmaxf(d, fmaxf(fabsf(a->w[k] - b->w[k]), fabsf(a->v[k] - b->v[k])));
    return d;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler sampler;
    ddp_sampler_desc sd = {0};
    run whole = {{0, 0}, {0, 0}, 0}, saved = {{0, 0}, {0, 0}, 0}, resumed, loaded;
    float d[2], *diffs;
    FILE *f = NULL;
    int r, ok[2] = {1, 1}, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;
    sd.dataset_size = N;
    sd.batch_size = BATCH;
    if (ddp_sampler_init(&sampler, &ctx, &sd) != DDP_OK) return 1;

    if (train(&ctx, &sampler, &whole, STEPS) != DDP_OK) return 1; /* the run that never stopped */
    /* the run that stops after step K: rank 0 saves it, then the job dies */
    if (train(&ctx, &sampler, &saved, K) != DDP_OK) return 1;
    if (ddp_is_main(&ctx) && (!(f = tmpfile()) || !save_checkpoint(&ctx, f, &saved))) return 1;
    /* the restart: a new process on every rank, its weights drawn afresh (different per rank) */
    resumed.w[0] = resumed.w[1] = (float)(ctx.rank + 1) * 100;
    resumed.v[0] = resumed.v[1] = 0;
    resumed.step = 0;
    if (load_checkpoint(&ctx, f, &resumed) != DDP_OK) return 1;
    loaded = resumed;
    d[0] = distance(&loaded, &saved);
    if (train(&ctx, &sampler, &resumed, STEPS) != DDP_OK) return 1;
    d[1] = distance(&resumed, &whole);

    /* every rank's differences, on every rank: after the load, and at the end */
    if (!(diffs = (float *)malloc(sizeof d * (size_t)ctx.world_size))) return 1;
    if (ddp_all_gather(&ctx, d, diffs, 2, DDP_F32, NULL) != DDP_OK) return 1;
    for (r = 0; r < ctx.world_size; r++) {
        ok[0] = ok[0] && diffs[2 * r] == 0;
        ok[1] = ok[1] && diffs[2 * r + 1] == 0;
    }
    for (r = 0; r < ctx.world_size; r++) diffs[r] = diffs[2 * r + ok[0]]; /* the first that went wrong */
    if (ok[0] && ok[1]) {
        ddp_print(&ctx, TR("correct: on all %d ranks the run resumed at step %d ends with the bits of the run that "
                           "never stopped\n",
                           "正确：%d 个 rank 上，从第 %d 步恢复的训练都与从没停过的那次逐位相同\n"),
                  ctx.world_size, K);
        lesson_one_rank(&ctx, 7);
    } else {
        if (!ok[0] && d[0] > 0) /* rank 0 says what it holds */
            ddp_print(&ctx, TR("wrong: after load_checkpoint() these ranks' runs differ from the saved one (rank 0 "
                               "holds step %d, saved %d; momentum %g %g, saved %g %g):",
                               "错误：load_checkpoint() 之后，这些 rank 上的训练与保存的不同（rank 0 上是第 %d 步，保存的"
                               "是第 %d 步；动量 %g %g，保存的是 %g %g）："),
                      (int)loaded.step, K, loaded.v[0], loaded.v[1], saved.v[0], saved.v[1]);
        else if (!ok[0])
            ddp_print(&ctx, TR("wrong: rank 0 holds the saved run after load_checkpoint(), these ranks do not:",
                               "错误：load_checkpoint() 之后 rank 0 拿到了保存的训练，这些 rank 没有："));
        else
            ddp_print(&ctx, TR("wrong: the resumed run ends elsewhere than the run that never stopped, on these ranks:",
                               "错误：恢复后的训练与从没停过的那次结果不同，这些 rank 上："));
        lesson_print_ranks(&ctx, diffs, 0);
        lesson_hints(&ctx, 7,
                     TR("a step reads more than w: look at what train() reads and changes besides it. The checkpoint "
                        "must hold all of that, and every rank must get it from rank 0's file (lesson 5).",
                        "一步训练读的不只是 w：看看 train() 除了 w 还读、还改了什么。检查点必须存下这些全部，并且每个 "
                        "rank 都必须从 rank 0 的文件里得到它们（第 5 课）。"),
                     TR("Save r->v (the momentum: the next step adds 0.8 of it) and r->step (it says the epoch and the "
                        "batch, so which samples come next) after w, read them back in the same order on rank 0, and "
                        "broadcast each from rank 0 as w is.",
                        "在 w 后面保存 r->v（动量：下一步会加上它的 0.8 倍）和 r->step（它决定 epoch 和批次，也就是下"
                        "面轮到哪些样本），在 rank 0 上按同样的顺序读回来，再像 w 那样从 rank 0 广播出去。"));
    }
    free(diffs);
    if (f) fclose(f);
    ddp_sampler_destroy(&sampler);
    if (ddp_destroy(&ctx) != DDP_OK) ok[0] = 0; /* a rank missing at the end fails the job */
    return ok[0] && ok[1] ? 0 : 1;
}
