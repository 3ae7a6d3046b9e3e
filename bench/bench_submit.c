/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq-bench submit`: durable submits per second through the C API (N submitter threads,
 * unique keys, group commit) against a plain single-thread SQLite loop that inserts the same
 * two rows (a calls row and an outbox row of the same size) with one transaction, hence one
 * fsync, per call. Both run in the same invocation on fresh databases in --dir, with the same
 * synchronous level, so the ratio is meaningful on a shared, noisy machine. Reports rate,
 * p50/p99/max latency of each, the average batch size, and the ratio.
 *
 * --db URI puts the onceq side on PostgreSQL (synchronous_commit=on, the same durability as
 * SQLite's FULL; the baseline stays the SQLite loop), so bench/run.sh can set both backends
 * side by side. Each run's keys carry the process id (a database may be reused). The onceq
 * side's CPU and bytes written per submit are measured from /proc (bench/procstat.c): this
 * process's, and the PostgreSQL server's (ONCEQ_BENCH_PG_PID) when it is there.
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
    {"db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "the onceq side's database: a PostgreSQL URI (password in a passfile) instead of a file "
     "in --dir"},
};

static const char bench_usage[] =
    "usage: onceq-bench submit [--threads 32] [--duration 5s] [--dir /tmp] [--synchronous full]\n"
    "       [--db postgresql://...]";

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
    int id;
    int64_t end_us;
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
        snprintf(key, sizeof key, "bench-%d-%d-%lld", (int)getpid(), w->id, (long long)w->n);
        oq_submit_req_t req = {NULL, key, "charge", args, NULL, 0, 0, NULL};
        oq_submit_outcome_t oc;
        int64_t s = oq_mono_us();
        if (oq_producer_submit(w->p, &req, NULL, &oc, NULL) != 0 || oc != OQ_SUBMIT_NEW)
            w->errors++;
        lat_add(&w->lat, oq_mono_us() - s);
        w->n++;
    }
    json_decref(args);
    return NULL;
}

int oq__bench_submit(int argc, char **argv)
{
    int ret = OQ_EXIT_FAIL, prc;
    oq_metrics_t *m = oq_metrics_new();
    oq_config_t *cfg =
        oq_config_new(bench_settings, sizeof bench_settings / sizeof bench_settings[0]);
    if (!cfg || !m) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq-bench", bench_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    int nth = (int)oq_config_int(cfg, "threads");
    int64_t dur = oq_config_int(cfg, "duration");
    const char *sync = oq_config_str(cfg, "synchronous");
    char pb[4200], po[4200];
    snprintf(pb, sizeof pb, "%s/onceq-bench-baseline-%d.db", oq_config_str(cfg, "dir"), getpid());
    snprintf(po, sizeof po, "%s/onceq-bench-submit-%d.db", oq_config_str(cfg, "dir"), getpid());

    lat_t bl = {0};
    double brate = 0;
    if (baseline(pb, sync, dur, &brate, &bl) != 0) goto out;
    qsort(bl.v, bl.n, sizeof *bl.v, cmp64);

    oq_error_t err = {0};
    oq_producer_t *p = NULL;
    oq_producer_opts_t opts = {.synchronous = sync,
                               .metrics = m,
                               .commit_delay_us = (int)oq_config_int(cfg, "commit-delay-us")};
    const char *pgdb = oq_config_str(cfg, "db");
    if (oq_producer_open(pgdb ? pgdb : po, &opts, &p, &err) != 0) {
        fprintf(stderr, "bench: %s\n", err.msg);
        goto out;
    }
    worker_t *w = calloc((size_t)nth, sizeof *w);
    oq_bench_procs_t me0, me1, pg0, pg1;
    oq__bench_procs(getpid(), 0, &me0);
    oq__bench_procs(oq__bench_pg_pid(), 1, &pg0);
    int64_t disk0 = oq__bench_disk_written();
    struct timespec pc0, pc1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &pc0);
    int64_t t0 = oq_mono_us(), end = t0 + dur * 1000;
    for (int i = 0; i < nth; i++) {
        w[i].p = p;
        w[i].id = i;
        w[i].end_us = end;
        pthread_create(&w[i].th, NULL, worker_main, &w[i]);
    }
    lat_t all = {0};
    int64_t total = 0, errors = 0;
    for (int i = 0; i < nth; i++) {
        pthread_join(w[i].th, NULL);
        total += w[i].n;
        errors += w[i].errors;
        for (size_t k = 0; k < w[i].lat.n; k++)
            lat_add(&all, w[i].lat.v[k]);
        free(w[i].lat.v);
    }
    double orate = (double)total * 1e6 / (double)(oq_mono_us() - t0);
    oq__bench_procs(getpid(), 0, &me1);
    oq__bench_procs(oq__bench_pg_pid(), 1, &pg1);
    int64_t disk1 = oq__bench_disk_written();
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &pc1);
    double cpu_s = (double)(pc1.tv_sec - pc0.tv_sec) + (double)(pc1.tv_nsec - pc0.tv_nsec) / 1e9;
    oq_producer_close(p);
    free(w);
    qsort(all.v, all.n, sizeof *all.v, cmp64);

    char *text = NULL;
    size_t tl = 0;
    double batches = 0, items = 0, wcpu = 0, commit_s = 0;
    if (oq_metrics_render(m, &text, &tl) == 0 && text) {
        char *s = strstr(text, "onceq_producer_batch_size_sum ");
        if (s) items = atof(s + strlen("onceq_producer_batch_size_sum "));
        s = strstr(text, "onceq_producer_batch_size_count ");
        if (s) batches = atof(s + strlen("onceq_producer_batch_size_count "));
        s = strstr(text, "\nonceq_producer_writer_cpu_seconds_total ");
        if (s) wcpu = atof(s + strlen("\nonceq_producer_writer_cpu_seconds_total "));
        s = strstr(text, "onceq_producer_commit_seconds_sum ");
        if (s) commit_s = atof(s + strlen("onceq_producer_commit_seconds_sum "));
    }
    free(text);
    printf("bench submit: synchronous=%s duration=%lldms (two rows per call: calls + outbox), "
           "onceq on %s\n",
           sync, (long long)dur, pgdb ? "PostgreSQL (synchronous_commit=on)" : "SQLite");
    printf("baseline  1 thread, 1 tx/call : %9.0f calls/s  p50 %6.2f ms  p99 %6.2f ms  max %6.2f ms"
           "  (%zu calls)\n",
           brate, pct(&bl, 50), pct(&bl, 99), pct(&bl, 100), bl.n);
    printf("onceq   %3d threads, group    : %9.0f calls/s  p50 %6.2f ms  p99 %6.2f ms  max %6.2f ms"
           "  (%lld calls, %lld errors, avg batch %.1f)\n",
           nth, orate, pct(&all, 50), pct(&all, 99), pct(&all, 100), (long long)total,
           (long long)errors, batches > 0 ? items / batches : 0.0);
    printf("ratio onceq/baseline: %.1fx\n", brate > 0 ? orate / brate : 0.0);
    if (total > 0 && batches > 0)
        printf("writer: %.1f us CPU per submit, COMMIT %.2f ms per batch (wall), whole process "
               "%.1f us CPU per submit\n",
               wcpu * 1e6 / (double)total, commit_s * 1e3 / batches, cpu_s * 1e6 / (double)total);
    if (total > 0) {
        double n = (double)total;
        double pg_cpu = pg1.n ? pg1.cpu_s - pg0.cpu_s : 0;
        int64_t pg_wb = pg1.n ? pg1.write_bytes - pg0.write_bytes : 0;
        printf("per submit: this process %.1f us CPU, %.0f bytes written; PostgreSQL server "
               "%.1f us CPU, %.0f bytes written%s\n",
               (me1.cpu_s - me0.cpu_s) * 1e6 / n, (double)(me1.write_bytes - me0.write_bytes) / n,
               pg_cpu * 1e6 / n, (double)pg_wb / n, pg1.n ? "" : " (not measured)");
        double disk = oq__bench_disk_delta(disk0, disk1);
        if (disk >= 0) disk /= n;
        oq__bench_print_disk("submit", disk);
        printf("result bench=submit backend=%s rate=%.0f p50_ms=%.2f p99_ms=%.2f cpu_us=%.1f "
               "write_bytes=%.0f pg_cpu_us=%.1f pg_write_bytes=%.0f disk_bytes=%.0f\n",
               pgdb ? "pg" : "sqlite", orate, pct(&all, 50), pct(&all, 99),
               (me1.cpu_s - me0.cpu_s) * 1e6 / n, (double)(me1.write_bytes - me0.write_bytes) / n,
               pg_cpu * 1e6 / n, (double)pg_wb / n, disk);
    }
    free(bl.v);
    free(all.v);
    ret = errors ? OQ_EXIT_FAIL : OQ_EXIT_OK;
out:
    if (cfg && !oq_config_int(cfg, "keep")) {
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
    oq_metrics_destroy(m);
    oq_config_destroy(cfg);
    return ret;
}
