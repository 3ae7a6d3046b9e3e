/* SPDX-License-Identifier: Apache-2.0 */
/*
 * server.c: the rules and the HTTP front of `onceq-downstream`, a payment service to test
 * onceq against (its API is in oq_downstream.h; its SQL in ledger.c).
 * (About 1,200 lines, over the usual 800: a test service whose routes, faults and group commit
 * share one request state machine; it is not part of the pipeline.)
 *
 * Design. It follows the producer's pattern on libmicrohttpd: a pool of epoll threads that
 * never block on a commit. A POST /v1/payments is read and validated on the epoll thread,
 * the connection is suspended and the job queued for one writer thread, which takes every job
 * waiting (up to max_batch) into one BEGIN IMMEDIATE transaction: for each job, if the key is
 * honoured, look it up (found -> replay, or conflict when the canonical body differs), else
 * insert a new payment; then one COMMIT (synchronous=FULL by default) for the whole batch, and
 * only then resume the connections. One writer means the look-up-then-insert of a key cannot
 * race another request with the same key, even inside one batch.
 *
 * Faults are decided once per request, on the epoll thread, from the request's
 * X-Downstream-Fault header or else (POSTs only) a draw from the configured probabilities.
 * The draw is splitmix64 over (seed, n-th draw), so a seeded run draws the same sequence of
 * faults (which request gets which depends on arrival order). Faults before the commit answer
 * (or close) without queueing a job; "drop-after-commit" closes the connection once the
 * writer has committed (returning MHD_NO makes libmicrohttpd close it without a response);
 * "late-after-commit" and "slow" suspend the connection again and hand it to a scheduler
 * thread that resumes it when its delay is over, so no epoll thread ever sleeps.
 *
 * Down/up: "down" closes the listening socket at once (connects are refused), waits for the
 * requests in progress, then stops the daemon, which closes kept-alive connections too; "up"
 * starts a new daemon on the same port. Requests are counted in memory (this process); effects
 * are counted from the ledger, which is durable.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "ledger.h"
#include "oq_downstream.h"
#include "oq_buf.h"
#include "oq_json.h"
#include "oq_log.h"
#include "oq_mhd.h"
#include "oq_metrics.h"
#include "oq_util.h"

/* libmicrohttpd's own messages. */
static const oq_mhd_log_ctx_t mhd_log_ctx = {"downstream", OQ_LOG_DEBUG};

/* Connections the pool is sized for (libmicrohttpd's default limit was 1,020). */
#define DS_MAX_CONNS 1000

/* --- faults ----------------------------------------------------------------------------------*/

typedef enum {
    F_NONE = 0,
    F_DROP_AFTER,
    F_LATE_AFTER,
    F_DROP_BEFORE,
    F_500,
    F_503,
    F_429,
    F_DECLINE,
    F_SLOW,
    F__COUNT
} fault_t;

static const char *const fault_names[F__COUNT] = {"none",
                                                  "drop-after-commit",
                                                  "late-after-commit",
                                                  "drop-before-commit",
                                                  "500",
                                                  "503",
                                                  "429",
                                                  "decline",
                                                  "slow"};

static int fault_parse_name(const char *s, size_t n)
{
    static const struct {
        const char *alias;
        fault_t f;
    } aliases[] = {{"fail-before-commit", F_500}, {"unavailable", F_503}, {"rate-limit", F_429}};
    for (int i = 0; i < F__COUNT; i++)
        if (strlen(fault_names[i]) == n && strncasecmp(s, fault_names[i], n) == 0) return i;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strlen(aliases[i].alias) == n && strncasecmp(s, aliases[i].alias, n) == 0)
            return (int)aliases[i].f;
    return -1;
}

/* "kind:p[,kind:p...]" (a bare kind means p = 1) into prob[]; the sum must be <= 1. */
static int faults_parse(const char *spec, double prob[F__COUNT], oq_error_t *err)
{
    double p[F__COUNT] = {0}, sum = 0;
    const char *s = spec ? spec : "";
    while (*s) {
        const char *end = strchr(s, ',');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        const char *colon = memchr(s, ':', n);
        size_t nlen = colon ? (size_t)(colon - s) : n;
        if (n == 0) return oq_error_set(err, OQ_EINVAL, 0, "fault spec '%s': empty item", spec);
        int f = fault_parse_name(s, nlen);
        if (f <= 0)
            return oq_error_set(err, OQ_EINVAL, 0,
                                "fault spec: unknown fault '%.*s' (drop-after-commit, "
                                "late-after-commit, drop-before-commit, 500, 503, 429, decline, "
                                "slow)",
                                (int)nlen, s);
        double v = 1.0;
        if (colon) {
            char buf[32], *e;
            size_t vl = n - nlen - 1;
            if (vl == 0 || vl >= sizeof buf)
                return oq_error_set(err, OQ_EINVAL, 0, "fault spec: bad probability for %s",
                                    fault_names[f]);
            memcpy(buf, colon + 1, vl);
            buf[vl] = '\0';
            v = strtod(buf, &e);
            if (*e || !(v >= 0.0 && v <= 1.0))
                return oq_error_set(err, OQ_EINVAL, 0,
                                    "fault spec: probability of %s must be in [0,1], got '%s'",
                                    fault_names[f], buf);
        }
        p[f] += v;
        sum += v;
        s = end ? end + 1 : s + n;
    }
    if (sum > 1.0 + 1e-9)
        return oq_error_set(err, OQ_EINVAL, 0, "fault spec '%s': probabilities sum to %.3f > 1",
                            spec, sum);
    memcpy(prob, p, sizeof p);
    return 0;
}

int oq_downstream_check_faults(const char *spec, oq_error_t *err)
{
    double p[F__COUNT];
    return faults_parse(spec, p, err);
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* --- state -----------------------------------------------------------------------------------*/

typedef struct ds_mode {
    int keys_ignore, lookup_off;
    double prob[F__COUNT];
    int64_t slow_ms, late_ms;
    int retry_after_s;
    uint64_t seed;
    char spec[256];
} ds_mode_t;

enum { ROUTE_PAY_POST = 1, ROUTE_ADMIN_MODE_POST, ROUTE_ADMIN_DOWN, ROUTE_OTHER };
enum { RS_READ = 0, RS_SLOW, RS_PROCESS, RS_COMMIT, RS_COMMITTED, RS_LATE, RS_RESPOND };
enum { JOB_CREATED = 0, JOB_REPLAYED, JOB_CONFLICT, JOB_FAILED };

typedef struct ds_req ds_req_t;
struct ds_req {
    oq_downstream_t *s;
    struct MHD_Connection *conn;
    int route;
    int state;
    int too_big;
    oq_buf_t body;
    /* decided once per request */
    int decided;
    fault_t fault;
    int keys_ignore, lookup_off;
    int64_t delay_ms;
    int retry_after_s;
    /* the writer's job */
    char key[OQ__DS_MAX_KEY + 1];
    int has_key;
    oq__ds_payment_t pay; /* in: the new payment's fields; out: the stored one */
    int outcome;          /* JOB_* */
    char errmsg[256];
    ds_req_t *qnext;
    /* scheduler */
    int64_t due_us;
    int next_state;
    ds_req_t *tnext;
};

struct oq_downstream {
    struct MHD_Daemon *d;
    struct sockaddr_in sa;
    int port;
    unsigned threads;
    int64_t max_body;
    char db_path[4096];
    char sync[16];
    atomic_int inflight;

    pthread_mutex_t mode_mu;
    ds_mode_t mode; /* under mode_mu; draws restarts at 0 when the seed is set */
    atomic_uint_fast64_t draws;

    /* writer */
    oq__ledger_t *wl;
    pthread_t writer;
    int writer_started;
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    ds_req_t *qhead, *qtail;
    int wstop;
    int max_batch;

    /* readers: idle read connections */
    pthread_mutex_t rmu;
    oq__ledger_t *idle[8];
    int nidle;

    /* scheduler for delayed resumes */
    pthread_t sched;
    int sched_started;
    pthread_mutex_t smu;
    pthread_cond_t scv;
    ds_req_t *timers; /* sorted by due_us */
    int sstop, sflush;

    /* down/up requests: 0 none, >0 down for ms, -2 down until up, -1 up now */
    atomic_llong down_req;
    int64_t up_at_us; /* 0: not scheduled */
    atomic_int listening;

    oq_metrics_t *metrics;
    oq_metric_t *m_req[5], *m_resp[3], *m_fault[F__COUNT];
    oq_metric_t *m_effects, *m_replays, *m_conflicts, *m_batches, *m_dropped;
};

static const char *const route_labels[5] = {"route=\"post_payment\"", "route=\"get_payment\"",
                                            "route=\"lookup\"", "route=\"admin\"",
                                            "route=\"other\""};
enum { RQ_POST = 0, RQ_GET, RQ_LOOKUP, RQ_ADMIN, RQ_OTHER };

static void mode_get(oq_downstream_t *s, ds_mode_t *m)
{
    pthread_mutex_lock(&s->mode_mu);
    *m = s->mode;
    pthread_mutex_unlock(&s->mode_mu);
}

/* --- responses -------------------------------------------------------------------------------*/

static void count_status(oq_downstream_t *s, unsigned status)
{
    oq_counter_add(s->m_resp[status < 300 ? 0 : status < 500 ? 1 : 2], 1);
}

typedef struct hdrs {
    const char *retry_after;
    const char *replayed;
    const char *match_count;
} hdrs_t;

static enum MHD_Result send_text(oq_downstream_t *s, struct MHD_Connection *c, unsigned status,
                                 char *text, const char *ctype, const hdrs_t *h)
{
    if (!text) return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (h && h->retry_after)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, h->retry_after);
    if (h && h->replayed) MHD_add_response_header(r, "Idempotent-Replayed", h->replayed);
    if (h && h->match_count) MHD_add_response_header(r, "X-Match-Count", h->match_count);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    count_status(s, status);
    return ret;
}

static enum MHD_Result send_json(oq_downstream_t *s, struct MHD_Connection *c, unsigned status,
                                 json_t *body, const hdrs_t *h)
{
    if (!body) return MHD_NO;
    char *text = oq_json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return send_text(s, c, status, text, "application/json", h);
}

static enum MHD_Result send_error_h(oq_downstream_t *s, struct MHD_Connection *c, unsigned status,
                                    const char *code, const char *msg, const hdrs_t *h)
{
    return send_json(s, c, status,
                     json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", msg ? msg : code),
                     h);
}

static enum MHD_Result send_error(oq_downstream_t *s, struct MHD_Connection *c, unsigned status,
                                  const char *code, const char *msg)
{
    return send_error_h(s, c, status, code, msg, NULL);
}

static json_t *payment_json(const oq__ds_payment_t *p)
{
    char ts[32];
    oq_time_format(p->created_at, ts);
    json_t *req = p->request ? json_loads(p->request, 0, NULL) : NULL;
    json_t *o = json_pack("{s:s,s:s,s:s,s:I,s:s,s:s?,s:s?,s:s,s:o*}", "id", p->id, "object",
                          "payment", "status", "succeeded", "amount", (json_int_t)p->amount,
                          "currency", p->currency, "reference", p->reference, "idempotency_key",
                          p->idem_key, "created_at", ts, "request", req);
    return o;
}

/* --- scheduler -------------------------------------------------------------------------------*/

/* Suspend \p r's connection and resume it after delay_ms in state \p next. */
static void schedule_resume(oq_downstream_t *s, ds_req_t *r, int64_t delay_ms, int next)
{
    r->due_us = oq_mono_us() + delay_ms * 1000;
    r->next_state = next;
    MHD_suspend_connection(r->conn);
    pthread_mutex_lock(&s->smu);
    ds_req_t **pp = &s->timers;
    while (*pp && (*pp)->due_us <= r->due_us)
        pp = &(*pp)->tnext;
    r->tnext = *pp;
    *pp = r;
    pthread_cond_signal(&s->scv);
    pthread_mutex_unlock(&s->smu);
}

static void *sched_main(void *arg)
{
    oq_downstream_t *s = arg;
    pthread_mutex_lock(&s->smu);
    for (;;) {
        int64_t now = oq_mono_us();
        while (s->timers && (s->sflush || s->timers->due_us <= now)) {
            ds_req_t *r = s->timers;
            s->timers = r->tnext;
            r->state = r->next_state;
            MHD_resume_connection(r->conn);
        }
        if (s->sstop && !s->timers) break;
        if (!s->timers) {
            pthread_cond_wait(&s->scv, &s->smu);
            continue;
        }
        int64_t wait_us = s->timers->due_us - now;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += (time_t)(wait_us / 1000000);
        ts.tv_nsec += (long)(wait_us % 1000000) * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->scv, &s->smu, &ts);
    }
    pthread_mutex_unlock(&s->smu);
    return NULL;
}

/* --- writer ----------------------------------------------------------------------------------*/

static int process_job(oq_downstream_t *s, ds_req_t *r, oq_error_t *err)
{
    oq__ds_payment_t old;
    int rc;
    if (r->has_key && !r->keys_ignore) {
        rc = oq__ledger_find_by_key(s->wl, r->key, &old, NULL, err);
        if (rc == 0) {
            if (strcmp(old.request, r->pay.request) != 0) {
                oq__ds_payment_clear(&old);
                r->outcome = JOB_CONFLICT;
                return 0;
            }
            oq__ds_payment_clear(&r->pay);
            r->pay = old;
            r->outcome = JOB_REPLAYED;
            return 0;
        }
        if (rc != OQ_ENOTFOUND) return rc;
    }
    unsigned char rnd[8];
    oq_random_bytes_buffered(rnd, sizeof rnd);
    memcpy(r->pay.id, "pay_", 4);
    oq_hex(rnd, sizeof rnd, r->pay.id + 4);
    r->pay.created_at = oq_now_ms();
    r->pay.honoured = r->has_key && !r->keys_ignore;
    if ((rc = oq__ledger_insert(s->wl, &r->pay, err)) != 0) return rc;
    r->outcome = JOB_CREATED;
    return 0;
}

static void *writer_main(void *arg)
{
    oq_downstream_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->wmu);
        while (!s->qhead && !s->wstop)
            pthread_cond_wait(&s->wcv, &s->wmu);
        if (!s->qhead) {
            pthread_mutex_unlock(&s->wmu);
            break;
        }
        ds_req_t *batch = s->qhead, *last = batch;
        int n = 1;
        while (last->qnext && n < s->max_batch) {
            last = last->qnext;
            n++;
        }
        s->qhead = last->qnext;
        if (!s->qhead) s->qtail = NULL;
        last->qnext = NULL;
        pthread_mutex_unlock(&s->wmu);

        oq_error_t err = {0};
        int rc = oq__ledger_begin(s->wl, &err);
        for (ds_req_t *r = batch; r && rc == 0; r = r->qnext)
            rc = process_job(s, r, &err);
        if (rc == 0) rc = oq__ledger_commit(s->wl, &err);
        if (rc != 0) {
            oq__ledger_rollback(s->wl);
            OQ_LOG_ERROR("downstream", "ledger batch of %d failed, nothing committed: %s", n,
                         err.msg);
        } else {
            oq_counter_add(s->m_batches, 1);
        }
        for (ds_req_t *r = batch, *next; r; r = next) {
            next = r->qnext;
            if (rc != 0) {
                r->outcome = JOB_FAILED;
                snprintf(r->errmsg, sizeof r->errmsg, "%s", err.msg);
            } else if (r->outcome == JOB_CREATED) {
                oq_counter_add(s->m_effects, 1);
            } else if (r->outcome == JOB_REPLAYED) {
                oq_counter_add(s->m_replays, 1);
            } else if (r->outcome == JOB_CONFLICT) {
                oq_counter_add(s->m_conflicts, 1);
            }
            r->state = RS_COMMITTED;
            MHD_resume_connection(r->conn);
        }
    }
    return NULL;
}

static void enqueue(oq_downstream_t *s, ds_req_t *r)
{
    r->state = RS_COMMIT;
    r->qnext = NULL;
    MHD_suspend_connection(r->conn);
    pthread_mutex_lock(&s->wmu);
    if (s->qtail)
        s->qtail->qnext = r;
    else
        s->qhead = r;
    s->qtail = r;
    pthread_cond_signal(&s->wcv);
    pthread_mutex_unlock(&s->wmu);
}

/* --- readers ---------------------------------------------------------------------------------*/

static oq__ledger_t *reader_take(oq_downstream_t *s, oq_error_t *err)
{
    oq__ledger_t *l = NULL;
    pthread_mutex_lock(&s->rmu);
    if (s->nidle > 0) l = s->idle[--s->nidle];
    pthread_mutex_unlock(&s->rmu);
    if (l) return l;
    if (oq__ledger_open(s->db_path, s->sync, 1, &l, err) != 0) return NULL;
    return l;
}

static void reader_give(oq_downstream_t *s, oq__ledger_t *l)
{
    pthread_mutex_lock(&s->rmu);
    if (s->nidle < (int)(sizeof s->idle / sizeof s->idle[0])) {
        s->idle[s->nidle++] = l;
        l = NULL;
    }
    pthread_mutex_unlock(&s->rmu);
    oq__ledger_close(l);
}

/* --- request handling ------------------------------------------------------------------------*/

static int valid_text(const char *k, size_t max)
{
    size_t n = strlen(k);
    if (n == 0 || n > max) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)k[i] < 0x20 || (unsigned char)k[i] > 0x7e) return 0;
    return 1;
}

static const char *hdr(struct MHD_Connection *c, const char *name)
{
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

/* Decide the request's fault and modes once: headers first, then the seeded draw (POSTs). */
static int decide(oq_downstream_t *s, ds_req_t *r, struct MHD_Connection *c, int is_post)
{
    ds_mode_t m;
    mode_get(s, &m);
    r->decided = 1;
    r->keys_ignore = m.keys_ignore;
    r->lookup_off = m.lookup_off;
    r->retry_after_s = m.retry_after_s;
    r->fault = F_NONE;
    const char *v;
    if ((v = hdr(c, "X-Downstream-Keys"))) {
        if (strcasecmp(v, "ignore") == 0)
            r->keys_ignore = 1;
        else if (strcasecmp(v, "honour") == 0 || strcasecmp(v, "honor") == 0)
            r->keys_ignore = 0;
        else
            return -1;
    }
    if ((v = hdr(c, "X-Downstream-Lookup"))) {
        if (strcasecmp(v, "off") == 0)
            r->lookup_off = 1;
        else if (strcasecmp(v, "on") == 0)
            r->lookup_off = 0;
        else
            return -1;
    }
    if ((v = hdr(c, "X-Downstream-Retry-After"))) {
        char *e;
        long x = strtol(v, &e, 10);
        if (*e || x < 0 || x > 86400) return -1;
        r->retry_after_s = (int)x;
    }
    if ((v = hdr(c, "X-Downstream-Fault"))) {
        int f = fault_parse_name(v, strlen(v));
        if (f < 0) return -1;
        r->fault = (fault_t)f;
    } else if (is_post) {
        uint64_t n = atomic_fetch_add(&s->draws, 1);
        double u = (double)(splitmix64(m.seed ^ splitmix64(n)) >> 11) * 0x1.0p-53;
        double acc = 0;
        for (int f = 1; f < F__COUNT; f++) {
            acc += m.prob[f];
            if (u < acc) {
                r->fault = (fault_t)f;
                break;
            }
        }
    }
    r->delay_ms = r->fault == F_SLOW ? m.slow_ms : m.late_ms;
    if ((v = hdr(c, "X-Downstream-Delay-Ms"))) {
        char *e;
        long long x = strtoll(v, &e, 10);
        if (*e || x < 0 || x > 600000) return -1;
        r->delay_ms = x;
    }
    if (r->fault != F_NONE) oq_counter_add(s->m_fault[r->fault], 1);
    return 0;
}

/*
 * Faults that act before any work: returns 1 when the request was answered (or must be
 * dropped: *ret = MHD_NO), 0 to go on. "slow" suspends first and comes back here (once).
 */
static int pre_faults(oq_downstream_t *s, ds_req_t *r, struct MHD_Connection *c,
                      enum MHD_Result *ret)
{
    char ra[24];
    snprintf(ra, sizeof ra, "%d", r->retry_after_s);
    hdrs_t h = {ra, NULL, NULL};
    switch (r->fault) {
    case F_SLOW:
        if (r->state != RS_PROCESS) {
            schedule_resume(s, r, r->delay_ms, RS_PROCESS);
            *ret = MHD_YES;
            return 1;
        }
        return 0;
    case F_DROP_BEFORE:
        oq_counter_add(s->m_dropped, 1);
        *ret = MHD_NO;
        return 1;
    case F_500:
        *ret = send_error(s, c, 500, "internal", "injected failure before commit");
        return 1;
    case F_503:
        *ret = send_error_h(s, c, 503, "unavailable", "injected: try again later", &h);
        return 1;
    case F_429:
        *ret = send_error_h(s, c, 429, "rate_limited", "injected: too many requests", &h);
        return 1;
    case F_DECLINE:
        *ret = send_error(s, c, 402, "card_declined", "injected: the payment was declined");
        return 1;
    default:
        return 0;
    }
}

static enum MHD_Result pay_begin(oq_downstream_t *s, ds_req_t *r, struct MHD_Connection *c)
{
    if (r->too_big) return send_error(s, c, 413, "payload_too_large", "body too large");
    const char *raw = hdr(c, "Idempotency-Key");
    if (raw) {
        size_t n = strlen(raw);
        if (n >= 2 && raw[0] == '"' && raw[n - 1] == '"') { /* sf-string form */
            raw++;
            n -= 2;
        }
        if (n == 0 || n > OQ__DS_MAX_KEY)
            return send_error(s, c, 400, "invalid_idempotency_key",
                              "Idempotency-Key must be 1-255 printable ASCII bytes");
        memcpy(r->key, raw, n);
        r->key[n] = '\0';
        if (!valid_text(r->key, OQ__DS_MAX_KEY))
            return send_error(s, c, 400, "invalid_idempotency_key",
                              "Idempotency-Key must be 1-255 printable ASCII bytes");
        r->has_key = 1;
    }
    oq_error_t err = {0};
    json_t *root = NULL;
    char msg[300] = "";
    if (oq_json_parse(r->body.p ? r->body.p : "", r->body.len, 16, &root, &err) != 0)
        return send_error(s, c, 400, "bad_request", err.msg);
    json_t *v;
    int64_t amount = 0;
    const char *currency = "EUR", *ref = NULL;
    if (!json_is_object(root)) {
        snprintf(msg, sizeof msg, "body must be a JSON object");
        goto bad;
    }
    if ((v = json_object_get(root, "amount"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            snprintf(msg, sizeof msg, "field amount: expected an integer >= 0");
            goto bad;
        }
        amount = json_integer_value(v);
    }
    if ((v = json_object_get(root, "currency"))) {
        const char *cur = json_string_value(v);
        if (!cur || strlen(cur) != 3 || strspn(cur, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != 3) {
            snprintf(msg, sizeof msg, "field currency: expected three capital letters");
            goto bad;
        }
        currency = cur;
    }
    if ((v = json_object_get(root, "reference")) && !json_is_null(v)) {
        ref = json_string_value(v);
        if (!ref || !valid_text(ref, OQ__DS_MAX_KEY)) {
            snprintf(msg, sizeof msg, "field reference: expected 1-255 printable ASCII bytes");
            goto bad;
        }
    }
    memset(&r->pay, 0, sizeof r->pay);
    r->pay.amount = amount;
    snprintf(r->pay.currency, sizeof r->pay.currency, "%s", currency);
    if (oq_jcs_canonicalize(root, &r->pay.request, NULL, &err) != 0) {
        snprintf(msg, sizeof msg, "%s", err.msg);
        goto bad;
    }
    if ((r->has_key && !(r->pay.idem_key = strdup(r->key))) ||
        (ref && !(r->pay.reference = strdup(ref)))) {
        json_decref(root);
        return send_error(s, c, 503, "unavailable", "out of memory");
    }
    json_decref(root);
    enqueue(s, r);
    return MHD_YES;
bad:
    json_decref(root);
    return send_error(s, c, 400, "bad_request", msg);
}

static enum MHD_Result pay_finish(oq_downstream_t *s, ds_req_t *r, struct MHD_Connection *c)
{
    if (r->outcome == JOB_FAILED) return send_error(s, c, 503, "unavailable", r->errmsg);
    if (r->outcome == JOB_CONFLICT)
        return send_error(s, c, 422, "idempotency_conflict",
                          "this Idempotency-Key was used with a different request body");
    if (r->state == RS_COMMITTED) {
        if (r->fault == F_DROP_AFTER) {
            oq_counter_add(s->m_dropped, 1);
            return MHD_NO;
        }
        if (r->fault == F_LATE_AFTER) {
            schedule_resume(s, r, r->delay_ms, RS_RESPOND);
            return MHD_YES;
        }
    }
    hdrs_t h = {NULL, r->outcome == JOB_REPLAYED ? "true" : NULL, NULL};
    return send_json(s, c, r->outcome == JOB_REPLAYED ? 200 : 201, payment_json(&r->pay), &h);
}

static enum MHD_Result get_payment(oq_downstream_t *s, ds_req_t *r, struct MHD_Connection *c,
                                   const char *id, const char *ref, const char *key)
{
    oq_error_t err = {0};
    oq__ds_payment_t p;
    int count = 1, rc;
    oq__ledger_t *l = reader_take(s, &err);
    if (!l) return send_error(s, c, 503, "unavailable", err.msg);
    if (id)
        rc = oq__ledger_get(l, id, &p, &err);
    else if (ref)
        rc = oq__ledger_find_by_ref(l, ref, &p, &count, &err);
    else
        rc = oq__ledger_find_by_key(l, key, &p, &count, &err);
    reader_give(s, l);
    if (rc == OQ_ENOTFOUND) return send_error(s, c, 404, "not_found", "no such payment");
    if (rc) return send_error(s, c, 503, "unavailable", err.msg);
    char n[24];
    snprintf(n, sizeof n, "%d", count);
    hdrs_t h = {NULL, NULL, id ? NULL : n};
    enum MHD_Result ret = send_json(s, c, 200, payment_json(&p), &h);
    oq__ds_payment_clear(&p);
    (void)r;
    return ret;
}

static json_t *mode_json(oq_downstream_t *s)
{
    ds_mode_t m;
    mode_get(s, &m);
    json_t *f = json_object();
    for (int i = 1; i < F__COUNT; i++)
        if (m.prob[i] > 0) json_object_set_new(f, fault_names[i], json_real(m.prob[i]));
    return json_pack("{s:s,s:s,s:o,s:s,s:I,s:I,s:I,s:i,s:b}", "keys",
                     m.keys_ignore ? "ignore" : "honour", "lookup", m.lookup_off ? "off" : "on",
                     "faults", f, "fault_spec", m.spec, "seed", (json_int_t)m.seed, "slow_ms",
                     (json_int_t)m.slow_ms, "late_ms", (json_int_t)m.late_ms, "retry_after_s",
                     m.retry_after_s, "down", !atomic_load(&s->listening));
}

/* POST /admin/mode: validate every field first, then apply all of them at once. */
static enum MHD_Result admin_mode(oq_downstream_t *s, ds_req_t *r, struct MHD_Connection *c)
{
    oq_error_t err = {0};
    json_t *root = NULL, *v;
    const char *k;
    char msg[300] = "";
    if (oq_json_parse(r->body.p ? r->body.p : "", r->body.len, 8, &root, &err) != 0)
        return send_error(s, c, 400, "bad_request", err.msg);
    ds_mode_t m;
    mode_get(s, &m);
    int reseed = 0;
    if (!json_is_object(root)) {
        snprintf(msg, sizeof msg, "body must be a JSON object");
        goto bad;
    }
    json_object_foreach(root, k, v)
    {
        const char *sv = json_string_value(v);
        if (strcmp(k, "keys") == 0 && sv &&
            (strcmp(sv, "honour") == 0 || strcmp(sv, "ignore") == 0)) {
            m.keys_ignore = strcmp(sv, "ignore") == 0;
        } else if (strcmp(k, "lookup") == 0 && sv &&
                   (strcmp(sv, "on") == 0 || strcmp(sv, "off") == 0)) {
            m.lookup_off = strcmp(sv, "off") == 0;
        } else if (strcmp(k, "faults") == 0 && sv) {
            if (strlen(sv) >= sizeof m.spec || faults_parse(sv, m.prob, &err) != 0) {
                snprintf(msg, sizeof msg, "faults: %s", err.msg[0] ? err.msg : "too long");
                goto bad;
            }
            snprintf(m.spec, sizeof m.spec, "%s", sv);
        } else if (strcmp(k, "seed") == 0 && json_is_integer(v) && json_integer_value(v) >= 0) {
            m.seed = (uint64_t)json_integer_value(v);
            reseed = 1;
        } else if (strcmp(k, "slow_ms") == 0 && json_is_integer(v) && json_integer_value(v) >= 0 &&
                   json_integer_value(v) <= 600000) {
            m.slow_ms = json_integer_value(v);
        } else if (strcmp(k, "late_ms") == 0 && json_is_integer(v) && json_integer_value(v) >= 0 &&
                   json_integer_value(v) <= 600000) {
            m.late_ms = json_integer_value(v);
        } else if (strcmp(k, "retry_after_s") == 0 && json_is_integer(v) &&
                   json_integer_value(v) >= 0 && json_integer_value(v) <= 86400) {
            m.retry_after_s = (int)json_integer_value(v);
        } else {
            snprintf(msg, sizeof msg,
                     "bad or unknown field '%.64s' (keys honour|ignore, lookup on|off, faults "
                     "spec, seed, slow_ms, late_ms, retry_after_s)",
                     k);
            goto bad;
        }
    }
    json_decref(root);
    pthread_mutex_lock(&s->mode_mu);
    s->mode = m;
    if (reseed) atomic_store(&s->draws, 0);
    pthread_mutex_unlock(&s->mode_mu);
    OQ_LOG_INFO("downstream", "mode keys=%s lookup=%s faults=%s",
                m.keys_ignore ? "ignore" : "honour", m.lookup_off ? "off" : "on",
                m.spec[0] ? m.spec : "none");
    return send_json(s, c, 200, mode_json(s), NULL);
bad:
    json_decref(root);
    return send_error(s, c, 400, "bad_request", msg);
}

static enum MHD_Result admin_down(oq_downstream_t *s, ds_req_t *r, struct MHD_Connection *c)
{
    oq_error_t err = {0};
    json_t *root = NULL;
    if (oq_json_parse(r->body.len ? r->body.p : "{}", r->body.len ? r->body.len : 2, 4, &root,
                      &err) != 0)
        return send_error(s, c, 400, "bad_request", err.msg);
    json_t *ms = json_object_get(root, "ms");
    if (!json_is_object(root) || json_object_size(root) > (ms ? 1u : 0u) ||
        (ms && (!json_is_integer(ms) || json_integer_value(ms) < 0 ||
                json_integer_value(ms) > 3600000))) {
        json_decref(root);
        return send_error(s, c, 400, "bad_request", "body: {\"ms\": 0..3600000} (0: until up)");
    }
    int64_t v = ms ? json_integer_value(ms) : 0;
    json_decref(root);
    oq_downstream_set_down(s, v);
    return send_json(s, c, 202, json_pack("{s:b,s:I}", "down", 1, "ms", (json_int_t)v), NULL);
}

static enum MHD_Result ledger_stats(oq_downstream_t *s, struct MHD_Connection *c)
{
    oq_error_t err = {0};
    json_t *ledger = NULL;
    oq__ledger_t *l = reader_take(s, &err);
    if (!l) return send_error(s, c, 503, "unavailable", err.msg);
    int rc = oq__ledger_stats(l, 20, &ledger, &err);
    reader_give(s, l);
    if (rc) return send_error(s, c, 503, "unavailable", err.msg);
    json_t *faults = json_object();
    for (int i = 1; i < F__COUNT; i++)
        json_object_set_new(faults, fault_names[i],
                            json_integer((json_int_t)oq_metric_value(s->m_fault[i])));
    json_t *req = json_object();
    static const char *const names[5] = {"post_payment", "get_payment", "lookup", "admin", "other"};
    double total = 0;
    for (int i = 0; i < 5; i++) {
        total += oq_metric_value(s->m_req[i]);
        json_object_set_new(req, names[i], json_integer((json_int_t)oq_metric_value(s->m_req[i])));
    }
    json_object_set_new(req, "total", json_integer((json_int_t)total));
    json_t *o = json_pack(
        "{s:o,s:{s:I,s:I,s:I},s:I,s:I,s:I,s:I,s:o,s:I,s:o}", "requests", req, "responses", "2xx",
        (json_int_t)oq_metric_value(s->m_resp[0]), "4xx", (json_int_t)oq_metric_value(s->m_resp[1]),
        "5xx", (json_int_t)oq_metric_value(s->m_resp[2]), "effects_committed",
        (json_int_t)oq_metric_value(s->m_effects), "replays",
        (json_int_t)oq_metric_value(s->m_replays), "conflicts",
        (json_int_t)oq_metric_value(s->m_conflicts), "commit_batches",
        (json_int_t)oq_metric_value(s->m_batches), "faults", faults, "dropped_replies",
        (json_int_t)oq_metric_value(s->m_dropped), "ledger", ledger);
    return send_json(s, c, 200, o, NULL);
}

#define PAY_PATH "/v1/payments"

static enum MHD_Result dispatch(oq_downstream_t *s, ds_req_t *r, struct MHD_Connection *c,
                                const char *url, const char *method)
{
    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    enum MHD_Result ret;

    if (r->route == ROUTE_PAY_POST) {
        if (r->state == RS_COMMITTED || r->state == RS_RESPOND) return pay_finish(s, r, c);
        if (r->state == RS_COMMIT) return MHD_YES; /* spurious call while suspended */
        if (pre_faults(s, r, c, &ret)) return ret;
        return pay_begin(s, r, c);
    }
    if (strcmp(url, "/healthz") == 0)
        return send_text(s, c, 200, strdup("{\"status\":\"ok\"}"), "application/json", NULL);
    if (strcmp(url, "/metrics") == 0) {
        char *text = NULL;
        size_t len = 0;
        if (oq_metrics_render(s->metrics, &text, &len) != 0)
            return send_error(s, c, 500, "internal", "metrics");
        return send_text(s, c, 200, text, "text/plain; version=0.0.4", NULL);
    }
    if (strcmp(url, "/ledger/stats") == 0) {
        if (!is_get) return send_error(s, c, 405, "method_not_allowed", "use GET");
        return ledger_stats(s, c);
    }
    if (strcmp(url, "/admin/mode") == 0) {
        if (r->route == ROUTE_ADMIN_MODE_POST) return admin_mode(s, r, c);
        if (!is_get) return send_error(s, c, 405, "method_not_allowed", "use GET or POST");
        return send_json(s, c, 200, mode_json(s), NULL);
    }
    if (strcmp(url, "/admin/down") == 0) {
        if (r->route != ROUTE_ADMIN_DOWN)
            return send_error(s, c, 405, "method_not_allowed", "use POST");
        return admin_down(s, r, c);
    }
    /* payment reads: the request's faults (headers only) apply to them too */
    if (strcmp(url, PAY_PATH) == 0 || strncmp(url, PAY_PATH "/", strlen(PAY_PATH) + 1) == 0) {
        if (!is_get)
            return send_error(s, c, 405, "method_not_allowed", "use GET (or POST " PAY_PATH ")");
        if (pre_faults(s, r, c, &ret)) return ret;
        if (url[strlen(PAY_PATH)] == '/') {
            const char *id = url + strlen(PAY_PATH) + 1;
            if (strlen(id) != OQ__DS_ID_LEN || strncmp(id, "pay_", 4) != 0)
                return send_error(s, c, 404, "not_found", "no such payment");
            return get_payment(s, r, c, id, NULL, NULL);
        }
        const char *ref = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "reference");
        const char *key = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "idempotency_key");
        if (r->lookup_off)
            return send_error(s, c, 501, "not_implemented", "this service offers no lookup");
        if ((ref != NULL) == (key != NULL))
            return send_error(s, c, 400, "bad_request",
                              "give exactly one of ?reference= and ?idempotency_key=");
        if (!valid_text(ref ? ref : key, OQ__DS_MAX_KEY))
            return send_error(s, c, 400, "bad_request", "lookup value: 1-255 printable bytes");
        return get_payment(s, r, c, NULL, ref, key);
    }
    return send_error(s, c, 404, "not_found", "no such endpoint");
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    oq_downstream_t *s = cls;
    ds_req_t *r = *con_cls;
    (void)version;
    if (!r) {
        int is_post = strcmp(method, "POST") == 0;
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->s = s;
        r->conn = c;
        r->state = RS_READ;
        if (is_post && strcmp(url, PAY_PATH) == 0)
            r->route = ROUTE_PAY_POST;
        else if (is_post && strcmp(url, "/admin/mode") == 0)
            r->route = ROUTE_ADMIN_MODE_POST;
        else if (is_post && strcmp(url, "/admin/down") == 0)
            r->route = ROUTE_ADMIN_DOWN;
        else
            r->route = ROUTE_OTHER;
        *con_cls = r;
        atomic_fetch_add(&s->inflight, 1);
        int rq = r->route == ROUTE_PAY_POST                              ? RQ_POST
                 : strncmp(url, "/admin/", 7) == 0                       ? RQ_ADMIN
                 : strncmp(url, PAY_PATH "/", strlen(PAY_PATH) + 1) == 0 ? RQ_GET
                 : strcmp(url, PAY_PATH) == 0                            ? RQ_LOOKUP
                                                                         : RQ_OTHER;
        oq_counter_add(s->m_req[rq], 1);
        const char *cl = hdr(c, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoll(cl, NULL, 10) > s->max_body) r->too_big = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->route == ROUTE_OTHER || r->too_big) return MHD_YES;
        if ((int64_t)(r->body.len + n) > s->max_body) {
            r->too_big = 1;
            return MHD_YES;
        }
        if (oq_buf_put(&r->body, upload, n)) return MHD_NO;
        return MHD_YES;
    }
    if (!r->decided) {
        int is_pay = r->route == ROUTE_PAY_POST || strncmp(url, PAY_PATH, strlen(PAY_PATH)) == 0;
        if (decide(s, r, c, r->route == ROUTE_PAY_POST) != 0)
            return send_error(s, c, 400, "bad_request", "bad X-Downstream-* header value");
        if (!is_pay) r->fault = F_NONE; /* admin and stats requests are never faulted */
        /* a read commits nothing: "after commit" faults act before the answer */
        if (r->route != ROUTE_PAY_POST && r->fault == F_DROP_AFTER) r->fault = F_DROP_BEFORE;
        if (r->route != ROUTE_PAY_POST && r->fault == F_LATE_AFTER) r->fault = F_SLOW;
    }
    return dispatch(s, r, c, url, method);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    oq_downstream_t *s = cls;
    ds_req_t *r = *con_cls;
    (void)c;
    (void)toe;
    if (!r) return;
    oq__ds_payment_clear(&r->pay);
    oq_buf_free(&r->body);
    free(r);
    *con_cls = NULL;
    atomic_fetch_sub(&s->inflight, 1);
}

/* --- lifecycle -------------------------------------------------------------------------------*/

static int listen_up(oq_downstream_t *s, oq_error_t *err)
{
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                                MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
                            (uint16_t)s->port, NULL, NULL, handler, s, MHD_OPTION_EXTERNAL_LOGGER,
                            oq_mhd_log, (void *)&mhd_log_ctx, MHD_OPTION_SOCK_ADDR, &s->sa,
                            MHD_OPTION_THREAD_POOL_SIZE, s->threads, MHD_OPTION_NOTIFY_COMPLETED,
                            completed, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
                            MHD_OPTION_CONNECTION_LIMIT, s->threads * OQ_MHD_CONNS_PER_THREAD,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)16384, MHD_OPTION_END);
    if (!s->d) return oq_error_set(err, OQ_EIO, 0, "cannot listen on 127.0.0.1:%d", s->port);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    if (info && info->port) s->port = info->port;
    s->sa.sin_port = htons((uint16_t)s->port);
    atomic_store(&s->listening, 1);
    return 0;
}

/* Close the listening socket at once, then wait (bounded) for requests in progress, let the
 * scheduler answer delayed ones now, and stop the daemon (closing kept-alive connections). */
static void listen_down(oq_downstream_t *s, int drain_ms)
{
    if (!s->d) return;
    atomic_store(&s->listening, 0);
    MHD_socket ls = MHD_quiesce_daemon(s->d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    int64_t deadline = oq_mono_us() + (int64_t)drain_ms * 1000;
    while (atomic_load(&s->inflight) > 0 && oq_mono_us() < deadline)
        oq_sleep_ms(5, NULL);
    pthread_mutex_lock(&s->smu);
    s->sflush = 1;
    pthread_cond_signal(&s->scv);
    pthread_mutex_unlock(&s->smu);
    deadline = oq_mono_us() + 5000000;
    while (atomic_load(&s->inflight) > 0 && oq_mono_us() < deadline)
        oq_sleep_ms(5, NULL);
    if (atomic_load(&s->inflight) > 0)
        OQ_LOG_WARN("downstream", "stopping with %d requests still in progress",
                    atomic_load(&s->inflight));
    MHD_stop_daemon(s->d);
    s->d = NULL;
    pthread_mutex_lock(&s->smu);
    s->sflush = 0;
    pthread_mutex_unlock(&s->smu);
}

void oq_downstream_set_down(oq_downstream_t *d, int64_t ms)
{
    if (!d) return;
    atomic_store(&d->down_req, ms > 0 ? ms : ms == 0 ? -2 : -1);
}

void oq_downstream_tick(oq_downstream_t *s)
{
    long long req = atomic_exchange(&s->down_req, 0);
    if (req == -1 || (s->up_at_us && oq_mono_us() >= s->up_at_us)) {
        s->up_at_us = 0;
        if (!s->d) {
            oq_error_t err = {0};
            if (listen_up(s, &err) != 0)
                OQ_LOG_ERROR("downstream", "up: %s (retrying)", err.msg);
            else
                OQ_LOG_INFO("downstream", "up: listening on 127.0.0.1:%d again", s->port);
            if (!s->d) s->up_at_us = oq_mono_us() + 100000;
        }
        return;
    }
    if (req > 0 || req == -2) {
        if (req > 0)
            OQ_LOG_INFO("downstream", "down: refusing connections for %lld ms", req);
        else
            OQ_LOG_INFO("downstream", "down: refusing connections until told to listen again");
        listen_down(s, 10000);
        s->up_at_us = req > 0 ? oq_mono_us() + (int64_t)req * 1000 : 0;
    }
}

int oq_downstream_port(const oq_downstream_t *d)
{
    return d && atomic_load(&d->listening) ? d->port : -1;
}

static void register_metrics(oq_downstream_t *s)
{
    oq_metrics_t *m = s->metrics;
    for (int i = 0; i < 5; i++)
        s->m_req[i] = oq_metrics_counter(m, "onceq_downstream_requests_total",
                                         "Requests received, by route.", route_labels[i]);
    static const char *const cls[3] = {"class=\"2xx\"", "class=\"4xx\"", "class=\"5xx\""};
    for (int i = 0; i < 3; i++)
        s->m_resp[i] = oq_metrics_counter(m, "onceq_downstream_responses_total",
                                          "Responses sent, by status class.", cls[i]);
    for (int i = 1; i < F__COUNT; i++) {
        char lab[64];
        snprintf(lab, sizeof lab, "fault=\"%s\"", fault_names[i]);
        s->m_fault[i] =
            oq_metrics_counter(m, "onceq_downstream_faults_total", "Faults injected.", lab);
    }
    s->m_effects = oq_metrics_counter(m, "onceq_downstream_effects_total",
                                      "Payments committed to the ledger by this process.", NULL);
    s->m_replays = oq_metrics_counter(m, "onceq_downstream_replays_total",
                                      "Requests answered from an honoured key.", NULL);
    s->m_conflicts = oq_metrics_counter(m, "onceq_downstream_conflicts_total",
                                        "Same key, different body (422).", NULL);
    s->m_batches = oq_metrics_counter(m, "onceq_downstream_commit_batches_total",
                                      "Ledger transactions committed.", NULL);
    s->m_dropped = oq_metrics_counter(m, "onceq_downstream_dropped_replies_total",
                                      "Connections closed without a response.", NULL);
}

int oq_downstream_start(const oq_downstream_opts_t *o, oq_downstream_t **out, oq_error_t *err)
{
    char host[64];
    int port = 0, rc;
    if ((rc = oq_parse_listen(o->listen ? o->listen : "127.0.0.1:8090", host, &port, err)))
        return rc;
    oq_downstream_t *s = calloc(1, sizeof *s);
    if (!s) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    pthread_mutex_init(&s->mode_mu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    pthread_cond_init(&s->wcv, NULL);
    pthread_mutex_init(&s->rmu, NULL);
    pthread_mutex_init(&s->smu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->scv, &ca);
    pthread_condattr_destroy(&ca);

    s->sa.sin_family = AF_INET;
    if (inet_pton(AF_INET, host, &s->sa.sin_addr) != 1) {
        rc = oq_error_set(err, OQ_EINVAL, 0, "bad listen address %s", host);
        goto fail;
    }
    s->port = port;
    s->sa.sin_port = htons((uint16_t)port);
    /* at least --threads, and one per 120 of its 1,000 connections: a thread that finds 128
     * requests ready at once stalls them up to the idle timeout (common/oq_mhd.h) */
    s->threads = oq_mhd_pool_threads(DS_MAX_CONNS, (unsigned)(o->threads >= 1 ? o->threads : 2));
    s->max_body = o->max_body > 0 ? o->max_body : 64 * 1024;
    s->max_batch = o->max_batch > 0 ? o->max_batch : 256;
    snprintf(s->db_path, sizeof s->db_path, "%s", o->db ? o->db : "downstream.db");
    snprintf(s->sync, sizeof s->sync, "%s", o->synchronous ? o->synchronous : "full");
    s->mode.keys_ignore = o->keys_ignore;
    s->mode.lookup_off = o->lookup_off;
    s->mode.slow_ms = o->slow_ms > 0 ? o->slow_ms : 2000;
    s->mode.late_ms = o->late_ms > 0 ? o->late_ms : 5000;
    s->mode.retry_after_s = o->retry_after_s > 0 ? o->retry_after_s : 1;
    if ((rc = faults_parse(o->faults, s->mode.prob, err)) != 0) goto fail;
    snprintf(s->mode.spec, sizeof s->mode.spec, "%s", o->faults ? o->faults : "");
    if (o->seed)
        s->mode.seed = o->seed;
    else
        oq_random_bytes(&s->mode.seed, sizeof s->mode.seed);
    if (!(s->metrics = oq_metrics_new())) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto fail;
    }
    register_metrics(s);
    if ((rc = oq__ledger_open(s->db_path, s->sync, 0, &s->wl, err)) != 0) goto fail;
    if (pthread_create(&s->writer, NULL, writer_main, s) != 0) {
        rc = oq_error_set(err, OQ_EIO, 0, "cannot start the writer thread");
        goto fail;
    }
    s->writer_started = 1;
    if (pthread_create(&s->sched, NULL, sched_main, s) != 0) {
        rc = oq_error_set(err, OQ_EIO, 0, "cannot start the scheduler thread");
        goto fail;
    }
    s->sched_started = 1;
    if ((rc = listen_up(s, err)) != 0) goto fail;
    OQ_LOG_INFO("downstream",
                "listening on %s:%d db=%s keys=%s lookup=%s faults=%s seed=%llu max_batch=%d "
                "synchronous=%s",
                host, s->port, s->db_path, s->mode.keys_ignore ? "ignore" : "honour",
                s->mode.lookup_off ? "off" : "on", s->mode.spec[0] ? s->mode.spec : "none",
                (unsigned long long)s->mode.seed, s->max_batch, s->sync);
    *out = s;
    return 0;
fail:
    oq_downstream_stop(s, 0);
    return rc;
}

void oq_downstream_stop(oq_downstream_t *s, int drain_ms)
{
    if (!s) return;
    listen_down(s, drain_ms);
    if (s->sched_started) {
        pthread_mutex_lock(&s->smu);
        s->sstop = 1;
        s->sflush = 1;
        pthread_cond_signal(&s->scv);
        pthread_mutex_unlock(&s->smu);
        pthread_join(s->sched, NULL);
    }
    if (s->writer_started) {
        pthread_mutex_lock(&s->wmu);
        s->wstop = 1;
        pthread_cond_signal(&s->wcv);
        pthread_mutex_unlock(&s->wmu);
        pthread_join(s->writer, NULL);
    }
    oq__ledger_close(s->wl);
    for (int i = 0; i < s->nidle; i++)
        oq__ledger_close(s->idle[i]);
    oq_metrics_destroy(s->metrics);
    pthread_mutex_destroy(&s->mode_mu);
    pthread_mutex_destroy(&s->wmu);
    pthread_cond_destroy(&s->wcv);
    pthread_mutex_destroy(&s->rmu);
    pthread_mutex_destroy(&s->smu);
    pthread_cond_destroy(&s->scv);
    free(s);
}
