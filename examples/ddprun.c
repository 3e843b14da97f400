/* ddprun: run any program as N ranks of one job on this host, like
   `torchrun --nproc_per_node=N`. Each copy gets RANK, WORLD_SIZE, LOCAL_RANK,
   LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port) and a job id; Ctrl-C and
   SIGTERM reach every rank; when one rank fails the others are stopped and ddprun
   exits with that rank's status.
       ddprun -n 4 ./examples/hello_allreduce */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void)
{
    fprintf(stderr, "usage: ddprun -n N program [args...]\n");
    return 2;
}

int main(int argc, char **argv)
{
    char *end;
    long n;
    if (argc < 4 || (strcmp(argv[1], "-n") != 0 && strcmp(argv[1], "--nproc") != 0)) return usage();
    n = strtol(argv[2], &end, 10);
    if (*end || n < 1 || n > 4096) {
        fprintf(stderr, "ddprun: -n needs a process count from 1 to 4096, not '%s'\n", argv[2]);
        return 2;
    }
    return ddp_run((int)n, argv + 3);
}
