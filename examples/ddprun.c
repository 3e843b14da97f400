/* ddprun: run any program as N ranks of one job on this host, like
   `torchrun --nproc_per_node=N`. Each copy gets RANK, WORLD_SIZE, LOCAL_RANK,
   LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port) and a job id; Ctrl-C and
   SIGTERM reach every rank; when one rank fails the others are stopped and ddprun
   exits with that rank's status, or, with --max-restarts N, starts the job again (up
   to N times; each attempt's ranks see TORCHELASTIC_RESTART_COUNT, as under torchrun).
       ddprun -n 4 ./examples/hello_allreduce
       ddprun -n 4 --max-restarts 3 ./examples/train_gpt --save gpt.safetensors --save-every 10 --resume auto
   The count may also be given as --nproc N, --nproc_per_node N or torch's
   --nproc_per_node=N; --max_restarts and the =N forms work too; `--` may end the
   options (for a program whose name starts with '-'). It takes up to 4096 ranks, for
   programs of any kind; a ddp.h program on the CPU backend takes 256 on one host (its
   own --nproc says so before it starts any). */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define USAGE "ddprun -n N [--max-restarts M] [--] program [args...]"

/* the usage to f, and the status to exit with */
static int usage(FILE *f, int status)
{
    fprintf(f, "usage: " USAGE "   (or --nproc N, --nproc_per_node N,\n"
               "       --nproc_per_node=N; --max_restarts M, --max-restarts=M)\n");
    return status;
}

/* argv[*i] is one of names, with its value after "=" or as the next argument:
   the value (and *i moves past it), else NULL */
static const char *option(int argc, char **argv, int *i, const char *const *names)
{
    for (; *names; names++) {
        size_t len = strlen(*names);
        if (strcmp(argv[*i], *names) == 0 && *i + 1 < argc) return argv[(*i += 2) - 1];
        if (strncmp(argv[*i], *names, len) == 0 && argv[*i][len] == '=') return argv[(*i)++] + len + 1;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    static const char *const counts[] = {"-n", "--nproc", "--nproc_per_node", "--nproc-per-node", NULL};
    static const char *const restarts[] = {"--max-restarts", "--max_restarts", NULL};
    const char *count = NULL, *count_flag = NULL, *max = "0", *max_flag = NULL, *v;
    char *end;
    long n, m;
    int i = 1;
    while (i < argc && argv[i][0] == '-') { /* the options, up to the program */
        const char *flag = argv[i], *twice = NULL;
        if (strcmp(flag, "--") == 0) { /* the options end: the program follows */
            i++;
            break;
        }
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) return usage(stdout, 0);
        if ((v = option(argc, argv, &i, counts)) != NULL) twice = count_flag, count = v, count_flag = flag;
        else if ((v = option(argc, argv, &i, restarts)) != NULL) twice = max_flag, max = v, max_flag = flag;
        else {
            const char *const *known = counts;
            int k;
            for (k = 0; k < 2; k++, known = restarts)
                for (; *known; known++)
                    if (strcmp(flag, *known) == 0) { /* the last argument: its value is missing */
                        fprintf(stderr, "ddprun: %s needs a value (usage: " USAGE ")\n", flag);
                        return 2;
                    }
            fprintf(stderr, "ddprun: unknown option '%s' before the program (usage: " USAGE ")\n", flag);
            return 2;
        }
        if (twice) { /* as the built-in launcher: which one was meant? */
            fprintf(stderr, "ddprun: %.*s given twice ('%s' and '%s'): give it once\n", (int)strcspn(flag, "="), flag,
                    twice, flag);
            return 2;
        }
    }
    if (!count || i >= argc) return usage(stderr, 2);
    n = strtol(count, &end, 10);
    if (!*count || *end || n < 1 || n > 4096) {
        fprintf(stderr, "ddprun: %.*s needs a process count from 1 to 4096, not '%s'\n", (int)strcspn(count_flag, "="),
                count_flag, count);
        return 2;
    }
    m = strtol(max, &end, 10);
    if (!*max || *end || m < 0 || m > 1000000) {
        fprintf(stderr, "ddprun: %.*s needs a restart count from 0 to 1000000, not '%s'\n", (int)strcspn(max_flag, "="),
                max_flag, max);
        return 2;
    }
    return ddp_run_restarts((int)n, (int)m, argv + i);
}
