/* Lesson 6: measuring the speed-up. The global batch stays at 192 samples whatever the
   number of ranks (strong scaling): with W ranks each computes 192 / W of it (rounded
   up), then the gradient is all-reduced. One line per run; a table is a loop:
       for n in 1 2 4; do ./examples/lessons/06_speedup/speedup --nproc $n; done
   speed-up = (samples/s with W ranks) / (samples/s with 1); efficiency = speed-up / W.
   A measurement, not one stopwatch reading: one epoch warms up (first touches of memory,
   the first collectives), then 5 epochs (--epochs N) are timed one by one, from a barrier
   to the slowest rank's end. The line gives the median epoch and the spread of all of
   them, and how much of its computing time the least lucky rank really had a core: below
   about 90 % the ranks took turns with each other or with other programs, and the
   numbers measure the machine's load, not data parallelism. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../device.h"
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { D = 1 << 17, N = 1920, GLOBAL = 192, MAX_EPOCHS = 100 };

static float feature(uint32_t i, uint32_t j) /* as in lesson 4: computed, not stored */
{
    uint32_t h = i * 0x9e3779b1u ^ j * 0x85ebca77u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return ((float)(h >> 8) / 8388608.0f - 1.0f) * 0.0047840f; /* sqrt(3 / D) */
}

static double seconds(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler sampler;
    ddp_sampler_desc sd = {0};
    static float w[D], g[D];
    float *dev;
    double t[MAX_EPOCHS], comm[MAX_EPOCHS], m[2], on_core = 0, computing = 0, spread;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t b, s;
    uint32_t j;
    int e, epochs = 5, status;
    for (e = 1; e < argc; e++)
        if (strcmp(argv[e], "--epochs") == 0 ? !lesson_int_flag(argc, argv, &e, 1, MAX_EPOCHS, &epochs)
                                             : !lesson_launch_flag(argc, argv, &e))
            return 2;
    if ((status = ddp_launch(&argc, argv)) != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    /* the template's batch_size is per rank (note 4): for a fixed global batch, divide */
    sd.dataset_size = N;
    sd.batch_size = (GLOBAL + (size_t)ctx.world_size - 1) / (size_t)ctx.world_size;
    if (ddp_sampler_init(&sampler, &ctx, &sd) != DDP_OK) return 1;
    dev = (float *)dev_alloc(&ctx, sizeof g);

    for (e = -1; e < epochs; e++) { /* epoch -1 warms up */
        double t0;
        m[1] = 0;
        if (ddp_barrier(&ctx) != DDP_OK) return 1; /* start the clock together */
        t0 = seconds(CLOCK_MONOTONIC);
        for (b = 0; b < sampler.num_batches; b++) {
            ddp_batch bt = ddp_sampler_batch(&sampler, (uint64_t)(e + 1), b);
            double c0 = seconds(CLOCK_MONOTONIC), u0 = seconds(CLOCK_THREAD_CPUTIME_ID);
            for (j = 0; j < D; j++) g[j] = 0;
            for (s = 0; s < bt.num_real; s++) { /* forward and backward of y = w . x, label 1 */
                uint32_t i = (uint32_t)bt.indices[s];
                float err = -1;
                for (j = 0; j < D; j++) err += w[j] * feature(i, j);
                for (j = 0; j < D; j++) g[j] += err * feature(i, j);
            }
            if (e >= 0) { /* of the time spent computing, how much this thread ran on a core */
                on_core += seconds(CLOCK_THREAD_CPUTIME_ID) - u0;
                computing += seconds(CLOCK_MONOTONIC) - c0;
            }
            c0 = seconds(CLOCK_MONOTONIC); /* communication, not overlapped here */
            dev_upload(&ctx, dev, g, sizeof g);
            if (ddp_all_reduce(&ctx, dev, dev, D, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
            dev_download(&ctx, g, dev, sizeof g);
            m[1] += seconds(CLOCK_MONOTONIC) - c0;
            for (j = 0; j < D; j++) w[j] -= 0.5f * g[j] / (float)bt.global_count;
        }
        m[0] = seconds(CLOCK_MONOTONIC) - t0;
        /* the job's epoch ends with its slowest rank; its all-reduce time: the longest */
        if (ddp_all_reduce(&ctx, m, m, 2, DDP_F64, DDP_MAX, NULL) != DDP_OK) return 1;
        if (e >= 0) t[e] = m[0], comm[e] = m[1];
    }
    m[0] = -on_core / computing; /* the rank that had a core least often: the max of the negation */
    if (ddp_all_reduce(&ctx, m, m, 1, DDP_F64, DDP_MAX, NULL) != DDP_OK) return 1;
    qsort(t, (size_t)epochs, sizeof t[0], by_value);
    qsort(comm, (size_t)epochs, sizeof comm[0], by_value);
    spread = (t[epochs - 1] - t[0]) / t[epochs / 2];
    ddp_print(&ctx, "%d rank%s x %zu samples: %.1f ms per step, %.1f of it all-reduce; %.0f samples/s (median of %d "
                    "epoch%s, spread %.0f %%); on a core %.0f %% of the computing time\n",
              ctx.world_size, ctx.world_size > 1 ? "s" : "", sd.batch_size, 1e3 * t[epochs / 2] / sampler.num_batches,
              1e3 * comm[epochs / 2] / sampler.num_batches, N / t[epochs / 2], epochs, epochs > 1 ? "s" : "",
              100 * spread, -100 * m[0]);
    if (ctx.world_size > cores)
        ddp_print(&ctx, "  %d ranks on %ld cores take turns: the speed-up cannot pass %ld\n", ctx.world_size, cores,
                  cores);
    else if (-m[0] < 0.9 || spread > 0.1)
        ddp_print(&ctx, "  other programs are using the cores: these numbers measure the machine's load (uptime)\n");
    dev_free(&ctx, dev);
    ddp_sampler_destroy(&sampler);
    return ddp_destroy(&ctx) == DDP_OK ? 0 : 1; /* a rank missing at the end fails the job */
}
