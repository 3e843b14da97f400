/* Lesson 4 exercise: DistributedDataParallel by hand. Every rank trains the same model,
   y = w . x with LAYERS layers of P weights, on its own samples. backward() computes the
   gradient layer by layer, from the last layer to the first, into one flat buffer, and
   ddp_grad must sum it over the ranks in buckets, one per layer, each bucket's
   all-reduce starting as soon as its layer is done, while backward goes on with the
   layers below. Then every rank takes the step that one process would take on the
   whole global batch, and all ranks keep the same weights.
   Check it from the repository root (it tries 1, 2, 3, 4, 5 and 7 ranks):
       make lesson-4
   Fill in bucket_bytes(), layer_done() and backward_done() until it says "correct".

   第 4 课练习：亲手实现 DistributedDataParallel。每个 rank 用自己的样本训练同一个模型：
   y = w . x，共 LAYERS 层，每层 P 个权重。backward() 从最后一层到第一层逐层计算梯度，写进一个
   连续的缓冲区；ddp_grad 要把它分桶（每层一个桶）在各 rank 间求和：某一层一算完，它那个桶的全归约
   就开始，同时 backward 继续计算下面的层。这样每个 rank 走的一步都和一个进程在整个全局 batch 上
   走的一步相同，所有 rank 的权重始终一致。
   在仓库根目录运行 make lesson-4 检查（它会用 1、2、3、4、5、7 个 rank 各试一次）。
   填好 bucket_bytes()、layer_done() 和 backward_done()，直到它说“正确”。 */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../exercise.h"
#include <math.h>
#include <stdio.h>

enum { LAYERS = 4, P = 64, D = LAYERS * P, N = 60, BATCH = 4, STEPS = 3 };

/* The check sees every ddp_grad_ready() call and whether it marks the layer whose
   layer_done() is running (watched_ready, below your part; not static: clang and nvcc
   refuse an unused static function, and an exercise that calls no ddp_grad_ready() yet
   leaves it unused).
   检查会看到每一次 ddp_grad_ready() 调用，以及它标记的是不是正在运行 layer_done() 的那一层
   （watched_ready，在你要改的部分下面；它不是 static：clang 和 nvcc 不接受没被用到的 static 函数，
   而还没调用 ddp_grad_ready() 的练习用不到它）。 */
ddp_result watched_ready(ddp_grad *g, size_t offset, size_t count);
#define ddp_grad_ready(g, offset, count) watched_ready(g, offset, count)

/* TODO 1: the size of a bucket in bytes, so that each layer is one bucket (0 means
   ddp.h's default, 25 MiB).
   TODO 1：桶的大小（字节），使每一层恰好是一个桶（0 表示 ddp.h 的默认值 25 MiB）。 */
static size_t bucket_bytes(void) { return 0; }

/* backward() calls this as soon as layer `layer`'s gradient, g[layer * P, (layer + 1) * P),
   is final. TODO 2: hand it to ddp_grad.
   backward() 一算完第 layer 层的梯度 g[layer * P, (layer + 1) * P) 就调用这里。
   TODO 2：把它交给 ddp_grad。 */
static ddp_result layer_done(ddp_grad *sync, int layer)
{
    (void)sync;
    (void)layer;
    return DDP_OK;
}

/* backward() calls this after the last layer, before the optimizer reads the gradient.
   TODO 3: the gradient must be summed over the ranks by then.
   backward() 算完最后一层、优化器读取梯度之前调用这里。TODO 3：此时梯度必须已在各 rank 间求和。 */
static ddp_result backward_done(ddp_grad *sync)
{
    (void)sync;
    return DDP_OK;
}

/* The overlap: layer l's elements must be marked while layer_done(sync, l) runs, so that
   its bucket's all-reduce starts while backward computes the layers below. */
static int running = -1;         /* the layer whose layer_done() runs, or -1 */
static int on_time[LAYERS];      /* this step's elements of each layer marked by its own layer_done() */
static int late = -1, late_in = -2; /* the first layer marked otherwise, and where (a layer, -1: elsewhere) */

ddp_result watched_ready(ddp_grad *g, size_t offset, size_t count)
{
    size_t j;
    for (j = offset; j < offset + count && j < D; j++)
        if ((int)(j / P) == running) on_time[running]++;
        else if (late < 0) late = (int)(j / P), late_in = running;
    return (ddp_grad_ready)(g, offset, count); /* in parentheses: ddp.h's own */
}

static float feature(size_t i, int j) { return (float)((i * 7 + (size_t)j * 3) % 11) / 11.0f - 0.5f; }
static float label(size_t i) { return (float)(i % 5); }

/* STEPS steps of SGD on the sampler's batches, the gradient in g. With `sync` it goes
   through ddp_grad; without, it is this process's alone (the reference: one process
   whose batch is the whole global batch). */
static ddp_result train(ddp_sampler *sampler, float *w, float *g, ddp_grad *sync)
{
    float err[N];
    size_t b, s;
    int j, layer;
    ddp_result r;
    for (b = 0; b < STEPS; b++) {
        ddp_batch bt = ddp_sampler_batch(sampler, 0, b);
        for (s = 0; s < bt.num_real; s++) { /* forward: each sample's error */
            err[s] = -label(bt.indices[s]);
            for (j = 0; j < D; j++) err[s] += w[j] * feature(bt.indices[s], j);
        }
        memset(on_time, 0, sizeof on_time);
        for (layer = LAYERS - 1; layer >= 0; layer--) { /* backward: the last layer first */
            for (j = layer * P; j < (layer + 1) * P; j++)
                for (g[j] = 0, s = 0; s < bt.num_real; s++) g[j] += err[s] * feature(bt.indices[s], j);
            running = layer;
            if (sync && (r = layer_done(sync, layer)) != DDP_OK) return r;
            running = -1;
        }
        if (sync && (r = backward_done(sync)) != DDP_OK) return r;
        for (layer = 0; sync && layer < LAYERS && late < 0; layer++)
            if (on_time[layer] != P) late = layer, late_in = -2; /* never marked by ddp_grad_ready() */
        for (j = 0; j < D; j++) w[j] -= 0.5f * g[j] / (float)bt.global_count; /* g: a sum over the global batch */
    }
    return DDP_OK;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler mine, whole;
    ddp_sampler_desc sd = {0};
    ddp_grad sync;
    ddp_grad_desc gd = {0};
    static float w[D], g[D], ref[D], ref_g[D], w0[D];
    float diff = 0, apart = 0, *diffs;
    char hint[512];
    int j, r, ok, same, failed, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;
    sd.dataset_size = N;
    sd.batch_size = BATCH;
    if (ddp_sampler_init(&mine, &ctx, &sd) != DDP_OK) return 1;
    sd.world_size = 1; /* the reference's sampler: one process, the whole global batch */
    sd.batch_size = BATCH * (size_t)ctx.world_size;
    if (ddp_sampler_init(&whole, &ctx, &sd) != DDP_OK) return 1;

    /* template: model = DistributedDataParallel(model). The ranks draw different
       weights; ddp_grad_init gives all of them rank 0's, where the reference starts. */
    for (j = 0; j < D; j++) w[j] = 0.01f * (float)(ctx.rank + 1);
    for (j = 0; j < D; j++) ref[j] = 0.01f;
    gd.grads = g;
    gd.count = D;
    gd.sum = 1; /* the sum over the ranks: train() divides by the global batch */
    gd.bucket_bytes = bucket_bytes();
    gd.params = w;
    if (ddp_grad_init(&sync, &ctx, &gd) != DDP_OK) return 1;

    failed = train(&mine, w, g, &sync) != DDP_OK; /* ddp.h has said why on stderr */
    (void)train(&whole, ref, ref_g, NULL);
    for (j = 0; j < D; j++) diff = fmaxf(diff, fabsf(w[j] - ref[j]));
    if (failed) diff = -1;
    /* every rank's difference from the reference, on every rank: the verdict is the job's */
    if (!(diffs = (float *)malloc(sizeof diff * (size_t)ctx.world_size))) return 1;
    if (ddp_all_gather(&ctx, &diff, diffs, 1, DDP_F32, NULL) != DDP_OK) return 1;
    for (same = 1, failed = 0, r = 0; r < ctx.world_size; r++) {
        failed = failed || diffs[r] < 0;
        same = same && diffs[r] >= 0 && diffs[r] <= 1e-5f;
    }
    /* how far the ranks' weights are apart: rank 0's on every rank */
    memcpy(w0, w, sizeof w0);
    if (ddp_broadcast(&ctx, w0, D, DDP_F32, 0, NULL) != DDP_OK) return 1;
    for (j = 0; j < D; j++) apart = fmaxf(apart, fabsf(w[j] - w0[j]));
    if (ddp_all_reduce(&ctx, &apart, &apart, 1, DDP_F32, DDP_MAX, NULL) != DDP_OK) return 1;
    { /* a layer marked out of turn on any rank is the job's: the first such rank's */
        int mine[2], *all = (int *)malloc(sizeof mine * (size_t)ctx.world_size);
        mine[0] = late, mine[1] = late_in;
        if (!all || ddp_all_gather(&ctx, mine, all, 2, DDP_I32, NULL) != DDP_OK) return 1;
        for (r = 0; r < ctx.world_size && all[2 * r] < 0; r++) {}
        if (r < ctx.world_size) late = all[2 * r], late_in = all[2 * r + 1];
        free(all);
    }
    ok = same && sync.num_buckets == LAYERS && late < 0; /* one problem at a time, the most basic first */
    if (ok) {
        ddp_print(&ctx, TR("correct: after %d steps all %d ranks hold the weights of one process on the global "
                           "batch; %d buckets, numbered in the order they start: bucket 0 is layer %d (the last)\n",
                           "正确：%d 步之后，%d 个 rank 的权重都等于一个进程在全局 batch 上训练出的权重；%d 个桶按开始的"
                           "先后编号：桶 0 是第 %d 层（最后一层）\n"),
                  STEPS, ctx.world_size, LAYERS, LAYERS - 1);
        lesson_one_rank(&ctx, 4);
    } else if (failed) {
        ddp_print(&ctx, TR("wrong: a ddp_grad call failed: %s\n", "错误：一次 ddp_grad 调用失败了：%s\n"), ddp_error(&ctx));
        lesson_hints(&ctx, 4,
                     TR("in one step every element of the gradient must be handed to ddp_grad exactly once "
                        "(layer_done()), and the step must be ended (backward_done()) before the next one begins.",
                        "在一步之内，梯度的每个元素都必须恰好交给 ddp_grad 一次（layer_done()），而且这一步必须在下一步"
                        "开始之前结束（backward_done()）。"),
                     TR("ddp_grad_ready() takes an offset and a count in elements, not bytes, of the flat "
                        "gradient; ddp_grad_finish() ends the step: it starts the buckets that are left and waits "
                        "for all of them.",
                        "ddp_grad_ready() 的参数是连续梯度缓冲区里的偏移和个数，单位是元素而不是字节；ddp_grad_finish() "
                        "结束这一步：它启动剩下的桶，并等待所有的桶完成。"));
    } else if (!same && apart <= 1e-6f) {
        ddp_print(&ctx, TR("wrong: after %d steps the ranks hold the same weights, but not one process's on the "
                           "global batch:",
                           "错误：%d 步之后各 rank 的权重彼此相同，却与一个进程在全局 batch 上训练出的不同："), STEPS);
        lesson_print_ranks(&ctx, diffs, 1e-5f);
        lesson_hints(&ctx, 4,
                     TR("the gradient was summed over the ranks (they agree), then its size changed: ddp_grad hands "
                        "back the sum (gd.sum = 1), which train() divides by the global batch itself. Dividing it "
                        "again, by the number of ranks, makes every step that many times too small.",
                        "梯度已经在各 rank 间求和（它们的权重一致），之后它的大小却被改了：ddp_grad 交回的是和（gd.sum = 1），"
                        "train() 自己会把它除以全局 batch 的大小。再除一次 rank 数，每一步就小了那么多倍。"),
                     TR("backward_done() only waits for ddp_grad; the gradient it leaves in the buffer is the one "
                        "the optimizer needs.",
                        "backward_done() 只需等待 ddp_grad；它留在缓冲区里的梯度就是优化器需要的。"));
    } else if (!same) {
        ddp_print(&ctx, TR("wrong: after %d steps the weights differ from one process's on the global batch:",
                           "错误：%d 步之后，权重与一个进程在全局 batch 上训练出的不同："), STEPS);
        lesson_print_ranks(&ctx, diffs, 1e-5f);
        lesson_hints(&ctx, 4,
                     TR("each rank stepped with the gradient of its own samples only: nothing summed it over the "
                        "ranks. ddp_grad does that once layer_done() hands it each layer and backward_done() "
                        "waits for it (lesson 4's page).",
                        "每个 rank 每一步都只用了自己样本的梯度：没有任何地方在各 rank 间对梯度求和。只要 layer_done() "
                        "把每一层交给 ddp_grad，backward_done() 等它完成，ddp_grad 就会做这件事（见第 4 课的讲义）。"),
                     TR("The region of layer `layer` is the P elements from layer * P on. When backward_done() "
                        "returns, every bucket's all-reduce must be over.",
                        "第 layer 层的区域是从 layer * P 开始的 P 个元素。backward_done() 返回时，所有桶的全归约都"
                        "必须已经完成。"));
    } else if (sync.num_buckets != LAYERS) {
        ddp_print(&ctx, TR("wrong: the gradient goes in %zu bucket(s), want %d, one per layer\n",
                           "错误：梯度被分成了 %zu 个桶，应为 %d 个，每层一个\n"), sync.num_buckets, LAYERS);
        if (bucket_bytes() && sync.num_buckets < LAYERS)
            snprintf(hint, sizeof hint,
                     TR("bucket_bytes() returns %zu bytes, room for %zu layers of %zu bytes in a bucket: its "
                        "all-reduce waits for the last of them, and the layers done before it wait too.",
                        "bucket_bytes() 返回 %zu 字节，一个桶能装下 %zu 个 %zu 字节的层：桶的全归约要等其中最后一层，"
                        "先算完的层也只好一起等。"),
                     bucket_bytes(), bucket_bytes() / (P * sizeof(float)), P * sizeof(float));
        lesson_hints(&ctx, 4,
                     bucket_bytes() && sync.num_buckets < LAYERS ? hint
                     : sync.num_buckets < LAYERS
                         ? TR("bucket_bytes() decides how the gradient is cut into buckets. With ddp.h's default "
                              "(25 MiB) the whole model is one bucket, whose all-reduce cannot start before "
                              "backward has finished every layer: nothing overlaps.",
                              "bucket_bytes() 决定梯度怎样分桶。用 ddp.h 的默认值（25 MiB）时整个模型只有一个桶，它的"
                              "全归约要等反向传播把每一层都算完才能开始：什么也没有重叠。")
                         : TR("bucket_bytes() decides how the gradient is cut into buckets: smaller buckets than a "
                              "layer make more all-reduces, each paying its start-up cost, with nothing more to "
                              "overlap.",
                              "bucket_bytes() 决定梯度怎样分桶：桶比一层还小，全归约的次数就更多，每一次都要付出启动的"
                              "开销，却没有多出可以重叠的东西。"),
                     TR("A layer is P floats; ddp_grad_desc.bucket_bytes counts bytes.",
                        "一层是 P 个 float；ddp_grad_desc.bucket_bytes 的单位是字节。"));
    } else {
        char where[128];
        if (late_in >= 0)
            snprintf(where, sizeof where, TR("marked ready in layer %d's layer_done()",
                                             "是在第 %d 层的 layer_done() 里标记的"), late_in);
        else if (late_in == -1)
            snprintf(where, sizeof where, "%s", TR("marked ready after backward", "是在 backward 结束之后才标记的"));
        else
            snprintf(where, sizeof where, "%s", TR("never marked with ddp_grad_ready()", "从未用 ddp_grad_ready() 标记过"));
        ddp_print(&ctx, TR("wrong: the weights are right, but layer %d's gradient was %s: its bucket could not start "
                           "while backward computed the layers below it\n",
                           "错误：权重是对的，但第 %d 层的梯度%s：backward 计算它下面各层的时候，它的桶没法开始\n"), late,
                  where);
        lesson_hints(&ctx, 4,
                     TR("layer_done(sync, layer) runs the moment layer `layer` is final: that is when its region "
                        "must be marked ready, so that its bucket's all-reduce runs while backward goes on. Marking "
                        "everything at the end gives the right weights, and no overlap.",
                        "layer_done(sync, layer) 在第 layer 层一算完时运行：这时就要把它的区域标记为就绪，这样它那个桶的"
                        "全归约才能在 backward 继续的同时进行。最后一起标记也能得到正确的权重，但什么也没有重叠。"),
                     TR("The region of layer `layer` is the P elements from layer * P on; backward_done() then "
                        "only ends the step.",
                        "第 layer 层的区域是从 layer * P 开始的 P 个元素；backward_done() 之后只需结束这一步。"));
    }
    free(diffs);
    ddp_grad_destroy(&sync);
    ddp_sampler_destroy(&mine);
    ddp_sampler_destroy(&whole);
    if (ddp_destroy(&ctx) != DDP_OK) ok = 0; /* a rank missing at the end fails the job */
    return ok ? 0 : 1;
}
