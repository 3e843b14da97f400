/* tests/emu/emu_blas.cpp - cuBLAS (cublasGemmEx), cuBLASLt (descriptors, heuristic,
   cublasLtMatmul) and CUB's radix sort for the CUDA emulator.

   A product is checked when it is called: shapes against leading dimensions, every
   operand's extent (from rows, columns, leading dimension and transpose) inside
   device memory of the handle's device, the workspace inside its allocation; then it
   is queued on its stream like any other work. It runs as cuBLAS computes: D = alpha
   op(A) op(B) + beta C (+ bias per row of D), column-major, products summed in fp32
   (fp32 inputs rounded to TF32 first under CUBLAS_COMPUTE_32F_FAST_TF32), C not read
   when beta is 0, the result rounded once to D's type. The sum runs in four partial
   sums (not cuBLAS's order: results match to fp32 rounding, not bit for bit). With
   DDP_EMU_SAMPLE=1 only the 16 first and last rows and columns of D are computed.

   cuBLASLt's heuristic is modelled on its alignment rules (see cublasLt.h): it is
   what makes ddp_kernels.cuh take its cublasGemmEx fallback, so that path runs here. */
#include "cub/device/device_radix_sort.cuh"
#include "cublasLt.h"
#include "cuda_bf16.h"
#include "emu_internal.h"
#include <algorithm>
#include <memory>
#include <numeric>
#include <stdio.h>
#include <vector>

using namespace emu;

namespace {
const uint32_t LT_HANDLE = 0x4c74684e, LT_DESC = 0x4c746473, LT_LAYOUT = 0x4c746c79, LT_PREF = 0x4c747066,
               LT_ALGO = 0x4c74616c, BLAS_HANDLE = 0x426c6173;

struct lt_handle { uint32_t magic; int device; };
struct blas_handle { uint32_t magic; int device; cudaStream_t stream; };
struct lt_desc {
    uint32_t magic;
    int compute, scale, ta, tb, epilogue, bias_type;
    const void *bias;
};
struct lt_layout {
    uint32_t magic;
    int type;
    uint64_t rows, cols;
    int64_t ld;
};
struct lt_pref {
    uint32_t magic;
    uint64_t workspace;
    uint32_t align[4]; /* A, B, C, D */
};
/* what cublasLtMatmulAlgo_t carries: the alignments its kernels assume */
struct lt_algo {
    uint32_t magic;
    uint32_t align[5]; /* A, B, C, D, bias */
    int tin, tout;
};
static_assert(sizeof(lt_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "descriptor too large");
static_assert(sizeof(lt_layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout too large");
static_assert(sizeof(lt_pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "preference too large");
static_assert(sizeof(lt_algo) <= sizeof(cublasLtMatmulAlgo_t), "algo too large");

size_t type_size(int t)
{
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_16F: case CUDA_R_16BF: return 2;
    default: return 0;
    }
}

float load(const void *p, int t, size_t i)
{
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_64F: return (float)((const double *)p)[i];
    case CUDA_R_16BF: return bf16_bits_to_float(((const uint16_t *)p)[i]);
    default: return half_to_float(((const uint16_t *)p)[i]);
    }
}

void store(void *p, int t, size_t i, float v)
{
    switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = v; break;
    case CUDA_R_64F: ((double *)p)[i] = v; break;
    case CUDA_R_16BF: ((uint16_t *)p)[i] = float_to_bf16_bits(v); break;
    default: ((uint16_t *)p)[i] = float_to_half(v); break;
    }
}

float tf32(float x) /* round to TF32: 10 bits of mantissa, to nearest even */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1)) & ~0x1fffu;
    memcpy(&x, &u, 4);
    return x;
}

/* One product, as queued. */
struct gemm {
    bool ta, tb, tf32;
    int64_t m, n, k;
    const void *A, *B, *C, *bias;
    void *D;
    int tA, tB, tC, tD, tbias;
    int64_t lda, ldb, ldc, ldd;
    float alpha, beta;
};

std::vector<int64_t> sampled(int64_t n)
{
    std::vector<int64_t> v;
    for (int64_t i = 0; i < n; i++) {
        if (cfg.sample && n > 64 && i == 16) i = n - 16;
        v.push_back(i);
    }
    return v;
}

/* cuBLAS's kernels are device code: multiply-adds fused as the emulated kernels' are */
DDP_EMU_DEVICE_CODE void run(const gemm &g)
{
    const std::vector<int64_t> rows = sampled(g.m), cols = sampled(g.n);
    const int64_t k = g.k;
    std::vector<float> a(rows.size() * (size_t)k), b(cols.size() * (size_t)k); /* op(A) rows, op(B) columns */
    for (size_t r = 0; r < rows.size(); r++)
        for (int64_t x = 0; x < k; x++) {
            const size_t i = (size_t)(g.ta ? x + rows[r] * g.lda : rows[r] + x * g.lda);
            const float v = load(g.A, g.tA, i);
            a[r * (size_t)k + (size_t)x] = g.tf32 ? tf32(v) : v;
        }
    for (size_t c = 0; c < cols.size(); c++)
        for (int64_t x = 0; x < k; x++) {
            const size_t i = (size_t)(g.tb ? cols[c] + x * g.ldb : x + cols[c] * g.ldb);
            const float v = load(g.B, g.tB, i);
            b[c * (size_t)k + (size_t)x] = g.tf32 ? tf32(v) : v;
        }
    for (size_t c = 0; c < cols.size(); c++)
        for (size_t r = 0; r < rows.size(); r++) {
            const float *x = &a[r * (size_t)k], *y = &b[c * (size_t)k];
            float s[4] = {0, 0, 0, 0};
            int64_t i = 0;
            for (; i + 4 <= k; i += 4)
                for (int j = 0; j < 4; j++) s[j] += x[i + j] * y[i + j];
            for (; i < k; i++) s[0] += x[i] * y[i];
            float v = g.alpha * ((s[0] + s[1]) + (s[2] + s[3]));
            if (g.beta != 0.0f) v += g.beta * load(g.C, g.tC, (size_t)(rows[r] + cols[c] * g.ldc));
            if (g.bias) v += load(g.bias, g.tbias, (size_t)rows[r]);
            store(g.D, g.tD, (size_t)(rows[r] + cols[c] * g.ldd), v);
        }
}

/* the extent of a column-major (rows, cols) matrix with leading dimension ld */
size_t extent(int64_t rows, int64_t cols, int64_t ld, int t)
{
    if (rows == 0 || cols == 0) return 0;
    return (size_t)((cols - 1) * ld + rows) * type_size(t);
}

void check_operand(const char *call, const char *name, const void *p, int64_t rows, int64_t cols, int64_t ld, int t,
                   int device)
{
    char what[200];
    snprintf(what, sizeof what, "%s: %s (%lld x %lld, ld %lld, %zu-byte elements)", call, name, (long long)rows,
             (long long)cols, (long long)ld, type_size(t));
    check_range(p, extent(rows, cols, ld, t), device, 1, what);
}

/* Checks a product and queues it; the status cuBLAS would return. */
cublasStatus_t submit(const char *call, int device, cudaStream_t h, const gemm &g)
{
    const int64_t ar = g.ta ? g.k : g.m, ac = g.ta ? g.m : g.k, br = g.tb ? g.n : g.k, bc = g.tb ? g.k : g.n;
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.lda < std::max<int64_t>(1, ar) || g.ldb < std::max<int64_t>(1, br) ||
        g.ldd < std::max<int64_t>(1, g.m) || (g.beta != 0.0f && g.ldc < std::max<int64_t>(1, g.m)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!type_size(g.tA) || !type_size(g.tB) || !type_size(g.tD) || g.tA != g.tB) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
    check_operand(call, "A", g.A, ar, ac, g.lda, g.tA, device);
    check_operand(call, "B", g.B, br, bc, g.ldb, g.tB, device);
    if (g.beta != 0.0f) check_operand(call, "C", g.C, g.m, g.n, g.ldc, g.tC, device);
    check_operand(call, "D", g.D, g.m, g.n, g.ldd, g.tD, device);
    if (g.bias) check_operand(call, "the bias", g.bias, g.m, 1, g.m, g.tbias, device);
    cudaError_t e;
    stream *s = stream_of(h, device, &e);
    if (!s) return CUBLAS_STATUS_INVALID_VALUE;
    enqueue(s, call, [g]() { run(g); });
    return CUBLAS_STATUS_SUCCESS;
}

uint32_t alignment(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a /= 2;
    return a;
}

const char *status_string(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "unknown status";
    }
}

template <class T> T *checked(void *p, uint32_t magic, const char *call, const char *what)
{
    if (!p || ((T *)p)->magic != magic) report("%s: %p is not a live %s", call, p, what);
    return (T *)p;
}
} // namespace

/* ---- cuBLAS ---- */
cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    init();
    const int d = current_device("cublasCreate");
    if (d < 0) return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = (cublasHandle_t)(void *)new blas_handle{BLAS_HANDLE, d, NULL};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    checked<blas_handle>(handle, BLAS_HANDLE, "cublasDestroy", "cuBLAS handle")->magic = 0; /* kept: a later use is named */
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    checked<blas_handle>(handle, BLAS_HANDLE, "cublasSetStream", "cuBLAS handle")->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream)
{
    *stream = checked<blas_handle>(handle, BLAS_HANDLE, "cublasGetStream", "cuBLAS handle")->stream;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s) { return status_string(s); }
const char *cublasGetStatusName(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
    }
}

namespace {
/* the product of cublasGemmEx's arguments (alpha and beta fp32, D = C) */
gemm blas_gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, const void *alpha, const void *A,
               cudaDataType_t Atype, int lda, const void *B, cudaDataType_t Btype, int ldb, const void *beta, void *C,
               cudaDataType_t Ctype, int ldc, cublasComputeType_t compute)
{
    gemm g;
    g.ta = transa != CUBLAS_OP_N, g.tb = transb != CUBLAS_OP_N;
    g.tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32 && Atype == CUDA_R_32F;
    g.m = m, g.n = n, g.k = k;
    g.A = A, g.B = B, g.C = C, g.D = C, g.bias = NULL;
    g.tA = Atype, g.tB = Btype, g.tC = Ctype, g.tD = Ctype, g.tbias = Ctype;
    g.lda = lda, g.ldb = ldb, g.ldc = ldc, g.ldd = ldc;
    g.alpha = *(const float *)alpha, g.beta = *(const float *)beta;
    return g;
}

bool blas_compute_ok(cublasComputeType_t c)
{
    return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_FAST_TF32 || c == CUBLAS_COMPUTE_32F_PEDANTIC;
}
} // namespace

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t)
{
    blas_handle *h = checked<blas_handle>(handle, BLAS_HANDLE, "cublasGemmEx", "cuBLAS handle");
    if (!blas_compute_ok(compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
    return submit("cublasGemmEx", h->device, h->stream,
                  blas_gemm(transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, compute));
}

/* each batch entry checked and queued as a product of its own */
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType_t Atype,
                                          int lda, long long strideA, const void *B, cudaDataType_t Btype, int ldb,
                                          long long strideB, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t compute, cublasGemmAlgo_t)
{
    const char *call = "cublasGemmStridedBatchedEx";
    blas_handle *h = checked<blas_handle>(handle, BLAS_HANDLE, call, "cuBLAS handle");
    if (!blas_compute_ok(compute) || !type_size(Atype) || !type_size(Btype) || !type_size(Ctype))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (batchCount < 0 || strideA < 0 || strideB < 0 || strideC < 0) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < batchCount; i++) {
        const cublasStatus_t s = submit(
            call, h->device, h->stream,
            blas_gemm(transa, transb, m, n, k, alpha, (const char *)A + (size_t)i * strideA * type_size(Atype), Atype, lda,
                      (const char *)B + (size_t)i * strideB * type_size(Btype), Btype, ldb, beta,
                      (char *)C + (size_t)i * strideC * type_size(Ctype), Ctype, ldc, compute));
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLASLt ---- */
cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    init();
    const int d = current_device("cublasLtCreate");
    if (d < 0) return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = (cublasLtHandle_t)(void *)new lt_handle{LT_HANDLE, d};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    checked<lt_handle>(handle, LT_HANDLE, "cublasLtDestroy", "cuBLASLt handle")->magic = 0;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t s) { return status_string(s); }
const char *cublasLtGetStatusName(cublasStatus_t s) { return cublasGetStatusName(s); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute, cudaDataType_t scale)
{
    lt_desc *d = (lt_desc *)calloc(1, sizeof(cublasLtMatmulDescOpaque_t));
    d->magic = LT_DESC;
    d->compute = compute, d->scale = scale, d->epilogue = CUBLASLT_EPILOGUE_DEFAULT, d->bias_type = -1;
    *desc = (cublasLtMatmulDesc_t)(void *)d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    checked<lt_desc>(desc, LT_DESC, "cublasLtMatmulDescDestroy", "matmul descriptor")->magic = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size)
{
    lt_desc *d = checked<lt_desc>(desc, LT_DESC, "cublasLtMatmulDescSetAttribute", "matmul descriptor");
    int32_t v = 0;
    if (attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER) {
        if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->bias, buf, sizeof(void *));
        return CUBLAS_STATUS_SUCCESS;
    }
    if (size != 4) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&v, buf, 4);
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: d->compute = v; break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: d->scale = v; break;
    case CUBLASLT_MATMUL_DESC_TRANSA: d->ta = v != CUBLAS_OP_N; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: d->tb = v != CUBLAS_OP_N; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (v != CUBLASLT_EPILOGUE_DEFAULT && v != CUBLASLT_EPILOGUE_BIAS) return CUBLAS_STATUS_NOT_SUPPORTED;
        d->epilogue = v;
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: d->bias_type = v; break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type, uint64_t rows, uint64_t cols,
                                          int64_t ld)
{
    if (!type_size(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    lt_layout *l = (lt_layout *)calloc(1, sizeof(cublasLtMatrixLayoutOpaque_t));
    l->magic = LT_LAYOUT;
    l->type = type, l->rows = rows, l->cols = cols, l->ld = ld;
    *layout = (cublasLtMatrixLayout_t)(void *)l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    checked<lt_layout>(layout, LT_LAYOUT, "cublasLtMatrixLayoutDestroy", "matrix layout")->magic = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    lt_pref *p = (lt_pref *)calloc(1, sizeof(cublasLtMatmulPreferenceOpaque_t));
    p->magic = LT_PREF;
    for (int i = 0; i < 4; i++) p->align[i] = 256; /* cuBLASLt's default: aligned pointers assumed */
    *pref = (cublasLtMatmulPreference_t)(void *)p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    checked<lt_pref>(pref, LT_PREF, "cublasLtMatmulPreferenceDestroy", "matmul preference")->magic = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf, size_t size)
{
    lt_pref *p = checked<lt_pref>(pref, LT_PREF, "cublasLtMatmulPreferenceSetAttribute", "matmul preference");
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != 8) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->workspace, buf, 8);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        if (size != 4) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
        return CUBLAS_STATUS_SUCCESS;
    }
    return attr == CUBLASLT_MATMUL_PREF_SEARCH_MODE ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

namespace {
/* m, n, k from the layouts, or false when they do not fit together */
bool shape(const lt_desc *d, const lt_layout *a, const lt_layout *b, const lt_layout *c, const lt_layout *dd,
           int64_t *m, int64_t *n, int64_t *k)
{
    *m = (int64_t)dd->rows, *n = (int64_t)dd->cols, *k = (int64_t)(d->ta ? a->rows : a->cols);
    return (int64_t)(d->ta ? a->cols : a->rows) == *m && (int64_t)(d->tb ? b->rows : b->cols) == *n &&
           (int64_t)(d->tb ? b->cols : b->rows) == *k && c->rows == dd->rows && c->cols == dd->cols &&
           a->ld >= (int64_t)std::max<uint64_t>(1, a->rows) && b->ld >= (int64_t)std::max<uint64_t>(1, b->rows) &&
           dd->ld >= (int64_t)std::max<uint64_t>(1, dd->rows) && c->ld >= (int64_t)std::max<uint64_t>(1, c->rows);
}

/* the alignment the emulated kernels need for an operand of type t: 16 bytes for
   16-bit types (128-bit loads), 4 for fp32 and wider */
uint32_t needed(int t) { return type_size(t) == 2 ? 16 : 4; }
} // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
                                              cublasLtMatrixLayout_t Ddesc, cublasLtMatmulPreference_t pref,
                                              int requested, cublasLtMatmulHeuristicResult_t results[], int *count)
{
    const char *call = "cublasLtMatmulAlgoGetHeuristic";
    checked<lt_handle>(handle, LT_HANDLE, call, "cuBLASLt handle");
    lt_desc *d = checked<lt_desc>(op, LT_DESC, call, "matmul descriptor");
    lt_layout *a = checked<lt_layout>(Adesc, LT_LAYOUT, call, "layout"), *b = checked<lt_layout>(Bdesc, LT_LAYOUT, call, "layout");
    lt_layout *c = checked<lt_layout>(Cdesc, LT_LAYOUT, call, "layout"), *dd = checked<lt_layout>(Ddesc, LT_LAYOUT, call, "layout");
    lt_pref *p = checked<lt_pref>(pref, LT_PREF, call, "matmul preference");
    int64_t m, n, k;
    *count = 0;
    if (requested <= 0 || !shape(d, a, b, c, dd, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
    if (a->type != b->type || c->type != dd->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    const int bias_type = d->bias_type >= 0 ? d->bias_type : dd->type;
    const lt_layout *ls[4] = {a, b, c, dd};
    lt_algo al;
    memset(&al, 0, sizeof al);
    al.magic = LT_ALGO;
    for (int i = 0; i < 4; i++) {
        const uint32_t need = needed(ls[i]->type);
        if (p->align[i] < need || (uint64_t)ls[i]->ld * type_size(ls[i]->type) % need) return CUBLAS_STATUS_NOT_SUPPORTED;
        al.align[i] = need;
    }
    if (d->epilogue == CUBLASLT_EPILOGUE_BIAS) {
        if (!d->bias || alignment(d->bias) < needed(bias_type)) return CUBLAS_STATUS_NOT_SUPPORTED;
        al.align[4] = needed(bias_type);
    }
    al.tin = a->type, al.tout = dd->type;
    memset(&results[0], 0, sizeof results[0]);
    memcpy(&results[0].algo, &al, sizeof al);
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    const char *call = "cublasLtMatmul";
    lt_handle *h = checked<lt_handle>(handle, LT_HANDLE, call, "cuBLASLt handle");
    lt_desc *d = checked<lt_desc>(op, LT_DESC, call, "matmul descriptor");
    lt_layout *a = checked<lt_layout>(Adesc, LT_LAYOUT, call, "layout"), *b = checked<lt_layout>(Bdesc, LT_LAYOUT, call, "layout");
    lt_layout *c = checked<lt_layout>(Cdesc, LT_LAYOUT, call, "layout"), *dd = checked<lt_layout>(Ddesc, LT_LAYOUT, call, "layout");
    int64_t m, n, k;
    lt_algo al;
    if (!shape(d, a, b, c, dd, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!algo) return CUBLAS_STATUS_NOT_SUPPORTED; /* the emulation has no default algorithm search */
    memcpy(&al, algo, sizeof al);
    if (al.magic != LT_ALGO || al.tin != a->type || al.tout != dd->type) return CUBLAS_STATUS_INVALID_VALUE;
    const void *ptrs[5] = {A, B, C, D, d->epilogue == CUBLASLT_EPILOGUE_BIAS ? d->bias : NULL};
    static const char *names[5] = {"A", "B", "C", "D", "the bias"};
    for (int i = 0; i < 5; i++)
        if (ptrs[i] && alignment(ptrs[i]) < al.align[i])
            report("%s: %s at %p is %u-byte aligned, but the algorithm was chosen for %u-byte alignment (a GPU "
                   "faults on the misaligned loads): plan with the pointers' own alignment", call, names[i], ptrs[i],
                   alignment(ptrs[i]), al.align[i]);
    if (workspace_bytes) check_range(workspace, workspace_bytes, h->device, 0, "cublasLtMatmul: the workspace");
    gemm g;
    g.ta = d->ta, g.tb = d->tb;
    g.tf32 = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a->type == CUDA_R_32F;
    g.m = m, g.n = n, g.k = k;
    g.A = A, g.B = B, g.C = C, g.D = D;
    g.bias = d->epilogue == CUBLASLT_EPILOGUE_BIAS ? d->bias : NULL;
    g.tA = a->type, g.tB = b->type, g.tC = c->type, g.tD = dd->type, g.tbias = d->bias_type >= 0 ? d->bias_type : dd->type;
    g.lda = a->ld, g.ldb = b->ld, g.ldc = c->ld, g.ldd = dd->ld;
    g.alpha = *(const float *)alpha, g.beta = *(const float *)beta;
    return submit(call, h->device, stream, g);
}

/* ---- CUB ---- */
namespace emu {
cudaError_t radix_sort(void *temp, size_t *temp_bytes, const void *keys_in, void *keys_out, size_t ks, bool key_signed,
                       const void *values_in, void *values_out, size_t vs, long long n, int begin_bit, int end_bit,
                       cudaStream_t h)
{
    const size_t need = (size_t)(n > 0 ? n : 0) * (ks + vs) + 256;
    if (!temp) {
        *temp_bytes = need;
        return cudaSuccess;
    }
    init();
    const int device = current_device("cub::DeviceRadixSort");
    if (device < 0) return cudaErrorNoDevice;
    if (begin_bit < 0 || end_bit <= begin_bit || end_bit > (int)ks * 8 || n < 0) return cudaErrorInvalidValue;
    if (*temp_bytes < need) {
        note("cub::DeviceRadixSort: temp_storage_bytes is %zu, the size query said %zu: cudaErrorInvalidValue",
             *temp_bytes, need);
        return cudaErrorInvalidValue;
    }
    if (n == 0) return cudaSuccess;
    const size_t nk = (size_t)n * ks, nv = (size_t)n * vs;
    check_range(temp, *temp_bytes, device, 0, "cub::DeviceRadixSort: the temp storage");
    check_range(keys_in, nk, device, 0, "cub::DeviceRadixSort: keys_in");
    check_range(keys_out, nk, device, 0, "cub::DeviceRadixSort: keys_out");
    if (values_in) check_range(values_in, nv, device, 0, "cub::DeviceRadixSort: values_in");
    if (values_out) check_range(values_out, nv, device, 0, "cub::DeviceRadixSort: values_out");
    struct range { const void *p; size_t n; const char *name; } rs[5] = {
        {temp, *temp_bytes, "the temp storage"}, {keys_in, nk, "keys_in"}, {keys_out, nk, "keys_out"},
        {values_in, values_in ? nv : 0, "values_in"}, {values_out, values_out ? nv : 0, "values_out"}};
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++) {
            const char *x = (const char *)rs[i].p, *y = (const char *)rs[j].p;
            if (rs[i].n && rs[j].n && x < y + rs[j].n && y < x + rs[i].n &&
                !(i == 1 && j == 2 && x == y) && !(i == 3 && j == 4 && x == y))
                report("cub::DeviceRadixSort: %s and %s overlap", rs[i].name, rs[j].name);
        }
    cudaError_t e;
    stream *s = stream_of(h, device, &e);
    if (!s) return e;
    enqueue(s, "cub::DeviceRadixSort", [=]() {
        std::vector<uint64_t> key((size_t)n);
        const uint64_t mask = (end_bit - begin_bit >= 64 ? ~0ull : (1ull << (end_bit - begin_bit)) - 1);
        for (size_t i = 0; i < (size_t)n; i++) {
            uint64_t u = 0;
            memcpy(&u, (const char *)keys_in + i * ks, ks);
            if (key_signed) u ^= 1ull << (ks * 8 - 1); /* CUB orders signed keys numerically */
            key[i] = (u >> begin_bit) & mask;
        }
        std::vector<size_t> order((size_t)n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return key[x] < key[y]; });
        std::vector<char> kout(nk), vout(nv);
        for (size_t i = 0; i < (size_t)n; i++) {
            memcpy(&kout[i * ks], (const char *)keys_in + order[i] * ks, ks);
            if (values_in) memcpy(&vout[i * vs], (const char *)values_in + order[i] * vs, vs);
        }
        memset(temp, 0xab, need); /* CUB leaves its temp storage in an unspecified state */
        memcpy(keys_out, kout.data(), nk);
        if (values_out) memcpy(values_out, vout.data(), nv);
    });
    return cudaSuccess;
}
} // namespace emu
