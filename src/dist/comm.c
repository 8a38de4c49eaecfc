/* The communicator over MPI (dist/comm.h): non-blocking calls polled
 * against a deadline, so that no operation waits forever on a lost rank. */
#include "dist/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef GP_HAVE_MPI
#include <mpi.h>

/* Tags above the user's range, one per message kind of the collectives: a
 * member already in the next phase (or the next collective) cannot have
 * its message matched by a receive of the phase before. MPI guarantees tags
 * up to 32767. */
enum {
    TAG_ALLGATHER = GP_COMM_MAX_TAG + 1,
    TAG_REDUCE,  /* a segment of someone's data, to the member that sums it */
    TAG_SUMMED,  /* a summed segment, to every member */
    TAG_WHO,     /* "whom are you waiting for?", from a rank that timed out */
    TAG_WAITING, /* the answer (struct waiting_answer) */
};

/* The waits this rank's threads are in, for answering TAG_WHO: a thread
 * registers once its wait outlasts the first polls. */
#define WAIT_SLOTS 16

struct wait_slot {
    bool used;
    int peer;  /* world rank of the first request still pending */
    bool recv; /* whether that request is a receive */
    double since;
};

struct waiting_answer {
    int32_t peer;    /* -1: not waiting on anyone */
    int32_t recv;
    double waited_s;
};

/* Answers sent without waiting for their completion (MPI_Request_free):
 * each keeps its buffer until ANSWER_RING answers later. */
#define ANSWER_RING 16

/* MPI counts are ints: larger messages go in pieces of this many bytes,
 * which arrive in order (MPI does not let messages of one sender, tag and
 * communicator overtake each other). */
#define CHUNK ((size_t)1 << 30)

struct gp_comm {
    MPI_Comm comm; /* a duplicate of MPI_COMM_WORLD: our messages never meet another library's */
    int rank, size;
    double timeout_s;
    /* Set by whichever thread's operation failed (threads of a pipeline
     * stage send and receive at once). */
    atomic_bool broken;
    /* The failure that broke it, for the operations that fail after it
     * (on other threads, too): 0 unset, 1 being written, 2 set. What a
     * stage's threads report first is often such a later failure. */
    atomic_int why_state;
    char why[400];
    bool concurrent; /* MPI_THREAD_MULTIPLE */
    bool ready;      /* the duplicate exists: questions can be answered */
    pthread_mutex_t waits_lock;
    struct wait_slot waits[WAIT_SLOTS];
    struct waiting_answer answers[ANSWER_RING];
    atomic_int next_answer;
    /* Where the answers to this rank's questions arrive: a question given
     * up on may still be answered late (into the ring, not a dead frame). */
    struct waiting_answer heard[ANSWER_RING];
    atomic_int next_heard;
};

/* The requests of one operation and, for each, the peer it waits on. */
struct pending {
    int n, cap;
    MPI_Request *req;
    MPI_Status *status;
    int *index;
    int *peer;      /* world rank; -1: every rank (the communicator's duplication) */
    bool *is_recv;
    size_t *bytes;  /* what a receive expects */
    int *tag;
};

static void pending_free(struct pending *p)
{
    free(p->req);
    free(p->status);
    free(p->index);
    free(p->peer);
    free(p->is_recv);
    free(p->bytes);
    free(p->tag);
    *p = (struct pending){0};
}

static gp_status pending_grow(struct pending *p, struct gp_error *err)
{
    if (p->n < p->cap) return GP_OK;
    int cap = p->cap ? 2 * p->cap : 16;
    void *r = realloc(p->req, sizeof *p->req * (size_t)cap), *s = realloc(p->status, sizeof *p->status * (size_t)cap),
         *x = realloc(p->index, sizeof *p->index * (size_t)cap), *q = realloc(p->peer, sizeof *p->peer * (size_t)cap),
         *v = realloc(p->is_recv, sizeof *p->is_recv * (size_t)cap), *b = realloc(p->bytes, sizeof *p->bytes * (size_t)cap),
         *t = realloc(p->tag, sizeof *p->tag * (size_t)cap);
    /* Each pointer that moved is kept, so pending_free frees it whatever failed. */
    if (r) p->req = r;
    if (s) p->status = s;
    if (x) p->index = x;
    if (q) p->peer = q;
    if (v) p->is_recv = v;
    if (b) p->bytes = b;
    if (t) p->tag = t;
    if (!r || !s || !x || !q || !v || !b || !t) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    p->cap = cap;
    return GP_OK;
}

static gp_status mpi_failed(struct gp_comm *c, int rc, const char *what, int peer, struct gp_error *err)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    c->broken = true;
    if (peer >= 0)
        return gp_error_set(err, GP_ERR_COMM, "%s: rank %d failed to communicate with rank %d: %s", what, c->rank,
                            peer, text);
    return gp_error_set(err, GP_ERR_COMM, "%s: rank %d: MPI failed: %s", what, c->rank, text);
}

/* Posts a send or receive of `bytes` bytes (in CHUNK pieces; a message of
 * zero bytes is still one message, so that the pair matches). */
static gp_status post(struct gp_comm *c, struct pending *p, bool recv, int peer, int tag, void *buf, size_t bytes,
                      const char *what, struct gp_error *err)
{
    size_t done = 0;
    do {
        size_t piece = bytes - done < CHUNK ? bytes - done : CHUNK;
        GP_TRY(pending_grow(p, err));
        int k = p->n;
        int rc = recv ? MPI_Irecv((char *)buf + done, (int)piece, MPI_BYTE, peer, tag, c->comm, &p->req[k])
                      : MPI_Isend((char *)buf + done, (int)piece, MPI_BYTE, peer, tag, c->comm, &p->req[k]);
        if (rc != MPI_SUCCESS) return mpi_failed(c, rc, what, peer, err);
        p->peer[k] = peer;
        p->is_recv[k] = recv;
        p->bytes[k] = piece;
        p->tag[k] = tag;
        p->n++;
        done += piece;
    } while (done < bytes);
    return GP_OK;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* "1, 3 and 4" from the distinct peers of the requests still pending of
 * one direction. */
static int pending_peers(const struct pending *p, bool recv, char *out, size_t size)
{
    int count = 0;
    size_t len = 0;
    out[0] = '\0';
    for (int k = 0; k < p->n; k++) {
        if (p->req[k] == MPI_REQUEST_NULL || p->is_recv[k] != recv) continue;
        bool seen = false;
        for (int j = 0; j < k; j++)
            seen |= p->req[j] != MPI_REQUEST_NULL && p->is_recv[j] == recv && p->peer[j] == p->peer[k];
        if (seen) continue;
        if (len < size)
            len += (size_t)snprintf(out + len, size - len, "%s%d", count ? ", " : "", p->peer[k]);
        count++;
    }
    return count;
}

/* ---- Whom a waiting rank waits for ----
 *
 * A rank that times out names the peer it did not hear from; but that peer
 * is often waiting itself, on a rank further along (a stage waits on the
 * next, which waits on a stopped one). Which of the waiting ranks times out
 * first is a matter of timing, and the first to fail ends the job. So every
 * rank answers, while it waits, its peers' question "whom are you waiting
 * for?", and a rank that times out follows those answers to the end of the
 * chain: the rank that does not answer (or the circle, when ranks wait on
 * each other). Its message thus names the rank that holds the job up,
 * whichever rank reports it. */

/* The slot of a wait that outlasted the first polls: -1 when every slot is
 * taken (the wait goes unreported). */
static int wait_register(struct gp_comm *c, double since)
{
    int slot = -1;
    pthread_mutex_lock(&c->waits_lock);
    for (int k = 0; k < WAIT_SLOTS && slot < 0; k++)
        if (!c->waits[k].used) {
            c->waits[k] = (struct wait_slot){.used = true, .peer = -1, .since = since};
            slot = k;
        }
    pthread_mutex_unlock(&c->waits_lock);
    return slot;
}

/* Records the first request of p still pending, receives first (the
 * message this rank waits for; a send waits only for its taker). */
static void wait_update(struct gp_comm *c, int slot, const struct pending *p)
{
    if (slot < 0) return;
    int peer = -1;
    bool recv = false;
    for (int pass = 0; pass < 2 && peer < 0; pass++)
        for (int k = 0; k < p->n && peer < 0; k++)
            if (p->req[k] != MPI_REQUEST_NULL && p->is_recv[k] == (pass == 0)) {
                peer = p->peer[k];
                recv = pass == 0;
            }
    pthread_mutex_lock(&c->waits_lock);
    c->waits[slot].peer = peer;
    c->waits[slot].recv = recv;
    pthread_mutex_unlock(&c->waits_lock);
}

static void wait_release(struct gp_comm *c, int slot)
{
    if (slot < 0) return;
    pthread_mutex_lock(&c->waits_lock);
    c->waits[slot].used = false;
    pthread_mutex_unlock(&c->waits_lock);
}

/* Answers every question that has arrived, with this rank's longest wait
 * on a single peer. Matched probes: two threads never take one question. */
static void answer_questions(struct gp_comm *c)
{
    while (c->ready) {
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        if (MPI_Improbe(MPI_ANY_SOURCE, TAG_WHO, c->comm, &flag, &msg, &st) != MPI_SUCCESS || !flag) return;
        char question;
        if (MPI_Mrecv(&question, 1, MPI_BYTE, &msg, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        struct waiting_answer a = {.peer = -1};
        double now = now_s(), oldest = now;
        pthread_mutex_lock(&c->waits_lock);
        for (int k = 0; k < WAIT_SLOTS; k++)
            if (c->waits[k].used && c->waits[k].peer >= 0 && c->waits[k].since <= oldest) {
                oldest = c->waits[k].since;
                a = (struct waiting_answer){.peer = c->waits[k].peer, .recv = c->waits[k].recv, .waited_s = now - oldest};
            }
        pthread_mutex_unlock(&c->waits_lock);
        struct waiting_answer *buf = &c->answers[atomic_fetch_add(&c->next_answer, 1) % ANSWER_RING];
        *buf = a;
        MPI_Request req;
        if (MPI_Isend(buf, (int)sizeof *buf, MPI_BYTE, st.MPI_SOURCE, TAG_WAITING, c->comm, &req) == MPI_SUCCESS)
            MPI_Request_free(&req);
    }
}

/* Sleeps while waiting: spin first (a frontier usually arrives within
 * microseconds of the first poll), then longer and longer, up to a
 * millisecond, so that ranks that wait do not take the cores of ranks that
 * compute (several ranks may share a machine's cores). */
static void idle_pause(long idle)
{
    if (idle <= 64) return;
    long ns = idle > 64 + 7 ? 1000000 : 8000L << (idle - 65);
    struct timespec t = {0, ns};
    nanosleep(&t, NULL);
}

/* How long a rank that timed out waits for each answer. */
#define ANSWER_WAIT_S 1.0

static double answer_wait(const struct gp_comm *c) { return c->timeout_s < ANSWER_WAIT_S ? c->timeout_s : ANSWER_WAIT_S; }

/* Asks `peer` whom it waits for: true and the answer, or false when no
 * answer came within ANSWER_WAIT_S (the question is left behind). */
static bool ask_peer(struct gp_comm *c, int peer, struct waiting_answer *a)
{
    static const char question = 0;
    struct waiting_answer *into = &c->heard[atomic_fetch_add(&c->next_heard, 1) % ANSWER_RING];
    MPI_Request req[2];
    if (MPI_Irecv(into, (int)sizeof *into, MPI_BYTE, peer, TAG_WAITING, c->comm, &req[0]) != MPI_SUCCESS) return false;
    if (MPI_Isend(&question, 1, MPI_BYTE, peer, TAG_WHO, c->comm, &req[1]) != MPI_SUCCESS) {
        MPI_Cancel(&req[0]);
        MPI_Request_free(&req[0]);
        return false;
    }
    double deadline = now_s() + answer_wait(c);
    int got = 0;
    for (long idle = 0; !got && now_s() < deadline; idle++) {
        if (MPI_Test(&req[0], &got, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        answer_questions(c); /* a rank that asks may be asked in turn */
        if (!got) idle_pause(idle);
    }
    if (got) *a = *into;
    else {
        MPI_Cancel(&req[0]);
        MPI_Request_free(&req[0]);
    }
    int sent = 0;
    MPI_Test(&req[1], &sent, MPI_STATUS_IGNORE);
    if (!sent) MPI_Request_free(&req[1]); /* a peer that never takes it is the one named */
    return got;
}

/* Appends to `out` the chain of waits that starts at `first`, whom this
 * rank waited for in vain: "; rank 1 has waited 3.9 s to hear from rank 2;
 * rank 2 did not answer within 1 s whom it waits for: rank 2 is dead, hung,
 * or elsewhere in the program, and the ranks before it wait on it". */
static void follow_chain(struct gp_comm *c, int first, char *out, size_t size)
{
    size_t len = strlen(out);
#define SAY(...) (len < size ? (len += (size_t)snprintf(out + len, size - len, __VA_ARGS__)) : 0)
    bool *seen = calloc((size_t)c->size, sizeof *seen);
    if (!seen) return;
    seen[c->rank] = true;
    int peer = first;
    for (int hop = 0; hop < c->size; hop++) {
        seen[peer] = true;
        struct waiting_answer a;
        if (!ask_peer(c, peer, &a)) {
            if (hop == 0) SAY("; nor did it answer within %g s whom it waits for", answer_wait(c));
            else
                SAY("; rank %d did not answer within %g s whom it waits for: rank %d is dead, hung, or elsewhere in "
                    "the program, and the ranks before it wait on it",
                    peer, answer_wait(c), peer);
            break;
        }
        if (a.peer < 0 || a.peer >= c->size) {
            SAY("; rank %d answers that it waits for no one (it is elsewhere in the program)", peer);
            break;
        }
        SAY("; rank %d has waited %.1f s %s rank %d", peer, a.waited_s, a.recv ? "to hear from" : "for its message to be taken by",
            a.peer);
        if (seen[a.peer]) {
            SAY(a.peer == c->rank ? " (this rank): the ranks wait on each other (they disagree on what comes next)"
                                  : ": the ranks wait in a circle (they disagree on what comes next)");
            break;
        }
        peer = a.peer;
    }
#undef SAY
    free(seen);
}

/* The deadline passed with requests of p pending: names the peers not
 * heard from (or that did not take this rank's message), and where the
 * first of them is waiting in turn. */
static gp_status timed_out(struct gp_comm *c, const struct pending *p, const char *what, struct gp_error *err)
{
    char peers[512];
    int first = -1;
    for (int pass = 0; pass < 2 && first < 0; pass++)
        for (int k = 0; k < p->n && first < 0; k++)
            if (p->req[k] != MPI_REQUEST_NULL && p->is_recv[k] == (pass == 0)) first = p->peer[k];
    int count = pending_peers(p, true, peers, sizeof peers);
    if (count > 0)
        gp_error_set(err, GP_ERR_COMM,
                     "%s: rank %d heard nothing from rank%s %s within %g s (dead, hung, or elsewhere in the program)",
                     what, c->rank, count > 1 ? "s" : "", peers, c->timeout_s);
    else if ((count = pending_peers(p, false, peers, sizeof peers)) > 0)
        gp_error_set(err, GP_ERR_COMM,
                     "%s: rank%s %s did not take rank %d's message within %g s (dead, hung, or elsewhere in the "
                     "program)",
                     what, count > 1 ? "s" : "", peers, c->rank, c->timeout_s);
    else
        return gp_error_set(err, GP_ERR_COMM, "%s: not every rank took part within %g s", what, c->timeout_s);
    if (first >= 0) follow_chain(c, first, err->msg, sizeof err->msg);
    return GP_ERR_COMM;
}

/* Waits for every request of p until the deadline. A receive of another
 * size than posted, an MPI error or the deadline is an error (and breaks
 * the communicator: what is still pending cannot be taken back). A wait
 * that outlasts the first polls answers its peers' questions. */
static gp_status wait_all(struct gp_comm *c, struct pending *p, double start, const char *what, struct gp_error *err)
{
    double deadline = start + c->timeout_s;
    int left = p->n;
    long idle = 0;
    int slot = -1;
    bool registered = false;
    gp_status result = GP_OK;
    while (left > 0) {
        int done = 0;
        int rc = MPI_Testsome(p->n, p->req, &done, p->index, p->status);
        if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
            result = mpi_failed(c, rc, what, -1, err);
            break;
        }
        if (done == MPI_UNDEFINED) break;
        for (int d = 0; d < done && result == GP_OK; d++) {
            int k = p->index[d];
            const MPI_Status *st = &p->status[d];
            if (rc == MPI_ERR_IN_STATUS && st->MPI_ERROR != MPI_SUCCESS) {
                if (st->MPI_ERROR == MPI_ERR_TRUNCATE) {
                    c->broken = true;
                    result = gp_error_set(err, GP_ERR_COMM,
                                          "%s: rank %d sent rank %d a longer message than the %zu bytes expected "
                                          "(tag %d): the ranks disagree on what they exchange",
                                          what, p->peer[k], c->rank, p->bytes[k], p->tag[k]);
                } else {
                    result = mpi_failed(c, st->MPI_ERROR, what, p->peer[k], err);
                }
            } else if (p->is_recv[k]) {
                int got = 0;
                MPI_Get_count(st, MPI_BYTE, &got);
                if ((size_t)got != p->bytes[k]) {
                    c->broken = true;
                    result = gp_error_set(err, GP_ERR_COMM,
                                          "%s: rank %d sent rank %d a message of %d bytes where %zu were expected "
                                          "(tag %d): the ranks disagree on what they exchange",
                                          what, p->peer[k], c->rank, got, p->bytes[k], p->tag[k]);
                }
            }
        }
        if (result != GP_OK) break;
        left -= done;
        if (done > 0) {
            idle = 0;
            if (registered) wait_update(c, slot, p);
            continue;
        }
        if (now_s() > deadline) {
            c->broken = true;
            result = timed_out(c, p, what, err);
            break;
        }
        if (++idle > 64) {
            if (!registered) {
                registered = true;
                slot = wait_register(c, start);
                wait_update(c, slot, p);
            }
            answer_questions(c);
        }
        idle_pause(idle);
    }
    if (registered) wait_release(c, slot);
    return result;
}

/* p's requests, waited for within the timeout from now, then freed. */
static gp_status finish(struct gp_comm *c, struct pending *p, double start, const char *what, gp_status st,
                        struct gp_error *err)
{
    if (st == GP_OK) st = wait_all(c, p, start, what, err);
    else if (p->n > 0) c->broken = true; /* posted requests that will never be waited for */
    pending_free(p);
    int unset = 0;
    if (st != GP_OK && c->broken && atomic_compare_exchange_strong(&c->why_state, &unset, 1)) {
        size_t n = strnlen(err->msg, sizeof c->why - 1); /* the first words name the rank */
        memcpy(c->why, err->msg, n);
        c->why[n] = 0;
        atomic_store(&c->why_state, 2);
    }
    return st;
}

/* An operation on a communicator that broke before: the first failure's
 * reason, which names the rank that was lost (waiting a moment for the
 * thread that broke it to record it). */
static gp_status failed_before(struct gp_comm *c, const char *what, struct gp_error *err)
{
    for (int k = 0; k < 1000 && atomic_load(&c->why_state) == 1; k++) {
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
    if (atomic_load(&c->why_state) == 2)
        return gp_error_set(err, GP_ERR_COMM, "%s: the communicator of rank %d failed before (%s)", what, c->rank,
                            c->why);
    return gp_error_set(err, GP_ERR_COMM, "%s: the communicator of rank %d failed before", what, c->rank);
}

bool gp_comm_available(void) { return true; }

gp_status gp_comm_init(const struct gp_launch *launch, double timeout_s, struct gp_comm **out, struct gp_error *err)
{
    *out = NULL;
    if (!(timeout_s > 0)) return gp_error_set(err, GP_ERR_INVALID, "the communication timeout must be positive");
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (inited) {
        MPI_Query_thread(&provided);
    } else {
        /* Threads at once where MPI allows it (a pipeline stage's streams
         * send and receive concurrently); else at least one at a time. */
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) return gp_error_set(err, GP_ERR_COMM, "MPI could not be initialized (error %d)", rc);
        if (provided < MPI_THREAD_SERIALIZED) {
            MPI_Finalize();
            return gp_error_set(err, GP_ERR_COMM, "this MPI cannot be called from several threads in turn "
                                                   "(MPI_THREAD_SERIALIZED)");
        }
    }
    struct gp_comm *c = calloc(1, sizeof *c);
    if (!c) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    c->timeout_s = timeout_s;
    c->concurrent = provided >= MPI_THREAD_MULTIPLE;
    c->comm = MPI_COMM_NULL;
    pthread_mutex_init(&c->waits_lock, NULL);
    /* Errors come back as codes, to be reported with the ranks involved
     * (MPI's default handler would abort without saying which). */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    *out = c;
    if (launch && launch->launcher != GP_LAUNCH_NONE && (c->rank != launch->rank || c->size != launch->size))
        return gp_error_set(err, GP_ERR_COMM,
                            "%s launched this process as rank %d of %d, but MPI sees rank %d of %d: this MPI "
                            "cannot join that launcher's job (with Slurm, try srun --mpi=pmix, or mpirun)",
                            gp_launcher_name(launch->launcher), launch->rank, launch->size, c->rank, c->size);
    /* The duplicate is made by every rank at once: a rank missing here is
     * named as such (who cannot be told). */
    struct pending p = {0};
    gp_status st = pending_grow(&p, err);
    if (st == GP_OK) {
        int rc = MPI_Comm_idup(MPI_COMM_WORLD, &c->comm, &p.req[0]);
        if (rc != MPI_SUCCESS) st = mpi_failed(c, rc, "making the communicator", -1, err);
        else {
            p.peer[0] = -1;
            p.is_recv[0] = false;
            p.bytes[0] = 0;
            p.tag[0] = 0;
            p.n = 1;
        }
    }
    st = finish(c, &p, now_s(), "making the communicator", st, err);
    if (st != GP_OK) return st;
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    c->ready = true;
    return GP_OK;
}

void gp_comm_finalize(struct gp_comm *c)
{
    if (!c) return;
    if (c->broken) gp_comm_abort(c, 1);
    if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
    pthread_mutex_destroy(&c->waits_lock);
    free(c);
    MPI_Finalize();
}

_Noreturn void gp_comm_abort(struct gp_comm *c, int code)
{
    (void)c;
    fflush(NULL); /* the message that says why goes out before the job ends */
    MPI_Abort(MPI_COMM_WORLD, code);
    _Exit(code); /* MPI_Abort does not return; if it ever did */
}

void gp_comm_set_timeout(struct gp_comm *c, double timeout_s)
{
    if (timeout_s > 0) c->timeout_s = timeout_s;
}

int gp_comm_rank(const struct gp_comm *c) { return c->rank; }
int gp_comm_size(const struct gp_comm *c) { return c->size; }
bool gp_comm_broken(const struct gp_comm *c) { return c->broken; }
bool gp_comm_concurrent(const struct gp_comm *c) { return c->concurrent; }

static gp_status check_peer(struct gp_comm *c, int peer, int tag, const char *what, struct gp_error *err)
{
    if (c->broken) return failed_before(c, what, err);
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return gp_error_set(err, GP_ERR_INVALID, "%s: rank %d has no peer rank %d (ranks 0 to %d, not itself)", what,
                            c->rank, peer, c->size - 1);
    if (tag < 0 || tag > GP_COMM_MAX_TAG)
        return gp_error_set(err, GP_ERR_INVALID, "%s: tag %d is not from 0 to %d", what, tag, GP_COMM_MAX_TAG);
    return GP_OK;
}

gp_status gp_comm_send(struct gp_comm *c, int to, int tag, const void *buf, size_t bytes, struct gp_error *err)
{
    GP_TRY(check_peer(c, to, tag, "sending", err));
    struct pending p = {0};
    double start = now_s();
    gp_status st = post(c, &p, false, to, tag, (void *)buf, bytes, "sending", err);
    return finish(c, &p, start, "sending", st, err);
}

gp_status gp_comm_recv(struct gp_comm *c, int from, int tag, void *buf, size_t bytes, struct gp_error *err)
{
    GP_TRY(check_peer(c, from, tag, "receiving", err));
    struct pending p = {0};
    double start = now_s();
    gp_status st = post(c, &p, true, from, tag, buf, bytes, "receiving", err);
    return finish(c, &p, start, "receiving", st, err);
}

/* This rank's position in the group (the world's when g is NULL). */
static gp_status group_index(struct gp_comm *c, const struct gp_comm_group *g, const char *what, int *size,
                             int *index, struct gp_error *err)
{
    if (c->broken) return failed_before(c, what, err);
    if (!g) {
        *size = c->size;
        *index = c->rank;
        return GP_OK;
    }
    *size = g->size;
    *index = -1;
    for (int k = 0; k < g->size; k++) {
        if (g->ranks[k] < 0 || g->ranks[k] >= c->size)
            return gp_error_set(err, GP_ERR_INVALID, "%s: the group names rank %d of a job of %d", what, g->ranks[k],
                                c->size);
        if (g->ranks[k] == c->rank) *index = k;
    }
    if (*index < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: rank %d is not in the group", what, c->rank);
    return GP_OK;
}

static int member(const struct gp_comm_group *g, int k) { return g ? g->ranks[k] : k; }

gp_status gp_comm_allgather(struct gp_comm *c, const struct gp_comm_group *g, const void *mine, size_t bytes,
                            void *all, struct gp_error *err)
{
    const char *what = "gathering records";
    int size = 0, me = 0;
    GP_TRY(group_index(c, g, what, &size, &me, err));
    char *out = all;
    memmove(out + (size_t)me * bytes, mine, bytes);
    struct pending p = {0};
    double start = now_s();
    gp_status st = GP_OK;
    for (int k = 0; k < size && st == GP_OK; k++) {
        if (k == me) continue;
        st = post(c, &p, true, member(g, k), TAG_ALLGATHER, out + (size_t)k * bytes, bytes, what, err);
        if (st == GP_OK)
            st = post(c, &p, false, member(g, k), TAG_ALLGATHER, out + (size_t)me * bytes, bytes, what, err);
    }
    return finish(c, &p, start, what, st, err);
}

gp_status gp_comm_barrier(struct gp_comm *c, const struct gp_comm_group *g, struct gp_error *err)
{
    int size = 0, me = 0;
    GP_TRY(group_index(c, g, "waiting at a barrier", &size, &me, err));
    char *all = calloc((size_t)size, 1);
    if (!all) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    char mine = 1;
    gp_status st = gp_comm_allgather(c, g, &mine, 1, all, err);
    if (st != GP_OK) gp_error_prefix(err, "at a barrier: ");
    free(all);
    return st;
}

/* Segment s of n elements split among `size` members: the first n % size
 * segments have one element more. */
static size_t seg_start(size_t n, int size, int s)
{
    size_t q = n / (size_t)size, r = n % (size_t)size;
    return q * (size_t)s + ((size_t)s < r ? (size_t)s : r);
}

static size_t seg_len(size_t n, int size, int s) { return seg_start(n, size, s + 1) - seg_start(n, size, s); }

/* The sum over group members in group order, in the element type's own
 * arithmetic: out[i] = ((c0[i] + c1[i]) + c2[i]) + ... where ck is member
 * k's contribution, at parts + k * len. */
static void sum_f32(float *out, const float *parts, int size, size_t len)
{
    for (size_t i = 0; i < len; i++) out[i] = parts[i];
    for (int k = 1; k < size; k++) {
        const float *p = parts + (size_t)k * len;
        for (size_t i = 0; i < len; i++) out[i] += p[i];
    }
}

static void sum_f64(double *out, const double *parts, int size, size_t len)
{
    for (size_t i = 0; i < len; i++) out[i] = parts[i];
    for (int k = 1; k < size; k++) {
        const double *p = parts + (size_t)k * len;
        for (size_t i = 0; i < len; i++) out[i] += p[i];
    }
}

/* Reduce-scatter then all-gather, both direct: member k receives segment k
 * of everyone's data and sums it in group order; then every member sends
 * its summed segment to every other. Each element is summed by exactly one
 * member in a fixed order, so the result does not depend on timing. */
static gp_status allreduce(struct gp_comm *c, const struct gp_comm_group *g, void *data, size_t n, size_t elem,
                           bool f64, struct gp_error *err)
{
    const char *what = f64 ? "summing doubles over ranks" : "summing floats over ranks";
    int size = 0, me = 0;
    GP_TRY(group_index(c, g, what, &size, &me, err));
    if (size == 1 || n == 0) return GP_OK;
    char *bytes = data;
    size_t mine = seg_len(n, size, me);
    char *parts = NULL;
    if (mine > 0) {
        parts = malloc(mine * elem * (size_t)size);
        if (!parts) return gp_error_set(err, GP_ERR_NOMEM, "%s: out of memory for %zu elements", what, mine * (size_t)size);
        memcpy(parts + (size_t)me * mine * elem, bytes + seg_start(n, size, me) * elem, mine * elem);
    }
    double start = now_s();
    struct pending p = {0};
    gp_status st = GP_OK;
    for (int k = 0; k < size && st == GP_OK; k++) {
        if (k == me) continue;
        if (mine > 0) st = post(c, &p, true, member(g, k), TAG_REDUCE, parts + (size_t)k * mine * elem, mine * elem, what, err);
        size_t len = seg_len(n, size, k);
        if (st == GP_OK && len > 0)
            st = post(c, &p, false, member(g, k), TAG_REDUCE, bytes + seg_start(n, size, k) * elem, len * elem, what, err);
    }
    st = finish(c, &p, start, what, st, err);
    if (st == GP_OK && mine > 0) {
        void *out = bytes + seg_start(n, size, me) * elem;
        if (f64) sum_f64(out, (const double *)parts, size, mine);
        else sum_f32(out, (const float *)parts, size, mine);
    }
    free(parts);
    if (st != GP_OK) return st;
    p = (struct pending){0};
    for (int k = 0; k < size && st == GP_OK; k++) {
        if (k == me) continue;
        size_t len = seg_len(n, size, k);
        if (len > 0)
            st = post(c, &p, true, member(g, k), TAG_SUMMED, bytes + seg_start(n, size, k) * elem, len * elem, what, err);
        if (st == GP_OK && mine > 0)
            st = post(c, &p, false, member(g, k), TAG_SUMMED, bytes + seg_start(n, size, me) * elem, mine * elem, what, err);
    }
    return finish(c, &p, now_s(), what, st, err);
}

gp_status gp_comm_allreduce_sum_f32(struct gp_comm *c, const struct gp_comm_group *g, float *data, size_t n,
                                    struct gp_error *err)
{
    return allreduce(c, g, data, n, sizeof(float), false, err);
}

gp_status gp_comm_allreduce_sum_f64(struct gp_comm *c, const struct gp_comm_group *g, double *data, size_t n,
                                    struct gp_error *err)
{
    return allreduce(c, g, data, n, sizeof(double), true, err);
}

#else /* no MPI */

struct gp_comm {
    int unused;
};

bool gp_comm_available(void) { return false; }

gp_status gp_comm_init(const struct gp_launch *launch, double timeout_s, struct gp_comm **out, struct gp_error *err)
{
    (void)launch;
    (void)timeout_s;
    *out = NULL;
    return gp_error_set(err, GP_ERR_UNSUPPORTED,
                        "this gpipe-onnx was built without MPI, which running several processes needs "
                        "(install Open MPI: scripts/bootstrap.sh; then meson setup --reconfigure build)");
}

void gp_comm_finalize(struct gp_comm *c) { (void)c; }

_Noreturn void gp_comm_abort(struct gp_comm *c, int code)
{
    (void)c;
    fflush(NULL);
    _Exit(code);
}

void gp_comm_set_timeout(struct gp_comm *c, double timeout_s) { (void)c, (void)timeout_s; }
int gp_comm_rank(const struct gp_comm *c) { (void)c; return 0; }
int gp_comm_size(const struct gp_comm *c) { (void)c; return 1; }
bool gp_comm_broken(const struct gp_comm *c) { (void)c; return false; }
bool gp_comm_concurrent(const struct gp_comm *c) { (void)c; return false; }

static gp_status none(struct gp_error *err)
{
    return gp_error_set(err, GP_ERR_UNSUPPORTED, "this gpipe-onnx was built without MPI");
}

gp_status gp_comm_send(struct gp_comm *c, int to, int tag, const void *buf, size_t bytes, struct gp_error *err)
{
    (void)c, (void)to, (void)tag, (void)buf, (void)bytes;
    return none(err);
}

gp_status gp_comm_recv(struct gp_comm *c, int from, int tag, void *buf, size_t bytes, struct gp_error *err)
{
    (void)c, (void)from, (void)tag, (void)buf, (void)bytes;
    return none(err);
}

gp_status gp_comm_barrier(struct gp_comm *c, const struct gp_comm_group *g, struct gp_error *err)
{
    (void)c, (void)g;
    return none(err);
}

gp_status gp_comm_allreduce_sum_f32(struct gp_comm *c, const struct gp_comm_group *g, float *data, size_t n,
                                    struct gp_error *err)
{
    (void)c, (void)g, (void)data, (void)n;
    return none(err);
}

gp_status gp_comm_allreduce_sum_f64(struct gp_comm *c, const struct gp_comm_group *g, double *data, size_t n,
                                    struct gp_error *err)
{
    (void)c, (void)g, (void)data, (void)n;
    return none(err);
}

gp_status gp_comm_allgather(struct gp_comm *c, const struct gp_comm_group *g, const void *mine, size_t bytes,
                            void *all, struct gp_error *err)
{
    (void)c, (void)g, (void)mine, (void)bytes, (void)all;
    return none(err);
}

#endif
