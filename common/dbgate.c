/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dbgate.c: the writer gate of a SQLite file, a hand-off between the writers of one database
 * on one host, so that a writer waiting for another's transaction is woken when it ends
 * instead of sleeping and polling.
 *
 * Why. SQLite lets one writer at a time into a WAL database and tells the others SQLITE_BUSY;
 * its busy handler can only sleep and try again (common/db.c: 50 us doubling to 2 ms). With
 * several writers on one file (`onceq up`'s two consumers on effects.db, each with its result
 * relay's writer; the producer's writer and its relay's watermark on calls.db) a loser sleeps
 * past the moment the lock was free: in the 32-thread HTTP-tool loop a consumer's BEGIN
 * IMMEDIATE went to the busy handler on about half of its batches (perf, 690 a second at
 * 1,250 calls a second), each time one hop of a call later. SQLite can block in the kernel
 * instead (SQLITE_ENABLE_SETLK_TIMEOUT), but Debian's libsqlite3 is not built with it, and no
 * packaged library offers this; so it is written here, small, and only ever an optimisation.
 *
 * What. Beside each database a read-write connection opens, a file `<db>-gate` (0600, one
 * page) holds a process-shared, robust, error-checking pthread mutex. oq_db_begin_immediate()
 * takes it (waiting at most until its own deadline) before BEGIN IMMEDIATE; oq_db_commit() and
 * oq_db_rollback() give it back when the transaction has ended. Waiting on the mutex (at most
 * 250 ms, then SQLite's busy handler as before: a holder that long is waiting for a writer
 * outside the gate, or is stopped, perhaps before it took SQLite's lock) is a
 * futex wait: the next writer runs as soon as the last one's COMMIT (its fsync included)
 * returned. A writer whose deadline passes while it waits for the gate has spent its time:
 * it tries BEGIN IMMEDIATE once without the busy handler's sleeps (the lock may be free, if
 * the holder stopped before it took SQLite's), so oq_db_begin_immediate() still returns by
 * its deadline, as the readiness checks (common/ready.c: 1 s) expect.
 *
 * Fairness. A mutex lets the thread that unlocks take it straight back before the waiter its
 * unlock woke has run; a consumer's batch loop (COMMIT, poll Kafka, BEGIN) did exactly that, so
 * on real Kafka, where a batch holds the gate 100-300 ms on a busy host, a result relay's
 * writer or the other consumer missed turn after turn and met the 250 ms cap (traced: 21 of
 * 196 takes were such re-takes, 20 waits timed out; the end-to-end p99 was three times that
 * without the gate). So a writer that gives the gate up while others wait (`waiters`, counted
 * in the page) marks a hand-over, and when it comes back for the gate first waits, on a futex
 * in the page, until one of them took it (the taker clears the mark and wakes it) or 10 ms
 * passed; a count left behind by a waiter killed in its wait is reset by such a timeout.
 * `test_gate_is_fair_to_a_waiter` failed without it.
 *
 * Off by default (ONCEQ_DB_GATE=1 turns it on). On the embedded broker it removed 99 % of the
 * busy sleeps and cut the 32-thread loop's p99; on real Kafka with two consumers it made the
 * end-to-end p99 about three times worse until the hand-over above, and with it three
 * alternated pairs still came out no better than without the gate (docs/SCALING.md, "Writers
 * of one file hand the lock over"), so it stays an option.
 *
 * Safety. SQLite's own locks stay the only thing that protects the data; the gate only orders
 * the writers that use it. Whatever goes wrong with it degrades to today's behaviour, never to
 * a wrong result or a hang: no gate file can be made (read-only folder, a full disk): no gate;
 * the mutex is not had by the deadline (a stopped holder, SIGSTOP): BEGIN IMMEDIATE as before,
 * with the busy handler; the holder died (kill -9): the robust mutex says EOWNERDEAD and the
 * next taker marks it consistent (SQLite rolls the dead writer's transaction back itself); a
 * writer that is not onceq (the sqlite3 shell) is met by SQLite's busy handler as before. A
 * thread never waits for a gate it holds already (EDEADLK from the error-checking mutex, and a
 * per-thread list of held gates), and gives it back on the thread that took it. The mutex
 * word lives in a MAP_SHARED page, so it is the same futex in every process that maps the file;
 * it is initialised once, under flock(), by the first opener that finds no magic number.
 *
 * Thread-safety: every function may be called from any thread. The registry of gates (one per
 * database path, for the life of the process) is guarded by a mutex; the held list is
 * thread-local.
 */
#include "dbgate.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "oq_log.h"
#include "oq_util.h"

#define GATE_MAGIC 0x6f716761u /* "oqga" */
#define GATE_VERSION 1u
#define GATE_SIZE 4096
/* The longest wait for the gate before going on as without one. A transaction holds it for
 * milliseconds; a holder that keeps it longer is waiting for a writer outside the gate or is
 * stopped (SIGSTOP) possibly before it took SQLite's lock, and then SQLite's busy handler is
 * the better judge of when the lock is free. */
#define GATE_WAIT_MAX_US 250000
/* How long a writer that gave the gate up while others waited lets one of them take it before
 * it takes it again itself (see "Fairness" above). */
#define HANDOFF_WAIT_US 10000

typedef struct {
    _Atomic uint32_t magic;
    uint32_t version;
    pthread_mutex_t mu;
    /* fairness; zero in a file made before these fields existed, which reads as "no waiter" */
    _Atomic int32_t waiters;      /* writers in a timed wait for mu */
    _Atomic uint32_t handoff;     /* futex word: 1 while the last holder lets a waiter go first */
    _Atomic int32_t handoff_from; /* that holder's thread id */
} gate_shm_t;

typedef struct gate {
    char *path; /* the database's full path (sqlite3_db_filename) */
    gate_shm_t *shm;
    _Atomic int broken; /* ENOTRECOVERABLE or an unexpected error: not used any more */
    struct gate *next;
} gate_t;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static gate_t *gates;
static _Atomic int gates_off = -1; /* -1: not read yet; gates are on only with ONCEQ_DB_GATE=1 */

#define HELD_MAX 4
static _Thread_local struct {
    sqlite3 *db;
    gate_t *g;
} held[HELD_MAX];
static _Thread_local int nheld;

static _Atomic uint64_t n_taken, n_waited, n_timeouts, n_owner_dead, n_handoffs;

static int off(void)
{
    int v = atomic_load(&gates_off);
    if (v < 0) {
        const char *e = getenv("ONCEQ_DB_GATE");
        v = !(e && strcmp(e, "1") == 0);
        atomic_store(&gates_off, v);
    }
    return v;
}

static gate_t *find_locked(const char *path)
{
    for (gate_t *g = gates; g; g = g->next)
        if (strcmp(g->path, path) == 0) return g;
    return NULL;
}

/* Maps (and the first time initialises) the gate file of \p path; NULL when it cannot. */
static gate_shm_t *map_gate(const char *path)
{
    size_t n = strlen(path);
    char *gp = malloc(n + sizeof "-gate");
    if (!gp) return NULL;
    memcpy(gp, path, n);
    memcpy(gp + n, "-gate", sizeof "-gate");
    int fd = open(gp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        OQ_LOG_DEBUG("db", "no writer gate for %s: %s: %s", path, gp, strerror(errno));
        free(gp);
        return NULL;
    }
    gate_shm_t *shm = NULL;
    struct stat st;
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &st) != 0) goto out;
    if (!S_ISREG(st.st_mode)) goto out;
    if (st.st_size < GATE_SIZE && ftruncate(fd, GATE_SIZE) != 0) goto out;
    void *p = mmap(NULL, GATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) goto out;
    shm = p;
    if (atomic_load(&shm->magic) != GATE_MAGIC) {
        pthread_mutexattr_t a;
        int ok = pthread_mutexattr_init(&a) == 0;
        ok = ok && pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED) == 0 &&
             pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST) == 0 &&
             pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK) == 0 &&
             pthread_mutex_init(&shm->mu, &a) == 0;
        pthread_mutexattr_destroy(&a);
        if (ok) {
            shm->version = GATE_VERSION;
            atomic_store(&shm->magic, GATE_MAGIC);
        }
    }
    if (atomic_load(&shm->magic) != GATE_MAGIC || shm->version != GATE_VERSION) {
        munmap(p, GATE_SIZE);
        shm = NULL;
    }
out:
    if (!shm) OQ_LOG_DEBUG("db", "no writer gate for %s: %s", path, strerror(errno));
    flock(fd, LOCK_UN);
    close(fd); /* the mapping stays */
    free(gp);
    return shm;
}

void oq__dbgate_attach(sqlite3 *db)
{
    const char *path = sqlite3_db_filename(db, "main");
    if (!path || !path[0] || off()) return;
    pthread_mutex_lock(&reg_mu);
    if (!find_locked(path)) {
        gate_t *g = calloc(1, sizeof *g);
        char *p = g ? strdup(path) : NULL;
        gate_shm_t *shm = p ? map_gate(path) : NULL;
        if (shm) {
            g->path = p;
            g->shm = shm;
            g->next = gates;
            gates = g;
        } else {
            free(p);
            free(g);
        }
    }
    pthread_mutex_unlock(&reg_mu);
}

static int held_idx(sqlite3 *db)
{
    for (int i = 0; i < nheld; i++)
        if (held[i].db == db) return i;
    return -1;
}

/* A futex word in the shared page (so not FUTEX_PRIVATE_FLAG): every process waits on it. */
static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* The caller gave the gate up while another writer waited for it, and wants it back: it waits
 * until a waiter took it (the taker clears handoff and wakes it) or HANDOFF_WAIT_US passed.
 * When nobody came, the count of waiters is taken to be stale (a waiter killed in its wait
 * never takes itself off) and is reset, so a leftover count cannot slow every writer after. */
static void let_waiter_go_first(gate_shm_t *shm, int64_t deadline_mono_us)
{
    int64_t until = oq_mono_us() + HANDOFF_WAIT_US;
    if (until > deadline_mono_us) until = deadline_mono_us;
    for (;;) {
        if (!atomic_load(&shm->handoff)) return; /* taken over */
        int64_t left = until - oq_mono_us();
        if (left <= 0) break;
        struct timespec ts = {.tv_sec = left / 1000000, .tv_nsec = (long)(left % 1000000) * 1000};
        syscall(SYS_futex, (uint32_t *)&shm->handoff, FUTEX_WAIT, 1u, &ts, NULL, 0);
    }
    uint32_t one = 1;
    if (atomic_load(&shm->handoff_from) == (int32_t)gettid() &&
        atomic_compare_exchange_strong(&shm->handoff, &one, 0))
        atomic_store(&shm->waiters, 0);
}

int oq__dbgate_enter(sqlite3 *db, int64_t deadline_mono_us)
{
    if (!db || off()) return 0;
    if (held_idx(db) >= 0) return 1;
    if (nheld >= HELD_MAX) return 0;
    const char *path = sqlite3_db_filename(db, "main");
    if (!path || !path[0]) return 0;
    pthread_mutex_lock(&reg_mu);
    gate_t *g = find_locked(path);
    pthread_mutex_unlock(&reg_mu);
    if (!g || atomic_load(&g->broken)) return 0;
    gate_shm_t *shm = g->shm;
    if (atomic_load(&shm->handoff) && atomic_load(&shm->handoff_from) == (int32_t)gettid())
        let_waiter_go_first(shm, deadline_mono_us);
    int e = pthread_mutex_trylock(&shm->mu);
    int64_t until = deadline_mono_us;
    if (e == EBUSY) {
        atomic_fetch_add(&n_waited, 1);
        int64_t cap = oq_mono_us() + GATE_WAIT_MAX_US;
        if (cap < until) until = cap;
        struct timespec ts = {.tv_sec = until / 1000000, .tv_nsec = (long)(until % 1000000) * 1000};
        atomic_fetch_add(&shm->waiters, 1);
        e = pthread_mutex_clocklock(&shm->mu, CLOCK_MONOTONIC, &ts);
        int32_t w = atomic_load(&shm->waiters); /* (never below 0: see let_waiter_go_first) */
        while (w > 0 && !atomic_compare_exchange_weak(&shm->waiters, &w, w - 1)) {
        }
    }
    if (e == EOWNERDEAD) {
        atomic_fetch_add(&n_owner_dead, 1);
        e = pthread_mutex_consistent(&shm->mu);
    }
    if (e == 0) {
        if (atomic_load(&shm->handoff) &&
            atomic_load(&shm->handoff_from) != (int32_t)gettid()) { /* handed over: say so */
            atomic_store(&shm->handoff, 0);
            futex_wake_all(&shm->handoff);
            atomic_fetch_add(&n_handoffs, 1);
        }
        held[nheld].db = db;
        held[nheld].g = g;
        nheld++;
        atomic_fetch_add(&n_taken, 1);
        return 1;
    }
    if (e == ETIMEDOUT) {
        atomic_fetch_add(&n_timeouts, 1);
        return until >= deadline_mono_us ? -1 : 0;
    }
    if (e != EDEADLK) {
        atomic_store(&g->broken, 1);
        OQ_LOG_WARN("db", "writer gate of %s not used any more: %s", path, strerror(e));
    }
    return 0;
}

void oq__dbgate_leave(sqlite3 *db)
{
    int i = held_idx(db);
    if (i < 0) return;
    gate_t *g = held[i].g;
    held[i] = held[--nheld];
    if (atomic_load(&g->shm->waiters) > 0) { /* the unlock wakes one: let it go first */
        atomic_store(&g->shm->handoff_from, (int32_t)gettid());
        atomic_store(&g->shm->handoff, 1);
    }
    int e = pthread_mutex_unlock(&g->shm->mu);
    if (e != 0) {
        atomic_store(&g->broken, 1);
        OQ_LOG_WARN("db", "writer gate of %s not used any more: unlock: %s", g->path, strerror(e));
    }
}

void oq_db_gate_counts(oq_db_gate_counts_t *out)
{
    out->taken = atomic_load(&n_taken);
    out->waited = atomic_load(&n_waited);
    out->timeouts = atomic_load(&n_timeouts);
    out->owner_dead = atomic_load(&n_owner_dead);
    out->handoffs = atomic_load(&n_handoffs);
}
