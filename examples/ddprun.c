/* ddprun: run any program as N ranks of one job on this host, like
   `torchrun --nproc_per_node=N`. Each copy gets RANK, WORLD_SIZE, LOCAL_RANK,
   LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port) and a job id; Ctrl-C and
   SIGTERM reach every rank; when one rank fails the others are stopped and ddprun
   exits with that rank's status.
       ddprun -n 4 ./examples/hello_allreduce
   The count may also be given as --nproc N, --nproc_per_node N or torch's
   --nproc_per_node=N. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void)
{
    fprintf(stderr, "usage: ddprun -n N program [args...]   (or --nproc N, --nproc_per_node N, --nproc_per_node=N)\n");
    return 2;
}

int main(int argc, char **argv)
{
    static const char *const flags[] = {"-n", "--nproc", "--nproc_per_node", "--nproc-per-node"};
    const char *count = NULL;
    char *end;
    long n;
    int i, prog = 0;
    if (argc < 2) return usage();
    for (i = 0; i < (int)(sizeof flags / sizeof flags[0]) && !count; i++) {
        size_t len = strlen(flags[i]);
        if (strcmp(argv[1], flags[i]) == 0 && argc > 2) {
            count = argv[2];
            prog = 3;
        } else if (strncmp(argv[1], flags[i], len) == 0 && argv[1][len] == '=') {
            count = argv[1] + len + 1;
            prog = 2;
        }
    }
    if (!count || prog >= argc) return usage();
    n = strtol(count, &end, 10);
    if (!*count || *end || n < 1 || n > 4096) {
        fprintf(stderr, "ddprun: %s needs a process count from 1 to 4096, not '%s'\n", argv[1], count);
        return 2;
    }
    return ddp_run((int)n, argv + prog);
}
