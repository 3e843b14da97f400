/* hello_allreduce: the smallest data-parallel program.
   Every rank contributes rank+1; after the all-reduce every rank holds the sum, and
   rank 0 checks it against world*(world+1)/2.
       ./examples/hello_allreduce --nproc 4 */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <stdio.h>
#include <string.h>

/* Its only flags are the launchers' (ddp_launch's --nproc and --max-restarts, the
   --local_rank that torch.distributed.launch passes to ddp_init): --help prints the
   usage (0), anything else is refused in one line (2), before any rank starts. Else -1. */
static int check_flags(int argc, char **argv)
{
    static const char *const launcher[] = {"--nproc", "--nproc_per_node", "--nproc-per-node", "--max-restarts",
                                           "--max_restarts", "--local_rank", "--local-rank", NULL};
    int i, k;
    for (i = 1; i < argc; i++) {
        const size_t n = strcspn(argv[i], "="); /* the flag's name: a value follows it or its = */
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: hello_allreduce [--nproc N] [--max-restarts N] [--help]   (or under torchrun, mpirun, "
                   "srun, ddprun)\n");
            return 0;
        }
        for (k = 0; launcher[k] && !(strlen(launcher[k]) == n && strncmp(argv[i], launcher[k], n) == 0); k++) {}
        if (!launcher[k]) {
            fprintf(stderr, "hello_allreduce: unknown argument '%s' (hello_allreduce --help lists the flags)\n",
                    argv[i]);
            return 2;
        }
        i += argv[i][n] == 0;
    }
    return -1;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    float x;
    int status = check_flags(argc, argv);
    if (status >= 0) return status;
    status = ddp_launch(&argc, argv); /* "--nproc N": this process starts N ranks */
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
