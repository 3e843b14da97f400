/* exercise.h - what every exercise (and its solution) shares: the verdict, and hints in
   English or in Chinese. Chinese when the locale says so (the first of LC_ALL,
   LC_MESSAGES, LANG that is set starts with "zh", e.g. LANG=zh_CN.UTF-8), English
   otherwise. A wrong answer gets the first hint (what is wrong, where to look);
   HINT=2 adds a second, closer one. No hint gives the answer: solution.c does.

   exercise.h - 每道练习（及其答案）共用的部分：判定结果，以及英文或中文的提示。
   语言由环境决定：LC_ALL、LC_MESSAGES、LANG 中第一个设置了的变量以 "zh" 开头
   （例如 LANG=zh_CN.UTF-8）时用中文，否则用英文。答错时给出第一条提示（错在哪里、
   该看哪里）；设置 HINT=2 会再给出第二条更具体的提示。提示从不直接给出答案，答案见
   solution.c。 */
#ifndef LESSON_EXERCISE_H
#define LESSON_EXERCISE_H
#include <stdlib.h>
#include <string.h>

/* 1 when the messages should be in Chinese. */
static inline int lesson_zh(void)
{
    static const char *const names[] = {"LC_ALL", "LC_MESSAGES", "LANG"};
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return strncmp(v, "zh", 2) == 0;
    }
    return 0;
}

/* The text in the reader's language; a macro, so that the compiler still checks a
   format string's arguments against both translations. */
#define TR(en, zh) (lesson_zh() ? (zh) : (en))

/* Rank 0 lists the ranks whose difference (diffs[r] for rank r) is above tol, then ends
   the line. */
static inline void lesson_print_ranks(const ddp_ctx *ctx, const float *diffs, float tol)
{
    int r, n = 0;
    for (r = 0; r < ctx->world_size; r++)
        if (diffs[r] > tol)
            ddp_print(ctx, TR("%srank %d by %g", "%srank %d 相差 %g"), n++ ? TR(", ", "，") : TR(" ", ""), r, diffs[r]);
    ddp_print(ctx, "\n");
}

/* After rank 0's "correct" line: one rank cannot show that the ranks work together. */
static inline void lesson_one_rank(const ddp_ctx *ctx, int lesson)
{
    if (ctx->world_size == 1)
        ddp_print(ctx, TR("(one rank only: an answer that ignores the other ranks passes too; make lesson-%d "
                          "checks 1 to 7 ranks)\n",
                          "（只有一个 rank：不理会其他 rank 的答案也能通过；make lesson-%d 会用 1 到 7 个 rank 检查）\n"),
                  lesson);
}

/* Rank 0 prints the hints: the first always, the second with HINT=2 (else how to get it).
   `lesson` is the number in `make lesson-N`. */
static inline void lesson_hints(const ddp_ctx *ctx, int lesson, const char *first, const char *second)
{
    const char *h = getenv("HINT");
    ddp_print(ctx, TR("hint 1: %s\n", "提示 1：%s\n"), first);
    if (h && atoi(h) >= 2)
        ddp_print(ctx, TR("hint 2: %s\n", "提示 2：%s\n"), second);
    else
        ddp_print(ctx, TR("(a closer hint: make lesson-%d HINT=2)\n", "（更具体的提示：make lesson-%d HINT=2）\n"), lesson);
}
#endif
