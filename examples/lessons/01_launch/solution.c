/* Lesson 1, solved: split the work. N items, numbered 0 .. N-1, are shared by the
   ranks: each rank takes one contiguous piece, every item must be taken by exactly one
   rank, whatever the number of ranks (10 items do not divide by 3), and the pieces are
   as even as they can be (their sizes differ by one at most).
   Check it from the repository root (it tries 1, 2, 3, 4, 5 and 7 ranks):
       make lesson-1
   Solved: each rank's piece begins where the one before it ends.

   第 1 课答案：分配任务。N 个任务编号为 0 .. N-1，由各个 rank 分担：每个 rank 领走连续的
   一段，而且不管有几个 rank，每个任务都必须恰好被一个 rank 领走（10 个任务不能被 3 整除），
   各段还要尽量一样长（长度最多相差 1）。
   在仓库根目录运行 make lesson-1 检查（它会用 1、2、3、4、5、7 个 rank 各试一次）。
   答案：每个 rank 的那一段从前一个 rank 的结束处开始。 */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../exercise.h"
#include <stdio.h>

enum { N = 10 };

/* This rank's items are [*begin, *end).  本 rank 的任务是 [*begin, *end)。 */
static void my_piece(const ddp_ctx *ctx, int *begin, int *end)
{
    /* multiply first: integer division then spreads the remainder (10 items, 3 ranks: 3 + 3 + 4)
       先乘后除：整数除法会把余数分摊开（10 个任务、3 个 rank：3 + 3 + 4） */
    *begin = ctx->rank * N / ctx->world_size;
    *end = (ctx->rank + 1) * N / ctx->world_size;
}

/* Rank 0 lists the items that more than one rank took (many = 1), or that none took. */
static void print_items(const ddp_ctx *ctx, const int *taken, int many, const char *label)
{
    int i, n = 0;
    for (i = 0; i < N; i++)
        if (many ? taken[i] > 1 : taken[i] == 0) ddp_print(ctx, "%s%d", n++ ? " " : label, i);
    if (n) ddp_print(ctx, "\n");
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    int32_t mine[2], *all;
    int taken[N] = {0}, i, r, ok, inside = 1, least = N, most = 0; /* taken[i]: ranks that took item i */
    int status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    my_piece(&ctx, &mine[0], &mine[1]);
    /* every rank's piece, to every rank: rank r's lands at all[2 r] */
    if (!(all = (int32_t *)malloc(sizeof mine * (size_t)ctx.world_size))) return 1;
    if (ddp_all_gather(&ctx, mine, all, 2, DDP_I32, NULL) != DDP_OK) return 1;
    for (r = 0; r < ctx.world_size; r++) { /* each piece lies in [0, N); the smallest and the largest */
        const int32_t b = all[2 * r], e = all[2 * r + 1];
        inside = inside && 0 <= b && b <= e && e <= N;
        least = e - b < least ? e - b : least;
        most = e - b > most ? e - b : most;
        for (i = b > 0 ? b : 0; i < e && i < N; i++) taken[i]++;
    }

    for (ok = inside && most - least <= 1, i = 0; i < N; i++) ok = ok && taken[i] == 1;
    if (ok) {
        ddp_print(&ctx, TR("correct: each of the %d items was taken by exactly one of %d ranks\n",
                           "正确：%d 个任务中的每一个都恰好被 %d 个 rank 中的一个领走\n"), N, ctx.world_size);
        lesson_one_rank(&ctx, 1);
    } else {
        ddp_print(&ctx, TR("wrong: with %d ranks:", "错误：用 %d 个 rank 时，"), ctx.world_size);
        for (r = 0; r < ctx.world_size; r++)
            ddp_print(&ctx, TR("%srank %d took [%d, %d)", "%srank %d 领了 [%d, %d)"), r ? TR(", ", "，") : TR(" ", ""),
                      r, all[2 * r], all[2 * r + 1]);
        ddp_print(&ctx, "\n");
        print_items(&ctx, taken, 1, TR("  taken more than once: ", "  被领了不止一次的任务："));
        print_items(&ctx, taken, 0, TR("  taken by no rank: ", "  没有 rank 领的任务："));
        if (!inside)
            ddp_print(&ctx, TR("  a piece [begin, end) must lie in [0, %d), with begin <= end\n",
                               "  每一段 [begin, end) 都必须在 [0, %d) 之内，且 begin <= end\n"), N);
        else if (most - least > 1)
            ddp_print(&ctx, TR("  uneven: a piece of %d items beside one of %d (they may differ by one at most)\n",
                               "  不均匀：有一段 %d 个任务，另一段 %d 个（最多只能相差 1）\n"), most, least);
        lesson_hints(&ctx, 1,
                     TR("in my_piece(), the pieces must fit together with no gap and no overlap: rank 0's "
                        "begins at 0, each rank's begins where the one before it ends, and the last one ends at N; "
                        "no piece is more than one item longer than another. A piece depends on ctx->rank and "
                        "ctx->world_size.",
                        "看 my_piece()：各段必须首尾相接，不留空隙也不重叠。rank 0 的那一段从 0 开始，每个 rank "
                        "的那一段从前一个 rank 的结束处开始，最后一段在 N 处结束；任何一段都不能比另一段多出一个以上的"
                        "任务。每一段的位置都取决于 ctx->rank 和 ctx->world_size。"),
                     TR("Rank r's piece begins r / W of the way through the N items and ends (r + 1) / W of the "
                        "way (W = ctx->world_size). In integer arithmetic the order of * and / decides whether "
                        "the remainder is lost. Try your formula by hand for N = 10, W = 3.",
                        "rank r 的那一段从 N 个任务的 r / W 处开始，到 (r + 1) / W 处结束（W = ctx->world_size）。"
                        "整数运算里，先乘还是先除决定了余数会不会丢掉。用 N = 10、W = 3 手算一遍你的公式。"));
    }
    free(all);
    if (ddp_destroy(&ctx) != DDP_OK) ok = 0; /* a rank missing at the end fails the job */
    return ok ? 0 : 1;
}
