/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_relay_fill: appends rows to a database's outbox for the relay tests and benchmark.
 *
 *   oq_relay_fill --db PATH --rows N [--keys K] [--size BYTES] [--batch B] [--topic T]
 *                 [--rate ROWS_PER_S] [--set producer|consumer] [--synchronous normal]
 *
 * Migrates PATH with the producer (default) or consumer migration set, then appends N rows in
 * transactions of B rows (oq_outbox_append): message_id a fresh UUIDv7, key "k<i mod K>"
 * (K keys, default 100), topic T (default onceq.tool-calls), payload a JSON object
 * {"i":<row number>,"pad":"xx..."} padded to about BYTES (default 300). With --rate the
 * commits are spread out so a relay runs concurrently with the filling. Prints one summary
 * line "filled rows=N secs=S". A test tool: exits from main, writes to stdout.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_db.h"
#include "oq_log.h"
#include "oq_util.h"

int main(int argc, char **argv)
{
    const char *db_path = NULL, *topic = "onceq.tool-calls", *set = "producer", *sync = "FULL";
    long rows = 0, keys = 100, size = 300, batch = 1000;
    double rate = 0;
    static const struct option lo[] = {
        {"db", required_argument, NULL, 'd'},          {"rows", required_argument, NULL, 'n'},
        {"keys", required_argument, NULL, 'k'},        {"size", required_argument, NULL, 's'},
        {"batch", required_argument, NULL, 'b'},       {"topic", required_argument, NULL, 't'},
        {"rate", required_argument, NULL, 'r'},        {"set", required_argument, NULL, 'S'},
        {"synchronous", required_argument, NULL, 'y'}, {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'd':
            db_path = optarg;
            break;
        case 'n':
            rows = atol(optarg);
            break;
        case 'k':
            keys = atol(optarg);
            break;
        case 's':
            size = atol(optarg);
            break;
        case 'b':
            batch = atol(optarg);
            break;
        case 't':
            topic = optarg;
            break;
        case 'r':
            rate = atof(optarg);
            break;
        case 'S':
            set = optarg;
            break;
        case 'y':
            sync = optarg;
            break;
        default:
            fprintf(stderr, "usage: oq_relay_fill --db PATH --rows N [--keys K] [--size B] "
                            "[--batch B] [--topic T] [--rate R] [--set producer|consumer]\n");
            return 2;
        }
    }
    if (!db_path || rows < 0 || keys < 1 || batch < 1 || size < 16) {
        fprintf(stderr, "oq_relay_fill: --db and --rows are required\n");
        return 2;
    }
    oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 1);
    oq_error_t err = {0};
    sqlite3 *db = NULL;
    oq_db_opts_t o = {.synchronous = sync};
    if (oq_db_open(db_path, &o, &db, &err) != 0 ||
        oq_db_migrate(
            db, strcmp(set, "consumer") == 0 ? oq_migrations_consumer : oq_migrations_producer,
            &err) != 0) {
        fprintf(stderr, "oq_relay_fill: %s\n", err.msg);
        return 1;
    }
    oq_stmt_cache_t *cache = oq_stmt_cache_new(db);
    char *payload = malloc((size_t)size + 64);
    if (!cache || !payload) return 1;
    int64_t t0 = oq_mono_us();
    long done = 0;
    while (done < rows) {
        if (oq_db_begin_immediate(db, 30000, &err) != 0) {
            fprintf(stderr, "oq_relay_fill: %s\n", err.msg);
            return 1;
        }
        long end = done + batch < rows ? done + batch : rows;
        for (long i = done; i < end; i++) {
            char mid[OQ_UUID_LEN + 1], key[32];
            oq_id_uuid(mid);
            snprintf(key, sizeof(key), "k%ld", i % keys);
            int n = snprintf(payload, (size_t)size + 64, "{\"i\":%ld,\"pad\":\"", i);
            while (n < size - 2)
                payload[n++] = 'x';
            payload[n++] = '"';
            payload[n++] = '}';
            payload[n] = '\0';
            oq_outbox_row_t row = {.message_id = mid,
                                   .topic = topic,
                                   .key = key,
                                   .payload = payload,
                                   .payload_len = (size_t)n,
                                   .created_at = oq_now_ms()};
            if (oq_outbox_append(db, cache, &row, &err) != 0) {
                fprintf(stderr, "oq_relay_fill: %s\n", err.msg);
                return 1;
            }
        }
        if (oq_db_commit(db, &err) != 0) {
            fprintf(stderr, "oq_relay_fill: %s\n", err.msg);
            return 1;
        }
        done = end;
        if (rate > 0) {
            int64_t due = t0 + (int64_t)((double)done / rate * 1e6);
            int64_t now = oq_mono_us();
            if (due > now) oq_sleep_ms((due - now) / 1000, NULL);
        }
    }
    printf("filled rows=%ld secs=%.3f\n", done, (double)(oq_mono_us() - t0) / 1e6);
    oq_stmt_cache_destroy(cache);
    sqlite3_close_v2(db);
    free(payload);
    return 0;
}
