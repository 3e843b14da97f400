/* tests/test.h - the smallest possible test harness.
   Each check prints one line: "PASS name", "FAIL name: why" or "SKIP name: why".
   tests/run.sh counts those lines over all test programs; a program that exits
   non-zero without printing a FAIL line is counted as one failure. */
#ifndef DDP_TEST_H
#define DDP_TEST_H
#include <stdio.h>
#include <stdarg.h>

static int test_failures_;

static inline void test_report(int ok, const char *name, const char *fmt, ...)
{
    if (ok) {
        printf("PASS %s\n", name);
    } else {
        va_list ap;
        printf("FAIL %s: ", name);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
        test_failures_++;
    }
    fflush(stdout);
}

static inline void test_skip(const char *name, const char *why)
{
    printf("SKIP %s: %s\n", name, why);
    fflush(stdout);
}

/* CHECK(name, cond, fmt, ...) reports cond; the message explains a failure. */
#define CHECK(name, cond, ...) test_report((cond) ? 1 : 0, (name), __VA_ARGS__)
#define TEST_EXIT() return test_failures_ ? 1 : 0

#endif
