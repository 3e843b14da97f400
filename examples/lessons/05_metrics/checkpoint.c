/* Lesson 5: metrics, printing on rank 0, checkpoints and resuming.
       ./examples/lessons/05_metrics/checkpoint --nproc 3 --epochs 2
       ./examples/lessons/05_metrics/checkpoint --nproc 3 --epochs 4 --resume
   Fits y = 3 x + 1 to 101 noisy points. Every epoch, the loss and the share of points
   within 0.1 of the line are averaged over all ranks exactly, rank 0 prints them and
   saves a checkpoint; --resume goes on from it, with any number of ranks. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../device.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { N = 101, BATCH = 8 };
static const char path[] = "checkpoint.bin", tmp[] = "checkpoint.bin.tmp"; /* epoch (int32), w, b */

static float x_of(size_t i) { return (float)i / N; }
static float y_of(size_t i) { return 3 * x_of(i) + 1 + 0.05f * (float)((int)(i * 37 % 11) - 5) / 5; }

/* Atomically: a crash while writing leaves the previous checkpoint, never half a file. */
static int save(const float *wb, int32_t epoch)
{
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(&epoch, sizeof epoch, 1, f) == 1 && fwrite(wb, sizeof(float), 2, f) == 2 &&
             fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f) ok = fclose(f) == 0 && ok;
    if (!ok) remove(tmp);
    return ok && rename(tmp, path) == 0;
}

/* Resuming trusts nothing in the file: a short or long file, an epoch this run cannot
   be at, a weight that is not a number (a diverged run) are refused, with the reason. */
static int load(float *wb, int32_t *epoch, int32_t epochs, char *why, size_t n)
{
    unsigned char buf[13];
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    if (!f) {
        snprintf(why, n, "cannot read it: run without --resume first");
        return 0;
    }
    if (got != 12) {
        snprintf(why, n, "%s than a checkpoint's 12 bytes: cut short, or not this program's",
                 got < 12 ? "shorter" : "longer");
        return 0;
    }
    memcpy(epoch, buf, 4);
    memcpy(wb, buf + 4, 8);
    if (*epoch < 0 || *epoch > epochs) {
        snprintf(why, n, "says %d epochs were done, not 0 to %d (--epochs)", (int)*epoch, (int)epochs);
        return 0;
    }
    if (!isfinite(wb[0]) || !isfinite(wb[1])) {
        snprintf(why, n, "holds w %g b %g: not numbers (a diverged run?)", wb[0], wb[1]);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    ddp_sampler sampler;
    ddp_sampler_desc sd = {0};
    float wb[2] = {0, 0}, *dev; /* the model: w and b */
    int32_t epoch = 0, ok = 1;
    char why[160] = "";
    int i, epochs = 3, resume = 0, status;
    for (i = 1; i < argc; i++)
        if (strcmp(argv[i], "--resume") == 0) resume = 1;
        else if (strcmp(argv[i], "--epochs") == 0 ? !lesson_int_flag(argc, argv, &i, 1, 1000000, &epochs)
                                                  : !lesson_launch_flag(argc, argv, &i))
            return 2;
    if ((status = ddp_launch(&argc, argv)) != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    /* Resuming: rank 0 reads the file, every rank learns whether that worked, and the
       weights and the epoch go from rank 0 to all (the model on each rank's device). */
    if (resume && ddp_is_main(&ctx)) ok = load(wb, &epoch, epochs, why, sizeof why);
    if (ddp_broadcast(&ctx, &ok, 1, DDP_I32, 0, NULL) != DDP_OK) return 1;
    if (!ok) {
        if (ddp_is_main(&ctx)) fprintf(stderr, "%s: %s\n", path, why);
        return 1;
    }
    dev = (float *)dev_alloc(&ctx, sizeof wb);
    dev_upload(&ctx, dev, wb, sizeof wb);
    if (ddp_broadcast(&ctx, dev, 2, DDP_F32, 0, NULL) != DDP_OK ||
        ddp_broadcast(&ctx, &epoch, 1, DDP_I32, 0, NULL) != DDP_OK)
        return 1;
    dev_download(&ctx, wb, dev, sizeof wb);
    if (resume) ddp_print(&ctx, "resumed from %s at epoch %d\n", path, epoch);

    sd.dataset_size = N;
    sd.batch_size = BATCH;
    if (ddp_sampler_init(&sampler, &ctx, &sd) != DDP_OK) return 1;
    for (; epoch < epochs; epoch++) {
        ddp_metric m[2] = {{0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}}; /* loss, within 0.1 */
        size_t b, s;
        for (b = 0; b < sampler.num_batches; b++) {
            ddp_batch bt = ddp_sampler_batch(&sampler, (uint64_t)epoch, b);
            float g[2] = {0, 0};
            for (s = 0; s < bt.num_real; s++) { /* real samples only (lesson 3) */
                float x = x_of(bt.indices[s]), err = wb[0] * x + wb[1] - y_of(bt.indices[s]);
                ddp_metric_add(&m[0], 0.5 * err * err, 1);
                ddp_metric_add(&m[1], err * err < 0.01f, 1);
                g[0] += err * x;
                g[1] += err;
            }
            dev_upload(&ctx, dev, g, sizeof g); /* the gradient's sum over ranks (lesson 4) */
            if (ddp_all_reduce(&ctx, dev, dev, 2, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
            dev_download(&ctx, g, dev, sizeof g);
            wb[0] -= 1.0f * g[0] / (float)bt.global_count;
            wb[1] -= 1.0f * g[1] / (float)bt.global_count;
        }
        /* template: all_reduce of per-rank means / world_size (note 6). Here: sums and
           counts of real samples, one collective, exact. */
        if (ddp_metric_reduce(&ctx, m, 2) != DDP_OK) return 1;
        /* template: if dist.get_rank() == 0: print(...); torch.save(...) (note 7) */
        ddp_print(&ctx, "epoch %d loss %.6f within_0.1 %.2f%% (%g samples) w %.4f b %.4f\n", epoch,
                  ddp_metric_mean(&m[0]), ddp_metric_percent(&m[1]), m[0].count, wb[0], wb[1]);
        if (ddp_is_main(&ctx) && !save(wb, epoch + 1)) {
            fprintf(stderr, "cannot write %s\n", path);
            return 1;
        }
    }
    dev_free(&ctx, dev);
    ddp_sampler_destroy(&sampler);
    return ddp_destroy(&ctx) == DDP_OK ? 0 : 1; /* a rank missing at the end fails the job */
}
