/* The first step of make check-gpu: which GPU this is, which driver, runtime and
   NCCL, where the shared libraries the GPU binaries need come from, and whether this
   binary's device code runs on the GPU. A build without this GPU's architecture fails
   here ("no kernel image is available for execution on the device") instead of deep
   inside a test; a missing or unusable GPU is reported with its cause (a FAIL under
   DDP_REQUIRE_GPU=1, which check-gpu sets). The probe links neither NCCL nor cuBLAS
   (it opens them as the loader would), so that a missing one is named, with where
   the loader looked, instead of stopping every binary before main. */
#include "test.h"
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>

__global__ void probe_kernel(int *out) { out[threadIdx.x] = 3 * (int)threadIdx.x + 1; }

/* Opens each library the GPU binaries link (NCCL, and cuBLAS(Lt) of this CUDA major
   version), prints where the loader found it; sets *nccl to NCCL's version. */
static void libraries(int *nccl)
{
    char names[3][32], missing[400] = "";
    const char *ld = getenv("LD_LIBRARY_PATH");
    int i;
    snprintf(names[0], sizeof names[0], "libnccl.so.2");
    snprintf(names[1], sizeof names[1], "libcublasLt.so.%d", CUDART_VERSION / 1000);
    snprintf(names[2], sizeof names[2], "libcublas.so.%d", CUDART_VERSION / 1000);
    for (i = 0; i < 3; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        struct link_map *map = NULL;
        if (!h) {
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", *missing ? ", " : "", names[i]);
            continue;
        }
        if (i == 0) {
            int (*version)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
            if (version) version(nccl);
        }
        printf("%s: %s\n", names[i], dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map ? map->l_name : "(found)");
    }
    CHECK("gpu.libraries", !*missing, "not found: %s; the loader looked in LD_LIBRARY_PATH (%s), its cache "
          "(ldconfig -p) and its default directories; make check-gpu also looks in PyTorch's wheels "
          "(site-packages/nvidia/*/lib)", missing, ld && *ld ? ld : "unset");
}

int main(void)
{
    int n = 0, drv = 0, rt = 0, nccl = 0, i, *d = NULL, h[64], ok = 1;
    cudaError_t e;
    libraries(&nccl);
    if (!test_gpu_ready("gpu.probe")) TEST_EXIT();
    cudaGetDeviceCount(&n);
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
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
