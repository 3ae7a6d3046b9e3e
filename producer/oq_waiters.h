/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_waiters.h
 * @brief Call waiters: be told when a call reaches a terminal state, or when a deadline
 *        passes, without a thread per waiter and without polling.
 *
 * A registry (oq_waiters_t) holds waiters keyed by call id, each with a deadline. The party
 * that commits state changes (the producer's writer, after the COMMIT of the batch that made
 * a call terminal) calls oq_waiters_notify(); one timer thread per registry fires the waiters
 * whose deadline passed; oq_waiters_wake_all() fires every waiter of one owner (a front door
 * that shuts down). Each waiter fires exactly once, whichever comes first, unless it was
 * cancelled before.
 *
 * A wake-up is a hint, not a state: the woken party reads the call again (the committed
 * state) and decides. To close the race between "read the call" and "start waiting", a user
 * reads, adds its waiter, then reads again (or adds first): a notify can only follow a
 * commit, so a change is either in the second read or wakes the waiter.
 *
 * Users: GET /v1/tool-calls/{id}?wait= (producer/http.c, a suspended libmicrohttpd
 * connection resumed by the callback); later the MCP gateway's tools/call and a tasks
 * orchestrator.
 *
 * Thread-safety: every function may be called from any thread, except from inside a
 * waiter's callback (the callback must not call back into the registry).
 */
#ifndef OQ_WAITERS_H
#define OQ_WAITERS_H

#include <stddef.h>
#include <stdint.h>

#include "oq_error.h"
#include "oq_util.h"

/** Why a waiter fired. */
typedef enum oq_wake {
    OQ_WAKE_SETTLED = 1, /**< oq_waiters_notify() for its call: a terminal state committed */
    OQ_WAKE_DEADLINE,    /**< its deadline passed */
    OQ_WAKE_SHUTDOWN     /**< oq_waiters_wake_all(), or the registry is being destroyed */
} oq_wake_t;

/** Longest wait the HTTP API accepts (GET ...?wait=), in ms. */
#define OQ_WAIT_MAX_MS 60000

typedef struct oq_waiters oq_waiters_t;
typedef struct oq_waiter oq_waiter_t;

/**
 * A waiter's callback: runs once, on the thread that fired it (the notifier, the timer
 * thread, or the caller of oq_waiters_wake_all / oq_waiters_destroy), with no registry lock
 * held. It must not block and must not call oq_waiters_* functions.
 */
typedef void (*oq_waiter_cb)(oq_waiter_t *w, oq_wake_t why, void *opaque);

/**
 * One waiter, allocated by the caller (typically inside its request context), zero-initialised
 * before its first use. The fields are private to the registry. The memory must stay valid
 * while the waiter is armed: until its callback has returned, or oq_waiters_cancel() returned.
 */
struct oq_waiter {
    char call_id[OQ_CALL_ID_LEN + 1];
    int64_t deadline_us; /**< oq_mono_us() clock */
    oq_waiter_cb cb;
    void *opaque;
    const void *owner;
    oq_waiter_t *next, *prev; /**< the call id's hash chain */
    oq_waiter_t *fire_next;   /**< the list being fired */
    size_t heap_idx;          /**< place in the deadline heap */
    int state;                /**< 0 idle, 1 armed, 2 firing */
};

/**
 * @brief New registry with its timer thread.
 * @returns 0 with \p out set (free with oq_waiters_destroy), OQ_ENOMEM or OQ_EIO.
 */
int oq_waiters_new(oq_waiters_t **out, oq_error_t *err);

/**
 * @brief Fire every waiter still armed (OQ_WAKE_SHUTDOWN), stop the timer thread, free the
 *        registry. No notifier may use it any more. NULL ok.
 */
void oq_waiters_destroy(oq_waiters_t *ws);

/**
 * @brief Arm \p w: \p cb(\p w, why, \p opaque) runs once when \p call_id is notified, when
 *        \p deadline_us (oq_mono_us() clock; a past deadline fires at once, on the timer
 *        thread) passes, or at oq_waiters_wake_all(\p owner) / destroy.
 * @param owner any pointer naming the user (e.g. the HTTP server), for oq_waiters_wake_all();
 *        may be NULL.
 * @returns 0, OQ_EINVAL (\p w armed already, or \p call_id not a call id), OQ_ENOMEM,
 *          OQ_ESHUTDOWN (the registry is being destroyed). On error the callback never runs.
 */
int oq_waiters_add(oq_waiters_t *ws, oq_waiter_t *w, const char *call_id, int64_t deadline_us,
                   oq_waiter_cb cb, void *opaque, const void *owner, oq_error_t *err);

/**
 * @brief Disarm \p w. When a firing is under way on another thread, waits until its callback
 *        returned. Not from inside \p w's own callback.
 * @returns 1 when \p w was armed and its callback will never run; 0 when it was not armed
 *          (its callback has already run, or it never was armed).
 */
int oq_waiters_cancel(oq_waiters_t *ws, oq_waiter_t *w);

/**
 * @brief Fire the waiters of \p call_id (OQ_WAKE_SETTLED). Call it after the commit that
 *        made the call terminal, never before: a woken party must read the committed state.
 * @returns how many waiters fired.
 */
size_t oq_waiters_notify(oq_waiters_t *ws, const char *call_id);

/**
 * @brief Fire every armed waiter of \p owner (NULL: of every owner) with OQ_WAKE_SHUTDOWN.
 * @returns how many fired.
 */
size_t oq_waiters_wake_all(oq_waiters_t *ws, const void *owner);

/** @brief Waiters armed now (for metrics and tests). */
size_t oq_waiters_count(oq_waiters_t *ws);

/**
 * @brief Parse a wait: "30s", "500ms", "1m" or a bare number of seconds ("30"), digits only
 *        (no sign, no fraction, no spaces), at most \p max_ms.
 * @returns 0 with \p out_ms set, OQ_EINVAL (malformed) or OQ_ERANGE (over \p max_ms).
 */
int oq_wait_parse(const char *s, int64_t max_ms, int64_t *out_ms);

#endif
