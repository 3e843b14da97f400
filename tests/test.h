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

#ifdef DDP_H_INCLUDED
/* Element i of a buffer of any ddp dtype, as a double (small integers are exact). */
static inline void test_put(void *buf, ddp_dtype t, size_t i, double v)
{
    switch (t) {
    case DDP_F32: ((float *)buf)[i] = (float)v; break;
    case DDP_F64: ((double *)buf)[i] = v; break;
    case DDP_BF16: ((uint16_t *)buf)[i] = ddp_f32_to_bf16((float)v); break;
    case DDP_F16: ((uint16_t *)buf)[i] = ddp_f32_to_f16((float)v); break;
    case DDP_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    default: ((int64_t *)buf)[i] = (int64_t)v; break;
    }
}

static inline double test_get(const void *buf, ddp_dtype t, size_t i)
{
    switch (t) {
    case DDP_F32: return ((const float *)buf)[i];
    case DDP_F64: return ((const double *)buf)[i];
    case DDP_BF16: return ddp_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DDP_F16: return ddp_f16_to_f32(((const uint16_t *)buf)[i]);
    case DDP_I32: return ((const int32_t *)buf)[i];
    default: return (double)((const int64_t *)buf)[i];
    }
}
#endif

#endif
