/* SPDX-License-Identifier: Apache-2.0 */
/*
 * webhooks.c: the producer's webhook sender. It POSTs the deliveries that decide.c queued in
 * webhook_deliveries (one per settled attempt of a call with a callback_url, written in the
 * transaction that settled the call) to their URL, signed, until a 2xx or the budget is spent.
 *
 * Why here, in the producer process and not beside the relay: the delivery rows, the calls
 * they describe, the tenants' secrets (the token file) and the one writer of calls.db are all
 * the producer's; the relay is a generic outbox-to-Kafka library that the consumer embeds too
 * and knows no tenant. A sender in the producer marks its tries through the producer's own
 * group-commit writer (a work item, oq__producer_webhook_marks), so calls.db keeps one writer
 * per process and the marks cost no fsync of their own, and it needs no second configuration.
 *
 * Design. A dispatcher thread reads due deliveries (state pending, next_at passed: the partial
 * index webhook_due) on a read connection of its own, every poll_ms or as soon as a slot frees,
 * and hands them to `concurrency` worker threads through a fixed array of slots; a delivery in
 * a slot is not read again. A worker signs the stored body (HMAC-SHA256 over "<t>.<body>" with
 * the tenant's secret, Stripe's scheme: header Onceq-Signature: t=<unix>,v1=<hex>), POSTs it
 * with Idempotency-Key: <delivery id> on its own libcurl handle (keep-alive, a timeout per try,
 * no redirects) and leaves the answer in its slot. The dispatcher turns finished slots into row
 * changes by the rule of decide.c (oq__decide_webhook_try: 2xx delivered; anything else tried
 * again after an exponential backoff with jitter; dead when tries or age run out) and has the
 * writer commit them in one item. Submits and results never wait for a webhook: the sender
 * only adds a small item to a group commit now and then, and its HTTP happens on its threads.
 *
 * At least once: a crash (kill -9) between a 2xx and the commit of its mark sends the delivery
 * again after the restart, with the same Idempotency-Key and body; receivers dedupe by the key.
 * The signature's timestamp is that of the try (a receiver's tolerance window applies to it).
 * One sender per database is assumed (one producer process): a second one would send every
 * delivery twice, which the key absorbs but is a waste.
 */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "oq_db.h"
#include "oq_httpc.h"
#include "oq_log.h"
#include "oq_metrics.h"
#include "oq_pg.h"
#include "oq_tokens.h"
#include "producer_int.h"

enum { SLOT_FREE = 0, SLOT_QUEUED, SLOT_SENDING, SLOT_DONE };

typedef struct slot {
    int state;
    oq__producer_delivery_t d; /* owned while not FREE */
    long status;
    int64_t retry_after_ms;
    char error[256];
} slot_t;

struct oq_webhooks {
    oq_producer_t *p;
    oq__webhook_policy_t pol;
    int64_t timeout_ms, poll_ms;
    int conc;
    char *secret, *token_file, *cacert;
    pthread_rwlock_t lock; /* guards tokens */
    oq_token_table_t *tokens;
    sqlite3 *db; /* the dispatcher's read connection, or */
    PGconn *pg;
    slot_t *slots;
    pthread_mutex_t mu;
    pthread_cond_t cv;  /* the dispatcher: a slot is DONE, or stop */
    pthread_cond_t wcv; /* the workers: a slot is QUEUED, or stop */
    int stop;           /* under mu */
    pthread_t disp, *workers;
    int disp_started, nworkers;
    oq_metric_t *m_delivered, *m_retry, *m_dead, *m_pending, *m_oldest, *m_dead_rows, *m_inflight;
};

/* --- signing -------------------------------------------------------------------------------- */

int oq_webhook_sign(const char *secret, int64_t t, const char *body, size_t len, char *out,
                    size_t cap)
{
    char pre[24];
    int pn = snprintf(pre, sizeof pre, "%lld.", (long long)t);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mlen = 0;
    /* one-shot HMAC(): the message in one piece */
    unsigned char *msg = malloc((size_t)pn + len);
    if (!msg) return OQ_ENOMEM;
    memcpy(msg, pre, (size_t)pn);
    memcpy(msg + pn, body, len);
    unsigned char *r =
        HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, (size_t)pn + len, mac, &mlen);
    free(msg);
    if (!r || mlen != 32) return OQ_EIO;
    char hex[65];
    for (unsigned i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    if ((size_t)snprintf(out, cap, "t=%lld,v1=%s", (long long)t, hex) >= cap) return OQ_ETOOBIG;
    return 0;
}

/* The secret of \p tenant (its webhook_secret= in the token file, else the default) into
 * \p out; 0 when there is none. */
static int secret_of(oq_webhooks_t *w, const char *tenant, char out[OQ_WEBHOOK_SECRET_MAX_LEN + 1])
{
    int found = 0;
    pthread_rwlock_rdlock(&w->lock);
    const oq_tenant_hook_t *h = oq_tokens_hook(w->tokens, tenant);
    if (h && h->secret) {
        snprintf(out, OQ_WEBHOOK_SECRET_MAX_LEN + 1, "%s", h->secret);
        found = 1;
    }
    pthread_rwlock_unlock(&w->lock);
    if (!found && w->secret) {
        snprintf(out, OQ_WEBHOOK_SECRET_MAX_LEN + 1, "%s", w->secret);
        found = 1;
    }
    return found;
}

int oq_webhooks_can_sign(oq_webhooks_t *w, const char *tenant)
{
    char s[OQ_WEBHOOK_SECRET_MAX_LEN + 1];
    int ok = w && secret_of(w, tenant && *tenant ? tenant : OQ_DEFAULT_TENANT, s);
    OPENSSL_cleanse(s, sizeof s);
    return ok;
}

int oq_webhooks_reload(oq_webhooks_t *w, oq_error_t *err)
{
    if (!w || !w->token_file) return 0;
    oq_token_table_t *t = NULL;
    int ret = oq_tokens_load(w->token_file, 1, &t, err);
    if (ret) return ret;
    pthread_rwlock_wrlock(&w->lock);
    oq_token_table_t *old = w->tokens;
    w->tokens = t;
    pthread_rwlock_unlock(&w->lock);
    oq_tokens_free(old);
    return 0;
}

/* --- the workers ---------------------------------------------------------------------------- */

/* One try of \p s->d: its answer (or why none) into the slot. @locality a worker, no lock */
static void send_one(oq_webhooks_t *w, oq_httpc_t *c, slot_t *s)
{
    char secret[OQ_WEBHOOK_SECRET_MAX_LEN + 1];
    s->status = 0;
    s->retry_after_ms = -1;
    s->error[0] = '\0';
    if (!secret_of(w, s->d.tenant, secret)) {
        snprintf(s->error, sizeof s->error,
                 "no webhook secret for tenant %.128s (webhook_secret= in the token file, or "
                 "--webhook-secret-file): not sent",
                 s->d.tenant);
        return;
    }
    char sig[160], h_sig[192], h_key[80], h_call[64];
    int rc =
        oq_webhook_sign(secret, oq_now_ms() / 1000, s->d.body, strlen(s->d.body), sig, sizeof sig);
    OPENSSL_cleanse(secret, sizeof secret);
    if (rc) {
        snprintf(s->error, sizeof s->error, "cannot sign: out of memory");
        return;
    }
    snprintf(h_sig, sizeof h_sig, "Onceq-Signature: %s", sig);
    snprintf(h_key, sizeof h_key, "Idempotency-Key: %s", s->d.delivery_id);
    snprintf(h_call, sizeof h_call, "Onceq-Call-Id: %s", s->d.call_id);
    const char *headers[] = {h_key, h_sig, h_call, NULL};
    oq_httpc_resp_t resp;
    memset(&resp, 0, sizeof resp);
    oq_error_t err = {0};
    if (oq_httpc_request(c, "POST", s->d.url, headers, s->d.body, &resp, &err) == 0) {
        s->status = resp.status;
        s->retry_after_ms = resp.retry_after_ms;
        if (resp.status < 200 || resp.status >= 300)
            snprintf(s->error, sizeof s->error, "HTTP %ld", resp.status);
    } else {
        snprintf(s->error, sizeof s->error, "%.250s", err.msg[0] ? err.msg : "no answer");
    }
    oq_httpc_resp_clear(&resp);
}

static void *worker_main(void *arg)
{
    oq_webhooks_t *w = arg;
    oq_error_t err = {0};
    oq_httpc_opts_t ho = {w->timeout_ms, w->cacert};
    oq_httpc_t *c = oq_httpc_new(&ho, &err);
    if (!c) OQ_LOG_ERROR("webhooks", "worker: %s", err.msg);
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        slot_t *s = NULL;
        for (int i = 0; i < w->conc && !s; i++)
            if (w->slots[i].state == SLOT_QUEUED) s = &w->slots[i];
        if (!s) {
            pthread_cond_wait(&w->wcv, &w->mu);
            continue;
        }
        s->state = SLOT_SENDING;
        pthread_mutex_unlock(&w->mu);
        if (c) {
            send_one(w, c, s);
        } else {
            s->status = 0;
            s->retry_after_ms = -1;
            snprintf(s->error, sizeof s->error, "no HTTP client: %.200s", err.msg);
        }
        pthread_mutex_lock(&w->mu);
        s->state = SLOT_DONE;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    oq_httpc_destroy(c);
    return NULL;
}

/* --- the dispatcher ------------------------------------------------------------------------- */

/* The store of the dispatcher's read connection (a lost PostgreSQL one is re-established). */
static oq__producer_store_t read_store(oq_webhooks_t *w)
{
    if (w->pg && PQstatus(w->pg) == CONNECTION_BAD) PQreset(w->pg);
    oq__producer_store_t s = {w->db, NULL, w->pg};
    return s;
}

/* Turn the DONE slots into row changes (decide.c's rule), commit them through the writer,
 * free the slots. @returns how many. @locality dispatcher (or the stopping thread) */
static int settle_done(oq_webhooks_t *w)
{
    oq__producer_delivery_mark_t *marks = calloc((size_t)w->conc, sizeof *marks);
    int *idx = calloc((size_t)w->conc, sizeof *idx);
    oq__webhook_try_t *tries = calloc((size_t)w->conc, sizeof *tries);
    int n = 0;
    if (!marks || !idx || !tries) goto out;
    int64_t now = oq_now_ms();
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->conc; i++) {
        slot_t *s = &w->slots[i];
        if (s->state != SLOT_DONE) continue;
        tries[n] = (oq__webhook_try_t){s->status, s->retry_after_ms, s->error};
        oq__decide_webhook_try(&s->d, &tries[n], &w->pol, now, &marks[n]);
        idx[n++] = i;
    }
    pthread_mutex_unlock(&w->mu); /* DONE slots are the dispatcher's alone */
    if (n == 0) goto out;
    oq_error_t err = {0};
    int rc = oq__producer_webhook_marks(w->p, marks, n, &err);
    if (rc)
        OQ_LOG_WARN("webhooks", "%d tries not recorded (they will be sent again): %s", n, err.msg);
    for (int k = 0; k < n; k++) {
        slot_t *s = &w->slots[idx[k]];
        const char *st = marks[k].state;
        if (!rc && strcmp(st, "delivered") == 0) {
            oq_counter_add(w->m_delivered, 1);
            OQ_LOGC_DEBUG("webhooks", s->d.call_id, "delivered delivery_id=%s tries=%lld",
                          s->d.delivery_id, (long long)marks[k].tries);
        } else if (!rc && strcmp(st, "dead") == 0) {
            oq_counter_add(w->m_dead, 1);
            OQ_LOGC_WARN("webhooks", s->d.call_id,
                         "delivery dead: its budget is spent delivery_id=%s tries=%lld "
                         "last_error=\"%s\" (onceq dlq list --webhooks-db)",
                         s->d.delivery_id, (long long)marks[k].tries, s->error);
        } else if (!rc) {
            oq_counter_add(w->m_retry, 1);
            OQ_LOGC_DEBUG("webhooks", s->d.call_id,
                          "try failed delivery_id=%s tries=%lld next_in_ms=%lld error=\"%s\"",
                          s->d.delivery_id, (long long)marks[k].tries,
                          (long long)(marks[k].next_at - now), s->error);
        }
    }
    pthread_mutex_lock(&w->mu);
    for (int k = 0; k < n; k++) {
        slot_t *s = &w->slots[idx[k]];
        oq__producer_delivery_clear(&s->d);
        s->state = SLOT_FREE;
    }
    pthread_mutex_unlock(&w->mu);
out:
    free(marks);
    free(idx);
    free(tries);
    return n;
}

/* Read due deliveries into the free slots. @returns how many were queued. @locality dispatcher */
static int fill_slots(oq_webhooks_t *w)
{
    int cap = 2 * w->conc, n = 0, queued = 0;
    oq__producer_delivery_t *rows = calloc((size_t)cap, sizeof *rows);
    if (!rows) return 0;
    oq_error_t err = {0};
    oq__producer_store_t s = read_store(w);
    if (oq__producer_store_delivery_due(&s, oq_now_ms(), cap, rows, &n, &err) != 0) {
        OQ_LOG_WARN("webhooks", "reading due deliveries: %s", err.msg);
        n = 0;
    }
    if (w->db) sqlite3_db_release_memory(w->db);
    pthread_mutex_lock(&w->mu);
    for (int r = 0; r < n; r++) {
        int busy = 0, free_i = -1;
        for (int i = 0; i < w->conc; i++) {
            if (w->slots[i].state == SLOT_FREE) {
                if (free_i < 0) free_i = i;
            } else if (strcmp(w->slots[i].d.delivery_id, rows[r].delivery_id) == 0) {
                busy = 1;
            }
        }
        if (busy || free_i < 0) continue;
        w->slots[free_i].d = rows[r];
        memset(&rows[r], 0, sizeof rows[r]);
        w->slots[free_i].state = SLOT_QUEUED;
        queued++;
    }
    if (queued) pthread_cond_broadcast(&w->wcv);
    pthread_mutex_unlock(&w->mu);
    for (int r = 0; r < n; r++)
        oq__producer_delivery_clear(&rows[r]);
    free(rows);
    return queued;
}

static void update_gauges(oq_webhooks_t *w)
{
    int64_t pending = 0, oldest = 0, dead = 0;
    oq_error_t err = {0};
    oq__producer_store_t s = read_store(w);
    if (oq__producer_store_delivery_counts(&s, &pending, &oldest, &dead, &err) != 0) return;
    oq_gauge_set(w->m_pending, (double)pending);
    oq_gauge_set(w->m_oldest, oldest ? (double)(oq_now_ms() - oldest) / 1000.0 : 0);
    oq_gauge_set(w->m_dead_rows, (double)dead);
    int inflight = 0;
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->conc; i++)
        inflight += w->slots[i].state != SLOT_FREE;
    pthread_mutex_unlock(&w->mu);
    oq_gauge_set(w->m_inflight, inflight);
}

static void *dispatch_main(void *arg)
{
    oq_webhooks_t *w = arg;
    int64_t next_poll = 0, next_gauges = 0;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        int stop = w->stop;
        pthread_mutex_unlock(&w->mu);
        if (stop) break;
        int settled = settle_done(w);
        int64_t now = oq_mono_us();
        if (settled || now >= next_poll) {
            fill_slots(w);
            next_poll = now + w->poll_ms * 1000;
        }
        if (now >= next_gauges) {
            update_gauges(w);
            next_gauges = now + 1000000;
        }
        pthread_mutex_lock(&w->mu);
        int done = 0;
        for (int i = 0; i < w->conc; i++)
            done |= w->slots[i].state == SLOT_DONE;
        if (!done && !w->stop) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t ns = ts.tv_nsec + (w->poll_ms % 1000) * 1000000;
            ts.tv_sec += w->poll_ms / 1000 + ns / 1000000000;
            ts.tv_nsec = ns % 1000000000;
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

/* --- start / stop --------------------------------------------------------------------------- */

static void register_metrics(oq_webhooks_t *w, oq_metrics_t *m)
{
    if (!m) return;
    const char *h = "Webhook delivery tries by outcome (retry: failed, tried again later)";
    w->m_delivered =
        oq_metrics_counter(m, "onceq_webhook_deliveries_total", h, "outcome=\"delivered\"");
    w->m_retry = oq_metrics_counter(m, "onceq_webhook_deliveries_total", h, "outcome=\"retry\"");
    w->m_dead = oq_metrics_counter(m, "onceq_webhook_deliveries_total", h, "outcome=\"dead\"");
    w->m_pending = oq_metrics_gauge(m, "onceq_webhook_pending",
                                    "webhook deliveries not delivered yet (queue depth)", NULL);
    w->m_oldest = oq_metrics_gauge(m, "onceq_webhook_oldest_pending_seconds",
                                   "age of the oldest webhook delivery not delivered yet", NULL);
    w->m_dead_rows = oq_metrics_gauge(m, "onceq_webhook_dead",
                                      "webhook deliveries whose budget ran out (onceq dlq)", NULL);
    w->m_inflight =
        oq_metrics_gauge(m, "onceq_webhook_in_flight", "webhook deliveries being sent now", NULL);
}

int oq_webhooks_start(oq_producer_t *p, const oq_webhooks_opts_t *o, oq_webhooks_t **out,
                      oq_error_t *err)
{
    int ret = 0;
    oq_webhooks_t *w = calloc(1, sizeof *w);
    if (!w) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    pthread_rwlock_init(&w->lock, NULL);
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&w->wcv, NULL);
    w->p = p;
    w->conc = o && o->concurrency > 0 ? o->concurrency : 8;
    w->timeout_ms = o && o->timeout_ms > 0 ? o->timeout_ms : 10000;
    w->poll_ms = o && o->poll_ms > 0 ? o->poll_ms : 200;
    w->pol.max_tries = o && o->max_tries > 0 ? o->max_tries : 20;
    w->pol.max_age_ms = o && o->max_age_ms > 0 ? o->max_age_ms : 24LL * 3600 * 1000;
    w->pol.backoff_base_ms = o && o->backoff_base_ms > 0 ? o->backoff_base_ms : 1000;
    w->pol.backoff_max_ms = o && o->backoff_max_ms > 0 ? o->backoff_max_ms : 3600 * 1000;
    if (w->pol.backoff_max_ms < w->pol.backoff_base_ms)
        w->pol.backoff_max_ms = w->pol.backoff_base_ms;
    if (o && o->secret && !oq_webhook_secret_valid(o->secret)) {
        ret = oq_error_set(err, OQ_EINVAL, 0,
                           "the webhook secret must be %d..%d printable ASCII bytes without "
                           "spaces",
                           OQ_WEBHOOK_SECRET_MIN_LEN, OQ_WEBHOOK_SECRET_MAX_LEN);
        goto out;
    }
    if ((o && o->secret && !(w->secret = strdup(o->secret))) ||
        (o && o->token_file && !(w->token_file = strdup(o->token_file))) ||
        (o && o->cacert && !(w->cacert = strdup(o->cacert))) ||
        !(w->slots = calloc((size_t)w->conc, sizeof *w->slots)) ||
        !(w->workers = calloc((size_t)w->conc, sizeof *w->workers))) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    if ((ret = oq_webhooks_reload(w, err))) goto out;
    const char *path = oq_producer_path(p);
    if (oq_backend_of(path) == OQ_BACKEND_POSTGRES) {
        if ((ret = oq_pg_connect(path, &w->pg, err))) goto out;
    } else {
        oq_db_opts_t ro = {NULL, 0, 1};
        if ((ret = oq_db_open(path, &ro, &w->db, err))) goto out;
    }
    register_metrics(w, o ? o->metrics : NULL);
    for (; w->nworkers < w->conc; w->nworkers++)
        if (pthread_create(&w->workers[w->nworkers], NULL, worker_main, w) != 0) {
            ret = oq_error_set(err, OQ_EIO, 0, "cannot start a webhook worker thread");
            goto out;
        }
    if (pthread_create(&w->disp, NULL, dispatch_main, w) != 0) {
        ret = oq_error_set(err, OQ_EIO, 0, "cannot start the webhook dispatcher thread");
        goto out;
    }
    w->disp_started = 1;
    pthread_setname_np(w->disp, "oq-webhooks");
    OQ_LOG_INFO("webhooks",
                "sender up concurrency=%d timeout_ms=%lld max_tries=%d max_age_ms=%lld "
                "backoff_base_ms=%lld backoff_max_ms=%lld default_secret=%s tenant_secrets=%s",
                w->conc, (long long)w->timeout_ms, w->pol.max_tries, (long long)w->pol.max_age_ms,
                (long long)w->pol.backoff_base_ms, (long long)w->pol.backoff_max_ms,
                w->secret ? "yes" : "no", w->token_file ? "token file" : "none");
out:
    if (ret) {
        oq_webhooks_stop(w);
        return ret;
    }
    *out = w;
    return 0;
}

void oq_webhooks_stop(oq_webhooks_t *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_cond_broadcast(&w->wcv);
    pthread_mutex_unlock(&w->mu);
    if (w->disp_started) pthread_join(w->disp, NULL);
    for (int i = 0; i < w->nworkers; i++) /* a try under way ends within its timeout */
        pthread_join(w->workers[i], NULL);
    /* the tries that finished are recorded (the writer is still open); the others are sent
     * again after the restart */
    if (w->disp_started) settle_done(w);
    for (int i = 0; w->slots && i < w->conc; i++)
        oq__producer_delivery_clear(&w->slots[i].d);
    free(w->slots);
    free(w->workers);
    if (w->db) sqlite3_close_v2(w->db);
    if (w->pg) PQfinish(w->pg);
    oq_tokens_free(w->tokens);
    if (w->secret) OPENSSL_cleanse(w->secret, strlen(w->secret));
    free(w->secret);
    free(w->token_file);
    free(w->cacert);
    pthread_rwlock_destroy(&w->lock);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_cond_destroy(&w->wcv);
    free(w);
}

/* --- the operators' view (onceq dlq --webhooks-db) ------------------------------------------ */

/* A connection of its own on the database setting \p db (a file or a PostgreSQL string); an
 * SQLite file is opened read-only unless \p rw (and never created). */
static int open_store(const char *db, int rw, sqlite3 **sq, PGconn **pg, oq_error_t *err)
{
    *sq = NULL;
    *pg = NULL;
    if (oq_backend_of(db) == OQ_BACKEND_POSTGRES) return oq_pg_connect(db, pg, err);
    if (access(db, F_OK) != 0)
        return oq_error_set(err, OQ_ENOTFOUND, errno, "no database file %s", db);
    oq_db_opts_t o = {NULL, 5000, !rw};
    return oq_db_open(db, &o, sq, err);
}

static json_t *delivery_json(const oq__producer_delivery_t *d, int with_body)
{
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:I,s:o,s:o,s:s*,s:I,s:I}", "delivery_id",
                          d->delivery_id, "call_id", d->call_id, "attempt", (json_int_t)d->attempt,
                          "tenant", d->tenant, "url", d->url, "state", d->state, "tries",
                          (json_int_t)d->tries, "next_at",
                          d->next_at ? json_integer(d->next_at) : json_null(), "last_status",
                          d->last_status >= 0 ? json_integer(d->last_status) : json_null(),
                          "last_error", d->last_error, "created_at", (json_int_t)d->created_at,
                          "updated_at", (json_int_t)d->updated_at);
    if (o && with_body) json_object_set_new(o, "body", json_string(d->body));
    return o;
}

int oq_webhooks_list(const char *db, const char *id, int limit, json_t **out, oq_error_t *err)
{
    sqlite3 *sq = NULL;
    PGconn *pg = NULL;
    oq__producer_delivery_t *rows = NULL;
    size_t n = 0;
    int ret = open_store(db, 0, &sq, &pg, err);
    if (ret) goto out;
    oq__producer_store_t s = {sq, NULL, pg};
    if ((ret = oq__producer_store_delivery_list(&s, id, "dead", limit, &rows, &n, err))) goto out;
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, delivery_json(&rows[i], id != NULL));
    if (!a) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    *out = a;
out:
    for (size_t i = 0; i < n; i++)
        oq__producer_delivery_clear(&rows[i]);
    free(rows);
    if (sq) sqlite3_close_v2(sq);
    if (pg) PQfinish(pg);
    return ret;
}

int oq_webhooks_redrive(const char *db, const char *id, const char *by, int *redriven,
                        oq_error_t *err)
{
    sqlite3 *sq = NULL;
    PGconn *pg = NULL;
    oq__producer_delivery_t *rows = NULL;
    size_t n = 0;
    *redriven = 0;
    int ret = open_store(db, 1, &sq, &pg, err);
    if (ret) goto out;
    oq__producer_store_t s = {sq, NULL, pg};
    int all = strcmp(id, "all") == 0;
    /* the rows first: each redrive is audited on its call */
    if ((ret = oq__producer_store_delivery_list(&s, all ? NULL : id, "dead", 1000000, &rows, &n,
                                                err)))
        goto out;
    if ((ret = oq__producer_store_begin(&s, 10000, err))) goto out;
    int64_t now = oq_now_ms();
    for (size_t i = 0; i < n; i++) {
        int changed = 0;
        if ((ret =
                 oq__producer_store_delivery_redrive(&s, rows[i].delivery_id, now, &changed, err)))
            break;
        if (!changed) continue;
        *redriven += changed;
        json_t *d = json_pack("{s:s, s:s}", "delivery_id", rows[i].delivery_id, "by",
                              by && by[0] ? by : "unknown");
        char *t = d ? json_dumps(d, JSON_COMPACT) : NULL;
        json_decref(d);
        ret = t ? oq__producer_store_audit_add(&s, now, rows[i].call_id, "webhook_redriven", t, err)
                : oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        free(t);
        if (ret) break;
    }
    if (!ret) ret = oq__producer_store_commit(&s, err);
    if (ret) oq__producer_store_rollback(&s);
out:
    for (size_t i = 0; i < n; i++)
        oq__producer_delivery_clear(&rows[i]);
    free(rows);
    if (sq) sqlite3_close_v2(sq);
    if (pg) PQfinish(pg);
    return ret;
}

/* --- a call's deliveries and the counts, on an operator's handle (the console) -------------- */

int oq_producer_db_webhooks(const oq_dbh_t *h, const char *call_id, json_t **out, oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    oq__producer_delivery_t *rows = NULL;
    size_t n = 0;
    int ret = oq__producer_store_delivery_of_call(&s, call_id, &rows, &n, err);
    json_t *a = ret ? NULL : json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, delivery_json(&rows[i], 0)) != 0) {
            json_decref(a);
            a = NULL;
        }
    if (!ret && !a) ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (!ret) *out = a;
    for (size_t i = 0; i < n; i++)
        oq__producer_delivery_clear(&rows[i]);
    free(rows);
    return ret;
}

int oq_producer_db_webhook_counts(const oq_dbh_t *h, int64_t *pending, int64_t *dead,
                                  oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    int64_t oldest = 0;
    return oq__producer_store_delivery_counts(&s, pending, &oldest, dead, err);
}
