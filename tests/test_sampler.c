/* tests/test_sampler.c - the distributed sampler against PyTorch's DistributedSampler
   (orders produced by torch.randperm), its invariants over many shapes, batching,
   and exact metrics with padding, all in one process (ranks simulated). */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Checks one rank's indices for (n, w, rank, seed, epoch, drop_last) against PyTorch. */
static int same_as_torch(size_t n, int w, int rank, uint64_t seed, uint64_t epoch, int drop_last,
                         const size_t *want, size_t want_n)
{
    ddp_sampler s;
    ddp_sampler_desc d;
    const size_t *got;
    int ok;
    memset(&d, 0, sizeof d);
    d.dataset_size = n;
    d.seed = seed;
    d.drop_last = drop_last;
    d.world_size = w;
    d.rank = rank;
    if (ddp_sampler_init(&s, NULL, &d) != DDP_OK) return 0;
    got = ddp_sampler_epoch(&s, epoch);
    ok = got && s.num_samples == want_n && memcmp(got, want, want_n * sizeof *want) == 0;
    ddp_sampler_destroy(&s);
    return ok;
}

static void torch_values(void)
{
    /* DistributedSampler(ds, num_replicas=w, rank=r, seed=s, drop_last=d).set_epoch(e) */
    static const size_t a[] = {4, 1, 7, 5, 3, 9, 0, 8, 6, 2}; /* torch.randperm(10) after manual_seed(0) */
    static const size_t b[] = {5, 6, 1, 2, 0, 8, 9, 3, 7, 4}; /* epoch 1: seed 0 + 1 */
    static const size_t c1[] = {5, 4, 10, 6}, c3[] = {9, 0, 7, 3}, c3d[] = {9, 0, 7};
    static const size_t e4[] = {1}, e0[] = {0};
    static const size_t big_first[] = {937, 1311, 152, 727, 340, 1465, 1485, 1629};
    static const size_t big_last[] = {1826, 554, 1944, 333, 809, 790, 752, 1556};
    ddp_sampler s;
    ddp_sampler_desc d;
    const size_t *got;
    int ok;

    CHECK("sampler torch seed 0 N=10", same_as_torch(10, 1, 0, 0, 0, 0, a, 10), "order differs from torch.randperm");
    CHECK("sampler torch seed 0 epoch 1", same_as_torch(10, 1, 0, 0, 1, 0, b, 10), "order differs");
    CHECK("sampler torch N=13 W=4 rank 1", same_as_torch(13, 4, 1, 5, 2, 0, c1, 4), "differs");
    CHECK("sampler torch N=13 W=4 rank 3 padded", same_as_torch(13, 4, 3, 5, 2, 0, c3, 4), "differs");
    CHECK("sampler torch N=13 W=4 rank 3 drop_last", same_as_torch(13, 4, 3, 5, 2, 1, c3d, 3), "differs");
    CHECK("sampler torch N=3 W=5 rank 4 (W > N)", same_as_torch(3, 5, 4, 7, 1, 0, e4, 1), "differs");
    CHECK("sampler torch N=3 W=5 rank 0 (W > N)", same_as_torch(3, 5, 0, 7, 1, 0, e0, 1), "differs");

    /* N = 2000 draws more than 624 numbers: the generator's state is refilled */
    memset(&d, 0, sizeof d);
    d.dataset_size = 2000;
    d.seed = 7;
    ok = ddp_sampler_init(&s, NULL, &d) == DDP_OK && (got = ddp_sampler_epoch(&s, 3)) != NULL &&
         memcmp(got, big_first, sizeof big_first) == 0 && memcmp(got + 1992, big_last, sizeof big_last) == 0;
    CHECK("sampler torch N=2000 seed 7 epoch 3", ok, "order differs from torch.randperm");
    ddp_sampler_destroy(&s);
}

/* All the invariants for one shape; returns a description of the first violation or NULL. */
static const char *check_shape(size_t n, int w, uint64_t seed, uint64_t epoch, int drop_last, int shuffle)
{
    static char why[200];
    ddp_sampler one, s;
    ddp_sampler_desc d;
    size_t *global, *seen, expect_ns, k, p;
    const size_t *single;
    const char *bad = NULL;
    int r;

    memset(&d, 0, sizeof d);
    d.dataset_size = n;
    d.seed = seed;
    d.no_shuffle = !shuffle;
    d.drop_last = drop_last;
    d.world_size = 1;
    if (ddp_sampler_init(&one, NULL, &d) != DDP_OK) return "init failed (world 1)";
    single = ddp_sampler_epoch(&one, epoch); /* the list every rank takes its positions from */
    expect_ns = (drop_last && n % (size_t)w) ? n / (size_t)w : (n + (size_t)w - 1) / (size_t)w;
    global = (size_t *)calloc(expect_ns * (size_t)w + 1, sizeof *global);
    seen = (size_t *)calloc(n + 1, sizeof *seen);
    for (r = 0; r < w && !bad; r++) {
        const size_t *idx;
        size_t real = 0;
        d.world_size = w;
        d.rank = r;
        if (ddp_sampler_init(&s, NULL, &d) != DDP_OK) { bad = "init failed"; break; }
        idx = ddp_sampler_epoch(&s, epoch);
        if (!idx) bad = "no indices";
        else if (s.num_samples != expect_ns) bad = "num_samples is not ceil(N/W) (floor with drop_last)";
        else if (s.total_size != expect_ns * (size_t)w) bad = "total_size";
        else if (drop_last && s.num_real != s.num_samples) bad = "padding with drop_last";
        for (k = 0; k < s.num_samples && !bad; k++) {
            p = (size_t)r + k * (size_t)w;
            if (idx[k] >= n) { bad = "index out of range"; break; }
            global[p] = idx[k];
            if ((k < s.num_real) != (p < n)) { bad = "num_real does not mark the padding positions"; break; }
            if (k < s.num_real) { seen[idx[k]]++; real++; }
        }
        ddp_sampler_destroy(&s);
    }
    /* interleaving the ranks gives the single shuffled list, padded from its start */
    for (p = 0; p < expect_ns * (size_t)w && !bad; p++)
        if (global[p] != single[p % n]) bad = "ranks do not interleave into one shuffled list";
    for (k = 0, p = 0; k < n && !bad; p += seen[k], k++) {
        if (!drop_last && seen[k] != 1) bad = "real positions are not a permutation of 0..N-1";
        if (drop_last && seen[k] > 1) bad = "an index appears twice with drop_last";
    }
    if (!bad && drop_last && p != expect_ns * (size_t)w) bad = "drop_last does not keep floor(N/W)*W samples";
    if (!bad && shuffle && n >= 5) {
        ddp_sampler other;
        d.world_size = 1;
        d.rank = 0;
        if (ddp_sampler_init(&other, NULL, &d) != DDP_OK) bad = "init failed";
        else {
            const size_t *next = ddp_sampler_epoch(&other, epoch + 1);
            if (memcmp(next, single, n * sizeof *next) == 0) bad = "epoch + 1 gives the same order";
            ddp_sampler_destroy(&other);
        }
    }
    if (!bad && !shuffle)
        for (k = 0; k < n; k++)
            if (single[k] != k) { bad = "no_shuffle is not 0..N-1"; break; }
    free(global);
    free(seen);
    ddp_sampler_destroy(&one);
    if (!bad) return NULL;
    snprintf(why, sizeof why, "N=%zu W=%d seed=%llu epoch=%llu drop_last=%d shuffle=%d: %s", n, w,
             (unsigned long long)seed, (unsigned long long)epoch, drop_last, shuffle, bad);
    return why;
}

static void invariants(void)
{
    static const size_t sizes[] = {0, 1, 2, 3, 5, 7, 10, 16, 31, 100, 257, 1000};
    const char *bad = NULL;
    size_t i;
    int w, drop, shuffle, shapes = 0;
    uint64_t seed, epoch;
    for (i = 0; i < sizeof sizes / sizeof *sizes && !bad; i++)
        for (w = 1; w <= 9 && !bad; w++)
            for (drop = 0; drop <= 1 && !bad; drop++)
                for (shuffle = 0; shuffle <= 1 && !bad; shuffle++)
                    for (seed = 0; seed <= 12345 && !bad; seed += 12345)
                        for (epoch = 0; epoch <= 3 && !bad; epoch += 3, shapes++)
                            bad = check_shape(sizes[i], w, seed, epoch, drop, shuffle);
    CHECK("sampler invariants (sizes, padding, permutation, interleave, epochs)", !bad, "%s", bad);
    (void)shapes;
}

/* Batch b of W ranks with per-rank size B holds the same samples as batch b of one
   rank with size B W; counts and padding flags add up. */
static void batches(void)
{
    static const size_t sizes[] = {0, 1, 7, 64, 100, 203};
    const char *bad = NULL;
    char why[200];
    size_t i, b;
    int w, r, dlb;
    for (i = 0; i < sizeof sizes / sizeof *sizes && !bad; i++)
        for (w = 1; w <= 5 && !bad; w++)
            for (dlb = 0; dlb <= 1 && !bad; dlb++) {
                size_t per = 3, n = sizes[i], total_real = 0;
                ddp_sampler one, s[5];
                ddp_sampler_desc d;
                memset(&d, 0, sizeof d);
                d.dataset_size = n;
                d.seed = 42;
                d.batch_size = per * (size_t)w;
                d.drop_last_batch = dlb;
                d.world_size = 1;
                ddp_sampler_init(&one, NULL, &d);
                d.batch_size = per;
                d.world_size = w;
                for (r = 0; r < w; r++) {
                    d.rank = r;
                    ddp_sampler_init(&s[r], NULL, &d);
                }
                if (!dlb && s[0].num_batches != one.num_batches) bad = "W ranks and one rank disagree on the batch count";
                if (!bad && s[0].num_batches != (dlb ? s[0].num_samples / per : (s[0].num_samples + per - 1) / per))
                    bad = "num_batches";
                for (b = 0; b < s[0].num_batches && !bad; b++) {
                    ddp_batch g = ddp_sampler_batch(&one, 2, b);
                    size_t got = 0, j, k;
                    for (r = 0; r < w && !bad; r++) {
                        ddp_batch bt = ddp_sampler_batch(&s[r], 2, b);
                        if (bt.count == 0 || bt.count > per) bad = "batch size";
                        else if (dlb && bt.count != per) bad = "partial batch with drop_last_batch";
                        else if (bt.global_count != g.global_count && !dlb) bad = "global_count differs from one rank's";
                        if (r == 0 && !bad) total_real += bt.global_count;
                        /* every real sample of this rank's batch is in the single-rank batch */
                        for (j = 0; j < bt.num_real && !bad; j++) {
                            for (k = 0; k < g.count && g.indices[k] != bt.indices[j]; k++) {}
                            if (k == g.count && !dlb) bad = "global batch is not the same set of samples";
                        }
                        got += bt.num_real;
                    }
                    if (!bad && got != ddp_sampler_batch(&s[0], 2, b).global_count) bad = "sum of num_real != global_count";
                    if (!bad && !dlb && got != g.num_real) bad = "real samples per global batch differ from one rank's";
                }
                if (!bad && !dlb && total_real != n) bad = "global_count over all batches != N";
                if (!bad && ddp_sampler_batch(&s[0], 2, s[0].num_batches).count != 0) bad = "a batch past the end";
                for (r = 0; r < w; r++) ddp_sampler_destroy(&s[r]);
                ddp_sampler_destroy(&one);
                if (bad) {
                    snprintf(why, sizeof why, "N=%zu W=%d drop_last_batch=%d: %s", n, w, dlb, bad);
                    bad = why;
                }
            }
    CHECK("sampler batches (global batch = single-process batch)", !bad, "%s", bad);
}

static void arguments(void)
{
    ddp_sampler s;
    ddp_sampler_desc d;
    memset(&d, 0, sizeof d);
    d.dataset_size = 10;
    d.world_size = 2;
    d.rank = 2;
    CHECK("sampler rank >= world_size is an error", ddp_sampler_init(&s, NULL, &d) == DDP_ERR_ARG, "accepted");
    { /* without a context, said on stderr (there is no ddp_error to read; it said nothing) */
        char got[400];
        test_capture_t cap = test_capture(2);
        (void)ddp_sampler_init(&s, NULL, &d);
        test_captured(cap, got, sizeof got);
        CHECK("sampler errors without a context are said on stderr",
              strcmp(got, "ddp: error: ddp_sampler_init: rank 2 is not a rank of a world of 2\n") == 0, "stderr: '%s'", got);
    }
    CHECK("sampler without desc is an error", ddp_sampler_init(&s, NULL, NULL) == DDP_ERR_ARG, "accepted");
    d.world_size = 0;
    CHECK("sampler without ctx or world_size is a world of one",
          ddp_sampler_init(&s, NULL, &d) == DDP_OK && s.world_size == 1 && s.num_samples == 10, "not");
    ddp_sampler_destroy(&s);
    d.batch_size = SIZE_MAX; /* one short batch, not none */
    CHECK("sampler batch larger than the dataset is one batch",
          ddp_sampler_init(&s, NULL, &d) == DDP_OK && s.num_batches == 1, "%zu batches", s.num_batches);
    ddp_sampler_destroy(&s);
    d.batch_size = 0;
    d.dataset_size = ((size_t)1 << 61) + 1; /* its indices would not fit in memory: an error, not an overflow */
    d.world_size = 2;
    d.rank = 1;
    CHECK("sampler past memory is an error", ddp_sampler_init(&s, NULL, &d) == DDP_ERR_NOMEM, "accepted");
    ddp_sampler_destroy(&s);
}

/* ddp_sampler_init on a live sampler is refused by name and that one goes on (its lists
   leaked, and it drew another dataset's order); a sampler destroyed, never set up (any
   bytes), or set up where a live one was left (another function's, at the same address)
   is no live one. */
static void init_twice(void)
{
    ddp_sampler s, other, kept;
    ddp_sampler_desc d;
    size_t before[10];
    const size_t *got;
    char err[400];
    int ok;
    memset(&d, 0, sizeof d);
    memset(&other, 0, sizeof other); /* (destroyed whether its init came or not) */
    d.dataset_size = 10;
    d.seed = 4;
    ok = ddp_sampler_init(&s, NULL, &d) == DDP_OK && (got = ddp_sampler_epoch(&s, 3)) != NULL;
    if (ok) memcpy(before, got, sizeof before);
    d.dataset_size = 20;
    {
        test_capture_t cap = test_capture(2);
        ok = ddp_sampler_init(&s, NULL, &d) == DDP_ERR_ARG && ok;
        test_captured(cap, err, sizeof err);
    }
    CHECK("sampler init on a live sampler is refused by name", ok && strcmp(err, "ddp: error: ddp_sampler_init on a "
          "ddp_sampler that ddp_sampler_init set up before: ddp_sampler_destroy it first\n") == 0, "stderr: '%s'", err);
    d.dataset_size = 10;
    ok = ok && s.dataset_size == 10 && (got = ddp_sampler_epoch(&s, 3)) != NULL && !memcmp(got, before, sizeof before);
    ok = ok && (got = ddp_sampler_epoch(&s, 4)) != NULL && ddp_sampler_init(&other, NULL, &d) == DDP_OK &&
         ddp_sampler_epoch(&other, 4) && !memcmp(got, other.indices, sizeof before);
    ddp_sampler_destroy(&other);
    CHECK("sampler refused init leaves the live one as it was", ok, "its order changed");
    ddp_sampler_destroy(&s);
    ok = ddp_sampler_init(&s, NULL, &d) == DDP_OK;
    ddp_sampler_destroy(&s);
    memset(&s, 0xa5, sizeof s);
    ok = ok && ddp_sampler_init(&s, NULL, &d) == DDP_OK;
    ddp_sampler_destroy(&s);
    ok = ok && ddp_sampler_init(&s, NULL, &d) == DDP_OK;
    kept = s; /* the live one lives on elsewhere; another sampler comes at its address */
    memset(&s, 0, sizeof s);
    ok = ok && ddp_sampler_init(&s, NULL, &d) == DDP_OK;
    ddp_sampler_destroy(&s);
    ddp_sampler_destroy(&kept);
    CHECK("sampler destroyed, never set up, or where a live one was: init takes it", ok, "refused");
}

/* Each simulated rank adds only its real samples; merging gives the exact mean. */
static void metrics(void)
{
    const size_t n = 23;
    const int w = 5;
    double exact = 0, lo = 1e300, hi = -1e300, template_mean = 0;
    ddp_metric total[2];
    ddp_sampler s;
    ddp_sampler_desc d;
    ddp_ctx ctx;
    ddp_desc cd;
    size_t i, k;
    int r, ok;
    memset(total, 0, sizeof total);
    for (i = 0; i < n; i++) {
        double v = (double)((i * 37) % 11) + 0.25 * (double)i;
        exact += v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    exact /= (double)n;
    memset(&d, 0, sizeof d);
    d.dataset_size = n;
    d.world_size = w;
    for (r = 0; r < w; r++) {
        ddp_metric m[2];
        double rank_sum = 0;
        memset(m, 0, sizeof m);
        d.rank = r;
        ddp_sampler_init(&s, NULL, &d);
        ddp_sampler_epoch(&s, 0);
        for (k = 0; k < s.num_samples; k++) {
            size_t j = s.indices[k];
            double v = (double)((j * 37) % 11) + 0.25 * (double)j;
            rank_sum += v;                  /* the template's way: padding included */
            if (k < s.num_real) {
                ddp_metric_add(&m[0], v, 1);
                ddp_metric_add(&m[1], v > 5 ? 1 : 0, 1);
            }
        }
        template_mean += rank_sum / (double)s.num_samples / w;
        ddp_metric_merge(total, m, 2);
        ddp_sampler_destroy(&s);
    }
    CHECK("metrics exact mean with padding (simulated 5 ranks, N=23)",
          total[0].count == (double)n && fabs(ddp_metric_mean(&total[0]) - exact) < 1e-12,
          "count %g mean %.17g, want %zu and %.17g", total[0].count, ddp_metric_mean(&total[0]), n, exact);
    CHECK("metrics min/max", total[0].min == lo && total[0].max == hi, "min %g max %g, want %g %g",
          total[0].min, total[0].max, lo, hi);
    CHECK("metrics percent", ddp_metric_percent(&total[1]) >= 0 && ddp_metric_percent(&total[1]) <= 100 &&
          fabs(ddp_metric_percent(&total[1]) - 100 * total[1].sum / (double)n) < 1e-12, "%g", ddp_metric_percent(&total[1]));
    CHECK("metrics: the template's mean of means is off with padding", fabs(template_mean - exact) > 1e-6,
          "padding made no difference (%g vs %g)", template_mean, exact);
    {
        ddp_metric e;
        memset(&e, 0, sizeof e);
        CHECK("metrics empty mean is 0", ddp_metric_mean(&e) == 0 && ddp_metric_percent(&e) == 0, "not 0");
    }

    /* a real world of one: reduce leaves the values as they are, and marks them reduced */
    memset(&cd, 0, sizeof cd);
    cd.world_size = 1;
    ok = ddp_init(&ctx, &cd) == DDP_OK;
    if (ok) {
        ddp_metric m[2];
        memcpy(m, total, sizeof m);
        total[0].reduced = total[1].reduced = 1;
        ok = ddp_metric_reduce(&ctx, m, 2) == DDP_OK && memcmp(m, total, sizeof m) == 0;
        ddp_destroy(&ctx);
    }
    CHECK("metrics reduce in a world of one", ok, "changed the values or failed");
}

/* "N W RANK SEED EPOCH DROP_LAST": print that rank's indices (for test_sampler_torch.sh) */
static int print_indices(char **a)
{
    ddp_sampler s;
    ddp_sampler_desc d;
    const size_t *ix;
    size_t i;
    memset(&d, 0, sizeof d);
    d.dataset_size = strtoull(a[0], NULL, 10);
    d.world_size = atoi(a[1]);
    d.rank = atoi(a[2]);
    d.seed = strtoull(a[3], NULL, 10);
    d.drop_last = atoi(a[5]);
    if (ddp_sampler_init(&s, NULL, &d) != DDP_OK) return 1;
    ix = ddp_sampler_epoch(&s, strtoull(a[4], NULL, 10));
    if (a[6]) { /* "sum": too many to print: the first and last 8 and sum((i + 1) ix[i]) mod 2^64 */
        uint64_t sum = 0;
        for (i = 0; i < s.num_samples; i++) sum += (uint64_t)(i + 1) * ix[i];
        for (i = 0; i < 8 && i < s.num_samples; i++) printf("%zu ", ix[i]);
        for (i = s.num_samples > 8 ? s.num_samples - 8 : s.num_samples; i < s.num_samples; i++) printf("%zu ", ix[i]);
        printf("%llu\n", (unsigned long long)sum);
    } else {
        for (i = 0; i < s.num_samples; i++) printf("%zu ", ix[i]);
        printf("\n");
    }
    ddp_sampler_destroy(&s);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 7 || argc == 8) return print_indices(argv + 1); /* N W rank seed epoch drop_last [sum] */
    torch_values();
    invariants();
    batches();
    arguments();
    init_twice();
    metrics();
    (void)test_skip;
    TEST_EXIT();
}
