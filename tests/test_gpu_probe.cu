/* The first step of make check-gpu: which GPU this is, which driver, runtime and
   NCCL, and whether this binary's device code runs on it. A build without this
   GPU's architecture fails here ("no kernel image is available for execution on
   the device") instead of deep inside a test; a missing or unusable GPU is reported
   with its cause (a FAIL under DDP_REQUIRE_GPU=1, which check-gpu sets). */
#include "test.h"
#include <cuda_runtime.h>
#include <nccl.h>

__global__ void probe_kernel(int *out) { out[threadIdx.x] = 3 * (int)threadIdx.x + 1; }

int main(void)
{
    int n = 0, drv = 0, rt = 0, nccl = 0, i, *d = NULL, h[64], ok = 1;
    cudaError_t e;
    if (!test_gpu_ready("gpu.probe")) TEST_EXIT();
    cudaGetDeviceCount(&n);
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    ncclGetVersion(&nccl);
    printf("driver %d.%d, runtime %d.%d, NCCL %d.%d.%d, %d device(s)\n", drv / 1000, drv % 1000 / 10, rt / 1000,
           rt % 1000 / 10, nccl / 10000, nccl / 100 % 100, nccl % 100, n);
    for (i = 0; i < n; i++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        printf("device %d: %s, sm_%d%d, %.1f GiB, %d SMs\n", i, p.name, p.major, p.minor,
               (double)p.totalGlobalMem / (1 << 30), p.multiProcessorCount);
    }
    test_report(1, "gpu.probe", "");
    /* device code from this build runs here */
    e = cudaMalloc((void **)&d, sizeof h);
    if (e == cudaSuccess) {
        probe_kernel<<<1, 64>>>(d);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    for (i = 0; i < 64 && e == cudaSuccess; i++) ok &= h[i] == 3 * i + 1;
    CHECK("gpu.kernel_image_runs", e == cudaSuccess && ok, "%s",
          e != cudaSuccess ? cudaGetErrorString(e) : "the kernel ran but wrote wrong values");
    cudaFree(d);
    TEST_EXIT();
}
