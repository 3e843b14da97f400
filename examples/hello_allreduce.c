/* hello_allreduce: the smallest data-parallel program.
   Every rank contributes rank+1; after the all-reduce every rank holds the sum, and
   rank 0 checks it against world*(world+1)/2.
       ./examples/hello_allreduce --nproc 4 */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <stdio.h>

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    float x;
    int status = ddp_launch(&argc, argv); /* "--nproc N": this process starts N ranks */
    if (status != DDP_WORKER) return status;

    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1; /* the reason is already on stderr */

    x = (float)(ctx.rank + 1);
    if (ddp_all_reduce(&ctx, &x, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;

    ddp_log(&ctx, "my sum is %g\n", x); /* every rank, prefixed */
    ddp_print(&ctx, "sum %g, expected %d, world %d, backend %s\n", x,
              ctx.world_size * (ctx.world_size + 1) / 2, ctx.world_size,
              ddp_backend_name(ctx.backend)); /* rank 0 only */
    status = x == ctx.world_size * (ctx.world_size + 1) / 2 ? 0 : 1;
    if (ddp_destroy(&ctx) != DDP_OK) status = 1; /* a rank missing at the end: the job failed */
    return status;
}
