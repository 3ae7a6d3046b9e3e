/* SPDX-License-Identifier: Apache-2.0 */
/*
 * waiters.c: call waiters (oq_waiters.h), the wait behind GET /v1/tool-calls/{id}?wait= and,
 * later, behind the MCP gateway's tools/call.
 *
 * Design. Waiters are caller-allocated and intrusive, so arming one allocates nothing but an
 * occasional growth of two arrays. One mutex guards everything: a hash table of chains keyed
 * by call id (notify walks one chain) and a binary min-heap of all armed waiters by deadline
 * (the timer thread sleeps until the heap's top, on a CLOCK_MONOTONIC condition variable;
 * arming a waiter that becomes the top wakes it). The heap array is also the list of every
 * armed waiter, which rehashing and wake_all walk. Thousands of waiting clients thus cost a
 * few hundred bytes each and no thread: one timer thread per registry.
 *
 * Firing. A waiter that fires is unlinked under the lock and marked "firing"; the callbacks
 * then run outside the lock (a callback typically resumes a libmicrohttpd connection, which
 * takes libmicrohttpd's own locks: never nest them inside ours), and each waiter is marked
 * idle under the lock afterwards. oq_waiters_cancel() of a waiter that is firing waits for
 * that mark, so once cancel returned the registry no longer touches the waiter's memory and
 * the callback is not running: the owner may free it.
 *
 * Who notifies: the producer's writer, after the COMMIT of a batch that made calls terminal
 * (results from the ingest, dead letters failed as unpublishable). The wake-up is a hint: the
 * woken party reads the committed state again.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oq_log.h"
#include "oq_waiters.h"

enum { W_IDLE = 0, W_ARMED = 1, W_FIRING = 2 };

#define MIN_BUCKETS 256

struct oq_waiters {
    pthread_mutex_t mu;
    pthread_cond_t timer_cv; /* the timer thread: top of the heap changed, or stop */
    pthread_cond_t fired_cv; /* a firing ended (cancel waits for it) */
    oq_waiter_t **buckets;
    size_t nbuckets; /* a power of two */
    oq_waiter_t **heap;
    size_t n, cap;
    int stop;
    pthread_t th;
    int started;
};

/* --- hash chains -----------------------------------------------------------------------------*/

static size_t hash_id(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return (size_t)h;
}

static void chain_link(oq_waiters_t *ws, oq_waiter_t *w)
{
    oq_waiter_t **b = &ws->buckets[hash_id(w->call_id) & (ws->nbuckets - 1)];
    w->prev = NULL;
    w->next = *b;
    if (*b) (*b)->prev = w;
    *b = w;
}

static void chain_unlink(oq_waiters_t *ws, oq_waiter_t *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        ws->buckets[hash_id(w->call_id) & (ws->nbuckets - 1)] = w->next;
    if (w->next) w->next->prev = w->prev;
    w->next = w->prev = NULL;
}

/* Double the table when chains grow past two waiters on average. Failure is harmless (the
 * chains only get longer). */
static void maybe_rehash(oq_waiters_t *ws)
{
    if (ws->n <= 2 * ws->nbuckets) return;
    size_t nb = ws->nbuckets * 2;
    oq_waiter_t **b = calloc(nb, sizeof *b);
    if (!b) return;
    free(ws->buckets);
    ws->buckets = b;
    ws->nbuckets = nb;
    for (size_t i = 0; i < ws->n; i++)
        chain_link(ws, ws->heap[i]);
}

/* --- deadline heap ---------------------------------------------------------------------------*/

static void heap_set(oq_waiters_t *ws, size_t i, oq_waiter_t *w)
{
    ws->heap[i] = w;
    w->heap_idx = i;
}

static void heap_up(oq_waiters_t *ws, size_t i)
{
    oq_waiter_t *w = ws->heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (ws->heap[parent]->deadline_us <= w->deadline_us) break;
        heap_set(ws, i, ws->heap[parent]);
        i = parent;
    }
    heap_set(ws, i, w);
}

static void heap_down(oq_waiters_t *ws, size_t i)
{
    oq_waiter_t *w = ws->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, min = i;
        int64_t dmin = w->deadline_us;
        if (l < ws->n && ws->heap[l]->deadline_us < dmin) {
            min = l;
            dmin = ws->heap[l]->deadline_us;
        }
        if (r < ws->n && ws->heap[r]->deadline_us < dmin) min = r;
        if (min == i) break;
        heap_set(ws, i, ws->heap[min]);
        i = min;
    }
    heap_set(ws, i, w);
}

static void heap_remove(oq_waiters_t *ws, oq_waiter_t *w)
{
    size_t i = w->heap_idx;
    oq_waiter_t *last = ws->heap[--ws->n];
    if (i == ws->n) return;
    heap_set(ws, i, last);
    heap_down(ws, i);
    heap_up(ws, last->heap_idx);
}

/* --- firing ----------------------------------------------------------------------------------*/

/* Disarm \p w for firing. mu held. */
static void unlink_for_fire(oq_waiters_t *ws, oq_waiter_t *w)
{
    chain_unlink(ws, w);
    heap_remove(ws, w);
    w->state = W_FIRING;
}

/* Unlink \p w and push it on \p list to be fired. mu held. */
static void take(oq_waiters_t *ws, oq_waiter_t *w, oq_waiter_t **list)
{
    unlink_for_fire(ws, w);
    w->fire_next = *list;
    *list = w;
}

/* Run the callbacks of \p list (mu NOT held), then mark each idle. @returns how many. */
static size_t fire(oq_waiters_t *ws, oq_waiter_t *list, oq_wake_t why)
{
    size_t n = 0;
    for (oq_waiter_t *w = list; w;) {
        oq_waiter_t *next = w->fire_next; /* read before the callback: the owner may reuse w */
        w->cb(w, why, w->opaque);
        pthread_mutex_lock(&ws->mu);
        w->state = W_IDLE; /* cancel() waits for this before the owner frees w */
        pthread_cond_broadcast(&ws->fired_cv);
        pthread_mutex_unlock(&ws->mu);
        w = next;
        n++;
    }
    return n;
}

static void abs_time(struct timespec *ts, int64_t mono_us)
{
    ts->tv_sec = (time_t)(mono_us / 1000000);
    ts->tv_nsec = (long)(mono_us % 1000000) * 1000;
}

static void *timer_main(void *arg)
{
    oq_waiters_t *ws = arg;
    pthread_mutex_lock(&ws->mu);
    while (!ws->stop) {
        int64_t now = oq_mono_us();
        oq_waiter_t *due = NULL;
        while (ws->n > 0 && ws->heap[0]->deadline_us <= now)
            take(ws, ws->heap[0], &due);
        if (due) {
            pthread_mutex_unlock(&ws->mu);
            fire(ws, due, OQ_WAKE_DEADLINE);
            pthread_mutex_lock(&ws->mu);
            continue;
        }
        if (ws->n == 0) {
            pthread_cond_wait(&ws->timer_cv, &ws->mu);
        } else {
            struct timespec ts;
            abs_time(&ts, ws->heap[0]->deadline_us);
            pthread_cond_timedwait(&ws->timer_cv, &ws->mu, &ts);
        }
    }
    pthread_mutex_unlock(&ws->mu);
    return NULL;
}

/* --- the API ---------------------------------------------------------------------------------*/

int oq_waiters_new(oq_waiters_t **out, oq_error_t *err)
{
    oq_waiters_t *ws = calloc(1, sizeof *ws);
    if (!ws) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    ws->nbuckets = MIN_BUCKETS;
    ws->buckets = calloc(ws->nbuckets, sizeof *ws->buckets);
    if (!ws->buckets) {
        free(ws);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    pthread_mutex_init(&ws->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the clock of oq_mono_us() */
    pthread_cond_init(&ws->timer_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&ws->fired_cv, NULL);
    int rc = pthread_create(&ws->th, NULL, timer_main, ws);
    if (rc != 0) {
        ws->started = 0;
        oq_waiters_destroy(ws);
        return oq_error_set(err, OQ_EIO, rc, "cannot start the waiters' timer thread");
    }
    ws->started = 1;
    pthread_setname_np(ws->th, "oq-waiters"); /* top -H; failure harmless */
    *out = ws;
    return 0;
}

void oq_waiters_destroy(oq_waiters_t *ws)
{
    if (!ws) return;
    pthread_mutex_lock(&ws->mu);
    ws->stop = 1;
    pthread_cond_signal(&ws->timer_cv);
    pthread_mutex_unlock(&ws->mu);
    if (ws->started) pthread_join(ws->th, NULL);
    size_t n = oq_waiters_wake_all(ws, NULL);
    if (n) OQ_LOG_DEBUG("producer", "waiters: %zu woken at close", n);
    free(ws->buckets);
    free(ws->heap);
    pthread_mutex_destroy(&ws->mu);
    pthread_cond_destroy(&ws->timer_cv);
    pthread_cond_destroy(&ws->fired_cv);
    free(ws);
}

int oq_waiters_add(oq_waiters_t *ws, oq_waiter_t *w, const char *call_id, int64_t deadline_us,
                   oq_waiter_cb cb, void *opaque, const void *owner, oq_error_t *err)
{
    if (!cb || !call_id || !oq_call_id_valid(call_id))
        return oq_error_set(err, OQ_EINVAL, 0, "waiter: not a call id");
    pthread_mutex_lock(&ws->mu);
    int ret = 0;
    if (ws->stop) {
        ret = oq_error_set(err, OQ_ESHUTDOWN, 0, "waiters: closing");
        goto out;
    }
    if (w->state != W_IDLE) {
        ret = oq_error_set(err, OQ_EINVAL, 0, "waiter armed already");
        goto out;
    }
    if (ws->n == ws->cap) {
        size_t ncap = ws->cap ? 2 * ws->cap : 64;
        oq_waiter_t **nh = realloc(ws->heap, ncap * sizeof *nh);
        if (!nh) {
            ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            goto out;
        }
        ws->heap = nh;
        ws->cap = ncap;
    }
    snprintf(w->call_id, sizeof w->call_id, "%s", call_id);
    w->deadline_us = deadline_us;
    w->cb = cb;
    w->opaque = opaque;
    w->owner = owner;
    w->fire_next = NULL;
    w->state = W_ARMED;
    chain_link(ws, w);
    ws->heap[ws->n] = w;
    w->heap_idx = ws->n++;
    heap_up(ws, w->heap_idx);
    if (w->heap_idx == 0) pthread_cond_signal(&ws->timer_cv); /* an earlier deadline */
    maybe_rehash(ws);
out:
    pthread_mutex_unlock(&ws->mu);
    return ret;
}

int oq_waiters_cancel(oq_waiters_t *ws, oq_waiter_t *w)
{
    int removed = 0;
    pthread_mutex_lock(&ws->mu);
    if (w->state == W_ARMED) {
        chain_unlink(ws, w);
        heap_remove(ws, w);
        w->state = W_IDLE;
        removed = 1;
    }
    while (w->state == W_FIRING)
        pthread_cond_wait(&ws->fired_cv, &ws->mu);
    pthread_mutex_unlock(&ws->mu);
    return removed;
}

size_t oq_waiters_notify(oq_waiters_t *ws, const char *call_id)
{
    oq_waiter_t *list = NULL;
    pthread_mutex_lock(&ws->mu);
    oq_waiter_t *w = ws->buckets[hash_id(call_id) & (ws->nbuckets - 1)];
    while (w) {
        oq_waiter_t *next = w->next;
        if (strcmp(w->call_id, call_id) == 0) take(ws, w, &list);
        w = next;
    }
    pthread_mutex_unlock(&ws->mu);
    return list ? fire(ws, list, OQ_WAKE_SETTLED) : 0;
}

size_t oq_waiters_wake_all(oq_waiters_t *ws, const void *owner)
{
    oq_waiter_t *list = NULL;
    pthread_mutex_lock(&ws->mu);
    /* select first, then unlink: unlinking reorders the heap being walked */
    for (size_t i = 0; i < ws->n; i++) {
        oq_waiter_t *w = ws->heap[i];
        if (!owner || w->owner == owner) {
            w->fire_next = list;
            list = w;
        }
    }
    for (oq_waiter_t *w = list; w; w = w->fire_next)
        unlink_for_fire(ws, w);
    pthread_mutex_unlock(&ws->mu);
    return list ? fire(ws, list, OQ_WAKE_SHUTDOWN) : 0;
}

size_t oq_waiters_count(oq_waiters_t *ws)
{
    pthread_mutex_lock(&ws->mu);
    size_t n = ws->n;
    pthread_mutex_unlock(&ws->mu);
    return n;
}

int oq_wait_parse(const char *s, int64_t max_ms, int64_t *out_ms)
{
    if (!s || !*s) return OQ_EINVAL;
    int64_t v = 0;
    size_t i = 0;
    for (; s[i] >= '0' && s[i] <= '9'; i++) {
        if (v > 1000000000) return OQ_ERANGE; /* far past any bound; no overflow below */
        v = v * 10 + (s[i] - '0');
    }
    if (i == 0) return OQ_EINVAL;
    const char *u = s + i;
    int64_t mult;
    if (*u == '\0' || strcmp(u, "s") == 0)
        mult = 1000;
    else if (strcmp(u, "ms") == 0)
        mult = 1;
    else if (strcmp(u, "m") == 0)
        mult = 60000;
    else
        return OQ_EINVAL;
    if (v * mult > max_ms) return OQ_ERANGE;
    *out_ms = v * mult;
    return 0;
}
