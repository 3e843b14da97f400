/* The store on rank 0 is reachable by anyone who can connect: a crowd of strangers,
   huge or stalled messages, wrong hellos, wrong secrets and a fake store must never
   crash it, bloat it, break the healthy job or learn its secret. A second claim to a
   rank of the job (its id known, and its secret when it has one) is a second launch on
   the port: it stops the job, naming why. Two ranks run as threads of this process;
   this thread plays the stranger. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "test.h"
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

typedef struct peer {
    int rank, port, rounds, timeout_ms;
    const char *secret, *addr;
    ddp_ctx ctx;
    ddp_result init, r;
    pthread_barrier_t *gate;
    double first_ms, last_ms; /* time of the first and last 2000 barriers */
} peer;

static void *peer_main(void *arg)
{
    peer *p = (peer *)arg;
    ddp_desc d;
    int i;
    memset(&d, 0, sizeof d);
    d.world_size = 2;
    d.rank = p->rank;
    d.master_addr = p->addr ? p->addr : "127.0.0.1";
    d.master_port = p->port;
    d.job_id = "store-abuse";
    d.secret = p->secret;
    d.timeout_ms = p->timeout_ms ? p->timeout_ms : 20000;
    p->init = ddp_init(&p->ctx, &d);
    if (!p->gate) return NULL;
    pthread_barrier_wait(p->gate); /* the stranger's turn */
    pthread_barrier_wait(p->gate);
    p->r = p->init;
    for (i = 0; i < p->rounds && p->r == DDP_OK; i++) {
        double t = test_now_s();
        p->r = ddp__store_barrier(&p->ctx, "b", "in the test");
        if (i < 2000) p->first_ms += (test_now_s() - t) * 1e3;
        if (i >= p->rounds - 2000) p->last_ms += (test_now_s() - t) * 1e3;
    }
    return NULL; /* the caller looks at the store, then destroys */
}

static void *destroy_main(void *arg)
{
    ddp_destroy(&((peer *)arg)->ctx);
    return NULL;
}

/* ddp_destroy is a meeting: both ranks leave together */
static void destroy_both(peer *p)
{
    pthread_t th[2];
    int i;
    for (i = 0; i < 2; i++) pthread_create(&th[i], NULL, destroy_main, &p[i]);
    for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
}

static int dial(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    return fd;
}

static int send_msg(int fd, uint32_t op, const char *key, const char *val, uint32_t vlen_claimed)
{
    uint32_t h[4];
    h[0] = htonl(DDP__MAGIC); h[1] = htonl(op); h[2] = htonl((uint32_t)strlen(key)); h[3] = htonl(vlen_claimed);
    if (write(fd, h, 16) != 16 || write(fd, key, strlen(key)) < 0) return -1;
    return val && write(fd, val, strlen(val)) < 0 ? -1 : 0;
}

/* status of the answer (its text in `text`), or -1 when the store hung up / went quiet */
static int answer(int fd, char *text, size_t n, int ms)
{
    uint32_t h[4], len;
    text[0] = 0;
    if (ddp__read_all(fd, h, 16, ddp__now_ms() + ms) != 0) return -1;
    len = ntohl(h[3]);
    if (len >= n || ddp__read_all(fd, text, len, ddp__now_ms() + ms) != 0) return -1;
    text[len] = 0;
    return (int)ntohl(h[1]);
}

/* 1 when the store closed the connection within ms */
static int hung_up(int fd, int ms)
{
    char b;
    return ddp__read_all(fd, &b, 1, ddp__now_ms() + ms) != 0 && errno == ECONNRESET;
}

static long rss_kb(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    if (f) fclose(f);
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static void start(peer *p, pthread_t *th, pthread_barrier_t *gate, int port, const char *secret, int rounds)
{
    int i;
    memset(p, 0, 2 * sizeof *p);
    for (i = 0; i < 2; i++) {
        p[i].rank = i;
        p[i].port = port;
        p[i].secret = secret;
        p[i].gate = gate;
        p[i].rounds = rounds;
        pthread_create(&th[i], NULL, peer_main, &p[i]);
    }
}

static void test_strangers(void)
{
    enum { CROWD = 1100 };
    static int crowd[CROWD];
    pthread_t th[2];
    pthread_barrier_t gate;
    peer p[2];
    struct rlimit rl;
    int port = test_free_port(), i, opened = 0, big_dropped = 0, stall_fd, hello_fd, wrong_status;
    int reconnect_ok = 0, nkv, ngathers;
    long rss0, rss1;
    char text[256], wrong_text[256] = "";
    ddp__server *s;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < CROWD + 100 && rl.rlim_max >= CROWD + 100) { rl.rlim_cur = CROWD + 100; setrlimit(RLIMIT_NOFILE, &rl); }
    pthread_barrier_init(&gate, NULL, 3);
    start(p, th, &gate, port, NULL, 20000);
    pthread_barrier_wait(&gate);
    s = p[0].ctx.st ? p[0].ctx.st->server : NULL;
    /* a crowd: far more connections than the job has ranks */
    for (i = 0; i < CROWD; i++) opened += (crowd[i] = dial(port)) >= 0;
    /* huge announced messages from strangers: hung up on at once, nothing reserved */
    rss0 = rss_kb();
    for (i = 0; i < 8; i++) {
        int fd = dial(port);
        if (fd < 0) continue;
        send_msg(fd, DDP__HELLO, "store-abuse", NULL, 64u << 20);
        big_dropped += hung_up(fd, 2000);
        close(fd);
    }
    rss1 = rss_kb();
    /* a wrong job id: refused without learning the real one */
    hello_fd = dial(port);
    send_msg(hello_fd, DDP__HELLO, "guess", "0 2 00", (uint32_t)strlen("0 2 00"));
    wrong_status = answer(hello_fd, wrong_text, sizeof wrong_text, 3000);
    close(hello_fd);
    for (i = 0; i < CROWD; i++) if (crowd[i] >= 0) close(crowd[i]);
    /* a newcomer that starts a message and stalls: dropped after DDP__STORE_HELLO_MS */
    stall_fd = dial(port);
    if (stall_fd >= 0 && write(stall_fd, "DDPS", 4) != 4) {}
    /* after the crowd the store still takes newcomers */
    if ((hello_fd = dial(port)) >= 0) {
        send_msg(hello_fd, DDP__HELLO, "guess", "0 2 00", (uint32_t)strlen("0 2 00"));
        reconnect_ok = answer(hello_fd, text, sizeof text, 3000) == DDP__ST_ERROR;
        close(hello_fd);
    }
    CHECK("store.crowd_of_strangers_survived", opened > 1024 && s && s->cap == 2 + DDP__STORE_PENDING && reconnect_ok,
          "%d of %d connections opened, table of %d, a later newcomer answered: %d", opened, CROWD, s ? s->cap : -1,
          reconnect_ok);
    CHECK("store.huge_message_dropped", big_dropped == 8 && rss1 - rss0 < 4096,
          "%d of 8 connections announcing 64 MiB were hung up on; memory grew %ld KiB", big_dropped, rss1 - rss0);
    CHECK("store.wrong_job_learns_nothing", wrong_status == DDP__ST_ERROR && !strstr(wrong_text, "store-abuse") &&
          strstr(wrong_text, "another job"), "status %d '%s'", wrong_status, wrong_text);
    CHECK("store.stalled_newcomer_dropped", stall_fd >= 0 && hung_up(stall_fd, DDP__STORE_HELLO_MS + 2000),
          "a connection that sent 4 bytes and stopped is still open after %d ms", DDP__STORE_HELLO_MS + 2000);
    if (stall_fd >= 0) close(stall_fd);
    pthread_barrier_wait(&gate); /* the ranks now meet 20,000 times */
    for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK("store.job_unharmed_by_strangers", p[0].init == DDP_OK && p[1].init == DDP_OK && p[0].r == DDP_OK &&
          p[1].r == DDP_OK, "init %d %d, 20000 barriers %d %d", (int)p[0].init, (int)p[1].init, (int)p[0].r, (int)p[1].r);
    /* every meeting is deleted once all have it: a long job holds what a short one does (read
       under the store's lock: it answers the last barrier before it deletes the meeting) */
    nkv = ngathers = -1;
    if (s) {
        pthread_mutex_lock(&s->mu);
        nkv = s->nkv;
        ngathers = s->ngathers;
        pthread_mutex_unlock(&s->mu);
    }
    CHECK("store.barriers_leave_nothing", ngathers == 0 && nkv <= 1, "after 20000 barriers the store holds %d keys and %d "
          "meetings", nkv, ngathers);
    printf("store: 20000 barriers: first 2000 %.1f ms, last 2000 %.1f ms (rank 0)\n", p[0].first_ms, p[0].last_ms);
    destroy_both(p);
    pthread_barrier_destroy(&gate);
}

/* Each rank after the stranger's claim: a meeting through the store, then a collective. */
static void *after_claim(void *arg)
{
    peer *p = (peer *)arg;
    p->init = ddp__store_barrier(&p->ctx, "after", "in the test");
    p->r = ddp_barrier(&p->ctx);
    return NULL;
}

/* A second claim to rank 1 of a running job (the port and job id of a second launch):
   without a secret it stops the job, which says why; with one, a claim that cannot
   prove the secret is refused and the job goes on. */
static void test_second_claim(void)
{
    static const char *const secrets[] = {NULL, "s3cret"};
    const char *hello = "1 2 00112233445566778899aabbccddeeff";
    size_t k;
    for (k = 0; k < 2; k++) {
        pthread_t th[2];
        pthread_barrier_t gate;
        peer p[2];
        char text[256] = "", name[64];
        int fd, status = -1, i, formed;
        pthread_barrier_init(&gate, NULL, 3);
        start(p, th, &gate, test_free_port(), secrets[k], 0);
        pthread_barrier_wait(&gate);
        if ((fd = dial(p[0].port)) >= 0) {
            send_msg(fd, DDP__HELLO, "store-abuse", hello, (uint32_t)strlen(hello));
            status = answer(fd, text, sizeof text, 3000);
            close(fd);
        }
        pthread_barrier_wait(&gate);
        for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
        formed = p[0].init == DDP_OK && p[1].init == DDP_OK;
        for (i = 0; formed && i < 2; i++) pthread_create(&th[i], NULL, after_claim, &p[i]);
        for (i = 0; formed && i < 2; i++) pthread_join(th[i], NULL);
        snprintf(name, sizeof name, "store.second_claim.%s", secrets[k] ? "secret_refused" : "stops_the_job");
        if (!secrets[k]) /* the store meeting fails on both, and so does rank 0's next collective */
            CHECK(name, formed && status == DDP__ST_ERROR && strstr(text, "two processes claim rank 1") &&
                  p[1].init != DDP_OK && p[0].r != DDP_OK && strstr(ddp_error(&p[0].ctx), "two processes claim rank 1") &&
                  strstr(ddp_error(&p[0].ctx), "without DDP_SECRET, anyone who reaches the port can claim a rank"),
                  "claim answered %d '%s'; rank 0: %s '%s'; rank 1: %s '%s'", status, text, ddp_strerror(p[0].r),
                  ddp_error(&p[0].ctx), ddp_strerror(p[1].init), ddp_error(&p[1].ctx));
        else
            CHECK(name, formed && status == DDP__ST_CHALLENGE && p[0].init == DDP_OK && p[1].init == DDP_OK &&
                  p[0].r == DDP_OK && p[1].r == DDP_OK, "claim answered %d '%s'; then rank 0 %s %s, rank 1 %s %s",
                  status, text, ddp_strerror(p[0].init), ddp_strerror(p[0].r), ddp_strerror(p[1].init),
                  ddp_strerror(p[1].r));
        destroy_both(p);
        pthread_barrier_destroy(&gate);
    }
}

/* A connection that never says hello (an idle client, a port scan) does not keep rank 0
   from leaving when the job ends: the store waits only for the job's ranks. */
static void test_idle_stranger(void)
{
    pthread_t th[2];
    pthread_barrier_t gate;
    peer p[2];
    int fd, i;
    double t0, dt;
    pthread_barrier_init(&gate, NULL, 3);
    start(p, th, &gate, test_free_port(), NULL, 0);
    pthread_barrier_wait(&gate);
    fd = dial(p[0].port);
    pthread_barrier_wait(&gate);
    for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
    t0 = test_now_s();
    destroy_both(p);
    dt = test_now_s() - t0;
    CHECK("store.idle_stranger_does_not_delay_the_end", fd >= 0 && dt < 1, "ddp_destroy took %.2f s with an idle "
          "connection open", dt);
    if (fd >= 0) close(fd);
    pthread_barrier_destroy(&gate);
}

/* Someone who knows the job id but not the secret claims rank 1 while the job forms:
   challenged, a made-up proof refused; the job then forms as usual. */
static void stranger(int port)
{
    const char *hello = "1 2 00112233445566778899aabbccddeeff";
    char t1[256] = "", t2[256] = "", mac[65];
    int fd = -1, st1 = -1, st2 = -1;
    double t0 = test_now_s();
    memset(mac, 'a', 64);
    mac[64] = 0;
    while (fd < 0 && test_now_s() - t0 < 5) { /* rank 0's thread is opening the store */
        struct timespec ts = {0, 10000000L};
        if ((fd = dial(port)) < 0) nanosleep(&ts, NULL);
    }
    if (fd >= 0) {
        send_msg(fd, DDP__HELLO, "store-abuse", hello, (uint32_t)strlen(hello));
        st1 = answer(fd, t1, sizeof t1, 3000);
        send_msg(fd, DDP__AUTH, "", mac, 64);
        st2 = answer(fd, t2, sizeof t2, 3000);
        close(fd);
    }
    CHECK("store.secret.stranger_refused", st1 == DDP__ST_CHALLENGE && st2 == DDP__ST_ERROR &&
          strstr(t2, "authentication failed"), "hello answered %d, a made-up proof answered %d '%s'", st1, st2, t2);
}

/* With a secret: a wrong secret, none, and a secret the store does not have are
   refused; the right one works; refusals do not harm the job. */
static void test_secret(void)
{
    static const struct { const char *server, *client, *want; } cases[] = {
        {"right", "right", NULL},
        {"right", "wrong", "could not prove it knows this rank's DDP_SECRET"},
        {"right", NULL, "asks for a secret"},
        {NULL, "right", "did not ask for the secret"},
    };
    size_t i;
    char name[64];
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        peer p[2];
        pthread_t th[2];
        int port = test_free_port(), k;
        memset(p, 0, sizeof p);
        for (k = 0; k < 2; k++) {
            p[k].rank = k;
            p[k].port = port;
            p[k].secret = k == 0 ? cases[i].server : cases[i].client;
            p[k].timeout_ms = cases[i].want && k == 0 ? 1500 : 0; /* rank 0 then waits for nobody */
            pthread_create(&th[k], NULL, peer_main, &p[k]);
            if (i == 0 && k == 0) stranger(port); /* before rank 1 has taken its place */
        }
        for (k = 0; k < 2; k++) pthread_join(th[k], NULL);
        snprintf(name, sizeof name, "store.secret.%zu", i);
        if (!cases[i].want)
            CHECK(name, p[0].init == DDP_OK && p[1].init == DDP_OK, "both know the secret: init %d %d", (int)p[0].init,
                  (int)p[1].init);
        else
            CHECK(name, p[1].init == DDP_ERR_REFUSED && strstr(ddp_error(&p[1].ctx), cases[i].want),
                  "rank 1 (secret %s, store's %s): %s '%s'", cases[i].client ? cases[i].client : "none",
                  cases[i].server ? cases[i].server : "none", ddp_strerror(p[1].init), ddp_error(&p[1].ctx));
        destroy_both(p);
    }
}

/* A fake store: what a rank with a secret sends must not contain the secret, and a
   store that cannot prove it knows the secret is refused. */
static void test_fake_store(void)
{
    peer p;
    pthread_t th;
    char seen[4096];
    size_t got = 0;
    int port, lfd = test_listen(&port), fd, refused;
    if (lfd < 0) {
        test_skip("store.secret_never_sent", "cannot listen on 127.0.0.1");
        return;
    }
    memset(&p, 0, sizeof p);
    p.rank = 1;
    p.port = port;
    p.secret = "TOPSECRET-4711";
    pthread_create(&th, NULL, peer_main, &p);
    if ((fd = accept(lfd, NULL, NULL)) >= 0) {
        const char *challenge = "0123456789abcdef0123456789abcdef 00000000000000000000000000000000"
                                "00000000000000000000000000000000";
        uint32_t h[4];
        ssize_t k;
        /* read the hello, answer with a challenge whose proof is wrong, keep reading */
        while (got < sizeof seen - 1 && (k = recv(fd, seen + got, sizeof seen - 1 - got, MSG_DONTWAIT)) != 0) {
            if (k < 0) { struct pollfd pf = {fd, POLLIN, 0}; if (poll(&pf, 1, 300) <= 0) break; continue; }
            got += (size_t)k;
            if (got >= 16 && got < 200) {
                h[0] = htonl(DDP__MAGIC); h[1] = htonl(DDP__ST_CHALLENGE); h[2] = 0; h[3] = htonl((uint32_t)strlen(challenge));
                if (write(fd, h, 16) != 16 || write(fd, challenge, strlen(challenge)) < 0) break;
            }
        }
        close(fd);
    }
    pthread_join(th, NULL);
    seen[got] = 0;
    refused = p.init == DDP_ERR_REFUSED && strstr(ddp_error(&p.ctx), "could not prove it knows");
    CHECK("store.fake_store_refused", refused, "%s '%s'", ddp_strerror(p.init), ddp_error(&p.ctx));
    CHECK("store.secret_never_sent", got > 16 && !memmem(seen, got, "TOPSECRET", 9), "%zu bytes seen%s", got,
          memmem(seen, got, "TOPSECRET", 9) ? ", with the secret in them" : "");
    ddp_destroy(&p.ctx);
    close(lfd);
}

/* The store listens only on MASTER_ADDR, and refuses an address that is not this host's. */
static void test_bind(void)
{
    peer p[2];
    pthread_t th[2];
    int port = test_free_port(), k, fd = -1, refused = 0;
    struct sockaddr_in a;
    ddp_ctx ctx;
    ddp_desc d;
    ddp_result r;
    memset(p, 0, sizeof p);
    for (k = 0; k < 2; k++) {
        p[k].rank = k;
        p[k].port = port;
        pthread_create(&th[k], NULL, peer_main, &p[k]);
    }
    for (k = 0; k < 2; k++) pthread_join(th[k], NULL);
    /* 127.0.0.2 is this host's too, but not the address the job chose */
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(0x7f000002);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    refused = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == ECONNREFUSED;
    if (fd >= 0) close(fd);
    CHECK("store.listens_on_master_addr_only", p[0].init == DDP_OK && refused,
          "init %d; a connection to 127.0.0.2 was %s", (int)p[0].init, refused ? "refused" : "accepted");
    destroy_both(p);
    /* rank 0 alone on an address that is not its host's: binding fails (no packet leaves) */
    memset(&d, 0, sizeof d);
    d.world_size = 2;
    d.master_addr = "192.0.2.1"; /* TEST-NET-1: never this host's */
    d.master_port = port;
    d.timeout_ms = 2000;
    r = ddp_init(&ctx, &d);
    CHECK("store.refuses_foreign_master_addr", r == DDP_ERR_ENV && strstr(ddp_error(&ctx), "not an address of rank 0's host"),
          "%s '%s'", ddp_strerror(r), ddp_error(&ctx));
    ddp_destroy(&ctx);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* the store hangs up on the stranger played here */
    test_strangers();
    test_second_claim();
    test_idle_stranger();
    test_secret();
    test_fake_store();
    test_bind();
    TEST_EXIT();
}
