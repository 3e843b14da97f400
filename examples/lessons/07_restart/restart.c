/* Lesson 7: a rank dies, the launcher starts the job again, and the program resumes from
   its checkpoint to the very bits of a run that never stopped.
       ./examples/lessons/07_restart/restart --nproc 3
       ./examples/lessons/07_restart/restart --nproc 3 --max-restarts 2 --crash-at 13
   Fits y = 3 x + 1 (lesson 5's points) by SGD with momentum, --steps steps of a global
   batch. Every --save-every steps rank 0 saves the run's whole state: the step (which
   says the epoch and the batch, where the sampler is), w and b, and their momentum. At
   start-up the program resumes from restart.ckpt where there is one (a finished run's
   too: then it only prints its end). With --crash-at S the last rank kills itself
   after S steps of the first attempt, as the out-of-memory killer would. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../device.h"
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { N = 101, BATCH = 8 };
static const char path[] = "restart.ckpt", tmp[] = "restart.ckpt.tmp";
static const float LR = 0.5f, MU = 0.8f;

static float x_of(size_t i) { return (float)i / N; }
static float y_of(size_t i) { return 3 * x_of(i) + 1 + 0.05f * (float)((int)(i * 37 % 11) - 5) / 5; }

/* Everything the next step reads: the checkpoint is this, byte for byte. */
typedef struct { int32_t steps, world, step; float wb[2], v[2]; } run_state;

/* Atomically, as in lesson 5: a rank killed while rank 0 writes leaves the last file whole. */
static int save(const run_state *s)
{
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(s, sizeof *s, 1, f) == 1 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f) ok = fclose(f) == 0 && ok;
    if (!ok) remove(tmp);
    return ok && rename(tmp, path) == 0;
}

/* 1: resumed into s; 0: no file, a fresh start; -1: a file this run cannot go on from. */
static int load(run_state *s, char *why, size_t n)
{
    run_state f;
    char extra;
    FILE *in = fopen(path, "rb");
    int got = in && fread(&f, sizeof f, 1, in) == 1, more = in && fread(&extra, 1, 1, in) == 1;
    if (in) fclose(in);
    if (!in) return 0;
    if (!got || more)
        snprintf(why, n, "not %d bytes: cut short, or not this program's", (int)sizeof f);
    else if (f.steps != s->steps || f.world != s->world)
        snprintf(why, n, "belongs to another run (%d steps, %d ranks; this one: %d steps, %d ranks): remove it to "
                 "start over", (int)f.steps, (int)f.world, (int)s->steps, (int)s->world);
    else if (f.step < 0 || f.step > f.steps || !isfinite(f.wb[0] + f.wb[1] + f.v[0] + f.v[1]))
        snprintf(why, n, "holds step %d of %d, w %g b %g: not a state of this run", (int)f.step, (int)f.steps,
                 f.wb[0], f.wb[1]);
    else {
        *s = f;
        return 1;
    }
    return -1;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler sampler;
    ddp_sampler_desc sd = {0};
    ddp_metric loss = {0, 0, 0, 0, 0};
    run_state s;
    float *dev;
    int32_t found = 0;
    char why[200] = "";
    int i, steps = 40, every = 5, crash_at = -1, status;
    for (i = 1; i < argc; i++)
        if (!(strcmp(argv[i], "--steps") == 0        ? lesson_int_flag(argc, argv, &i, 1, 1000000, &steps)
              : strcmp(argv[i], "--save-every") == 0 ? lesson_int_flag(argc, argv, &i, 1, 1000000, &every)
              : strcmp(argv[i], "--crash-at") == 0   ? lesson_int_flag(argc, argv, &i, 0, 1000000, &crash_at)
                                                     : lesson_launch_flag(argc, argv, &i)))
            return 2;
    if ((status = ddp_launch(&argc, argv)) != DDP_WORKER) return status; /* --max-restarts is the launcher's */
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    /* The program goes on by itself, as under torchrun: rank 0 reads the checkpoint if there
       is one, and the whole state goes to every rank (a broadcast only copies: its 7 words
       travel as they are, the floats among them). */
    memset(&s, 0, sizeof s);
    s.steps = steps;
    s.world = ctx.world_size;
    if (ddp_is_main(&ctx)) found = load(&s, why, sizeof why);
    if (ddp_broadcast(&ctx, &found, 1, DDP_I32, 0, NULL) != DDP_OK) return 1;
    if (found < 0) {
        if (ddp_is_main(&ctx)) fprintf(stderr, "%s: %s\n", path, why);
        return 1;
    }
    dev = (float *)dev_alloc(&ctx, sizeof s);
    dev_upload(&ctx, dev, &s, sizeof s);
    if (ddp_broadcast(&ctx, dev, sizeof s / 4, DDP_I32, 0, NULL) != DDP_OK) return 1;
    dev_download(&ctx, &s, dev, sizeof s);
    ddp_print(&ctx, found ? "attempt %d: resumed from %s at step %d\n" : "attempt %d: no %s, from step %d\n",
              ddp_restart_count() + 1, path, (int)s.step); /* the count is 0 on the first attempt */

    sd.dataset_size = N;
    sd.batch_size = BATCH;
    if (ddp_sampler_init(&sampler, &ctx, &sd) != DDP_OK) return 1;
    while (s.step < steps) {
        /* the step alone says where the data is: epoch and batch, so the sampler's order */
        const uint64_t epoch = (uint64_t)s.step / sampler.num_batches;
        ddp_batch bt = ddp_sampler_batch(&sampler, epoch, (size_t)s.step % sampler.num_batches);
        float g[2] = {0, 0};
        size_t k;
        if (s.step == crash_at && ddp_restart_count() == 0 && ctx.rank == ctx.world_size - 1)
            kill(getpid(), SIGKILL); /* a lost rank: no message, no clean-up */
        for (k = 0; k < bt.num_real; k++) {
            float x = x_of(bt.indices[k]), err = s.wb[0] * x + s.wb[1] - y_of(bt.indices[k]);
            ddp_metric_add(&loss, 0.5 * err * err, 1);
            g[0] += err * x;
            g[1] += err;
        }
        dev_upload(&ctx, dev, g, sizeof g);
        if (ddp_all_reduce(&ctx, dev, dev, 2, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
        dev_download(&ctx, g, dev, sizeof g);
        for (k = 0; k < 2; k++) { /* the momentum is state too: a step reads the last one */
            s.v[k] = MU * s.v[k] + g[k] / (float)bt.global_count;
            s.wb[k] -= LR * s.v[k];
        }
        s.step++;
        if (s.step % every == 0 || s.step == steps) { /* the loss since the last checkpoint */
            if (ddp_metric_reduce(&ctx, &loss, 1) != DDP_OK) return 1;
            ddp_print(&ctx, "step %d loss %.6f w %.9g b %.9g\n", (int)s.step, ddp_metric_mean(&loss), s.wb[0], s.wb[1]);
            memset(&loss, 0, sizeof loss);
            if (ddp_is_main(&ctx) && !save(&s)) {
                fprintf(stderr, "cannot write %s\n", path);
                return 1;
            }
        }
    }
    ddp_print(&ctx, "done: %d steps, w %.9g b %.9g\n", steps, s.wb[0], s.wb[1]);
    dev_free(&ctx, dev);
    ddp_sampler_destroy(&sampler);
    return ddp_destroy(&ctx) == DDP_OK ? 0 : 1;
}
