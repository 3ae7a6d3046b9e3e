/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_relay_check: reads a topic back from the beginning and checks it against a database's
 * outbox, for the relay tests.
 *
 *   oq_relay_check --brokers B --db PATH [--topic T] [--timeout-ms MS] [--allowed-dups FILE]
 *                  [--max-dups N] [--verbose] [--topic-prefix P]
 *
 * T is the rows' (logical) topic; with --topic-prefix the topic read is its physical name
 * under P (oq_topic_name), as the relay publishes it.
 *
 * Loads every outbox row (message_id, seq, key, payload), assigns all partitions of T
 * (default onceq.tool-calls) at the beginning (no group join, no commits) and consumes until
 * every row was seen and every partition is at its end, or MS (default 30000) passes. For each
 * message it takes the `onceq-message-id` header and checks:
 *   - the id is a row of the outbox (else "unknown"), key and value equal the row's;
 *   - per key, first copies arrive in seq order (a later copy of an already seen id is a
 *     duplicate, not an order violation: consumers dedupe it); with --order last, the last
 *     copies instead (the relay's guarantee when the user sets a finite message.timeout.ms);
 *   - with --allowed-dups, a duplicated id must be listed in FILE (one id per line): the
 *     crash tests list the rows that were delivered but not yet marked when the relay died;
 *   - with --max-dups, at most N duplicate copies in total.
 * Prints "# summary total=.. received=.. distinct=.. missing=.. dups=.. bad_dups=.. unknown=..
 * order_violations=.. mismatched=.." and exits 0 only if nothing is missing and no check
 * failed (1 otherwise, 2 on bad usage). A test tool: exits from main, prints to stdout.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_util.h"

typedef struct {
    char *id;
    int64_t seq;
    int key;
    char *payload;
    int plen;
    int seen;
    int allowed_dup;
    int64_t last_offset; /* offset of the last copy (one key -> one partition) */
} row_t;

typedef struct {
    char **keys;
    int64_t *last_seq;
    size_t n, cap;
    int *table; /* open addressing: key index + 1 */
    size_t tcap;
} keys_t;

static row_t *g_rows;
static size_t g_nrows;
static int *g_idx; /* open addressing over g_rows by id: index + 1 */
static size_t g_icap;

static uint64_t hash_str(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static long find_row(const char *id, size_t n)
{
    for (size_t i = hash_str(id, n) & (g_icap - 1);; i = (i + 1) & (g_icap - 1)) {
        if (!g_idx[i]) return -1;
        row_t *r = &g_rows[g_idx[i] - 1];
        if (strlen(r->id) == n && memcmp(r->id, id, n) == 0) return g_idx[i] - 1;
    }
}

static int key_id(keys_t *k, const char *key)
{
    size_t n = strlen(key);
    size_t i = hash_str(key, n) & (k->tcap - 1);
    for (;; i = (i + 1) & (k->tcap - 1)) {
        if (!k->table[i]) break;
        if (strcmp(k->keys[k->table[i] - 1], key) == 0) return k->table[i] - 1;
    }
    if (k->n == k->cap) {
        k->cap = k->cap ? k->cap * 2 : 1024;
        k->keys = realloc(k->keys, k->cap * sizeof(*k->keys));
        k->last_seq = realloc(k->last_seq, k->cap * sizeof(*k->last_seq));
        if (!k->keys || !k->last_seq) exit(1);
    }
    k->keys[k->n] = strdup(key);
    k->last_seq[k->n] = -1;
    k->table[i] = (int)++k->n;
    return (int)k->n - 1;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 1024;
    while (c < n)
        c <<= 1;
    return c;
}

int main(int argc, char **argv)
{
    const char *brokers = NULL, *db_path = NULL, *topic = "onceq.tool-calls", *allowed = NULL,
               *prefix = NULL;
    long timeout_ms = 30000, max_dups = -1;
    int verbose = 0, order_last = 0;
    static const struct option lo[] = {{"brokers", required_argument, NULL, 'b'},
                                       {"db", required_argument, NULL, 'd'},
                                       {"topic", required_argument, NULL, 't'},
                                       {"timeout-ms", required_argument, NULL, 'T'},
                                       {"allowed-dups", required_argument, NULL, 'a'},
                                       {"max-dups", required_argument, NULL, 'm'},
                                       {"verbose", no_argument, NULL, 'v'},
                                       {"order", required_argument, NULL, 'o'},
                                       {"topic-prefix", required_argument, NULL, 'P'},
                                       {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'b':
            brokers = optarg;
            break;
        case 'd':
            db_path = optarg;
            break;
        case 't':
            topic = optarg;
            break;
        case 'P':
            prefix = optarg;
            break;
        case 'T':
            timeout_ms = atol(optarg);
            break;
        case 'a':
            allowed = optarg;
            break;
        case 'm':
            max_dups = atol(optarg);
            break;
        case 'v':
            verbose = 1;
            break;
        case 'o':
            order_last = strcmp(optarg, "last") == 0;
            break;
        default:
            return 2;
        }
    }
    if (!brokers || !db_path) {
        fprintf(stderr, "usage: oq_relay_check --brokers B --db PATH [--topic T] ...\n");
        return 2;
    }
    oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 1);

    /* --- the outbox ---------------------------------------------------------------------- */
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    oq_db_opts_t o = {.readonly = 1};
    if (oq_db_open(db_path, &o, &db, &err) != 0) {
        fprintf(stderr, "oq_relay_check: %s\n", err.msg);
        return 1;
    }
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT message_id, seq, key, payload FROM outbox WHERE topic = ?1 "
                           "ORDER BY seq",
                           -1, &st, NULL) != SQLITE_OK) {
        fprintf(stderr, "oq_relay_check: %s\n", sqlite3_errmsg(db));
        return 1;
    }
    sqlite3_bind_text(st, 1, topic, -1, SQLITE_STATIC);
    size_t cap = 0;
    keys_t keys = {0};
    keys.tcap = 1 << 20;
    keys.table = calloc(keys.tcap, sizeof(int));
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (g_nrows == cap) {
            cap = cap ? cap * 2 : 4096;
            g_rows = realloc(g_rows, cap * sizeof(*g_rows));
            if (!g_rows) return 1;
        }
        row_t *r = &g_rows[g_nrows++];
        memset(r, 0, sizeof(*r));
        r->id = strdup((const char *)sqlite3_column_text(st, 0));
        r->seq = sqlite3_column_int64(st, 1);
        r->key = key_id(&keys, (const char *)sqlite3_column_text(st, 2));
        r->plen = sqlite3_column_bytes(st, 3);
        r->payload = malloc((size_t)r->plen + 1);
        memcpy(r->payload, sqlite3_column_blob(st, 3), (size_t)r->plen);
    }
    sqlite3_finalize(st);
    sqlite3_close_v2(db);
    g_icap = pow2_at_least(g_nrows * 2 + 1);
    g_idx = calloc(g_icap, sizeof(int));
    for (size_t i = 0; i < g_nrows; i++) {
        size_t h = hash_str(g_rows[i].id, strlen(g_rows[i].id)) & (g_icap - 1);
        while (g_idx[h])
            h = (h + 1) & (g_icap - 1);
        g_idx[h] = (int)i + 1;
    }
    long allowed_n = 0;
    if (allowed) {
        FILE *f = fopen(allowed, "r");
        char line[256];
        while (f && fgets(line, sizeof(line), f)) {
            size_t n = strcspn(line, "\r\n ");
            long i = find_row(line, n);
            if (i >= 0) {
                g_rows[i].allowed_dup = 1;
                allowed_n++;
            }
        }
        if (f) fclose(f);
    }

    /* --- the topic ----------------------------------------------------------------------- */
    char errstr[512], group[64];
    char rnd[17];
    unsigned char b[8];
    oq_random_bytes(b, sizeof(b));
    oq_hex(b, sizeof(b), rnd);
    snprintf(group, sizeof(group), "oq-relay-check-%s", rnd);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set_log_cb(conf, oq_log_rdkafka_cb);
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "group.id", group, errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "enable.partition.eof", "true", errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "fetch.wait.max.ms", "10", errstr, sizeof(errstr))) {
        fprintf(stderr, "oq_relay_check: %s\n", errstr);
        return 2;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!rk) {
        fprintf(stderr, "oq_relay_check: %s\n", errstr);
        return 1;
    }
    rd_kafka_poll_set_consumer(rk);
    char phys[OQ_TOPIC_NAME_CAP];
    oq_topic_name(prefix, topic, phys, sizeof phys);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, phys, NULL);
    const rd_kafka_metadata_t *md = NULL;
    int nparts = 0;
    for (int tries = 0; tries < 50 && nparts == 0; tries++) {
        if (rd_kafka_metadata(rk, 0, rkt, &md, 2000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (md->topic_cnt == 1 && md->topics[0].err == 0) nparts = md->topics[0].partition_cnt;
            rd_kafka_metadata_destroy(md);
        }
        if (nparts == 0) oq_sleep_ms(200, NULL);
    }
    if (nparts == 0) {
        fprintf(stderr, "oq_relay_check: no metadata for topic %s\n", phys);
        return 1;
    }
    rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(nparts);
    for (int p = 0; p < nparts; p++)
        rd_kafka_topic_partition_list_add(tl, phys, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, tl);
    rd_kafka_topic_partition_list_destroy(tl);
    int *eof = calloc((size_t)nparts, sizeof(int));

    long received = 0, distinct = 0, dups = 0, bad_dups = 0, unknown = 0, violations = 0,
         mismatched = 0;
    int64_t deadline = oq_mono_us() + timeout_ms * 1000;
    while (oq_mono_us() < deadline) {
        int all_eof = 1;
        for (int p = 0; p < nparts; p++)
            all_eof &= eof[p];
        if (all_eof && (size_t)distinct == g_nrows) break;
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            if (m->partition >= 0 && m->partition < nparts) eof[m->partition] = 1;
            rd_kafka_message_destroy(m);
            continue;
        }
        if (m->err) {
            fprintf(stderr, "oq_relay_check: consume: %s\n", rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            continue;
        }
        if (m->partition >= 0 && m->partition < nparts) eof[m->partition] = 0;
        received++;
        rd_kafka_headers_t *hdrs = NULL;
        const void *hv = NULL;
        size_t hn = 0;
        long i = -1;
        if (rd_kafka_message_headers(m, &hdrs) == 0 &&
            rd_kafka_header_get_last(hdrs, OQ_HDR_MESSAGE_ID, &hv, &hn) == 0 && hv)
            i = find_row(hv, hn);
        if (i < 0) {
            unknown++;
            if (unknown <= 5)
                fprintf(stderr, "unknown message at %d/%" PRId64 "\n", (int)m->partition,
                        m->offset);
            rd_kafka_message_destroy(m);
            continue;
        }
        row_t *r = &g_rows[i];
        const char *kname = keys.keys[r->key];
        if (m->key_len != strlen(kname) || memcmp(m->key, kname, m->key_len) != 0 ||
            m->len != (size_t)r->plen || memcmp(m->payload, r->payload, m->len) != 0) {
            mismatched++;
        }
        if (verbose)
            printf("%d %" PRId64 " %s %s seq=%" PRId64 "%s\n", (int)m->partition, m->offset, kname,
                   r->id, r->seq, r->seen ? " dup" : "");
        r->last_offset = m->offset;
        if (r->seen++) {
            dups++;
            if (allowed && !r->allowed_dup) {
                bad_dups++;
                if (bad_dups <= 5)
                    fprintf(stderr, "duplicate not allowed: %s seq=%" PRId64 "\n", r->id, r->seq);
            }
        } else {
            distinct++;
            if (order_last) {
                /* checked at the end */
            } else if (r->seq < keys.last_seq[r->key]) {
                violations++;
                if (violations <= 5)
                    fprintf(stderr,
                            "order violation key=%s seq=%" PRId64 " after seq=%" PRId64
                            " (partition %d offset %" PRId64 ")\n",
                            kname, r->seq, keys.last_seq[r->key], (int)m->partition, m->offset);
            } else {
                keys.last_seq[r->key] = r->seq;
            }
        }
        rd_kafka_message_destroy(m);
    }
    if (order_last) {
        /* rows are in seq order: per key, the last copies' offsets must increase */
        int64_t *last_off = malloc(keys.n * sizeof(int64_t));
        for (size_t k = 0; k < keys.n; k++)
            last_off[k] = -1;
        for (size_t i = 0; i < g_nrows; i++) {
            row_t *r = &g_rows[i];
            if (!r->seen) continue;
            if (r->last_offset <= last_off[r->key]) {
                violations++;
                if (violations <= 5)
                    fprintf(stderr, "order violation (last copies) key=%s seq=%" PRId64 "\n",
                            keys.keys[r->key], r->seq);
            }
            last_off[r->key] = r->last_offset;
        }
        free(last_off);
    }
    long missing = (long)g_nrows - distinct;
    if (missing > 0) {
        int shown = 0;
        for (size_t i = 0; i < g_nrows && shown < 5; i++)
            if (!g_rows[i].seen) {
                fprintf(stderr, "missing: %s seq=%" PRId64 "\n", g_rows[i].id, g_rows[i].seq);
                shown++;
            }
    }
    printf("# summary total=%zu received=%ld distinct=%ld missing=%ld dups=%ld bad_dups=%ld "
           "allowed=%ld unknown=%ld order_violations=%ld mismatched=%ld keys=%zu partitions=%d\n",
           g_nrows, received, distinct, missing, dups, bad_dups, allowed_n, unknown, violations,
           mismatched, keys.n, nparts);
    rd_kafka_consumer_close(rk);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    for (size_t i = 0; i < g_nrows; i++) {
        free(g_rows[i].id);
        free(g_rows[i].payload);
    }
    for (size_t k = 0; k < keys.n; k++)
        free(keys.keys[k]);
    free(keys.keys);
    free(keys.last_seq);
    free(keys.table);
    free(g_rows);
    free(g_idx);
    free(eof);
    int ok = missing == 0 && bad_dups == 0 && unknown == 0 && violations == 0 && mismatched == 0 &&
             (max_dups < 0 || dups <= max_dups);
    return ok ? 0 : 1;
}
