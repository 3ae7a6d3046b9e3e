/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_mhd.h
 * @brief What the onceq servers (producer API, consumer admin, console, metrics listeners, the
 *        test downstream) share of libmicrohttpd: its logger, the replies and error body, the
 *        connection guard.
 */
#ifndef OQ_MHD_H
#define OQ_MHD_H

#include <stdarg.h>
#include <stddef.h>

#include "oq_log.h"

/** What oq_mhd_log writes with: pass a pointer to one (static) as the logger's closure. */
typedef struct oq_mhd_log_ctx {
    const char *component; /**< the log line's component */
    oq_log_level_t level;  /**< the level of libmicrohttpd's messages there */
} oq_mhd_log_ctx_t;

/** @brief MHD_OPTION_EXTERNAL_LOGGER: one log line (trailing newlines cut) per message, with
 *         \p cls an oq_mhd_log_ctx_t. */
void oq_mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

#include <jansson.h>
#include <microhttpd.h>
#include <stdint.h>

#include "oq_error.h"
#include "oq_metrics.h"

/**
 * @brief MHD_OPTION_UNESCAPE_CALLBACK: libmicrohttpd's own percent-decoding, except that a
 *        decoded NUL (%00) becomes 0x7f. libmicrohttpd hands the path to the handler as a C
 *        string, so a %00 would cut it there (by-key/a%00b read as the key "a"); 0x7f is a byte
 *        that no key, tenant or call id accepts, so such a request is refused instead.
 */
size_t oq_mhd_unescape(void *cls, struct MHD_Connection *c, char *s);

/**
 * @brief 0 when a header value of \p c was cut at a NUL byte: libmicrohttpd reports a length
 *        past the NUL (MHD_lookup_connection_value_n), or, as libmicrohttpd 0.9.75 does, cuts
 *        the value itself and leaves the rest of the line in its buffer, where this finds it
 *        (the header block is parsed in place from \p method, the handler's argument, for
 *        MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE bytes). A folded header line (obs-fold, which
 *        RFC 9112 lets a server refuse) reads the same way and is refused too. 1 otherwise.
 *        The guard's handler refuses such a request with 400 bad_request before the server
 *        sees it.
 */
int oq_mhd_headers_intact(struct MHD_Connection *c, const char *method);

/*
 * Replies: the one way the onceq servers (producer API and /mcp, consumer admin, console,
 * metrics listeners) queue an answer. Each server keeps its own small wrappers (its status
 * counters, its fixed headers); the response, its headers and the error body are made here.
 */

/** One extra header of a reply; a list of them ends at name NULL, an entry with value NULL is
 *  skipped (so optional headers can sit in a fixed list). */
typedef struct oq_mhd_header {
    const char *name, *value;
} oq_mhd_header_t;

#define OQ_MHD_CLOSE 0x1u        /**< Connection: close */
#define OQ_MHD_RETRY_503 0x2u    /**< Retry-After: 1 when the status is 503 */
#define OQ_MHD_JSON_SORTED 0x4u  /**< oq_mhd_reply_json / oq_mhd_error: keys sorted */
#define OQ_MHD_JSON_NEWLINE 0x8u /**< oq_mhd_reply_json / oq_mhd_error: the body ends in \n */

/**
 * @brief Queue \p status with \p len bytes of \p body (held as \p mode says; freed here when
 *        MHD_RESPMEM_MUST_FREE and the response cannot be made), Content-Type \p ctype, then
 *        the headers of \p hdrs (or NULL) and those \p flags ask for (OQ_MHD_*).
 * @returns what MHD_queue_response returns, MHD_NO when the response cannot be made.
 */
enum MHD_Result oq_mhd_reply(struct MHD_Connection *c, unsigned status, const char *ctype,
                             void *body, size_t len, enum MHD_ResponseMemoryMode mode,
                             unsigned flags, const oq_mhd_header_t *hdrs);

/** @brief \p v (a new reference, consumed; NULL is MHD_NO) as compact application/json. */
enum MHD_Result oq_mhd_reply_json(struct MHD_Connection *c, unsigned status, json_t *v,
                                  unsigned flags, const oq_mhd_header_t *hdrs);

/**
 * @brief The error body the API documents (docs/openapi.yaml, Error):
 *        {"error":{"code":CODE,"message":MSG}}, \p msg NULL reading as \p code.
 */
enum MHD_Result oq_mhd_error(struct MHD_Connection *c, unsigned status, const char *code,
                             const char *msg, unsigned flags, const oq_mhd_header_t *hdrs);

/*
 * The connection guard: the connection table of one libmicrohttpd daemon, so that slow or
 * hostile clients cannot hold every slot and keep health checks out (common/mhd.c).
 *
 *  - limits: at most max_conns connections (and max_conns_per_ip per client address) take a
 *    normal slot; a connection over a limit is closed at accept, counted and logged (one line
 *    a second at most);
 *  - a request deadline: a request's line, headers and body must all arrive within
 *    request_timeout_ms of the connection's accept or of the end of its previous request
 *    (libmicrohttpd's own timeout is an idle timeout: one byte every few seconds resets it);
 *    a request being answered (a submit waiting for its commit included) is never timed out;
 *  - eviction: when the table is full, a new connection takes the slot of the oldest request
 *    still incomplete after OQ_MHD_EVICT_AGE_MS;
 *  - probe slots: when no slot can be had that way, probe_slots more connections are let in
 *    that may only ask GET /healthz or /readyz (anything else is 503 and closed) and must do
 *    so within OQ_MHD_PROBE_DEADLINE_MS.
 * Closing is done with shutdown(2) on the connection's socket under the guard's lock, which
 * libmicrohttpd then sees as the client going away; the socket cannot be closed and reused
 * meanwhile, because libmicrohttpd reports the connection closed (removing it from the table
 * under the same lock) before it closes the socket.
 *
 * Use: fill oq_mhd_guard_opts_t, oq_mhd_guard_new(), then pass OQ_MHD_GUARD_DAEMON_ARGS(g) as
 * the accept policy / handler arguments of MHD_start_daemon and OQ_MHD_GUARD_OPTIONS(g) among
 * its options (they take MHD_OPTION_NOTIFY_CONNECTION and MHD_OPTION_NOTIFY_COMPLETED: give
 * the server's own completion callback in the opts). Destroy after MHD_stop_daemon.
 */
#define OQ_MHD_EVICT_AGE_MS 1000
/** The relays' and consumers' listeners (--metrics-listen, --metrics-only-listen). */
#define OQ_MHD_ADMIN_CONNS 64
#define OQ_MHD_ADMIN_PROBE_SLOTS 8
#define OQ_MHD_ADMIN_REQUEST_TIMEOUT_MS 10000
#define OQ_MHD_PROBE_DEADLINE_MS 2000

typedef struct oq_mhd_guard oq_mhd_guard_t;

typedef struct oq_mhd_guard_opts {
    const char *component;             /**< of its log lines */
    unsigned max_conns;                /**< normal slots; 0: 64 */
    unsigned max_conns_per_ip;         /**< 0: no limit per address */
    unsigned probe_slots;              /**< slots for /healthz and /readyz only; 0: none */
    int64_t request_timeout_ms;        /**< 0: no request deadline */
    MHD_AccessHandlerCallback handler; /**< the server's handler */
    void *handler_cls;
    MHD_RequestCompletedCallback completed; /**< the server's, or NULL */
    void *completed_cls;
    oq_metric_t *m_conns;                         /**< gauge: connections open (or NULL) */
    oq_metric_t *m_refused_global, *m_refused_ip; /**< counters of refusals (or NULL) */
} oq_mhd_guard_opts_t;

/** @brief A new guard (registers onceq_http_requests_closed_total{reason} in \p metrics
 *         when not NULL). @returns NULL with \p err filled. */
oq_mhd_guard_t *oq_mhd_guard_new(const oq_mhd_guard_opts_t *o, oq_metrics_t *metrics,
                                 oq_error_t *err);
/** @brief Stop its deadline thread and free it; after MHD_stop_daemon. Accepts NULL. */
void oq_mhd_guard_destroy(oq_mhd_guard_t *g);
/**
 * @brief What libmicrohttpd's own connection limit should be for a pool of \p threads: a
 *        backstop past the guard's limits, but never more than OQ_MHD_CONNS_PER_THREAD per
 *        thread (libmicrohttpd splits it evenly between the pool's threads).
 */
unsigned oq_mhd_guard_mhd_limit(const oq_mhd_guard_t *g, unsigned threads);

/*
 * Connections per libmicrohttpd pool thread. Its epoll loop (0.9.75, Debian 12's; upstream's is
 * the same) takes at most 128 events per epoll_wait, and when it got exactly 128 it calls
 * epoll_wait again, with the timeout it computed before the first call (the time left to its
 * oldest connection's idle timeout), before it serves any of them. When nothing else becomes
 * ready meanwhile, every request of that batch waits for the idle timeout, and the connections
 * idle that long (all of them when they were opened together) are then closed unanswered.
 * Measured on the producer (tests/integration/test_http_burst.sh, 10 s idle timeout): 128
 * requests sent together to the connections of one pool thread, a 9.9 s stall, then 20 to all
 * 128 of those connections closed unanswered. Which thread accepts a connection is a race (256
 * connections opened one after the other: 250 on one thread of two, or all 256), so a pool of
 * two does not prevent it: the signature `onceq-bench e2e` showed now and then (a 10 s stall
 * near the start, one retry per load connection) is this one, its 128 connections on one
 * thread. A thread
 * watches its connections, the listening socket and its wake-up descriptor: with at most 125
 * connections it can never fill a batch. libmicrohttpd gives each thread an equal share of its
 * connection limit and a thread at its share leaves new connections to the others, so the
 * servers set that limit to at most this many per thread (a margin under 125) and size their
 * pools to hold their guard's connections (oq_mhd_pool_threads).
 */
#define OQ_MHD_CONNS_PER_THREAD 120
/** The largest pool oq_mhd_pool_threads gives (the producer's --threads maximum). */
#define OQ_MHD_MAX_THREADS 64

/**
 * @brief The connections (normal and probe slots) a pool of \p threads holds under
 *        oq_mhd_guard_mhd_limit: OQ_MHD_CONNS_PER_THREAD each, less the guard's overshoot
 *        (one per thread) and a few connections the guard closed that libmicrohttpd has not
 *        yet counted out.
 */
unsigned oq_mhd_pool_room(unsigned threads);

/**
 * @brief Pool threads for \p conns connections (normal and probe slots): at least
 *        \p min_threads, enough that oq_mhd_pool_room holds \p conns, at most
 *        OQ_MHD_MAX_THREADS (the caller lowers its limit when that is not enough).
 */
unsigned oq_mhd_pool_threads(unsigned conns, unsigned min_threads);

enum MHD_Result oq_mhd_guard_accept(void *cls, const struct sockaddr *addr, socklen_t len);
enum MHD_Result oq_mhd_guard_handler(void *cls, struct MHD_Connection *c, const char *url,
                                     const char *method, const char *version, const char *upload,
                                     size_t *upload_size, void **con_cls);
void oq_mhd_guard_notify(void *cls, struct MHD_Connection *c, void **socket_ctx,
                         enum MHD_ConnectionNotificationCode code);
void oq_mhd_guard_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                            enum MHD_RequestTerminationCode toe);

/** MHD_start_daemon's apc, apc_cls, dh, dh_cls for guard \p g. */
#define OQ_MHD_GUARD_DAEMON_ARGS(g) oq_mhd_guard_accept, (g), oq_mhd_guard_handler, (g)
/** MHD_start_daemon options for guard \p g. */
#define OQ_MHD_GUARD_OPTIONS(g)                                                                    \
    MHD_OPTION_NOTIFY_CONNECTION, oq_mhd_guard_notify, (g), MHD_OPTION_NOTIFY_COMPLETED,           \
        oq_mhd_guard_completed, (g)

/** @brief Non-zero when \p host (a Host header or a URL's host, "host[:port]" or "[v6][:port]")
 *  names a loopback address exactly: 127.d.d.d, localhost or [::1] (never "127.evil.example",
 *  which DNS could point anywhere). NULL is not loopback. */
int oq_mhd_host_is_loopback(const char *host);

/** @brief Non-zero when the peer of \p c connects from a loopback address (127/8, ::1, or a
 *  v4-mapped 127/8). */
int oq_mhd_client_is_loopback(struct MHD_Connection *c);

#endif
