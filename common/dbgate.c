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
 * Off by default (ONCEQ_DB_GATE=1 turns it on). On the embedded broker it removed 99 % of the
 * busy sleeps and cut the 32-thread loop's p99; on real Kafka with two consumers it made the
 * end-to-end p99 about three times worse (441-456 ms against 143-153, two pairs of
 * scripts/kafka-bench.sh), for a reason not yet found (docs/SCALING.md, "Writers of one file
 * hand the lock over"). Until that is understood it stays an option.
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
#include <sys/stat.h>
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

typedef struct {
    _Atomic uint32_t magic;
    uint32_t version;
    pthread_mutex_t mu;
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

static _Atomic uint64_t n_taken, n_waited, n_timeouts, n_owner_dead;

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
    int e = pthread_mutex_trylock(&g->shm->mu);
    int64_t until = deadline_mono_us;
    if (e == EBUSY) {
        atomic_fetch_add(&n_waited, 1);
        int64_t cap = oq_mono_us() + GATE_WAIT_MAX_US;
        if (cap < until) until = cap;
        struct timespec ts = {.tv_sec = until / 1000000, .tv_nsec = (long)(until % 1000000) * 1000};
        e = pthread_mutex_clocklock(&g->shm->mu, CLOCK_MONOTONIC, &ts);
    }
    if (e == EOWNERDEAD) {
        atomic_fetch_add(&n_owner_dead, 1);
        e = pthread_mutex_consistent(&g->shm->mu);
    }
    if (e == 0) {
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
}
