/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq dlq list|show|redrive`: the dead letters of the consumers (topic onceq.dlq), and of
 * the relay (the table outbox_dead of a database), without SQL or a Kafka tool.
 *
 *   onceq dlq list    --brokers B [--limit 100] [--json]        the DLQ topic, oldest first
 *   onceq dlq show    P:O --brokers B [--json | --payload]      one message with its headers
 *   onceq dlq redrive P:O --brokers B [--payload-file FIXED]    put it back where it was read
 *   onceq dlq list    --outbox-db calls.db [--json]      the relay's outbox_dead rows
 *   onceq dlq show    SEQ --outbox-db calls.db [--json | --payload]
 *   onceq dlq list    --webhooks-db calls.db [--json]    webhook deliveries that ran out of tries
 *   onceq dlq show    ID --webhooks-db calls.db [--json | --payload]
 *   onceq dlq redrive ID|all --webhooks-db calls.db      a fresh budget: sent again, same id
 *
 * --outbox-db is an SQLite file or PostgreSQL (a postgres:// URI or libpq keyword string,
 * schema onceq); oq_relay_db_dead_list reads either.
 *
 * A consumer dead-letters a message it cannot execute (undecodable, not a tool_call, a
 * fingerprint that differs from the call's execution) with the headers of oq_envelope.h: the
 * stable reason code, its detail, the origin topic, partition and offset, and the message id
 * its inbox recorded. Reading never joins a consumer group and commits nothing: list and show
 * assign the partitions and read up to the high watermark (bounded by --limit and --timeout).
 *
 * redrive re-publishes the dead letter to its origin topic, with the same key, the same
 * onceq-message-id and the header onceq-redrive, and waits for the delivery report. The
 * consumer's inbox holds that message id as 'dlq': a copy that is valid now (the consumer was
 * fixed, or --payload-file holds the repaired envelope, which must keep the message id) goes
 * through once and every later copy is a duplicate; a copy still invalid is a dead letter
 * again, with its reason. A message without an origin topic header (written before the
 * headers existed) is refused unless --origin-topic names the topic. The relay's dead rows
 * are not redriven: the producer fails their calls (unpublishable), and a client resubmits.
 *
 * Exit codes: 0 ok, 1 broker or database failure, 2 bad usage or a redrive refused (nothing
 * published), 4 no such dead letter.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "cmds.h"
#include "oq_buf.h"
#include "oq_dbh.h"
#include "oq_envelope.h"
#include "oq_kafka.h"
#include "oq_pg.h"
#include "oq_producer.h"
#include "oq_relay.h"
#include "oq_util.h"
#include "oq_json.h"

static const char dlq_usage[] =
    "usage: onceq dlq list    --brokers B [--limit N] [--json]\n"
    "       onceq dlq show    PARTITION:OFFSET --brokers B [--json | --payload]\n"
    "       onceq dlq redrive PARTITION:OFFSET --brokers B [--payload-file FILE]\n"
    "                         [--origin-topic T]\n"
    "       onceq dlq list    --outbox-db calls.db [--limit N] [--json]   (relay: outbox_dead)\n"
    "       onceq dlq show    SEQ --outbox-db calls.db [--json | --payload]\n"
    "       onceq dlq list    --webhooks-db calls.db [--limit N] [--json]  (dead webhooks)\n"
    "       onceq dlq show    DELIVERY_ID --webhooks-db calls.db [--json | --payload]\n"
    "       onceq dlq redrive DELIVERY_ID|all --webhooks-db calls.db\n"
    "       (all: [--topic-prefix onceq.] [--dlq-topic T] [--timeout 10s] [-X "
    "kafka.prop=value]...)\n"
    "\n"
    "redrive re-publishes a dead letter to its origin topic with its key, its onceq-message-id\n"
    "and the header onceq-redrive; the consumers' inbox lets that message id through once when\n"
    "it is valid now, and dead-letters it again (with the reason) when it is not.\n"
    "Exit codes: 0 ok, 1 broker or database failure, 2 bad usage or redrive refused (nothing\n"
    "published), 4 no such dead letter.";

static const oq_setting_t dlq_settings[] = {
    {"brokers", OQ_SET_STRING, NULL, 1, 4096, NULL, "Kafka bootstrap servers (the DLQ topic)"},
    {"dlq-topic", OQ_SET_STRING, NULL, 1, 249, NULL,
     "the dead-letter topic (default: PREFIX + dlq, onceq.dlq)"},
    OQ_SETTING_TOPIC_PREFIX,
    OQ_SETTING_KAFKA_PROFILE,
    {"outbox-db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "list/show: the relay's dead outbox rows (outbox_dead) of this database instead (a file, "
     "or a postgres:// URI / libpq keyword string)"},
    {"webhooks-db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "the producer's dead webhook deliveries (a file or a PostgreSQL string): list, show, "
     "redrive (the producer's sender sends them again, same Idempotency-Key)"},
    {"json", OQ_SET_BOOL, "false", 0, -1, NULL, "list/show: print JSON"},
    {"payload", OQ_SET_BOOL, "false", 0, -1, NULL,
     "show: print only the message's bytes (to repair them for --payload-file)"},
    {"limit", OQ_SET_INT, "100", 1, 100000, NULL, "list: at most this many, oldest first"},
    {"timeout", OQ_SET_DURATION, "10s", 100, 600000, NULL,
     "bound on reading the topic and on the redrive's delivery"},
    {"payload-file", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "redrive: publish these bytes (a repaired envelope with the same message_id) instead"},
    {"origin-topic", OQ_SET_STRING, NULL, 1, 249, NULL,
     "redrive: the topic to publish to when the dead letter names none"},
};

/* --- one message as JSON --------------------------------------------------------------------- */

/* The last value of header \p name as a new string, or NULL. */
static char *header_dup(rd_kafka_headers_t *h, const char *name)
{
    const void *v = NULL;
    size_t len = 0;
    if (!h || rd_kafka_header_get_last(h, name, &v, &len) != RD_KAFKA_RESP_ERR_NO_ERROR || !v)
        return NULL;
    char *s = malloc(len + 1);
    if (!s) return NULL;
    memcpy(s, v, len);
    s[len] = '\0';
    return s;
}

/* Bytes as a JSON string when they are UTF-8, else null. */
static json_t *bytes_json(const void *p, size_t len)
{
    json_t *s = p ? json_stringn((const char *)p, len) : NULL;
    return s ? s : json_null();
}

/* {ref, partition, offset, timestamp, key, message_id, reason, detail, origin, redrive,
 *  payload, payload_bytes}; with \p all also every header in order. */
static json_t *msg_json(const rd_kafka_message_t *m, int all)
{
    rd_kafka_headers_t *h = NULL;
    rd_kafka_timestamp_type_t tt;
    char ref[48];
    if (rd_kafka_message_headers(m, &h) != RD_KAFKA_RESP_ERR_NO_ERROR) h = NULL;
    snprintf(ref, sizeof ref, "%" PRId32 ":%" PRId64, m->partition, m->offset);
    char *mid = header_dup(h, OQ_HDR_MESSAGE_ID), *reason = header_dup(h, OQ_HDR_DLQ_REASON);
    char *detail = header_dup(h, OQ_HDR_DLQ_DETAIL), *ot = header_dup(h, OQ_HDR_DLQ_TOPIC);
    char *op = header_dup(h, OQ_HDR_DLQ_PARTITION), *oo = header_dup(h, OQ_HDR_DLQ_OFFSET);
    char *redrive = header_dup(h, OQ_HDR_REDRIVE);
    json_t *o = json_pack("{s:s, s:i, s:I, s:I, s:o, s:s*, s:s*, s:s*, s:s*, s:o, s:I}", "ref", ref,
                          "partition", (int)m->partition, "offset", (json_int_t)m->offset,
                          "timestamp", (json_int_t)rd_kafka_message_timestamp(m, &tt), "key",
                          bytes_json(m->key, m->key_len), "message_id", mid, "reason", reason,
                          "detail", detail, "redrive", redrive, "payload",
                          bytes_json(m->payload, m->len), "payload_bytes", (json_int_t)m->len);
    if (o)
        json_object_set_new(o, "origin",
                            ot && ot[0]
                                ? json_pack("{s:s, s:I, s:I}", "topic", ot, "partition",
                                            (json_int_t)(op ? strtoll(op, NULL, 10) : -1), "offset",
                                            (json_int_t)(oo ? strtoll(oo, NULL, 10) : -1))
                                : json_null());
    if (o && all) {
        json_t *a = json_array();
        const char *name;
        const void *v;
        size_t len;
        for (size_t i = 0; h && rd_kafka_header_get_all(h, i, &name, &v, &len) == 0; i++)
            json_array_append_new(a, json_pack("[s, o]", name, bytes_json(v, len)));
        json_object_set_new(o, "headers", a);
    }
    free(mid);
    free(reason);
    free(detail);
    free(ot);
    free(op);
    free(oo);
    free(redrive);
    return o;
}

static void print_json(json_t *v)
{
    char *t = oq_json_dumps(v, JSON_INDENT(2));
    if (t) puts(t);
    free(t);
}

/* A string member, or \p dflt. */
static const char *jstr(const json_t *o, const char *k, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : dflt;
}

/* Prints \p s on one line: control bytes and non-ASCII as \xNN, cut after \p max bytes. */
static void print_escaped(const char *s, size_t len, size_t max)
{
    for (size_t i = 0; i < len && i < max; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch > 0x7e)
            printf("\\x%02x", ch);
        else
            putchar(ch);
    }
    if (len > max) printf("...");
}

/* --- reading the topic ----------------------------------------------------------------------- */

typedef struct {
    rd_kafka_t *rk;
    int32_t *parts;
    int64_t *lo, *hi;
    int nparts;
} reader_t;

static void reader_close(reader_t *r)
{
    if (r->rk) {
        rd_kafka_assign(r->rk, NULL);
        rd_kafka_destroy(r->rk);
    }
    free(r->parts);
    free(r->lo);
    free(r->hi);
    memset(r, 0, sizeof(*r));
}

/* A consumer that never joins a group or commits, and the topic's partitions with their low
 * and high watermarks. */
static int reader_open(const oq_config_t *cfg, const char *topic, int timeout_ms, reader_t *r,
                       oq_error_t *err)
{
    char errstr[512];
    const struct rd_kafka_metadata *md = NULL;
    memset(r, 0, sizeof(*r));
    rd_kafka_conf_t *conf =
        oq_kafka_conf_new(OQ_KAFKA_CONSUMER, oq_config_str(cfg, "brokers"), cfg, err);
    if (!conf) return OQ_EINVAL;
    if (oq_kafka_conf_set(conf, "group.id", "onceq-dlq-cli", err) ||
        oq_kafka_conf_set(conf, "enable.auto.commit", "false", err) ||
        oq_kafka_conf_set(conf, "enable.auto.offset.store", "false", err)) {
        rd_kafka_conf_destroy(conf);
        return OQ_EINVAL;
    }
    if (!(r->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr))) {
        rd_kafka_conf_destroy(conf);
        return oq_error_set(err, OQ_EKAFKA, 0, "kafka consumer: %s", errstr);
    }
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(r->rk, topic, NULL);
    rd_kafka_resp_err_t e =
        rkt ? rd_kafka_metadata(r->rk, 0, rkt, &md, timeout_ms) : RD_KAFKA_RESP_ERR__INVALID_ARG;
    if (rkt) rd_kafka_topic_destroy(rkt);
    if (e) return oq_error_set(err, OQ_EKAFKA, 0, "metadata of %s: %s", topic, rd_kafka_err2str(e));
    int rc = 0;
    if (md->topic_cnt != 1 || md->topics[0].err) {
        rc = oq_error_set(err, OQ_EKAFKA, 0, "topic %s: %s", topic,
                          md->topic_cnt == 1 ? rd_kafka_err2str(md->topics[0].err) : "not found");
        goto out;
    }
    int n = md->topics[0].partition_cnt;
    r->parts = calloc((size_t)n + 1, sizeof *r->parts);
    r->lo = calloc((size_t)n + 1, sizeof *r->lo);
    r->hi = calloc((size_t)n + 1, sizeof *r->hi);
    if (!r->parts || !r->lo || !r->hi) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        int32_t p = md->topics[0].partitions[i].id;
        if ((e = rd_kafka_query_watermark_offsets(r->rk, topic, p, &r->lo[i], &r->hi[i],
                                                  timeout_ms))) {
            rc = oq_error_set(err, OQ_EKAFKA, 0, "offsets of %s [%d]: %s", topic, (int)p,
                              rd_kafka_err2str(e));
            goto out;
        }
        r->parts[i] = p;
    }
    r->nparts = n;
out:
    rd_kafka_metadata_destroy(md);
    return rc;
}

static int reader_index(const reader_t *r, int32_t partition)
{
    for (int i = 0; i < r->nparts; i++)
        if (r->parts[i] == partition) return i;
    return -1;
}

/* Reads every message below the high watermarks (at most \p limit), calling \p cb for each in
 * the order they arrive; or, with \p one_part >= 0, only that partition from \p one_off. */
static int reader_run(reader_t *r, const char *topic, int32_t one_part, int64_t one_off, long limit,
                      int timeout_ms, int (*cb)(const rd_kafka_message_t *, void *), void *opaque,
                      oq_error_t *err)
{
    rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(r->nparts + 1);
    int left = 0, rc = 0;
    long seen = 0;
    char *done = calloc((size_t)r->nparts + 1, 1);
    if (!tl || !done) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    for (int i = 0; i < r->nparts; i++) {
        int64_t from = one_part >= 0 ? one_off : r->lo[i];
        if ((one_part >= 0 && r->parts[i] != one_part) || from >= r->hi[i]) {
            done[i] = 1;
            continue;
        }
        rd_kafka_topic_partition_list_add(tl, topic, r->parts[i])->offset = from;
        left++;
    }
    if (left == 0) goto out;
    rd_kafka_resp_err_t e = rd_kafka_assign(r->rk, tl);
    if (e) {
        rc = oq_error_set(err, OQ_EKAFKA, 0, "assign: %s", rd_kafka_err2str(e));
        goto out;
    }
    int64_t deadline = oq_mono_us() + (int64_t)timeout_ms * 1000;
    while (left > 0 && seen < limit) {
        if (oq_mono_us() >= deadline) {
            rc = oq_error_set(err, OQ_ETIMEDOUT, 0,
                              "%s: not read to its end within %d ms (%ld message(s) read)", topic,
                              timeout_ms, seen);
            break;
        }
        rd_kafka_message_t *m = rd_kafka_consumer_poll(r->rk, 100);
        if (!m) continue;
        int i = reader_index(r, m->partition);
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            if (i >= 0 && !done[i]) done[i] = 1, left--;
        } else if (m->err) {
            rc = oq_error_set(err, OQ_EKAFKA, 0, "%s: %s", topic, rd_kafka_message_errstr(m));
        } else if (i >= 0 && !done[i]) {
            seen++;
            rc = cb(m, opaque);
            if (m->offset + 1 >= r->hi[i]) done[i] = 1, left--;
        }
        rd_kafka_message_destroy(m);
        if (rc) break;
    }
out:
    free(done);
    if (tl) rd_kafka_topic_partition_list_destroy(tl);
    return rc;
}

/* --- the actions ----------------------------------------------------------------------------- */

static int collect(const rd_kafka_message_t *m, void *opaque)
{
    json_t *o = msg_json(m, 0);
    if (!o) return OQ_ENOMEM;
    json_object_del(o, "payload"); /* the list shows what, not the bytes */
    return json_array_append_new((json_t *)opaque, o) ? OQ_ENOMEM : 0;
}

static int by_ref(const void *a, const void *b)
{
    const json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    int64_t tx = json_integer_value(json_object_get(x, "timestamp"));
    int64_t ty = json_integer_value(json_object_get(y, "timestamp"));
    if (tx != ty) return tx < ty ? -1 : 1;
    int64_t px = json_integer_value(json_object_get(x, "partition"));
    int64_t py = json_integer_value(json_object_get(y, "partition"));
    if (px != py) return px < py ? -1 : 1;
    int64_t ox = json_integer_value(json_object_get(x, "offset"));
    int64_t oy = json_integer_value(json_object_get(y, "offset"));
    return ox < oy ? -1 : ox > oy;
}

/* The list sorted by time (then partition and offset). */
static json_t *sorted(json_t *a)
{
    size_t n = json_array_size(a);
    json_t **v = calloc(n + 1, sizeof *v), *out = json_array();
    for (size_t i = 0; v && i < n; i++)
        v[i] = json_array_get(a, i);
    if (v) qsort(v, n, sizeof *v, by_ref);
    for (size_t i = 0; v && out && i < n; i++)
        json_array_append(out, v[i]);
    free(v);
    json_decref(a);
    return out;
}

static void print_list(json_t *a, const char *where)
{
    size_t i;
    json_t *r;
    if (json_array_size(a) == 0) {
        printf("no dead letters in %s\n", where);
        return;
    }
    printf("%-10s %-24s %-22s %-26s %-36s %s\n", "REF", "TIME", "REASON", "ORIGIN", "MESSAGE_ID",
           "DETAIL");
    json_array_foreach(a, i, r)
    {
        char ts[32], origin[300] = "-";
        json_t *o = json_object_get(r, "origin");
        oq_time_format(json_integer_value(json_object_get(r, "timestamp")), ts);
        if (json_is_object(o))
            snprintf(origin, sizeof origin, "%s:%lld:%lld", jstr(o, "topic", "?"),
                     (long long)json_integer_value(json_object_get(o, "partition")),
                     (long long)json_integer_value(json_object_get(o, "offset")));
        const char *detail = jstr(r, "detail", "-");
        printf("%-10s %-24s %-22s %-26s %-36s ", jstr(r, "ref", "?"), ts, jstr(r, "reason", "-"),
               origin, jstr(r, "message_id", "-"));
        print_escaped(detail, strlen(detail), 80);
        const char *from = json_string_value(json_object_get(r, "redrive"));
        printf("%s%s%s\n", from ? " (redriven from " : "", from ? from : "", from ? ")" : "");
    }
    printf("%zu dead letter(s) in %s: onceq dlq show REF, then onceq dlq redrive REF once the "
           "cause is fixed\n",
           json_array_size(a), where);
}

static int do_list(const oq_config_t *cfg, const char *topic)
{
    oq_error_t err = {0};
    reader_t r;
    json_t *a = json_array();
    int tmo = (int)oq_config_int(cfg, "timeout");
    int rc = a ? reader_open(cfg, topic, tmo, &r, &err) : OQ_ENOMEM;
    if (rc == 0)
        rc = reader_run(&r, topic, -1, 0, (long)oq_config_int(cfg, "limit"), tmo, collect, a, &err);
    reader_close(&r);
    if (rc) {
        fprintf(stderr, "onceq dlq list: %s\n", err.msg[0] ? err.msg : "out of memory");
        json_decref(a);
        return oq_cli_exit_for(rc);
    }
    a = sorted(a);
    if (oq_config_int(cfg, "json"))
        print_json(a);
    else
        print_list(a, topic);
    json_decref(a);
    return OQ_EXIT_OK;
}

/* "P:O" (or "TOPIC:P:O", as the onceq-redrive header writes it). */
static int parse_ref(const char *s, int32_t *p, int64_t *o)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s) return -1;
    const char *ps = colon - 1;
    while (ps > s && ps[-1] != ':')
        ps--;
    char *end = NULL;
    long part = strtol(ps, &end, 10);
    if (end != colon || part < 0 || part > INT32_MAX) return -1;
    long long off = strtoll(colon + 1, &end, 10);
    if (!colon[1] || *end || off < 0) return -1;
    *p = (int32_t)part;
    *o = off;
    return 0;
}

typedef struct {
    int64_t offset;
    json_t *j; /* msg_json of the message, headers included */
    void *key, *payload;
    size_t key_len, len;
} fetch_t;

static void *memdup0(const void *p, size_t n)
{
    char *c = malloc(n + 1);
    if (c && n) memcpy(c, p, n);
    if (c) c[n] = '\0';
    return c;
}

static int keep_one(const rd_kafka_message_t *m, void *opaque)
{
    fetch_t *f = opaque;
    if (m->offset < f->offset) return 0;
    if (m->offset > f->offset) return 1; /* compacted away: not found */
    f->j = msg_json(m, 1);
    f->key = m->key ? memdup0(m->key, m->key_len) : NULL;
    f->key_len = m->key ? m->key_len : 0;
    f->payload = memdup0(m->payload, m->payload ? m->len : 0);
    f->len = m->payload ? m->len : 0;
    if (!f->j || !f->payload || (m->key && !f->key)) return OQ_ENOMEM;
    return 1; /* stop */
}

static void fetch_free(fetch_t *f)
{
    json_decref(f->j);
    free(f->key);
    free(f->payload);
    memset(f, 0, sizeof(*f));
}

/* One dead letter into \p f: 0, OQ_ENOTFOUND, or another error (\p err filled). */
static int fetch(const oq_config_t *cfg, const char *topic, const char *ref, fetch_t *f,
                 oq_error_t *err)
{
    int tmo = (int)oq_config_int(cfg, "timeout");
    int32_t p;
    int64_t o;
    reader_t r;
    memset(f, 0, sizeof(*f));
    if (parse_ref(ref, &p, &o) != 0)
        return oq_error_set(err, OQ_EINVAL, 0,
                            "'%s': expected PARTITION:OFFSET (see onceq dlq list)", ref);
    int rc = reader_open(cfg, topic, tmo, &r, err);
    if (rc == 0) {
        int i = reader_index(&r, p);
        if (i < 0)
            rc = oq_error_set(err, OQ_ENOTFOUND, 0, "%s has no partition %" PRId32, topic, p);
        else if (o < r.lo[i] || o >= r.hi[i])
            rc = oq_error_set(err, OQ_ENOTFOUND, 0,
                              "no message %" PRId32 ":%" PRId64 " in %s (partition %" PRId32
                              " holds offsets %" PRId64 "..%" PRId64 ")",
                              p, o, topic, p, r.lo[i], r.hi[i] - 1);
    }
    if (rc == 0) {
        f->offset = o;
        rc = reader_run(&r, topic, p, o, 1000000, tmo, keep_one, f, err);
        if (rc == 1) rc = 0;
        if (rc == 0 && !f->j)
            rc = oq_error_set(err, OQ_ENOTFOUND, 0,
                              "no message %" PRId32 ":%" PRId64 " in %s (compacted away)", p, o,
                              topic);
    }
    reader_close(&r);
    if (rc) fetch_free(f);
    return rc;
}

static int do_show(const oq_config_t *cfg, const char *topic, const char *ref)
{
    oq_error_t err = {0};
    fetch_t f;
    int rc = fetch(cfg, topic, ref, &f, &err);
    if (rc) {
        fprintf(stderr, "onceq dlq show: %s\n", err.msg[0] ? err.msg : "out of memory");
        return oq_cli_exit_for(rc);
    }
    if (oq_config_int(cfg, "payload")) {
        fwrite(f.payload, 1, f.len, stdout);
    } else if (oq_config_int(cfg, "json")) {
        print_json(f.j);
    } else {
        char ts[32];
        json_t *o = json_object_get(f.j, "origin"), *h = json_object_get(f.j, "headers"), *kv;
        size_t i;
        oq_time_format(json_integer_value(json_object_get(f.j, "timestamp")), ts);
        printf("dead letter %s:%s (%s)\nreason      %s\ndetail      %s\n", topic,
               jstr(f.j, "ref", "?"), ts, jstr(f.j, "reason", "- (no reason header)"),
               jstr(f.j, "detail", "-"));
        if (json_is_object(o))
            printf("origin      %s partition %lld offset %lld\n", jstr(o, "topic", "?"),
                   (long long)json_integer_value(json_object_get(o, "partition")),
                   (long long)json_integer_value(json_object_get(o, "offset")));
        else
            printf("origin      unknown (no %s header: redrive needs --origin-topic)\n",
                   OQ_HDR_DLQ_TOPIC);
        printf("message id  %s\nkey         ", jstr(f.j, "message_id", "-"));
        if (f.key)
            print_escaped(f.key, f.key_len, 300);
        else
            printf("-");
        printf("\nheaders\n");
        json_array_foreach(h, i, kv)
        {
            const char *v = json_string_value(json_array_get(kv, 1));
            printf("  %-28s ", json_string_value(json_array_get(kv, 0)));
            print_escaped(v ? v : "(not UTF-8)", v ? strlen(v) : 11, 300);
            printf("\n");
        }
        printf("payload     %zu bytes\n  ", f.len);
        print_escaped(f.payload, f.len, 4096);
        printf("\n");
    }
    fetch_free(&f);
    return OQ_EXIT_OK;
}

typedef struct {
    int done;
    rd_kafka_resp_err_t err;
    int32_t partition;
    int64_t offset;
} delivery_t;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    delivery_t *d = m->_private;
    if (!d) return;
    d->done = 1;
    d->err = m->err;
    d->partition = m->partition;
    d->offset = m->offset;
}

/* Reads --payload-file into *buf; a repaired envelope must decode and keep \p message_id. */
static int read_fixed(const char *path, const char *message_id, char **buf, size_t *len,
                      oq_error_t *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return oq_error_set(err, OQ_EINVAL, errno, "--payload-file %s: cannot open", path);
    oq_buf_t fb = {0};
    if (oq_buf_read(&fb, fp, 64 * 1024 * 1024) != 0) {
        oq_buf_free(&fb);
        fclose(fp);
        return oq_error_set(err, OQ_EINVAL, 0, "--payload-file %s: too large", path);
    }
    size_t n = 0;
    char *b = oq_buf_take(&fb, &n);
    if (!b) {
        fclose(fp);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    fclose(fp);
    while (n > 0 && (b[n - 1] == '\n' || b[n - 1] == '\r'))
        n--; /* an editor's final newline */
    oq_envelope_t e;
    oq_error_t derr = {0};
    memset(&e, 0, sizeof(e));
    int rc = oq_envelope_decode(b, n, &e, &derr);
    if (rc)
        rc = oq_error_set(err, OQ_EINVAL, 0,
                          "--payload-file %s does not decode as an envelope: %s (nothing "
                          "published)",
                          path, derr.msg);
    else if (e.kind != OQ_KIND_TOOL_CALL)
        rc = oq_error_set(err, OQ_EINVAL, 0, "--payload-file %s: not a tool_call envelope", path);
    else if (message_id && strcmp(e.message_id, message_id) != 0)
        rc = oq_error_set(err, OQ_EINVAL, 0,
                          "--payload-file %s: message_id %s, but the dead letter's is %s: keep it "
                          "so the inbox lets the message through once (nothing published)",
                          path, e.message_id, message_id);
    oq_envelope_clear(&e);
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = n;
    return 0;
}

static int do_redrive(const oq_config_t *cfg, const char *topic, const char *ref)
{
    oq_error_t err = {0};
    fetch_t f;
    char errstr[512], src[300], *fixed = NULL;
    size_t fixed_len = 0;
    rd_kafka_t *rk = NULL;
    int ret = OQ_EXIT_FAIL;
    int rc = fetch(cfg, topic, ref, &f, &err);
    if (rc) {
        fprintf(stderr, "onceq dlq redrive: %s\n", err.msg[0] ? err.msg : "out of memory");
        return oq_cli_exit_for(rc);
    }
    json_t *o = json_object_get(f.j, "origin");
    const char *to = json_is_object(o) ? jstr(o, "topic", NULL) : NULL;
    const char *mid = jstr(f.j, "message_id", NULL);
    if (oq_config_str(cfg, "origin-topic")) to = oq_config_str(cfg, "origin-topic");
    snprintf(src, sizeof src, "%s:%s", topic, jstr(f.j, "ref", "?"));
    if (!to) {
        fprintf(stderr,
                "onceq dlq redrive: %s: origin unknown (no %s header; written before dead letters "
                "carried their origin): nothing published. Name the topic with --origin-topic "
                "(normally %s)\n",
                src, OQ_HDR_DLQ_TOPIC, "PREFIX + tool-calls");
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (strcmp(to, topic) == 0) {
        fprintf(stderr,
                "onceq dlq redrive: %s: the origin is the dead-letter topic itself: "
                "nothing published\n",
                src);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (!mid || !mid[0]) {
        fprintf(stderr,
                "onceq dlq redrive: %s: no %s header, so the inbox could not tell copies apart: "
                "nothing published\n",
                src, OQ_HDR_MESSAGE_ID);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    const char *fpath = oq_config_str(cfg, "payload-file");
    if (fpath && read_fixed(fpath, mid, &fixed, &fixed_len, &err) != 0) {
        fprintf(stderr, "onceq dlq redrive: %s\n", err.msg);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    rd_kafka_conf_t *conf =
        oq_kafka_conf_new(OQ_KAFKA_PRODUCER, oq_config_str(cfg, "brokers"), cfg, &err);
    if (!conf || oq_kafka_conf_set(conf, "enable.idempotence", "true", &err) ||
        oq_kafka_conf_set(conf, "acks", "all", &err)) {
        if (conf) rd_kafka_conf_destroy(conf);
        fprintf(stderr, "onceq dlq redrive: %s\n", err.msg);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    if (!(rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr))) {
        rd_kafka_conf_destroy(conf);
        fprintf(stderr, "onceq dlq redrive: kafka producer: %s\n", errstr);
        goto out;
    }
    delivery_t d = {0};
    rd_kafka_resp_err_t e = rd_kafka_producev(
        rk, RD_KAFKA_V_TOPIC(to), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_KEY(f.key, f.key_len),
        RD_KAFKA_V_VALUE(fixed ? fixed : f.payload, fixed ? fixed_len : f.len),
        RD_KAFKA_V_HEADER(OQ_HDR_MESSAGE_ID, mid, -1), RD_KAFKA_V_HEADER(OQ_HDR_REDRIVE, src, -1),
        RD_KAFKA_V_OPAQUE(&d), RD_KAFKA_V_END);
    if (e) {
        fprintf(stderr, "onceq dlq redrive: produce to %s: %s\n", to, rd_kafka_err2str(e));
        goto out;
    }
    int64_t deadline = oq_mono_us() + oq_config_int(cfg, "timeout") * 1000;
    while (!d.done && oq_mono_us() < deadline)
        rd_kafka_poll(rk, 100);
    if (!d.done || d.err) {
        fprintf(stderr,
                "onceq dlq redrive: %s -> %s: %s (it may still arrive; a second copy "
                "would be absorbed by the inbox)\n",
                src, to, d.done ? rd_kafka_err2str(d.err) : "no delivery report in time");
        goto out;
    }
    printf("redriven %s -> %s partition %" PRId32 " offset %" PRId64
           " (message id %s, %s bytes%s)\n",
           src, to, d.partition, d.offset, mid, fixed ? "repaired" : "original",
           fixed ? " from --payload-file" : "");
    ret = OQ_EXIT_OK;
out:
    if (rk) {
        rd_kafka_flush(rk, 1000);
        rd_kafka_destroy(rk);
    }
    free(fixed);
    fetch_free(&f);
    return ret;
}

/* --- the relay's dead outbox rows ------------------------------------------------------------ */

static int do_dead_rows(const oq_config_t *cfg, const char *action, const char *ref)
{
    oq_error_t err = {0};
    oq_dbh_t db = {0};
    json_t *a = NULL;
    int ret = OQ_EXIT_FAIL;
    int64_t seq = 0;
    const char *setting = oq_config_str(cfg, "outbox-db"), *path = oq_dbh_label(setting);
    if (ref) {
        char *end = NULL;
        seq = strtoll(ref, &end, 10);
        if (!ref[0] || *end || seq <= 0) {
            fprintf(stderr, "onceq dlq show: '%s': expected the SEQ of an outbox_dead row\n", ref);
            return OQ_EXIT_USAGE;
        }
    }
    oq_db_opts_t o = {NULL, 0, 1};
    if (oq_dbh_open(setting, &o, &db, &err) != 0 ||
        oq_relay_db_dead_list(&db, ref ? seq : 0, (int)oq_config_int(cfg, "limit"), &a, &err) !=
            0) {
        fprintf(stderr, "onceq dlq %s: %s: %s\n", action, path, err.msg);
        if (err.code == OQ_EINVAL) ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (ref && json_array_size(a) == 0) {
        fprintf(stderr, "onceq dlq show: no outbox_dead row %lld in %s\n", (long long)seq, path);
        ret = OQ_EXIT_NOTFOUND;
        goto out;
    }
    json_t *row = json_array_get(a, 0);
    if (ref && oq_config_int(cfg, "payload")) {
        const char *p = jstr(row, "payload", "");
        fwrite(p, 1, strlen(p), stdout);
    } else if (oq_config_int(cfg, "json")) {
        print_json(ref ? row : a);
    } else if (!ref) {
        size_t i;
        json_array_foreach(a, i, row)
        {
            char ts[32];
            if (i == 0)
                printf("%-8s %-24s %-22s %-34s %-36s %s\n", "SEQ", "DEAD_AT", "REASON", "KEY",
                       "MESSAGE_ID", "HANDLED");
            oq_time_format(json_integer_value(json_object_get(row, "dead_at")), ts);
            printf("%-8lld %-24s %-22s %-34s %-36s %s\n",
                   (long long)json_integer_value(json_object_get(row, "seq")), ts,
                   jstr(row, "reason", "?"), jstr(row, "key", "?"), jstr(row, "message_id", "?"),
                   json_is_integer(json_object_get(row, "handled_at")) ? "yes" : "no");
        }
        if (json_array_size(a) == 0)
            printf("no dead outbox rows in %s\n", path);
        else
            printf("%zu dead outbox row(s) in %s: Kafka refused them for good; the producer "
                   "fails their calls (unpublishable), a client resubmits after the fix\n",
                   json_array_size(a), path);
    } else {
        char ts[32];
        oq_time_format(json_integer_value(json_object_get(row, "dead_at")), ts);
        const char *p = jstr(row, "payload", "");
        printf("outbox_dead %lld of %s (%s)\nreason      %s\ndetail      %s\ntopic       "
               "%s\nkey         %s\nmessage id  %s\nhandled     %s\npayload     %zu bytes\n  ",
               (long long)seq, path, ts, jstr(row, "reason", "?"), jstr(row, "detail", "-"),
               jstr(row, "topic", "?"), jstr(row, "key", "?"), jstr(row, "message_id", "?"),
               json_is_integer(json_object_get(row, "handled_at")) ? "yes" : "no", strlen(p));
        print_escaped(p, strlen(p), 4096);
        printf("\n");
    }
    ret = OQ_EXIT_OK;
out:
    json_decref(a);
    oq_dbh_close(&db);
    return ret;
}

/* --- the producer's dead webhook deliveries ------------------------------------------------ */

static int do_webhooks(const oq_config_t *cfg, const char *action, const char *ref)
{
    oq_error_t err = {0};
    json_t *a = NULL;
    const char *db = oq_config_str(cfg, "webhooks-db");
    int on_pg = oq_backend_of(db) == OQ_BACKEND_POSTGRES;
    const char *shown = on_pg ? "postgres" : db;
    if (on_pg && oq_pg_conninfo_has_password(db)) {
        fprintf(stderr, "onceq dlq %s: --webhooks-db holds a password: put it in a passfile\n",
                action);
        return OQ_EXIT_USAGE;
    }
    if (strcmp(action, "redrive") == 0) {
        int n = 0;
        if (oq_webhooks_redrive(db, ref, getenv("USER"), &n, &err) != 0) {
            fprintf(stderr, "onceq dlq redrive: %s: %s\n", shown, err.msg);
            return OQ_EXIT_FAIL;
        }
        if (n == 0 && strcmp(ref, "all") != 0) {
            fprintf(stderr, "onceq dlq redrive: no dead webhook delivery %s in %s\n", ref, shown);
            return OQ_EXIT_NOTFOUND;
        }
        printf("redriven %d webhook deliver%s: the producer sends %s again (same "
               "Idempotency-Key, a fresh budget of tries)\n",
               n, n == 1 ? "y" : "ies", n == 1 ? "it" : "them");
        return OQ_EXIT_OK;
    }
    if (oq_webhooks_list(db, ref, (int)oq_config_int(cfg, "limit"), &a, &err) != 0) {
        fprintf(stderr, "onceq dlq %s: %s: %s\n", action, shown, err.msg);
        return OQ_EXIT_FAIL;
    }
    int ret = OQ_EXIT_OK;
    json_t *row = json_array_get(a, 0);
    if (ref && !row) {
        fprintf(stderr, "onceq dlq show: no webhook delivery %s in %s\n", ref, shown);
        ret = OQ_EXIT_NOTFOUND;
    } else if (ref && oq_config_int(cfg, "payload")) {
        const char *p = jstr(row, "body", "");
        fwrite(p, 1, strlen(p), stdout);
    } else if (oq_config_int(cfg, "json")) {
        print_json(ref ? row : a);
    } else if (!ref) {
        size_t i;
        json_array_foreach(a, i, row)
        {
            char ts[32];
            if (i == 0)
                printf("%-36s %-34s %-24s %-5s %-6s %s\n", "DELIVERY_ID", "CALL_ID", "DEAD_AT",
                       "TRIES", "STATUS", "URL / LAST ERROR");
            oq_time_format(json_integer_value(json_object_get(row, "updated_at")), ts);
            json_t *st = json_object_get(row, "last_status");
            char status[16] = "-";
            if (json_is_integer(st))
                snprintf(status, sizeof status, "%lld", (long long)json_integer_value(st));
            printf("%-36s %-34s %-24s %-5lld %-6s %s\n    %s\n", jstr(row, "delivery_id", "?"),
                   jstr(row, "call_id", "?"), ts,
                   (long long)json_integer_value(json_object_get(row, "tries")), status,
                   jstr(row, "url", "?"), jstr(row, "last_error", "-"));
        }
        if (json_array_size(a) == 0)
            printf("no dead webhook deliveries in %s\n", shown);
        else
            printf("%zu dead webhook deliver%s in %s: fix the receiver, then onceq dlq redrive "
                   "ID (or all) --webhooks-db\n",
                   json_array_size(a), json_array_size(a) == 1 ? "y" : "ies", shown);
    } else {
        json_t *st = json_object_get(row, "last_status");
        const char *body = jstr(row, "body", "");
        printf("delivery    %s (%s)\ncall        %s attempt %lld tenant %s\nurl         %s\n"
               "tries       %lld\nlast status %s%lld\nlast error  %s\nbody        %zu bytes\n  ",
               jstr(row, "delivery_id", "?"), jstr(row, "state", "?"), jstr(row, "call_id", "?"),
               (long long)json_integer_value(json_object_get(row, "attempt")),
               jstr(row, "tenant", "?"), jstr(row, "url", "?"),
               (long long)json_integer_value(json_object_get(row, "tries")),
               json_is_integer(st) ? "" : "none ", (long long)json_integer_value(st),
               jstr(row, "last_error", "-"), strlen(body));
        print_escaped(body, strlen(body), 4096);
        printf("\n");
    }
    json_decref(a);
    return ret;
}

int oq__cmd_dlq(int argc, char **argv)
{
    int ret = OQ_EXIT_USAGE;
    oq_config_t *cfg = oq_config_new(dlq_settings, sizeof dlq_settings / sizeof dlq_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    int prc = oq_cli_parse(cfg, "onceq", dlq_usage, argc, argv);
    if (prc >= 0) {
        ret = prc;
        goto out;
    }
    int npos = oq_config_npositional(cfg);
    const char *action = npos > 0 ? oq_config_positional(cfg, 0) : NULL;
    int list = action && strcmp(action, "list") == 0, show = action && strcmp(action, "show") == 0;
    int redrive = action && strcmp(action, "redrive") == 0;
    if (!list && !show && !redrive) {
        fprintf(stderr, "onceq dlq: %s%s%s\n%s\n", action ? "unknown action '" : "which action?",
                action ? action : "", action ? "'" : "", dlq_usage);
        goto out;
    }
    if ((list && npos != 1) || (!list && npos != 2)) {
        fprintf(stderr, "onceq dlq %s: %s\n%s\n", action,
                list ? "takes no argument"
                     : "takes one dead letter (PARTITION:OFFSET, or SEQ with --outbox-db)",
                dlq_usage);
        goto out;
    }
    const char *ref = npos == 2 ? oq_config_positional(cfg, 1) : NULL;
    if (!redrive &&
        (oq_config_is_set(cfg, "payload-file") || oq_config_is_set(cfg, "origin-topic"))) {
        fprintf(stderr, "onceq dlq %s: --payload-file and --origin-topic go with redrive\n",
                action);
        goto out;
    }
    if (oq_config_int(cfg, "payload") && !show) {
        fprintf(stderr, "onceq dlq %s: --payload goes with show\n", action);
        goto out;
    }
    if (oq_config_str(cfg, "webhooks-db")) {
        if (oq_config_str(cfg, "brokers") || oq_config_str(cfg, "outbox-db")) {
            fprintf(stderr,
                    "onceq dlq %s: --webhooks-db goes alone (not with --brokers or --outbox-db)\n",
                    action);
            goto out;
        }
        ret = do_webhooks(cfg, action, ref);
        goto out;
    }
    if (oq_config_str(cfg, "outbox-db")) {
        if (redrive) {
            fprintf(stderr,
                    "onceq dlq redrive: the relay's dead outbox rows are not redriven: Kafka "
                    "refused them for good, and the producer fails their calls (unpublishable); "
                    "fix the cause (e.g. the topic's max.message.bytes), then the client "
                    "resubmits with the same key\n");
            goto out;
        }
        if (oq_config_str(cfg, "brokers")) {
            fprintf(stderr,
                    "onceq dlq %s: --outbox-db (the relay's dead rows) or --brokers (the DLQ "
                    "topic), not both\n",
                    action);
            goto out;
        }
        ret = do_dead_rows(cfg, action, ref);
        goto out;
    }
    if (!oq_config_str(cfg, "brokers")) {
        fprintf(stderr,
                "onceq dlq %s: --brokers is required (or --outbox-db for the relay's dead "
                "outbox rows)\n",
                action);
        goto out;
    }
    const char *prefix = oq_config_str(cfg, "topic-prefix");
    if (oq_cli_check_topic_prefix(cfg, "dlq") != 0) {
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    char dlq_topic[OQ_TOPIC_NAME_CAP];
    const char *topic = oq_config_str(cfg, "dlq-topic");
    if (!topic) topic = oq_topic_name(prefix, OQ_TOPIC_DLQ, dlq_topic, sizeof dlq_topic);
    if (list)
        ret = do_list(cfg, topic);
    else if (show)
        ret = do_show(cfg, topic, ref);
    else
        ret = do_redrive(cfg, topic, ref);
out:
    oq_config_destroy(cfg);
    return ret;
}
