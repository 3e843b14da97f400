/* Lesson 5 exercise: resume from a checkpoint. Rank 0 saved the trained weights (only
   rank 0 writes files: note 7 of the template). On resume every rank must start from
   them, whatever it drew at start-up.
       ./examples/lessons/05_metrics/exercise --nproc 3
   Fix load_checkpoint() until the program says "correct". */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include <math.h>
#include <stdio.h>

enum { P = 6 };

static float trained(int j) { return 0.25f * (float)j - 0.5f; } /* what was saved */

/* Rank 0 reads the weights from f; afterwards every rank must hold them in w. */
static ddp_result load_checkpoint(ddp_ctx *ctx, FILE *f, float *w)
{
    int32_t ok = 1;
    if (ddp_is_main(ctx)) {
        rewind(f);
        ok = fread(w, sizeof(float), P, f) == P;
    }
    /* every rank must know when rank 0 could not read the file */
    if (ddp_broadcast(ctx, &ok, 1, DDP_I32, 0, NULL) != DDP_OK || !ok) return DDP_ERR_SYSTEM;
    /* TODO: rank 0 has the weights now; the others still hold what they drew. */
    return DDP_OK;
}

int main(int argc, char **argv)
{
    ddp_ctx ctx;
    ddp_desc desc = {0};
    float w[P], diff = 0;
    FILE *f = NULL;
    int j, ok, status = ddp_launch(&argc, argv);
    if (status != DDP_WORKER) return status;
    desc.argc = &argc;
    desc.argv = argv;
    if (ddp_init(&ctx, &desc) != DDP_OK) return 1;

    if (ddp_is_main(&ctx)) { /* the checkpoint of an earlier run */
        for (j = 0; j < P; j++) w[j] = trained(j);
        if (!(f = tmpfile()) || fwrite(w, sizeof(float), P, f) != P) return 1;
    }
    for (j = 0; j < P; j++) w[j] = (float)(ctx.rank + 1) * 100; /* fresh weights, different per rank */

    if (load_checkpoint(&ctx, f, w) != DDP_OK) return 1;
    for (j = 0; j < P; j++) diff = fmaxf(diff, fabsf(w[j] - trained(j)));
    if (ddp_all_reduce(&ctx, &diff, &diff, 1, DDP_F32, DDP_MAX, NULL) != DDP_OK) return 1;
    ok = diff == 0;
    if (ok) {
        ddp_print(&ctx, "correct: all %d ranks resume from rank 0's checkpoint\n", ctx.world_size);
    } else {
        ddp_print(&ctx, "wrong: a rank's weights differ from the checkpoint by %g\n", diff);
        ddp_print(&ctx, "hint: only rank 0 read the file; send its weights to every rank in load_checkpoint(): "
                        "ddp_broadcast(ctx, w, P, DDP_F32, 0, NULL)\n");
    }
    if (f) fclose(f);
    ddp_destroy(&ctx);
    return ok ? 0 : 1;
}
