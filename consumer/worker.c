/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer-group worker: the Kafka poll loop and the batch transaction. What a message
 * means and how an execution moves are decided in consumer/execution.c; every row goes
 * through consumer/consumer_store.h.
 *
 * Threads: the main thread owns the Kafka consumer and one database connection; it polls a
 * batch, handles it in ONE write transaction (group commit: inbox dedupe, planning, and for
 * fast tools run + effect + terminal state + result event), commits, and only then stores the
 * Kafka offsets (committed at most once a second: commit_stored). A new call of a fast tool
 * runs inline: its run is prepared in
 * memory and its execution row written once, in its outcome state, with one audit row (see
 * execution.c: writing the PLANNED and STARTED versions cost about half the worker's database
 * time, `onceq bench consumer`). Blocking tools are not run there: their executions are left
 * PLANNED (durable, so the offsets can be committed) and handed to runner threads, each with
 * its own connection, which claim them in a short transaction, run the tool with no
 * transaction open, and finish with a fenced write. A heartbeat thread (own connection) renews
 * the leases of running executions every lease/3; when a renewal finds the fence changed the
 * lease is lost and the runner's finishing write is refused.
 *
 * Everything after intake is driven by the database, not by Kafka: the main thread
 * periodically runs recovery (lapsed leases -> UNKNOWN -> reconcile) and a scheduler that
 * claims due executions (PLANNED leftovers, FAILED_RETRYABLE after their backoff, SAFE_RETRY),
 * so retries never block a partition and any worker sharing the database can finish work
 * another worker planned. Claims are conditional UPDATEs, so workers racing for the same row
 * are safe.
 *
 * Dead letters are written to the dlq table inside the batch transaction and produced to
 * onceq.dlq after the commit (retried until delivered), so a crash loses none. Rebalance: on a
 * revoke the pending batch is finished and its offsets committed before the partitions go;
 * commit failures during a rebalance are tolerated (the inbox absorbs the redelivery).
 *
 * Outside calls (HTTP tools of the --tools file) are started or claimed in the same
 * transactions and sent once they commit; their answers are written by the next batch
 * transaction (outside.c). At stop, no new request starts and those in flight get up to --drain
 * (default: the longest tool timeout, at most 60 s) to answer and commit normally; the rest
 * are abandoned (UNKNOWN when sent) and written.
 *
 * Files: this one keeps the Kafka poll loop, the batch transaction, rebalances, dead letters,
 * the periodic work (recovery, scheduler, retention) and the worker's lifecycle; runner.c the
 * compiled tools' runs (inline, runner threads, heartbeat); outside.c the hand-off of jobs to
 * the dispatcher and of outcomes back; consumer_metrics.c the metrics and /stats. They share
 * struct oq_consumer through worker_int.h. Threads and locks: the main thread owns the Kafka
 * consumer, c->store and every batch field (no lock); c->mu guards only the runners' queue and
 * lease slots (runner.c); the admin thread reads stats through c->stats_mu.
 */
#include "worker_int.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "oq_cli.h"
#include "oq_db.h"
#include "oq_kafka.h"
#include "oq_json.h"
#include "oq_log.h"
#include "oq_pg.h"
#include "oq_service.h"
#include "oq_util.h"

static int tools_check(const oq__http_tools_t *t, const char *path, oq_error_t *err);

/* --- settings -------------------------------------------------------------------------------- */

const oq_setting_t oq_consumer_settings[] = {
    OQ_CLI_LOG_SETTINGS,
    {"db", OQ_SET_STRING, "effects.db", 1, 4096, NULL, "effects database (SQLite, WAL)"},
    {"brokers", OQ_SET_STRING, NULL, 1, 4096, NULL, "bootstrap servers host:port[,...]"},
    {"group", OQ_SET_STRING, "onceq-workers", 1, 255, NULL, "consumer group id"},
    {"topic", OQ_SET_STRING, NULL, 1, 249, NULL, "input topic (default: PREFIX + tool-calls)"},
    OQ_SETTING_TOPIC_PREFIX,
    OQ_SETTING_KAFKA_PROFILE,
    {"lease", OQ_SET_DURATION, "30s", 200, 3600000, NULL,
     "execution lease (longer than the longest tool; renewed by a heartbeat)"},
    {"max-attempts", OQ_SET_INT, "5", 1, 100, NULL, "tool runs per attempt before failing final"},
    {"batch", OQ_SET_INT, "500", 1, 100000, NULL, "max messages per poll batch and transaction"},
    {"runners", OQ_SET_INT, "4", 1, 64, NULL, "threads running blocking tools"},
    {"retry-base", OQ_SET_DURATION, "200ms", 1, 3600000, NULL, "first retry backoff"},
    {"retry-max", OQ_SET_DURATION, "30s", 1, 86400000, NULL, "retry backoff cap"},
    {"recover-every", OQ_SET_DURATION, "1s", 10, 3600000, NULL, "recovery scan period"},
    {"synchronous", OQ_SET_ENUM, "full", 0, -1, "full|normal|off", "SQLite synchronous level"},
    {"relay-synchronous", OQ_SET_ENUM, "normal", 0, -1, "full|normal|off",
     "synchronous level of the result relay's marks (a lost mark only republishes a result)"},
    {"metrics-listen", OQ_SET_STRING, NULL, 1, 255, NULL,
     "admin listener host:port: /metrics, /stats, /v1/review (see README); not loopback: "
     "needs --token-file"},
    {"token-file", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "token file (the producer's format): operator tokens (TOKEN TENANT operator) guard "
     "/v1/review and /stats"},
    {"metrics-only-listen", OQ_SET_STRING, NULL, 1, 255, NULL,
     "host:port serving /metrics, /healthz and /readyz only, open (any address)"},
    {"worker-id", OQ_SET_STRING, NULL, 1, 100, NULL, "worker id (default host:pid:random)"},
    {"exit-idle", OQ_SET_DURATION, "0", 0, 86400000, NULL,
     "exit after this long without input or due work, once a message was handled (0: never)"},
    {"inbox-retention", OQ_SET_DURATION, "7d", 60000, 3650LL * 86400000, NULL,
     "purge inbox rows older than this (keep >= the topic's retention.ms)"},
    {"retention", OQ_SET_DURATION, "7d", 0, 3650LL * 86400000, NULL,
     "purge settled executions, effects, audit this long after they settled (at least "
     "--inbox-retention; keep >= the topic's retention.ms and the producer's --key-ttl; 0: "
     "never)"},
    {"no-relay", OQ_SET_BOOL, "false", 0, -1, NULL,
     "do not publish results (another process relays effects.db)"},
    {"tools", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "tools file declaring HTTP tools (JSON; see examples/tools.json)"},
    {"http-inflight", OQ_SET_INT, "256", 1, 65536, NULL,
     "outside requests running at once (as many more may wait in a queue, leases renewed; the "
     "rest stays in Kafka)"},
    {"lookup-attempts", OQ_SET_INT, "5", 1, 1000, NULL,
     "undecided lookups of an unknown outcome before it goes to review"},
    {"drain", OQ_SET_DURATION, NULL, 0, 600000, NULL,
     "at stop, how long outside requests in flight may still answer and commit (default: the "
     "longest timeout in the tools file, at most 60s; 0 = abandon them at once)"},
};
const size_t oq_consumer_nsettings = sizeof(oq_consumer_settings) / sizeof(oq_consumer_settings[0]);

void oq_consumer_opts_from_config(const oq_config_t *cfg, oq_consumer_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->db_path = oq_config_str(cfg, "db");
    o->brokers = oq_config_str(cfg, "brokers");
    o->group = oq_config_str(cfg, "group");
    o->topic = oq_config_str(cfg, "topic");
    o->topic_prefix = oq_config_str(cfg, "topic-prefix");
    o->lease_ms = oq_config_int(cfg, "lease");
    o->max_attempts = (int)oq_config_int(cfg, "max-attempts");
    o->batch = (int)oq_config_int(cfg, "batch");
    o->runners = (int)oq_config_int(cfg, "runners");
    o->retry_base_ms = oq_config_int(cfg, "retry-base");
    o->retry_max_ms = oq_config_int(cfg, "retry-max");
    o->recover_every_ms = oq_config_int(cfg, "recover-every");
    o->synchronous = oq_config_str(cfg, "synchronous");
    o->relay_synchronous = oq_config_str(cfg, "relay-synchronous");
    o->metrics_listen = oq_config_str(cfg, "metrics-listen");
    o->token_file = oq_config_str(cfg, "token-file");
    o->metrics_only_listen = oq_config_str(cfg, "metrics-only-listen");
    o->worker_id = oq_config_str(cfg, "worker-id");
    o->no_relay = (int)oq_config_int(cfg, "no-relay");
    o->inbox_retention_ms = oq_config_int(cfg, "inbox-retention");
    o->retention_ms = oq_config_int(cfg, "retention");
    if (o->retention_ms == 0) o->retention_ms = -1; /* --retention 0: executions are kept */
    o->tools_path = oq_config_str(cfg, "tools");
    o->http_inflight = (int)oq_config_int(cfg, "http-inflight");
    o->lookup_budget = (int)oq_config_int(cfg, "lookup-attempts");
    if (oq_config_is_set(cfg, "drain"))
        o->drain_ms = oq_config_int(cfg, "drain") > 0 ? oq_config_int(cfg, "drain") : -1;
    o->cfg = cfg;
}

/* --- helpers --------------------------------------------------------------------------------- */

static char *strdup0(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* --- the rules' view of the tools ------------------------------------------------------------ */

/* Traits for the rules (execution.h): a declared HTTP tool is remote; a compiled one local. */
static void tool_traits(const char *tool, void *ctx, oq__tool_traits_t *out)
{
    oq_consumer_t *c = ctx;
    const oq__http_tool_t *h = oq__http_tools_find(c->tools, tool);
    memset(out, 0, sizeof(*out));
    if (h) {
        out->known = 1;
        out->remote = 1;
        out->has_lookup = h->has_lookup;
        out->idempotent = h->idempotent;
        out->settle_ms = h->settle_ms;
        return;
    }
    out->known = oq_tool_find(tool) != NULL;
}

/* --- dead letters ---------------------------------------------------------------------------- */

typedef struct {
    int64_t id;
    int state; /* 0 in flight, 1 delivered, -1 failed */
} dlq_track_t;

typedef struct {
    oq_consumer_t *c;
    dlq_track_t *t;
    int n, cap;
} dlq_pub_t;

static void dlq_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    dlq_track_t *t = m->_private;
    if (t) t->state = m->err ? -1 : 1;
    if (m->err) OQ_LOG_WARN(OQ__COMP, "dead letter delivery failed: %s", rd_kafka_err2str(m->err));
}

static void dlq_produce_one(const oq__dlq_row_t *r, void *opaque)
{
    dlq_pub_t *p = opaque;
    if (p->n >= p->cap) return;
    dlq_track_t *t = &p->t[p->n];
    t->id = r->id;
    t->state = 0;
    /* where it was read, so `onceq dlq redrive` can put it back there */
    char part[16], off[24];
    snprintf(part, sizeof part, "%d", (int)r->src.partition);
    snprintf(off, sizeof off, "%" PRId64, r->src.offset);
    rd_kafka_headers_t *h = rd_kafka_headers_new(8);
    rd_kafka_header_add(h, OQ_HDR_DLQ_REASON, -1, r->code ? r->code : OQ_DLQ_INVALID, -1);
    rd_kafka_header_add(h, OQ_HDR_DLQ_DETAIL, -1, r->reason, -1);
    rd_kafka_header_add(h, OQ_HDR_DLQ_TOPIC, -1, r->src.topic ? r->src.topic : "", -1);
    rd_kafka_header_add(h, OQ_HDR_DLQ_PARTITION, -1, part, -1);
    rd_kafka_header_add(h, OQ_HDR_DLQ_OFFSET, -1, off, -1);
    rd_kafka_header_add(h, OQ_HDR_MESSAGE_ID, -1, r->message_id, -1);
    if (r->redrive) rd_kafka_header_add(h, OQ_HDR_REDRIVE, -1, r->redrive, -1);
    rd_kafka_resp_err_t e = rd_kafka_producev(
        p->c->dlq_rk, RD_KAFKA_V_TOPIC(p->c->dlq_topic), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_KEY(r->key, r->key_len), RD_KAFKA_V_VALUE((void *)r->payload, r->len),
        RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_OPAQUE(t), RD_KAFKA_V_END);
    if (e) {
        rd_kafka_headers_destroy(h); /* owned by the message only when produced */
        OQ_LOG_WARN(OQ__COMP, "dead letter produce: %s", rd_kafka_err2str(e));
        return;
    }
    p->n++;
}

/* Produces every unpublished dead letter and marks the delivered ones. */
static void dlq_publish(oq_consumer_t *c)
{
    dlq_track_t t[128];
    dlq_pub_t p = {.c = c, .t = t, .n = 0, .cap = 128};
    oq_error_t err = {0};
    if (!c->dlq_rk) return;
    if (oq__consumer_store_dlq_pending(c->store, p.cap, dlq_produce_one, &p, &err)) {
        OQ_LOG_WARN(OQ__COMP, "dead letters: %s", err.msg);
        return;
    }
    if (p.n == 0) {
        c->dlq_added = 0;
        return;
    }
    rd_kafka_flush(c->dlq_rk, 10000);
    int ok = 0;
    for (int i = 0; i < p.n; i++) {
        if (t[i].state != 1) continue;
        if (oq__consumer_store_dlq_mark(c->store, t[i].id, lease_now(c), &err) == 0) ok++;
    }
    if (ok == p.n) c->dlq_added = 0;
    OQ_LOG_INFO(OQ__COMP, "dead letters published=%d of %d", ok, p.n);
}

/* --- the batch ------------------------------------------------------------------------------- */

/* The header \p name of \p m into \p buf (cut to fit), or NULL when it has none. */
static const char *header_str(const rd_kafka_message_t *m, const char *name, char *buf, size_t n)
{
    rd_kafka_headers_t *h = NULL;
    const void *v = NULL;
    size_t len = 0;
    if (rd_kafka_message_headers(m, &h) != RD_KAFKA_RESP_ERR_NO_ERROR ||
        rd_kafka_header_get_last(h, name, &v, &len) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return NULL;
    snprintf(buf, n, "%.*s", (int)(len < n ? len : n - 1), v ? (const char *)v : "");
    return buf;
}

static void dlq_msg(oq_consumer_t *c, const rd_kafka_message_t *m, const oq__msg_src_t *src,
                    const char *call_id, const char *message_id_hint, const char *code,
                    const char *reason, int64_t now, oq_error_t *err, int *rc)
{
    char key[OQ_UUID_LEN + 64], redrive[300];
    const void *hv = NULL;
    size_t hlen = 0;
    int dup = 0;
    rd_kafka_headers_t *h = NULL;
    if (message_id_hint) {
        snprintf(key, sizeof(key), "%s", message_id_hint);
    } else {
        if (rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR &&
            rd_kafka_header_get_last(h, OQ_HDR_MESSAGE_ID, &hv, &hlen) ==
                RD_KAFKA_RESP_ERR_NO_ERROR &&
            hv && hlen > 0 && hlen <= OQ_UUID_LEN)
            snprintf(key, sizeof(key), "%.*s", (int)hlen, (const char *)hv);
        else
            snprintf(key, sizeof(key), "dlq:%s:%d:%" PRId64, src->topic, src->partition,
                     src->offset);
    }
    oq__dlq_row_t row = {.message_id = key,
                         .reason = reason,
                         .code = code,
                         .redrive = header_str(m, OQ_HDR_REDRIVE, redrive, sizeof redrive),
                         .src = *src,
                         .key = m->key,
                         .key_len = m->key_len,
                         .payload = m->payload,
                         .len = m->len,
                         .created_at = now};
    *rc = oq__exec_dead_letter(c->store, &row, call_id, &dup, err);
    if (*rc) return;
    if (dup) {
        atomic_fetch_add(&c->n_dup, 1);
        oq_counter_add(c->m_dup, 1);
        return;
    }
    OQ_LOGC_WARN(OQ__COMP, call_id,
                 "dead letter partition=%d offset=%" PRId64 " code=%s%s%s reason=\"%s\"",
                 src->partition, src->offset, code, row.redrive ? " redriven_from=" : "",
                 row.redrive ? row.redrive : "", reason);
    atomic_fetch_add(&c->n_dlq, 1);
    oq_counter_add(c->m_dlq[oq__dlq_reason_index(code)], 1);
    c->dlq_added = 1;
}

/* Hands \p call_id (PLANNED, durable once the batch commits) to the runners after the commit. */
static void hand_off(oq_consumer_t *c, const char *call_id)
{
    if (c->nhandoff < c->o.batch)
        snprintf(c->handoff[c->nhandoff++], OQ_CALL_ID_LEN + 1, "%s", call_id);
}

/* Decodes the batch's messages once (c->envs, cleared by batch_clear) and lists the ids of its
 * tool calls for the store to read ahead. @returns how many ids. */
static int batch_decode(oq_consumer_t *c)
{
    int n = 0;
    for (int i = 0; i < c->nbatch; i++) {
        const rd_kafka_message_t *m = c->batch[i];
        memset(&c->envs[i], 0, sizeof(c->envs[i]));
        memset(&c->env_err[i], 0, sizeof(c->env_err[i]));
        c->env_rc[i] =
            !m->payload || m->len == 0
                ? OQ_EINVAL
                : oq_envelope_decode_call(m->payload, m->len, &c->envs[i], &c->env_err[i]);
        if (c->env_rc[i] == 0 && c->envs[i].kind == OQ_KIND_TOOL_CALL) {
            c->ids_call[n] = c->envs[i].call_id;
            c->ids_msg[n++] = c->envs[i].message_id;
        }
    }
    return n;
}

static void batch_clear(oq_consumer_t *c)
{
    for (int i = 0; i < c->nbatch; i++)
        if (c->env_rc[i] == 0) oq_envelope_clear(&c->envs[i]);
}

/* Message \p i of the batch, inside the batch transaction. */
static int handle_message(oq_consumer_t *c, int i, int64_t now, oq_error_t *err)
{
    const rd_kafka_message_t *m = c->batch[i];
    const oq_envelope_t env = c->envs[i]; /* borrowed (batch_clear frees it) */
    int rc = 0, decision = -1;
    oq__msg_src_t src = {
        .topic = rd_kafka_topic_name(m->rkt), .partition = m->partition, .offset = m->offset};
    if (!m->payload || m->len == 0) {
        dlq_msg(c, m, &src, NULL, NULL, OQ_DLQ_EMPTY, "empty message", now, err, &rc);
        return rc;
    }
    int drc;
    if ((drc = c->env_rc[i]) != 0) {
        char reason[300];
        snprintf(reason, sizeof(reason), "undecodable envelope: %s", c->env_err[i].msg);
        dlq_msg(c, m, &src, NULL, NULL,
                drc == OQ_ETOOBIG    ? OQ_DLQ_TOO_LARGE
                : drc == OQ_EVERSION ? OQ_DLQ_UNKNOWN_VERSION
                                     : OQ_DLQ_INVALID,
                reason, now, err, &rc);
        return rc;
    }
    if (env.kind != OQ_KIND_TOOL_CALL) {
        dlq_msg(c, m, &src, env.call_id, env.message_id, OQ_DLQ_NOT_TOOL_CALL,
                "not a tool_call envelope", now, err, &rc);
        goto out;
    }
    /* A declared HTTP tool is STARTED here and its request sent once the batch commits; a fast
     * compiled tool runs right here, in the batch transaction; a blocking one is left PLANNED
     * (durable with the batch) and handed to the runners after the commit. */
    const oq__http_tool_t *remote = oq__http_tools_find(c->tools, env.tool);
    int fast = !remote && oq_tool_blocks(oq_tool_find(env.tool), env.args) == 0;
    if ((rc = oq__exec_intake(c->store, &env, &src, now, &decision, err))) goto out;
    switch (decision) {
    case OQ__INTAKE_NEW:
        if (remote) {
            rc = oq__outside_start(c, &env, remote, now, err);
        } else if (fast) {
            rc = oq__run_inline(c, &env, NULL, env.args, now, err);
        } else if ((rc = oq__exec_plan(c->store, &env, now, err)) == 0) {
            hand_off(c, env.call_id);
        }
        break;
    case OQ__INTAKE_REPLANNED:
        if (remote)
            rc = oq__outside_claim(c, env.call_id, remote, now, err);
        else if (fast)
            rc = oq__run_inline(c, NULL, env.call_id, env.args, now, err);
        else
            hand_off(c, env.call_id);
        break;
    case OQ__INTAKE_IN_PROGRESS:
        /* a redelivery of a call not settled yet: if its outcome is unknown, reconcile now */
        atomic_store(&c->recover_now, 1);
        break;
    case OQ__INTAKE_DUPLICATE:
        atomic_fetch_add(&c->n_dup, 1);
        oq_counter_add(c->m_dup, 1);
        break;
    case OQ__INTAKE_MISMATCH:
        dlq_msg(c, m, &src, env.call_id, env.message_id, OQ_DLQ_MISMATCH,
                "fingerprint differs from the existing execution of this call_id", now, err, &rc);
        break;
    case OQ__INTAKE_EXPIRED:
        dlq_msg(c, m, &src, env.call_id, env.message_id, OQ_DLQ_EXPIRED,
                "no execution, and created before the retention horizon: its execution may "
                "have been purged, so it is not executed",
                now, err, &rc);
        break;
    case OQ__INTAKE_REEMITTED: /* a duplicate too: nothing executed */
        atomic_fetch_add(&c->n_dup, 1);
        oq_counter_add(c->m_dup, 1);
        oq_counter_add(c->m_reemit, 1);
        c->results_emitted = 1;
        break;
    case OQ__INTAKE_DONE:
        c->results_emitted = 1;
        break;
    default:
        break;
    }
out:
    return rc;
}

/* Commit the stored offsets (rd_kafka_offsets_store after each database commit: nothing else
 * is ever stored) asynchronously, at most once per OQ_KAFKA_COMMIT_INTERVAL_MS:
 * an OffsetCommit per batch is a replicated write on the group coordinator, which under load
 * cost a real cluster more than the calls themselves. A crash loses at most an interval of
 * commits: those messages are redelivered and absorbed by the inbox. Revoke and stop commit
 * synchronously (rebalance_cb, oq_consumer_run). */
static void commit_stored(oq_consumer_t *c)
{
    int64_t now = oq_mono_us();
    if (!c->offsets_dirty || now - c->last_commit_us < OQ_KAFKA_COMMIT_INTERVAL_MS * 1000) return;
    rd_kafka_resp_err_t e = rd_kafka_commit(c->rk, NULL, 1);
    if (e && e != RD_KAFKA_RESP_ERR__NO_OFFSET)
        OQ_LOG_DEBUG(OQ__COMP, "offset commit: %s", rd_kafka_err2str(e));
    c->offsets_dirty = 0;
    c->last_commit_us = now;
}

/*
 * A batch transaction that failed: try \p tries of the batch (whose items are counted now),
 * with \p msg; \p tries 0: the batch committed after failing. Retrying as a whole is right for
 * what passes (a locked or unreachable database); what does not pass stops the worker, so it
 * is made visible: a counter, an error logged per try (above), and /readyz's "batch" check.
 */
static void note_stall(oq_consumer_t *c, int tries, const char *msg)
{
    pthread_mutex_lock(&c->stall_mu);
    if (tries == 0) {
        OQ_LOG_INFO(OQ__COMP, "batch committed after %d failed tries (%.1f s)", c->stall_tries,
                    (double)(oq_mono_us() - c->stall_since_us) / 1e6);
        c->stall_since_us = 0;
        c->stall_tries = 0;
    } else {
        if (!c->stall_since_us) c->stall_since_us = oq_mono_us();
        c->stall_tries = tries;
        c->stall_items = c->nbatch + c->noutcomes;
        snprintf(c->stall_msg, sizeof(c->stall_msg), "%s", msg ? msg : "");
        oq_utf8_repair(c->stall_msg);
    }
    pthread_mutex_unlock(&c->stall_mu);
    if (tries) oq_counter_add(c->m_rollbacks, 1);
}

/*
 * Handles the collected batch, and the answers of outside requests that came back, in one
 * transaction, retried as a whole on a database error (a partial batch is never committed);
 * then stores and commits the offsets, forgets the answered requests and sends the requests
 * the batch started (their STARTED rows are now durable).
 */
static int process_batch(oq_consumer_t *c)
{
    oq_error_t err = {0};
    int rc = 0;
    oq__outside_take(c);
    if (c->nbatch == 0 && !c->outcomes) return 0;
    int nids = batch_decode(c), failed = 0;
    for (int tries = 0;; tries++) {
        c->nhandoff = 0;
        c->results_emitted = 0;
        oq__outside_drop(c);
        int64_t now = lease_now(c);
        if ((rc = oq__consumer_store_begin_batch(c->store, c->ids_call, c->ids_msg, nids, &err)) ==
            0) {
            for (int i = 0; i < c->nbatch && rc == 0; i++)
                rc = handle_message(c, i, now, &err);
            for (oq__job_t *j = c->outcomes; j && rc == 0; j = j->done_next)
                rc = oq__outside_apply(c, j, now, &err);
            if (rc == 0) {
                OQ_CRASH_POINT("consumer.after_intake_before_commit");
                OQ_CRASH_POINT("consumer.after_effect_before_commit");
                int64_t tc = oq_mono_us();
                rc = oq__consumer_store_commit(c->store, &err);
                c->t_commit_us += oq_mono_us() - tc;
            }
            if (rc) oq__consumer_store_rollback(c->store);
        }
        if (rc == 0) break;
        OQ_LOG_ERROR(OQ__COMP, "batch of %d rolled back (try %d): %s", c->nbatch, tries + 1,
                     err.msg);
        note_stall(c, failed = tries + 1, err.msg);
        if (c->stop) {
            /* Not committed: offsets stay where they were, the batch will be redelivered; the
             * answered requests keep their rows STARTED, whose leases lapse into UNKNOWN. */
            batch_clear(c);
            for (int i = 0; i < c->nbatch; i++)
                rd_kafka_message_destroy(c->batch[i]);
            c->nbatch = 0;
            oq__outside_drop(c);
            oq__outside_forget(c);
            return rc;
        }
        oq_sleep_ms(tries < 20 ? 50 * (tries + 1) : 1000, &c->stop);
    }
    if (failed) note_stall(c, 0, NULL);
    batch_clear(c);
    if (c->outcomes) OQ_CRASH_POINT("consumer.after_outcome_commit_before_offset");
    oq__outside_forget(c);
    oq__outside_flush(c);
    if (c->nbatch == 0) {
        if (c->results_emitted) oq_relay_notify(c->relay);
        return 0;
    }
    OQ_CRASH_POINT("consumer.after_commit_before_offset");

    int64_t t1 = oq_mono_us();
    rd_kafka_topic_partition_list_t *offs = rd_kafka_topic_partition_list_new(8);
    for (int i = 0; i < c->nbatch; i++) {
        rd_kafka_message_t *m = c->batch[i];
        rd_kafka_topic_partition_t *p =
            rd_kafka_topic_partition_list_find(offs, rd_kafka_topic_name(m->rkt), m->partition);
        if (!p)
            p = rd_kafka_topic_partition_list_add(offs, rd_kafka_topic_name(m->rkt), m->partition);
        if (m->offset + 1 > p->offset) p->offset = m->offset + 1;
        oq_histogram_observe(c->m_latency, (double)(t1 - c->batch_t0[i]) / 1e6);
    }
    rd_kafka_resp_err_t e = rd_kafka_offsets_store(c->rk, offs);
    if (e) OQ_LOG_DEBUG(OQ__COMP, "offsets store: %s", rd_kafka_err2str(e));
    rd_kafka_topic_partition_list_destroy(offs);
    c->offsets_dirty = 1;
    commit_stored(c);

    atomic_fetch_add(&c->n_consumed, (uint64_t)c->nbatch);
    oq_counter_add(c->m_consumed, (uint64_t)c->nbatch);
    for (int i = 0; i < c->nbatch; i++)
        rd_kafka_message_destroy(c->batch[i]);
    c->nbatch = 0;
    if (c->results_emitted) oq_relay_notify(c->relay);
    for (int i = 0; i < c->nhandoff; i++)
        oq__runner_push(c, c->handoff[i]);
    c->nhandoff = 0;
    if (c->dlq_added) dlq_publish(c);
    return 0;
}

/* --- rebalance ------------------------------------------------------------------------------- */

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    oq_consumer_t *c = opaque;
    int coop = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        OQ_LOG_INFO(OQ__COMP, "assigned %d partition(s)", parts->cnt);
        int was = atomic_load(&c->assigned_n);
        atomic_store(&c->assigned_n, (coop && was > 0 ? was : 0) + parts->cnt);
        oq_kafka_rebalance_apply(rk, err, parts, OQ__COMP);
        oq_service_group_joined(c->group, atomic_load(&c->assigned_n));
        return;
    }
    /* Revoke (or error): finish what was polled, commit it, then let the partitions go. */
    OQ_LOG_INFO(OQ__COMP, "revoking partitions=%d reason=\"%s\"", parts->cnt,
                rd_kafka_err2str(err));
    int left = atomic_load(&c->assigned_n) - parts->cnt;
    atomic_store(&c->assigned_n,
                 coop && err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS && left >= 0 ? left : -1);
    process_batch(c);
    rd_kafka_resp_err_t ce = rd_kafka_commit(rk, NULL, 0);
    if (ce && ce != RD_KAFKA_RESP_ERR__NO_OFFSET)
        OQ_LOG_INFO(OQ__COMP, "commit on revoke: %s (redelivery is absorbed by the inbox)",
                    rd_kafka_err2str(ce));
    oq_kafka_rebalance_apply(rk, err, parts, OQ__COMP);
}

static void commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *offsets, void *opaque)
{
    if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
        OQ_LOG_DEBUG(OQ__COMP, "offset commit failed: %s (tolerated)", rd_kafka_err2str(err));
}

/* --- periodic work --------------------------------------------------------------------------- */

/*
 * Recovery and reconciliation (execution.c): lapsed leases -> UNKNOWN, UNKNOWN decided; the
 * executions that need a lookup at their downstream are RECONCILING once this commits, and
 * their lookups are sent then (the answers come back through the batch transaction).
 */
static void recover_lapsed(oq_consumer_t *c)
{
    oq_error_t err = {0};
    int n = 0, nl = 0, rc;
    atomic_store(&c->recover_now, 0);
    if (!oq__consumer_store_recovery_pending(c->store, lease_now(c))) return;
    if ((rc = oq__consumer_store_begin(c->store, &err)) == 0) {
        rc = oq__exec_recover(c->store, lease_now(c), &c->policy, OQ__RECOVER_CAP,
                              c->disp ? c->lookups : NULL, &nl, &n, &err);
        if (rc == 0) rc = oq__consumer_store_commit(c->store, &err);
        if (rc) oq__consumer_store_rollback(c->store);
    }
    if (rc) {
        for (int i = 0; i < nl; i++)
            oq__exec_row_clear(&c->lookups[i]);
        OQ_LOG_WARN(OQ__COMP, "recovery: %s", err.msg);
        return;
    }
    oq__outside_send_lookups(c, nl);
    if (n > 0) {
        OQ_LOG_INFO(OQ__COMP, "recovery moved %d execution(s), %d lookup(s) sent", n, nl);
        oq_counter_add(c->m_recovered, (uint64_t)n);
        oq_relay_notify(c->relay);
        if (n >= OQ__RECOVER_CAP) atomic_store(&c->recover_now, 1); /* more to do */
    }
}

/* At start-up: rows still held under this worker id belong to its dead previous process. */
static void release_held(oq_consumer_t *c)
{
    oq_error_t err = {0};
    int n = 0, rc;
    if ((rc = oq__consumer_store_begin(c->store, &err)) == 0) {
        rc = oq__exec_release_held(c->store, lease_now(c), &n, &err);
        if (rc == 0) rc = oq__consumer_store_commit(c->store, &err);
        if (rc) oq__consumer_store_rollback(c->store);
    }
    if (rc)
        OQ_LOG_WARN(OQ__COMP, "start-up release of held executions: %s", err.msg);
    else if (n > 0)
        OQ_LOG_INFO(OQ__COMP, "start-up: %d execution(s) held by this worker id before: UNKNOWN",
                    n);
}

/* A due execution: a declared HTTP tool (claimed and sent), or a compiled one and how long it
 * blocks (0: fast, run inline; else on a runner). */
typedef struct {
    char call_id[OQ_CALL_ID_LEN + 1];
    const oq__http_tool_t *remote;
    int64_t blocks_ms;
} due_t;

typedef struct {
    const oq_consumer_t *c;
    due_t *rows;
    int n, cap;
} due_list_t;

static void due_collect(const oq__due_row_t *r, void *opaque)
{
    due_list_t *l = opaque;
    if (l->n >= l->cap) return;
    due_t *d = &l->rows[l->n++];
    snprintf(d->call_id, sizeof(d->call_id), "%s", r->call_id ? r->call_id : "");
    d->remote = oq__http_tools_find(l->c->tools, r->tool);
    d->blocks_ms = 0;
    if (d->remote) return;
    json_t *a = r->args ? json_loads(r->args, 0, NULL) : NULL;
    d->blocks_ms = oq_tool_blocks(oq_tool_find(r->tool), a);
    json_decref(a);
}

/* Runs due executions: HTTP ones claimed (and sent after the commit) and fast ones run inline,
 * in one transaction; blocking ones on runners.
 * @locality main thread (the row buffer is static). @returns the number of due rows seen. */
static int schedule_due(oq_consumer_t *c)
{
    static due_t due[OQ__DUE_CAP];
    due_list_t list = {.c = c, .rows = due, .n = 0, .cap = OQ__DUE_CAP};
    oq_error_t err = {0};
    int n = 0, rc, nhere = 0;
    int64_t now = lease_now(c);
    if (oq__consumer_store_next_due(c->store) > now) return 0;
    if (oq__consumer_store_due(c->store, now, OQ__DUE_CAP, due_collect, &list, &err)) {
        OQ_LOG_WARN(OQ__COMP, "scheduler: %s", err.msg);
        return 0;
    }
    n = list.n;
    for (int i = 0; i < n; i++) {
        if (due[i].blocks_ms > 0)
            oq__runner_push(c, due[i].call_id);
        else
            nhere++;
    }
    if (nhere == 0) return n;
    c->results_emitted = 0;
    oq__outside_drop(c);
    if ((rc = oq__consumer_store_begin(c->store, &err)) == 0) {
        for (int i = 0; i < n && rc == 0; i++) {
            if (due[i].remote)
                rc = oq__outside_claim(c, due[i].call_id, due[i].remote, lease_now(c), &err);
            else if (due[i].blocks_ms == 0)
                rc = oq__run_inline(c, NULL, due[i].call_id, NULL, lease_now(c), &err);
        }
        if (rc == 0) rc = oq__consumer_store_commit(c->store, &err);
        if (rc) oq__consumer_store_rollback(c->store);
    }
    if (rc) {
        oq__outside_drop(c);
        OQ_LOG_WARN(OQ__COMP, "scheduler batch rolled back: %s", err.msg);
        return n;
    }
    oq__outside_flush(c);
    if (c->results_emitted) oq_relay_notify(c->relay);
    return n;
}

/* Retention (oq__exec_purge: the rule is in execution.c), in short transactions of 1000 rows
 * so batches are not held up for long. */
static void purge_retention(oq_consumer_t *c)
{
    oq_error_t err = {0};
    oq_consumer_purge_stats_t st;
    if (oq__exec_purge(c->store, lease_now(c), c->o.retention_ms, c->o.inbox_retention_ms, 1000,
                       &st, &err)) {
        OQ_LOG_WARN(OQ__COMP, "purge: %s", err.msg);
        return;
    }
    if (st.inbox || st.executions || st.audit)
        OQ_LOG_INFO(OQ__COMP,
                    "purged past retention inbox=%" PRId64 " executions=%" PRId64
                    " effects=%" PRId64 " audit=%" PRId64,
                    st.inbox, st.executions, st.effects, st.audit);
}

/* /readyz "batch": failing while a batch transaction has kept failing for a second or more
 * (one that passes at its next try, 50 ms later, does not flip the check). */
static int check_batch(void *arg, char *out, size_t cap)
{
    oq_consumer_t *c = arg;
    pthread_mutex_lock(&c->stall_mu);
    int64_t since = c->stall_since_us;
    double s = since ? (double)(oq_mono_us() - since) / 1e6 : 0;
    if (since && s >= 1.0)
        snprintf(out, cap,
                 "a batch of %d item(s) has failed %d time(s) over %.1f s and is retried; "
                 "last: %.160s",
                 c->stall_items, c->stall_tries, s, c->stall_msg);
    else
        snprintf(out, cap, "batches commit");
    pthread_mutex_unlock(&c->stall_mu);
    oq_utf8_repair(out);
    return since && s >= 1.0 ? OQ_EBUSY : 0;
}

/* Readiness: this worker is a member of the group with an assignment (it may be empty when the
 * group has more workers than partitions). */
static int check_group(void *arg, char *out, size_t cap)
{
    oq_consumer_t *c = arg;
    int n = atomic_load(&c->assigned_n);
    if (n < 0) {
        snprintf(out, cap, "not assigned: joining group %s or rebalancing", c->group);
        return OQ_ESTATE;
    }
    snprintf(out, cap,
             n ? "assigned %d partition(s)"
               : "member with no partition (more workers "
                 "than partitions)",
             n);
    return 0;
}

/* --- lifecycle ------------------------------------------------------------------------------- */

int oq_consumer_new(const oq_consumer_opts_t *opts, oq_consumer_t **out, oq_error_t *err)
{
    int rc = 0;
    char errstr[512];
    rd_kafka_conf_t *conf = NULL;
    *out = NULL;
    oq_error_t perr = {0};
    if (opts->topic_prefix && (rc = oq_topic_prefix_check(opts->topic_prefix, &perr)) != 0)
        return oq_error_set(err, rc, 0, "topic prefix '%s': %s", opts->topic_prefix, perr.msg);
    if ((rc = oq__admin_check_listen(opts->metrics_listen, opts->token_file, err)) != 0)
        return rc; /* before anything starts */
    oq_consumer_t *c = calloc(1, sizeof(*c));
    if (!c) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->o = *opts;
    c->db_path = strdup0(opts->db_path ? opts->db_path : "effects.db");
    c->brokers = strdup0(opts->brokers);
    c->group = strdup0(opts->group ? opts->group : "onceq-workers");
    char calls_topic[OQ_TOPIC_NAME_CAP];
    c->topic_prefix = strdup0(opts->topic_prefix);
    oq_topic_name(opts->topic_prefix, OQ_TOPIC_CALLS, calls_topic, sizeof calls_topic);
    oq_topic_name(opts->topic_prefix, OQ_TOPIC_DLQ, c->dlq_topic, sizeof c->dlq_topic);
    c->topic = strdup0(opts->topic ? opts->topic : calls_topic);
    c->sync = strdup0(opts->synchronous);
    c->metrics_listen = strdup0(opts->metrics_listen);
    atomic_store(&c->assigned_n, -1);
    if (c->o.lease_ms <= 0) c->o.lease_ms = 30000;
    if (c->o.max_attempts <= 0) c->o.max_attempts = 5;
    if (c->o.batch <= 0) c->o.batch = 500;
    if (c->o.runners <= 0) c->o.runners = 4;
    if (c->o.recover_every_ms <= 0) c->o.recover_every_ms = 1000;
    if (c->o.inbox_retention_ms <= 0) c->o.inbox_retention_ms = 7LL * 86400000;
    if (c->o.retention_ms == 0) c->o.retention_ms = 7LL * 86400000;
    if (c->o.retention_ms > 0 && c->o.retention_ms < c->o.inbox_retention_ms)
        c->o.retention_ms = c->o.inbox_retention_ms; /* an execution outlives its inbox row */
    if (c->o.http_inflight <= 0) c->o.http_inflight = 256;
    c->policy.max_attempts = c->o.max_attempts;
    c->policy.base_ms = c->o.retry_base_ms > 0 ? c->o.retry_base_ms : 200;
    c->policy.max_ms = c->o.retry_max_ms > 0 ? c->o.retry_max_ms : 30000;
    c->policy.lookup_budget = c->o.lookup_budget > 0 ? c->o.lookup_budget : 5;
    c->policy.lease_ms = c->o.lease_ms;
    c->policy.traits = tool_traits;
    c->policy.traits_ctx = c;
    c->policy.on_reconciled = oq__consumer_on_reconciled;
    c->policy.on_ctx = c;
    pthread_mutex_init(&c->resolve_ring.mu, NULL);
    pthread_mutex_init(&c->stats_mu, NULL);
    pthread_mutex_init(&c->stall_mu, NULL);
    if (opts->worker_id) {
        snprintf(c->worker_id, sizeof(c->worker_id), "%s", opts->worker_id);
    } else {
        char host[64] = "localhost";
        unsigned char rnd[3];
        char hex[7];
        gethostname(host, sizeof(host) - 1);
        oq_random_bytes(rnd, sizeof(rnd));
        oq_hex(rnd, sizeof(rnd), hex);
        snprintf(c->worker_id, sizeof(c->worker_id), "%s:%d:%s", host, (int)getpid(), hex);
    }
    if (!c->brokers) {
        rc = oq_error_set(err, OQ_EINVAL, 0, "--brokers is required");
        goto fail;
    }
    c->batch = calloc((size_t)c->o.batch, sizeof(*c->batch));
    c->batch_t0 = calloc((size_t)c->o.batch, sizeof(*c->batch_t0));
    c->handoff = calloc((size_t)c->o.batch, sizeof(*c->handoff));
    c->envs = calloc((size_t)c->o.batch, sizeof(*c->envs));
    c->env_rc = calloc((size_t)c->o.batch, sizeof(*c->env_rc));
    c->env_err = calloc((size_t)c->o.batch, sizeof(*c->env_err));
    c->ids_call = calloc((size_t)c->o.batch, sizeof(*c->ids_call));
    c->ids_msg = calloc((size_t)c->o.batch, sizeof(*c->ids_msg));
    c->nrunners = c->o.runners;
    c->qcap = c->nrunners * 4;
    c->queue = calloc((size_t)c->qcap, sizeof(*c->queue));
    c->slots = calloc((size_t)c->nrunners, sizeof(*c->slots));
    c->runners = calloc((size_t)c->nrunners, sizeof(*c->runners));
    c->metrics = oq_metrics_new();
    c->lookups = calloc(OQ__RECOVER_CAP, sizeof(*c->lookups));
    if (!c->batch || !c->batch_t0 || !c->handoff || !c->queue || !c->slots || !c->runners ||
        !c->metrics || !c->lookups || !c->envs || !c->env_rc || !c->env_err || !c->ids_call ||
        !c->ids_msg) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto fail;
    }
    /* HTTP tools: declared in the tools file; a name that is also compiled in is ambiguous */
    if (c->o.tools_path) {
        if ((rc = oq__http_tools_load(c->o.tools_path, &c->tools, err)) ||
            (rc = tools_check(c->tools, c->o.tools_path, err)))
            goto fail;
        if (c->tools->n && !(c->tmetrics = calloc(c->tools->n, sizeof(*c->tmetrics)))) {
            rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            goto fail;
        }
        for (size_t i = 0; i < c->tools->n; i++)
            pthread_mutex_init(&c->tmetrics[i].ring.mu, NULL);
    }
    /* the drain at stop: by default every request in flight may reach its own timeout */
    if (c->o.drain_ms == 0) {
        c->o.drain_ms = oq__http_tools_max_timeout(c->tools);
        if (c->o.drain_ms > OQ__DRAIN_DEFAULT_MAX_MS) c->o.drain_ms = OQ__DRAIN_DEFAULT_MAX_MS;
    }
    if (c->o.drain_ms < 0) c->o.drain_ms = 0;
    oq__consumer_metrics_init(c);

    /* Consumers sharing effects.db each run a checkpointer (oq_ckpt.h): the commits of the
     * batch transaction, the runners, the heartbeat and the result relay never checkpoint. */
    if (oq_backend_of(c->db_path) == OQ_BACKEND_SQLITE && c->db_path[0] &&
        strcmp(c->db_path, ":memory:") != 0) {
        oq_ckpt_opts_t co = {.synchronous = c->sync,
                             .component = OQ__COMP,
                             .metrics = c->metrics,
                             .metric_prefix = "onceq_consumer"};
        if ((rc = oq_ckpt_new(c->db_path, &co, &c->ckpt, err))) goto fail;
    }
    oq_db_opts_t dbo = {.synchronous = c->sync, .busy_timeout_ms = 10000};
    if ((rc = oq__consumer_store_open(c->db_path, &dbo, c->worker_id, &c->store, err))) goto fail;
    if ((rc = oq__consumer_store_open(c->db_path, &dbo, c->worker_id, &c->hb_store, err)) ||
        (rc = oq__consumer_store_open(c->db_path, &dbo, c->worker_id, &c->stats_store, err)))
        goto fail;
    oq__consumer_store_attach(c->store, c->ckpt);
    oq__consumer_store_attach(c->hb_store, c->ckpt);
    oq__consumer_store_attach(c->stats_store, c->ckpt);
    for (int i = 0; i < c->nrunners; i++) {
        c->runners[i].c = c;
        c->runners[i].index = i;
        if ((rc = oq__consumer_store_open(c->db_path, &dbo, c->worker_id, &c->runners[i].store,
                                          err)))
            goto fail;
        oq__consumer_store_attach(c->runners[i].store, c->ckpt);
    }

    /* Kafka consumer: manual offset store + commit, default assignment strategy. */
    if (!(conf = oq_kafka_conf_new(OQ_KAFKA_CONSUMER, c->brokers, c->o.cfg, err))) {
        rc = err ? err->code : OQ_EINVAL;
        goto fail;
    }
    if ((rc = oq_kafka_conf_set(conf, "group.id", c->group, err)) ||
        (rc = oq_kafka_conf_set(conf, "enable.auto.commit", "false", err)) ||
        (rc = oq_kafka_conf_set(conf, "enable.auto.offset.store", "false", err)) ||
        (rc = oq_kafka_conf_set(conf, "auto.offset.reset", "earliest", err)) ||
        (rc = oq_kafka_conf_set(conf, "client.id", c->worker_id, err)))
        goto fail;
    /* the user's -X wins over our defaults for anything but the commit discipline */
    if ((rc = oq_kafka_conf_apply(conf, OQ_KAFKA_CONSUMER, c->o.cfg, err))) goto fail;
    if ((rc = oq_kafka_conf_set(conf, "enable.auto.commit", "false", err)) ||
        (rc = oq_kafka_conf_set(conf, "enable.auto.offset.store", "false", err)))
        goto fail;
    rd_kafka_conf_set_opaque(conf, c);
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    rd_kafka_conf_set_offset_commit_cb(conf, commit_cb);
    if (!(c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr)))) {
        rc = oq_error_set(err, OQ_EKAFKA, 0, "consumer: %s", errstr);
        goto fail;
    }
    conf = NULL;
    rd_kafka_poll_set_consumer(c->rk);
    c->cq = rd_kafka_queue_get_consumer(c->rk);

    /* DLQ producer (plain; dead letters are retried from the dlq table until delivered). */
    if (!(conf = oq_kafka_conf_new(OQ_KAFKA_PRODUCER, c->brokers, c->o.cfg, err))) {
        rc = err ? err->code : OQ_EINVAL;
        goto fail;
    }
    if ((rc = oq_kafka_conf_set(conf, "acks", "all", err)) ||
        (rc = oq_kafka_conf_set(conf, "linger.ms", "0", err)))
        goto fail;
    rd_kafka_conf_set_dr_msg_cb(conf, dlq_dr);
    if (!(c->dlq_rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr)))) {
        rc = oq_error_set(err, OQ_EKAFKA, 0, "dlq producer: %s", errstr);
        goto fail;
    }
    conf = NULL;

    if (!c->o.no_relay) {
        oq_relay_opts_t ro;
        oq_relay_opts_init(&ro);
        ro.db_path = c->db_path;
        ro.db_synchronous = c->o.relay_synchronous; /* NULL: NORMAL */
        ro.brokers = c->brokers;
        ro.kafka_cfg = c->o.cfg; /* security and client settings reach every client */
        ro.owner = c->worker_id;
        ro.metrics = c->metrics;
        ro.metrics_labels = "relay=\"results\"";
        ro.topic_prefix = c->topic_prefix; /* result rows name onceq.tool-results */
        /* Consumers sharing effects.db share one outbox and one relay lease: the holder
         * publishes every consumer's results, and only this process's commits can notify it.
         * Watching the WAL wakes it at another consumer's commit too, instead of at its next
         * idle poll (up to poll_max_ms: ~3 ms of a lone call's result hop, half the time). */
        ro.watch_wal = 1;
        ro.ckpt = c->ckpt;
        if (!(c->relay = oq_relay_new(&ro, err))) {
            rc = err ? err->code : OQ_EKAFKA;
            goto fail;
        }
        if ((rc = oq_relay_start(c->relay, err))) goto fail;
    }
    if (c->metrics_listen &&
        !(c->msrv = oq__admin_start(c->metrics_listen, c->o.token_file, c->metrics, c->db_path,
                                    oq__consumer_stats_cb, c, err))) {
        rc = err ? err->code : OQ_EIO;
        goto fail;
    }
    if (c->o.metrics_only_listen &&
        !(c->mosrv = oq_metrics_serve(c->metrics, c->o.metrics_only_listen, err))) {
        rc = err ? err->code : OQ_EIO;
        goto fail;
    }
    if (c->msrv ||
        c->mosrv) { /* GET /readyz: effects.db writable, the brokers answer, in the group */
        if (!(c->ready = oq_ready_new(OQ__COMP, c->metrics)) ||
            oq_ready_add_db(c->ready, c->db_path) != 0 ||
            oq_ready_add(c->ready, "group", check_group, c) != 0 ||
            oq_ready_add(c->ready, "batch", check_batch, c) != 0) {
            rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            goto fail;
        }
        if ((rc = oq_ready_add_kafka(c->ready, c->brokers, c->o.cfg, err)) ||
            (rc = oq_ready_start(c->ready, err)))
            goto fail;
        oq__admin_set_ready(c->msrv, c->ready);
        oq_metrics_server_set_ready(c->mosrv, c->ready);
    }
    if (c->tools) {
        oq__http_exec_opts_t xo = {.max_inflight = c->o.http_inflight};
        if (!(c->disp = oq__dispatch_new(&xo, oq__outside_wake, c, err))) {
            rc = err ? err->code : OQ_EIO;
            goto fail;
        }
    }
    if ((rc = oq__runners_start(c, err))) goto fail;
    OQ_LOG_INFO(OQ__COMP,
                "worker started worker_id=%s db=%s group=%s topic=%s lease=%" PRId64
                "ms runners=%d http_tools=%zu inbox_retention_ms=%" PRId64 " retention_ms=%" PRId64,
                c->worker_id,
                oq_backend_of(c->db_path) == OQ_BACKEND_POSTGRES ? "postgres" : c->db_path,
                c->group, c->topic, c->o.lease_ms, c->nrunners, c->tools ? c->tools->n : (size_t)0,
                c->o.inbox_retention_ms, c->o.retention_ms);
    *out = c;
    return 0;
fail:
    if (conf) rd_kafka_conf_destroy(conf);
    oq_consumer_destroy(c);
    return rc;
}

void oq_consumer_stop(oq_consumer_t *c)
{
    if (c) c->stop = 1;
}

/*
 * The inbox must remember a message id for at least as long as the topic keeps the message
 * (DESIGN: key scope and retention), or a redelivery of an older message is not recognised
 * by its id (the execution row and the UNIQUE effects gate still stop a second effect, but
 * the DLQ / retry bookkeeping would run again). Settled executions are kept at least as long
 * (--retention is raised to --inbox-retention), so the same check covers them: a message older
 * than their retention would be dead-lettered `expired` (execution.c, "what retention
 * deletes"), never run twice, but never run either. Reads the topic's retention.ms with
 * DescribeConfigs (bounded wait) and warns when --inbox-retention is shorter. A broker that
 * does not answer (the embedded mock has no admin API) is logged at info level.
 */
static void retention_check_start(oq_consumer_t *c)
{
    char errstr[256];
    c->rres = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, c->topic);
    c->rq = rd_kafka_queue_new(c->rk);
    c->rao = rd_kafka_AdminOptions_new(c->rk, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
    if (!c->rres || !c->rq || !c->rao) return; /* polled: reports and cleans up */
    rd_kafka_AdminOptions_set_request_timeout(c->rao, 3000, errstr, sizeof errstr);
    rd_kafka_DescribeConfigs(c->rk, &c->rres, 1, c->rao, c->rq);
    c->rdeadline_us = oq_mono_us() + 5000000;
}

static void retention_check_done(oq_consumer_t *c)
{
    if (c->rao) rd_kafka_AdminOptions_destroy(c->rao);
    if (c->rq) rd_kafka_queue_destroy(c->rq);
    if (c->rres) rd_kafka_ConfigResource_destroy(c->rres);
    c->rao = NULL;
    c->rq = NULL;
    c->rres = NULL;
    c->rdeadline_us = 0;
}

/* Polls the answer without waiting (from the worker loop); logs once and cleans up. */
static void retention_check_poll(oq_consumer_t *c)
{
    if (!c->rdeadline_us && !c->rq && !c->rao && !c->rres) return;
    rd_kafka_event_t *ev = c->rq && c->rdeadline_us ? rd_kafka_queue_poll(c->rq, 0) : NULL;
    if (!ev && c->rdeadline_us && oq_mono_us() < c->rdeadline_us) return;
    long long retention = -2;
    const char *why = NULL;
    if (!c->rdeadline_us) {
        why = "out of memory";
    } else if (!ev) {
        why = "no answer within 5 s";
    } else if (rd_kafka_event_error(ev)) {
        why = rd_kafka_event_error_string(ev);
    } else {
        const rd_kafka_DescribeConfigs_result_t *r = rd_kafka_event_DescribeConfigs_result(ev);
        size_t nr = 0, ne = 0;
        const rd_kafka_ConfigResource_t **rs =
            r ? rd_kafka_DescribeConfigs_result_resources(r, &nr) : NULL;
        if (nr < 1 || rd_kafka_ConfigResource_error(rs[0])) {
            why = nr < 1 ? "empty answer" : rd_kafka_ConfigResource_error_string(rs[0]);
        } else {
            const rd_kafka_ConfigEntry_t **es = rd_kafka_ConfigResource_configs(rs[0], &ne);
            for (size_t i = 0; i < ne; i++) {
                const char *v = rd_kafka_ConfigEntry_value(es[i]);
                if (strcmp(rd_kafka_ConfigEntry_name(es[i]), "retention.ms") == 0 && v)
                    retention = strtoll(v, NULL, 10);
            }
            if (retention == -2) why = "retention.ms not in the answer";
        }
    }
    if (why)
        OQ_LOG_INFO(OQ__COMP,
                    "could not read retention.ms of topic %s (%s): keep --inbox-retention "
                    "(%" PRId64 " ms) at or above it",
                    c->topic, why, c->o.inbox_retention_ms);
    else if (retention < 0 || retention > c->o.inbox_retention_ms)
        OQ_LOG_WARN(OQ__COMP,
                    "topic %s has retention.ms=%lld%s but the inbox forgets message ids after "
                    "%" PRId64 " ms (--inbox-retention): a redelivery older than that is not "
                    "recognised by its id; raise --inbox-retention to at least retention.ms",
                    c->topic, retention, retention < 0 ? " (kept for ever)" : "",
                    c->o.inbox_retention_ms);
    else
        OQ_LOG_DEBUG(OQ__COMP, "topic %s retention.ms=%lld <= inbox retention %" PRId64 " ms",
                     c->topic, retention, c->o.inbox_retention_ms);
    if (ev) rd_kafka_event_destroy(ev);
    retention_check_done(c);
}

int oq_consumer_run(oq_consumer_t *c, int64_t max_idle_ms, oq_error_t *err)
{
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, c->topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(c->rk, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (e) return oq_error_set(err, OQ_EKAFKA, e, "subscribe: %s", rd_kafka_err2str(e));
    c->subscribed = 1;
    if (!c->rq && !c->rdeadline_us) retention_check_start(c); /* answer polled below */

    release_held(c);
    recover_lapsed(c);
    dlq_publish(c);
    int64_t last_recover = oq_mono_us(), last_gauges = 0, last_sched = 0, last_dlq = oq_mono_us();
    int64_t last_busy = oq_mono_us(), last_purge = 0;
    while (!c->stop) {
        retention_check_poll(c);
        /* collect a batch: wait briefly for the first message (an answered outside request
         * cuts the wait short), then take what is there; holding as many outside jobs as it
         * may (oq__outside_admit_limit), take no new message until some are answered */
        int64_t t0 = oq_mono_us();
        int held = c->disp ? oq__dispatch_count(c->disp) : 0;
        int admit = c->disp ? oq__outside_admit_limit(c, t0) : INT32_MAX;
        int full = held >= admit;
        rd_kafka_message_t *m = NULL;
        if (full)
            (void)oq__dispatch_wait_done(c->disp, 5);
        else
            m = rd_kafka_consumer_poll(c->rk, oq__dispatch_has_done(c->disp) ? 0 : 50);
        int64_t tpoll = oq_mono_us();
        while (m) {
            if (m->err) {
                if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                    OQ_LOG_WARN(OQ__COMP, "consume: %s", rd_kafka_message_errstr(m));
                rd_kafka_message_destroy(m);
            } else {
                if (atomic_load(&c->first_poll_us) == 0) atomic_store(&c->first_poll_us, t0);
                c->batch_t0[c->nbatch] = t0;
                c->batch[c->nbatch++] = m;
            }
            if (c->nbatch >= c->o.batch || held + c->nbatch >= admit) break;
            m = rd_kafka_consumer_poll(c->rk, 0);
        }
        int64_t now = oq_mono_us();
        c->t_poll_us += now - t0;
        (void)tpoll;
        if (c->nbatch > 0 || oq__dispatch_has_done(c->disp)) {
            last_busy = now;
            c->n_batches++;
            process_batch(c);
            c->t_batch_us += oq_mono_us() - now;
        }
        if (oq__dispatch_count(c->disp) > 0) {
            last_busy = now;
            oq__outside_tell_running(c, now);
        }
        if (atomic_load(&c->recover_now) || now - last_recover >= c->o.recover_every_ms * 1000) {
            int64_t tr = oq_mono_us();
            recover_lapsed(c);
            c->t_recover_us += oq_mono_us() - tr;
            last_recover = now;
        }
        if (now - last_sched >= 20000) {
            int64_t ts = oq_mono_us();
            if (schedule_due(c) > 0) last_busy = now;
            c->t_sched_us += oq_mono_us() - ts;
            last_sched = now;
        }
        if (!oq__runners_idle(c)) last_busy = now;
        commit_stored(c);
        if (c->dlq_added && now - last_dlq >= 1000000) {
            dlq_publish(c);
            last_dlq = now;
        }
        if (now - last_purge >= 60000000) {
            purge_retention(c);
            last_purge = now;
        }
        if (now - last_gauges >= 2000000) {
            oq__consumer_refresh_gauges(c);
            last_gauges = now;
        }
        if (max_idle_ms > 0 && atomic_load(&c->first_poll_us) != 0 &&
            now - last_busy >= max_idle_ms * 1000 &&
            oq__consumer_store_next_due(c->store) == INT64_MAX)
            break;
    }
    int64_t n_stmt = 0, n_rt = 0; /* PostgreSQL: the main thread's connection (0 on SQLite) */
    oq__consumer_store_counts(c->store, &n_stmt, &n_rt);
    OQ_LOG_INFO(OQ__COMP,
                "stopping: batches=%" PRId64 " msgs=%llu main thread ms: batch=%" PRId64
                " (commit=%" PRId64 ") poll-collect=%" PRId64 " schedule=%" PRId64
                " recover=%" PRId64 "; write-lock wait ms (all threads)=%" PRId64
                " outside requests=%llu pg_statements=%" PRId64 " pg_round_trips=%" PRId64,
                c->n_batches, (unsigned long long)atomic_load(&c->n_consumed), c->t_batch_us / 1000,
                c->t_commit_us / 1000, c->t_poll_us / 1000, c->t_sched_us / 1000,
                c->t_recover_us / 1000, oq_db_lock_wait_us() / 1000,
                (unsigned long long)atomic_load(&c->n_requests), n_stmt, n_rt);
    process_batch(c);
    /* outside requests: the drain. Nothing new starts; the running ones may answer for up to
     * --drain and their outcomes commit as they come (leases renewed meanwhile); the ones still
     * running then are abandoned: UNKNOWN when sent (reconciled later), else not run */
    if (c->disp) {
        int64_t t0 = oq_mono_us(), until = t0 + c->o.drain_ms * 1000;
        int n0 = oq__dispatch_count(c->disp);
        oq__dispatch_drain(c->disp, c->o.drain_ms);
        if (n0 > 0)
            OQ_LOG_INFO(OQ__COMP, "draining: requests=%d drain_ms=%" PRId64, n0, c->o.drain_ms);
        while (oq__dispatch_count(c->disp) > 0 && oq_mono_us() < until) {
            oq_sleep_ms(5, NULL);
            process_batch(c);
        }
        int left = oq__dispatch_count(c->disp);
        oq__dispatch_stop(c->disp, 0);
        process_batch(c);
        if (n0 > 0)
            OQ_LOG_INFO(OQ__COMP, "drained: requests=%d abandoned=%d ms=%" PRId64, n0, left,
                        (oq_mono_us() - t0) / 1000);
    }
    e = rd_kafka_commit(c->rk, NULL, 0);
    if (e && e != RD_KAFKA_RESP_ERR__NO_OFFSET)
        OQ_LOG_INFO(OQ__COMP, "final commit: %s", rd_kafka_err2str(e));
    rd_kafka_consumer_close(c->rk);
    c->subscribed = 0;
    oq__runners_stop(c);
    if (c->dlq_added) dlq_publish(c);
    oq__consumer_refresh_gauges(c);
    return 0;
}

/* A declared HTTP tool whose name is also compiled in would be ambiguous. */
static int tools_check(const oq__http_tools_t *t, const char *path, oq_error_t *err)
{
    for (size_t i = 0; i < t->n; i++)
        if (oq_tool_find(t->tools[i].name))
            return oq_error_set(err, OQ_EINVAL, 0,
                                "%s: tool \"%s\" is declared there and compiled into onceq: "
                                "rename one of them",
                                path, t->tools[i].name);
    return 0;
}

int oq_consumer_check_tools(const char *path, oq_error_t *err)
{
    oq__http_tools_t *t = NULL;
    int rc = oq__http_tools_load(path, &t, err);
    if (rc == 0) rc = tools_check(t, path, err);
    oq__http_tools_destroy(t);
    return rc;
}

void oq_consumer_destroy(oq_consumer_t *c)
{
    if (!c) return;
    oq__runners_stop(c);
    if (c->relay) oq_relay_destroy(c->relay);
    oq__admin_stop(c->msrv);
    oq_metrics_serve_stop(c->mosrv);
    c->msrv = NULL;
    oq_ready_destroy(c->ready);
    c->ready = NULL;
    oq__consumer_store_close(c->stats_store);
    pthread_mutex_destroy(&c->stats_mu);
    pthread_mutex_destroy(&c->stall_mu);
    retention_check_done(c);
    oq__dispatch_destroy(c->disp);
    c->disp = NULL;
    oq__outside_drop(c);
    free(c->sends);
    if (c->lookups)
        for (int i = 0; i < OQ__RECOVER_CAP; i++)
            oq__exec_row_clear(&c->lookups[i]);
    free(c->lookups);
    if (c->cq) rd_kafka_queue_destroy(c->cq);
    if (c->rk) {
        if (c->subscribed) rd_kafka_consumer_close(c->rk);
        for (int i = 0; i < c->nbatch; i++)
            rd_kafka_message_destroy(c->batch[i]);
        rd_kafka_destroy(c->rk);
    }
    if (c->dlq_rk) {
        rd_kafka_flush(c->dlq_rk, 2000);
        rd_kafka_destroy(c->dlq_rk);
    }
    if (c->runners)
        for (int i = 0; i < c->o.runners; i++)
            oq__consumer_store_close(c->runners[i].store);
    oq__consumer_store_close(c->hb_store);
    oq__consumer_store_close(c->store);
    oq_ckpt_destroy(c->ckpt); /* after every connection attached to it */
    oq_metrics_destroy(c->metrics);
    for (size_t i = 0; c->tmetrics && i < c->tools->n; i++)
        pthread_mutex_destroy(&c->tmetrics[i].ring.mu);
    free(c->tmetrics);
    oq__http_tools_destroy(c->tools);
    pthread_mutex_destroy(&c->resolve_ring.mu);
    free(c->batch);
    free(c->batch_t0);
    free(c->handoff);
    free(c->envs);
    free(c->env_rc);
    free(c->env_err);
    free(c->ids_call);
    free(c->ids_msg);
    free(c->queue);
    free(c->slots);
    free(c->runners);
    free(c->db_path);
    free(c->brokers);
    free(c->group);
    free(c->topic);
    free(c->topic_prefix);
    free(c->sync);
    free(c->metrics_listen);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}
