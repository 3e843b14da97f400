/* tests/emu/cuda_bf16.h - __nv_bfloat16 for the CUDA emulator: the upper 16 bits of an
   IEEE float, converted from float by rounding to nearest even (NaN stays NaN), to
   float exactly, as the GPU converts. Arithmetic goes through float, as ddp_kernels.cuh
   writes it; the bf16 operators of CUDA's own header (sm_80 bf16 math) are not here. */
#ifndef EMU_CUDA_BF16_H
#define EMU_CUDA_BF16_H
#include "cuda_runtime.h"

namespace emu {
static inline unsigned short float_to_bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40); /* a quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (unsigned short)(u >> 16);
}
static inline float bf16_bits_to_float(unsigned short h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
} // namespace emu

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(emu::float_to_bf16_bits(f)) {}
    __nv_bfloat16(double d) : __x(emu::float_to_bf16_bits((float)d)) {}
    __nv_bfloat16(int i) : __x(emu::float_to_bf16_bits((float)i)) {}
    operator float() const { return emu::bf16_bits_to_float(__x); }
};
typedef __nv_bfloat16 nv_bfloat16;

static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return emu::bf16_bits_to_float(h.__x); }
#endif
