/* Lesson 1: one program, many processes. Each copy is a rank; each rank owns a device.
       ./examples/lessons/01_launch/ranks --nproc 4
       torchrun --no-python --nproc_per_node 4 ./examples/lessons/01_launch/ranks
   Built with nvcc (ranks_gpu) on a machine with GPUs, rank r works on GPU r. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <stdio.h>
#include <stdlib.h>
#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

enum { N = 4 }; /* numbers each rank holds */

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    float host[N], *data = host; /* `data` is where the numbers live: host or GPU */
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    int i, status;

    /* template: python -m torch.distributed.launch --nproc_per_node=4 xxx.py.
       With --nproc N this process becomes the launcher: it starts N copies of the
       program, each with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT set, and
       waits for them. In a copy (or without --nproc) it returns DDP_WORKER. */
    status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;

    /* template: dist.init_process_group(...); torch.cuda.set_device(local_rank).
       Joins the process group (进程组): rank 0 hosts a small store where the ranks
       meet, then the backend connects them (NCCL with GPUs, shared memory without). */
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1; /* the reason is on stderr */

    /* rank: who I am in the job (0 .. world_size-1); local_rank: who I am on this
       machine; device: my GPU (local_rank, or the only one I see), or -1 on the CPU. */
    ddp_log(&ctx, "rank %d of %d, local rank %d on node %d, device %d, backend %s\n", ctx.rank, ctx.world_size,
            ctx.local_rank, ctx.node_rank, ctx.device, ddp_backend_name(ctx.backend));
    if (ctx.world_size == 1)
        ddp_print(&ctx, "a world of one: no store\n");
    else if (addr && port)
        ddp_print(&ctx, "the store: rank 0 at %s:%s\n", addr, port);
    else /* mpirun, srun, Hydra: their own variables said where rank 0 is, or the port */
        ddp_print(&ctx, "the store: rank 0's, found through the launcher's variables (no MASTER_%s here)\n",
                  addr ? "PORT" : "ADDR");

    for (i = 0; i < N; i++) host[i] = (float)ctx.rank; /* my own data: my rank number */
#ifdef __CUDACC__
    /* template: data = data.cuda(args.local_rank) (note 2). ddp_init has selected this
       rank's GPU for this thread (torch.cuda.set_device), so cudaMalloc allocates there;
       another thread of the program would call cudaSetDevice(ctx.device) first. */
    if (ctx.device >= 0) {
        if (cudaMalloc((void **)&data, sizeof host) != cudaSuccess ||
            cudaMemcpy(data, host, sizeof host, cudaMemcpyHostToDevice) != cudaSuccess) {
            ddp_log(&ctx, "cannot put my data on GPU %d\n", ctx.device);
            return 1;
        }
    }
#endif

    /* The first collective: every rank adds its numbers and gets the sum (lesson 2). */
    if (ddp_all_reduce(&ctx, data, data, N, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;

#ifdef __CUDACC__
    if (ctx.device >= 0) {
        if (cudaMemcpy(host, data, sizeof host, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
        cudaFree(data);
    }
#endif
    /* template: if dist.get_rank() == 0: print(...) (note 7). ddp_print prints on rank 0
       only; ddp_log above printed on every rank, prefixed "[rank r/w]". */
    ddp_print(&ctx, "sum of all ranks' numbers: %g (0 + 1 + ... + %d = %d)\n", host[0], ctx.world_size - 1,
              ctx.world_size * (ctx.world_size - 1) / 2);
    status = host[0] == ctx.world_size * (ctx.world_size - 1) / 2 ? 0 : 1;
    if (ddp_destroy(&ctx) != DDP_OK) status = 1; /* a rank missing at the end fails the job */
    return status;
}
