/* tests/emu/avx512.h - the five AVX-512 intrinsics ddp_kernels.cuh's 12 x 32 matmul tile uses,
   in plain C, lane by lane (fmaf per lane: the bits of the hardware's vfmadd231ps), so that
   the tile's logic runs and is checked bit for bit on CPUs without AVX-512. Included ahead
   of the header with DDP__AVX512_STANDIN defined (tests/test_kernels_isa.sh):
       cc -DDDP__AVX512_STANDIN -include tests/emu/avx512.h ... tests/test_kernels.c */
#ifndef DDP_EMU_AVX512_H
#define DDP_EMU_AVX512_H
#include <math.h>
typedef struct { float f[16]; } __m512;
static inline __m512 _mm512_loadu_ps(const float *p)
{
    __m512 r;
    for (int i = 0; i < 16; i++) r.f[i] = p[i];
    return r;
}
static inline void _mm512_storeu_ps(float *p, __m512 v)
{
    for (int i = 0; i < 16; i++) p[i] = v.f[i];
}
static inline __m512 _mm512_set1_ps(float x)
{
    __m512 r;
    for (int i = 0; i < 16; i++) r.f[i] = x;
    return r;
}
static inline __m512 _mm512_setzero_ps(void) { return _mm512_set1_ps(0.0f); }
static inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c)
{
    for (int i = 0; i < 16; i++) c.f[i] = fmaf(a.f[i], b.f[i], c.f[i]);
    return c;
}
#endif
