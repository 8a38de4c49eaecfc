/* Run under mpirun by tests/test_mpi.sh: the communicator between real
 * processes. One mode per run:
 *
 *   mpi_check ranks TIMEOUT            each rank prints where it stands
 *   mpi_check sums TIMEOUT             sums over all ranks and over groups,
 *                                      checked bit for bit against the
 *                                      serial sum in group order; rank 0
 *                                      prints their digest (equal run to run)
 *   mpi_check p2p TIMEOUT              a ring of large messages, records
 *                                      gathered, a barrier
 *   mpi_check short TIMEOUT            rank 1 expects 8 bytes, gets 6
 *   mpi_check hang TIMEOUT RANK        RANK stops answering; the others sum on
 *   mpi_check die TIMEOUT RANK         RANK is killed (SIGKILL) mid-run
 *   mpi_check quit TIMEOUT RANK        RANK exits 0 mid-run, not finalizing
 *   mpi_check chain TIMEOUT            rank 0 waits on 1, which waits (longer)
 *                                      on 2, which is elsewhere: rank 0 times
 *                                      out first and must name rank 2
 *   mpi_check circle TIMEOUT           ranks 0 and 1 wait on each other
 *
 * Exit 0 when everything checked; a failure prints its reason and ends the
 * job with exit status 3 (gp_comm_abort). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/comm.h"
#include "util/xxh64.h"

static struct gp_comm *comm;

static void check(gp_status st, const struct gp_error *err)
{
    if (st == GP_OK) return;
    fprintf(stderr, "mpi_check: %s\n", err->msg);
    gp_comm_abort(comm, 3);
}

static _Noreturn void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mpi_check: rank %d: FAIL: ", comm ? gp_comm_rank(comm) : -1);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    gp_comm_abort(comm, 3);
}

/* Rank r's element i: floats of exponents from 2^-12 to 2^12 and both signs,
 * so that the order of a sum changes its rounding. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    return x ^ (x >> 33);
}

static double value(int rank, size_t i)
{
    uint64_t h = mix(((uint64_t)rank << 40) ^ (uint64_t)i ^ 0x9e3779b97f4a7c15ULL);
    double mant = (double)(h >> 11) / 9007199254740992.0; /* [0, 1) */
    int e = (int)((h >> 3) % 25) - 12;
    return (h & 1 ? -1 : 1) * (0.5 + mant) * ldexp(1.0, e);
}

/* The serial sum over ranks[0..n) in that order, in float and in double. */
static float serial_f32(const int *ranks, int n, size_t i)
{
    float acc = (float)value(ranks[0], i);
    for (int k = 1; k < n; k++) acc += (float)value(ranks[k], i);
    return acc;
}

static double serial_f64(const int *ranks, int n, size_t i)
{
    double acc = value(ranks[0], i);
    for (int k = 1; k < n; k++) acc += value(ranks[k], i);
    return acc;
}

/* Sums n elements over the group (NULL: the world) and checks every bit;
 * returns how many elements another order (the reverse) would round
 * otherwise, and hashes the results into h (unless NULL). */
static size_t check_sum(const struct gp_comm_group *g, size_t n, struct gp_xxh64 *h)
{
    int size = gp_comm_size(comm), me = gp_comm_rank(comm);
    int world[64], *ranks = world, count = g ? g->size : size;
    if (g) ranks = (int *)g->ranks;
    else
        for (int k = 0; k < size; k++) world[k] = k;
    int reversed[64];
    for (int k = 0; k < count; k++) reversed[k] = ranks[count - 1 - k];
    float *f = malloc(sizeof *f * (n ? n : 1));
    double *d = malloc(sizeof *d * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)value(me, i);
        d[i] = value(me, i);
    }
    struct gp_error err = {0};
    check(gp_comm_allreduce_sum_f32(comm, g, f, n, &err), &err);
    check(gp_comm_allreduce_sum_f64(comm, g, d, n, &err), &err);
    size_t order_matters = 0;
    for (size_t i = 0; i < n; i++) {
        float ef = serial_f32(ranks, count, i);
        double ed = serial_f64(ranks, count, i);
        if (memcmp(&ef, &f[i], sizeof ef))
            fail("float sum of %zu elements, element %zu: %.9g, the serial sum in group order is %.9g", n, i,
                 (double)f[i], (double)ef);
        if (memcmp(&ed, &d[i], sizeof ed))
            fail("double sum of %zu elements, element %zu: %.17g, the serial sum in group order is %.17g", n, i,
                 d[i], ed);
        float rf = serial_f32(reversed, count, i);
        order_matters += memcmp(&rf, &ef, sizeof rf) != 0;
    }
    if (h) {
        gp_xxh64_update(h, f, sizeof *f * n);
        gp_xxh64_update(h, d, sizeof *d * n);
    }
    free(f);
    free(d);
    return order_matters;
}

static void sums(void)
{
    int size = gp_comm_size(comm), me = gp_comm_rank(comm);
    if (size < 2 || size > 64) fail("run with 2 to 64 ranks, not %d", size);
    struct gp_xxh64 h;
    gp_xxh64_init(&h, 0);
    /* Fewer elements than ranks (empty segments), a few, an odd count. */
    static const size_t lengths[] = {0, 1, 3, 7, 1000, 100003};
    size_t matters = 0;
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) matters = check_sum(NULL, lengths[k], &h);
    /* The test means something only if another order would differ. */
    if (matters == 0) fail("the reverse order sums 100003 elements alike: the data cannot tell orders apart");
    /* Two groups at once: every rank but 2 in descending order (the
     * group's order is the order of the sum), and rank 2 alone. (A sum of
     * two is the same both ways round: order shows from three members.) */
    int others[64], n_others = 0, alone[1] = {2};
    for (int r = size - 1; r >= 0; r--)
        if (r != 2) others[n_others++] = r;
    struct gp_comm_group g = me == 2 ? (struct gp_comm_group){1, alone} : (struct gp_comm_group){n_others, others};
    size_t group_matters = check_sum(&g, 20011, NULL); /* the groups' sums differ: not in the digest */
    if (g.size > 2 && group_matters == 0) fail("the reverse order sums the group's elements alike");
    /* Every rank holds the same world sums; rank 0 prints them for the
     * script to compare across runs. */
    char hex[17];
    gp_xxh64_hex(gp_xxh64_digest(&h), hex);
    printf("rank %d sums ok, order matters at %zu of 100003, digest %s\n", me, matters, hex);
}

static void p2p(void)
{
    int size = gp_comm_size(comm), me = gp_comm_rank(comm);
    struct gp_error err = {0};
    /* Larger than any eager limit: a send completes only once received.
     * Even ranks send first, odd ones receive first, so the ring moves. */
    size_t n = (size_t)3 << 20;
    unsigned char *out = malloc(n), *in = malloc(n);
    for (size_t i = 0; i < n; i++) out[i] = (unsigned char)(mix((uint64_t)me * n + i) & 0xff);
    int next = (me + 1) % size, prev = (me + size - 1) % size;
    for (int pass = 0; pass < 2; pass++) {
        if ((me % 2 == 0) == (pass == 0)) check(gp_comm_send(comm, next, 7, out, n, &err), &err);
        else check(gp_comm_recv(comm, prev, 7, in, n, &err), &err);
    }
    for (size_t i = 0; i < n; i++)
        if (in[i] != (unsigned char)(mix((uint64_t)prev * n + i) & 0xff))
            fail("byte %zu of rank %d's message differs", i, prev);
    struct { int32_t rank, twice; } mine = {me, 2 * me}, all[64];
    check(gp_comm_allgather(comm, NULL, &mine, sizeof mine, all, &err), &err);
    for (int r = 0; r < size; r++)
        if (all[r].rank != r || all[r].twice != 2 * r) fail("gathered record %d is {%d, %d}", r, all[r].rank, all[r].twice);
    check(gp_comm_barrier(comm, NULL, &err), &err);
    /* Refusals that need no peer. */
    if (gp_comm_send(comm, me, 1, out, 0, &err) == GP_OK) fail("a send to itself was taken");
    gp_error_clear(&err);
    if (gp_comm_send(comm, next, GP_COMM_MAX_TAG + 1, out, 0, &err) == GP_OK) fail("a reserved tag was taken");
    free(out);
    free(in);
    printf("rank %d p2p ok\n", me);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mpi_check MODE TIMEOUT [RANK]\n");
        return 2;
    }
    const char *mode = argv[1];
    double timeout = atof(argv[2]);
    int target = argc > 3 ? atoi(argv[3]) : -1;
    struct gp_launch l;
    struct gp_error err = {0};
    if (gp_launch_from_environ(&l, &err) != GP_OK) {
        fprintf(stderr, "mpi_check: %s\n", err.msg);
        return 3;
    }
    /* Starting up is given a minute whatever the mode's timeout: ranks
     * start slowly on a busy machine (and under the sanitizers), and a
     * fault test must time out on the rank it stops, not on a slow start. */
    if (gp_comm_init(&l, 60, &comm, &err) != GP_OK) {
        fprintf(stderr, "mpi_check: %s\n", err.msg);
        if (comm) gp_comm_abort(comm, 3);
        return 3;
    }
    check(gp_comm_barrier(comm, NULL, &err), &err);
    gp_comm_set_timeout(comm, timeout);
    int me = gp_comm_rank(comm);
    if (!strcmp(mode, "ranks")) {
        printf("rank %d of %d, local %d of %d, launcher %s\n", l.rank, l.size, l.local_rank, l.local_size,
               gp_launcher_name(l.launcher));
    } else if (!strcmp(mode, "sums")) {
        sums();
    } else if (!strcmp(mode, "p2p")) {
        p2p();
    } else if (!strcmp(mode, "short")) {
        char buf[8] = {0};
        if (me == 0) check(gp_comm_send(comm, 1, 3, buf, 6, &err), &err);
        if (me == 1) check(gp_comm_recv(comm, 0, 3, buf, 8, &err), &err);
    } else if (!strcmp(mode, "hang") || !strcmp(mode, "die") || !strcmp(mode, "quit")) {
        float x[64];
        for (int step = 0; step < 100000; step++) {
            if (me == target && step == 3) {
                fprintf(stderr, "mpi_check: rank %d %s at step %d\n", me, mode, step);
                fflush(stderr);
                if (!strcmp(mode, "die")) raise(SIGKILL);
                if (!strcmp(mode, "quit")) _exit(0);
                sleep(600); /* alive, silent */
            }
            for (int i = 0; i < 64; i++) x[i] = (float)step;
            check(gp_comm_allreduce_sum_f32(comm, NULL, x, 64, &err), &err);
        }
        fail("the job went on without rank %d", target);
    } else if (!strcmp(mode, "chain") || !strcmp(mode, "circle")) {
        /* Rank 0 times out first: the others wait three times as long. */
        if (me != 0) gp_comm_set_timeout(comm, 3 * timeout);
        int from = !strcmp(mode, "circle") ? (me == 0 ? 1 : me == 1 ? 0 : -1) : me < 2 ? me + 1 : -1;
        char byte;
        if (from >= 0) check(gp_comm_recv(comm, from, 5, &byte, 1, &err), &err);
        else sleep(600); /* alive, elsewhere in the program: not polling */
        fail("rank %d heard from rank %d", me, from);
    } else {
        fail("unknown mode '%s'", mode);
    }
    fflush(stdout);
    gp_comm_finalize(comm);
    return 0;
}
