/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq-bench submit`: durable submits per second through the C API (N submitter threads,
 * unique keys, group commit) against a plain single-thread SQLite loop that inserts the same
 * two rows (a calls row and an outbox row of the same size) with one transaction, hence one
 * fsync, per call. Both run in the same invocation on fresh databases in --dir, with the same
 * synchronous level, so the ratio is meaningful on a shared, noisy machine. Reports rate,
 * p50/p99/max latency of each, the average batch size, and the ratio.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_metrics.h"
#include "oq_producer.h"

static const oq_setting_t bench_settings[] = {
    {"threads", OQ_SET_INT, "32", 1, 1024, NULL, "concurrent submitters (onceq side)"},
    {"duration", OQ_SET_DURATION, "5s", 100, 600000, NULL, "length of each measurement"},
    {"dir", OQ_SET_STRING, "/tmp", 1, 4096, NULL, "directory for the two scratch databases"},
    {"synchronous", OQ_SET_ENUM, "full", 0, 0, "full|normal|off", "SQLite synchronous level"},
    {"commit-delay-us", OQ_SET_INT, "0", -1, 100000, NULL,
     "max wait to grow a group commit: 0 = adaptive, -1 = off"},
    {"keep", OQ_SET_BOOL, "false", 0, 0, NULL, "keep the scratch databases"},
    {"rate", OQ_SET_INT, "0", 0, 10000000, NULL,
     "offered calls/s over all threads, latency from each call's scheduled time (0 = as fast as "
     "they go)"},
    {"pg", OQ_SET_STRING, "", 0, 4096, NULL,
     "also run the onceq side on this PostgreSQL database (libpq URI), right after SQLite"},
};

static const char bench_usage[] =
    "usage: onceq-bench submit [--threads 32] [--duration 5s] [--dir /tmp] [--synchronous full] "
    "[--rate N] [--pg URL]";

typedef struct lat {
    int64_t *v;
    size_t n, cap;
} lat_t;

static void lat_add(lat_t *l, int64_t us)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4096;
        int64_t *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) return;
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = us;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const lat_t *l, double p)
{
    if (!l->n) return 0;
    size_t i = (size_t)(p / 100.0 * (double)(l->n - 1));
    return (double)l->v[i] / 1000.0;
}

static const char ARGS[] = "{\"amount\":1234,\"currency\":\"EUR\",\"note\":\"bench\"}";

/* --- baseline: one transaction (one fsync) per call ----------------------------------------- */

static int baseline(const char *path, const char *sync, int64_t dur_ms, double *rate, lat_t *l)
{
    oq_error_t err = {0};
    sqlite3 *db = NULL;
    oq_db_opts_t o = {sync, 0, 0};
    int ret = oq_db_open(path, &o, &db, &err);
    if (!ret) ret = oq_db_migrate(db, oq_migrations_producer, &err);
    if (ret) {
        fprintf(stderr, "baseline: %s\n", err.msg);
        if (db) sqlite3_close_v2(db);
        return ret;
    }
    sqlite3_stmt *ic = NULL, *io = NULL;
    sqlite3_prepare_v2(db,
                       "INSERT INTO calls(call_id,tenant,idem_key,fingerprint,tool,args,state,"
                       "attempt,created_at,updated_at,expires_at) "
                       "VALUES(?1,'default',?2,?3,'charge',?4,'pending',1,?5,?5,?6)",
                       -1, &ic, NULL);
    sqlite3_prepare_v2(db,
                       "INSERT INTO outbox(message_id,topic,key,payload,created_at) "
                       "VALUES(?1,'onceq.tool-calls',?2,?3,?4)",
                       -1, &io, NULL);
    char payload[512];
    int64_t n = 0, t0 = oq_mono_us(), end = t0 + dur_ms * 1000;
    while (oq_mono_us() < end) {
        int64_t s = oq_mono_us(), now = oq_now_ms();
        char id[OQ_CALL_ID_LEN + 1], mid[OQ_UUID_LEN + 1], key[48], fp[OQ_FINGERPRINT_LEN + 1];
        oq_id_call(id);
        oq_id_uuid(mid);
        snprintf(key, sizeof key, "base-%lld", (long long)n);
        memset(fp, 'a', OQ_FINGERPRINT_LEN);
        fp[OQ_FINGERPRINT_LEN] = '\0';
        snprintf(payload, sizeof payload,
                 "{\"v\":1,\"kind\":\"tool_call\",\"message_id\":\"%s\",\"call_id\":\"%s\","
                 "\"tenant\":\"default\",\"idem_key\":\"%s\",\"fingerprint\":\"%s\","
                 "\"tool\":\"charge\",\"args\":%s,\"attempt\":1,\"created_at\":%lld}",
                 mid, id, key, fp, ARGS, (long long)now);
        if (oq_db_exec(db, "BEGIN IMMEDIATE", &err)) break;
        sqlite3_bind_text(ic, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(ic, 2, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(ic, 3, fp, -1, SQLITE_STATIC);
        sqlite3_bind_text(ic, 4, ARGS, -1, SQLITE_STATIC);
        sqlite3_bind_int64(ic, 5, now);
        sqlite3_bind_int64(ic, 6, now + OQ_DEFAULT_KEY_TTL_MS);
        int r1 = sqlite3_step(ic);
        sqlite3_reset(ic);
        sqlite3_bind_text(io, 1, mid, -1, SQLITE_STATIC);
        sqlite3_bind_text(io, 2, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(io, 3, payload, -1, SQLITE_STATIC);
        sqlite3_bind_int64(io, 4, now);
        int r2 = sqlite3_step(io);
        sqlite3_reset(io);
        if (r1 != SQLITE_DONE || r2 != SQLITE_DONE || oq_db_exec(db, "COMMIT", &err)) {
            fprintf(stderr, "baseline: insert failed: %s\n", sqlite3_errmsg(db));
            break;
        }
        lat_add(l, oq_mono_us() - s);
        n++;
    }
    *rate = (double)n * 1e6 / (double)(oq_mono_us() - t0);
    sqlite3_finalize(ic);
    sqlite3_finalize(io);
    sqlite3_close_v2(db);
    return 0;
}

/* --- onceq: N threads through oq_producer_submit ------------------------------------------- */

typedef struct worker {
    oq_producer_t *p;
    const char *tag; /* key prefix: unique per run (a PostgreSQL database is not fresh) */
    int id;
    int64_t end_us;
    int64_t every_us; /* --rate: one submit per every_us from start_us (0: back to back) */
    int64_t start_us;
    int64_t n, errors;
    lat_t lat;
    pthread_t th;
} worker_t;

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    json_t *args = json_loads(ARGS, 0, NULL);
    char key[64];
    while (oq_mono_us() < w->end_us) {
        snprintf(key, sizeof key, "%s-%d-%lld", w->tag, w->id, (long long)w->n);
        oq_submit_req_t req = {NULL, key, "charge", args, NULL, 0, 0, NULL};
        oq_submit_outcome_t oc;
        int64_t s = oq_mono_us();
        if (w->every_us > 0) { /* open loop: the call's slot, waited for when ahead */
            int64_t due = w->start_us + w->n * w->every_us;
            if (due >= w->end_us) break;
            if (due > s) {
                struct timespec ts = {(time_t)((due - s) / 1000000),
                                      (long)((due - s) % 1000000) * 1000};
                nanosleep(&ts, NULL);
            }
            s = due;
        }
        if (oq_producer_submit(w->p, &req, NULL, &oc, NULL) != 0 || oc != OQ_SUBMIT_NEW)
            w->errors++;
        lat_add(&w->lat, oq_mono_us() - s);
        w->n++;
    }
    json_decref(args);
    return NULL;
}

/* One measured run of the onceq side on \p db (an SQLite path or a PostgreSQL URI). */
typedef struct orun {
    double rate, cpu_s, batches, items, wcpu, commit_s;
    int64_t total, errors;
    lat_t all;
} orun_t;

static int run_onceq(const char *db, const char *tag, int nth, int64_t dur, int64_t rate,
                     const char *sync, int commit_delay_us, orun_t *o)
{
    memset(o, 0, sizeof *o);
    oq_metrics_t *m = oq_metrics_new();
    oq_error_t err = {0};
    oq_producer_t *p = NULL;
    oq_producer_opts_t opts = {
        .synchronous = sync, .metrics = m, .commit_delay_us = commit_delay_us};
    if (!m || oq_producer_open(db, &opts, &p, &err) != 0) {
        fprintf(stderr, "bench: %s\n", err.msg);
        oq_metrics_destroy(m);
        return -1;
    }
    worker_t *w = calloc((size_t)nth, sizeof *w);
    struct timespec pc0, pc1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &pc0);
    int64_t t0 = oq_mono_us(), end = t0 + dur * 1000;
    for (int i = 0; i < nth; i++) {
        w[i].p = p;
        w[i].tag = tag;
        w[i].id = i;
        w[i].end_us = end;
        w[i].every_us = rate > 0 ? (int64_t)nth * 1000000 / rate : 0;
        w[i].start_us = t0 + (rate > 0 ? (int64_t)i * 1000000 / rate : 0);
        pthread_create(&w[i].th, NULL, worker_main, &w[i]);
    }
    for (int i = 0; i < nth; i++) {
        pthread_join(w[i].th, NULL);
        o->total += w[i].n;
        o->errors += w[i].errors;
        for (size_t k = 0; k < w[i].lat.n; k++)
            lat_add(&o->all, w[i].lat.v[k]);
        free(w[i].lat.v);
    }
    o->rate = (double)o->total * 1e6 / (double)(oq_mono_us() - t0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &pc1);
    o->cpu_s = (double)(pc1.tv_sec - pc0.tv_sec) + (double)(pc1.tv_nsec - pc0.tv_nsec) / 1e9;
    oq_producer_close(p);
    free(w);
    qsort(o->all.v, o->all.n, sizeof *o->all.v, cmp64);

    char *text = NULL;
    size_t tl = 0;
    if (oq_metrics_render(m, &text, &tl) == 0 && text) {
        char *s = strstr(text, "onceq_producer_batch_size_sum ");
        if (s) o->items = atof(s + strlen("onceq_producer_batch_size_sum "));
        s = strstr(text, "onceq_producer_batch_size_count ");
        if (s) o->batches = atof(s + strlen("onceq_producer_batch_size_count "));
        s = strstr(text, "\nonceq_producer_writer_cpu_seconds_total ");
        if (s) o->wcpu = atof(s + strlen("\nonceq_producer_writer_cpu_seconds_total "));
        s = strstr(text, "onceq_producer_commit_seconds_sum ");
        if (s) o->commit_s = atof(s + strlen("onceq_producer_commit_seconds_sum "));
    }
    free(text);
    oq_metrics_destroy(m);
    return 0;
}

static void print_onceq(const char *what, int nth, const orun_t *o)
{
    printf("%-6s  %3d threads, group    : %9.0f calls/s  p50 %6.2f ms  p99 %6.2f ms  max %6.2f ms"
           "  (%lld calls, %lld errors, avg batch %.1f)\n",
           what, nth, o->rate, pct(&o->all, 50), pct(&o->all, 99), pct(&o->all, 100),
           (long long)o->total, (long long)o->errors, o->batches > 0 ? o->items / o->batches : 0.0);
}

static void print_cpu(const char *what, const orun_t *o)
{
    if (o->total > 0 && o->batches > 0)
        printf("%s writer: %.1f us CPU per submit, COMMIT %.2f ms per batch (wall), whole process "
               "%.1f us CPU per submit\n",
               what, o->wcpu * 1e6 / (double)o->total, o->commit_s * 1e3 / o->batches,
               o->cpu_s * 1e6 / (double)o->total);
}

int oq__bench_submit(int argc, char **argv)
{
    int ret = OQ_EXIT_FAIL, prc;
    oq_config_t *cfg =
        oq_config_new(bench_settings, sizeof bench_settings / sizeof bench_settings[0]);
    char pb[4200], po[4200];
    pb[0] = po[0] = '\0';
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq-bench", bench_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    int nth = (int)oq_config_int(cfg, "threads");
    int64_t dur = oq_config_int(cfg, "duration");
    const char *sync = oq_config_str(cfg, "synchronous");
    const char *pg = oq_config_str(cfg, "pg");
    int delay = (int)oq_config_int(cfg, "commit-delay-us");
    int64_t rate = oq_config_int(cfg, "rate");
    snprintf(pb, sizeof pb, "%s/onceq-bench-baseline-%d.db", oq_config_str(cfg, "dir"), getpid());
    snprintf(po, sizeof po, "%s/onceq-bench-submit-%d.db", oq_config_str(cfg, "dir"), getpid());

    lat_t bl = {0};
    double brate = 0;
    if (baseline(pb, sync, dur, &brate, &bl) != 0) goto out;
    qsort(bl.v, bl.n, sizeof *bl.v, cmp64);

    orun_t os, op;
    memset(&op, 0, sizeof op);
    char tag[48];
    snprintf(tag, sizeof tag, "bench-%d-%lld", getpid(), (long long)oq_now_ms());
    if (run_onceq(po, tag, nth, dur, rate, sync, delay, &os) != 0) goto out;
    if (pg && *pg && run_onceq(pg, tag, nth, dur, rate, sync, delay, &op) != 0) {
        free(os.all.v);
        goto out;
    }
    printf("bench submit: synchronous=%s duration=%lldms (two rows per call: calls + outbox)%s\n",
           sync, (long long)dur, rate > 0 ? " offered rate below" : "");
    if (rate > 0)
        printf("offered %lld calls/s (latency from each call's scheduled time)\n", (long long)rate);
    printf("baseline  1 thread, 1 tx/call : %9.0f calls/s  p50 %6.2f ms  p99 %6.2f ms  max %6.2f ms"
           "  (%zu calls)\n",
           brate, pct(&bl, 50), pct(&bl, 99), pct(&bl, 100), bl.n);
    print_onceq("onceq", nth, &os);
    if (pg && *pg) print_onceq("pg", nth, &op);
    printf("ratio onceq/baseline: %.1fx\n", brate > 0 ? os.rate / brate : 0.0);
    if (pg && *pg)
        printf("ratio PostgreSQL/SQLite (onceq, synchronous_commit=on): %.2f\n",
               os.rate > 0 ? op.rate / os.rate : 0.0);
    print_cpu("sqlite", &os);
    if (pg && *pg) print_cpu("pg", &op);
    free(bl.v);
    free(os.all.v);
    free(op.all.v);
    ret = os.errors || op.errors ? OQ_EXIT_FAIL : OQ_EXIT_OK;
out:
    if (cfg && pb[0] && !oq_config_int(cfg, "keep")) {
        for (int i = 0; i < 2; i++) {
            const char *b = i ? po : pb;
            char f[4300];
            static const char *const sfx[] = {"", "-wal", "-shm"};
            for (int k = 0; k < 3; k++) {
                snprintf(f, sizeof f, "%s%s", b, sfx[k]);
                unlink(f);
            }
        }
    }
    oq_config_destroy(cfg);
    return ret;
}
