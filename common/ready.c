/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Readiness prober (oq_ready.h). One thread runs every check once a second and stores each
 * one's text under the lock; oq_ready_render() only reads them, so /readyz never waits for a
 * database lock or a broker. The database check keeps its own connection and reopens it after
 * a failure (the file may have become writable again); the Kafka check owns a producer handle
 * that sends nothing but metadata requests.
 */
#include "oq_ready.h"
#include "oq_db.h"
#include "oq_kafka.h"
#include "oq_log.h"
#include "oq_pg.h"
#include "oq_util.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define READY_MAX_CHECKS 8
#define READY_PERIOD_MS 1000
#define READY_STALE_US (5 * 1000 * 1000)

typedef struct {
    char name[32];
    oq_ready_check_fn *fn;
    void *arg;
    char text[256]; /* last result ("ok" or the reason) */
    int ok;
} check_t;

struct oq_ready {
    char component[32];
    oq_metric_t *m_ready;
    check_t checks[READY_MAX_CHECKS];
    int n;
    pthread_t th;
    int started, stop, was_ready;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t probed_us; /* 0 until the first probe finished */
    /* database check */
    char *db_path;
    sqlite3 *db;
    PGconn *pg; /* the same check on PostgreSQL: the server answers a write-capable session */
    int busy_streak;
    /* kafka check */
    rd_kafka_t *rk;
};

oq_ready_t *oq_ready_new(const char *component, oq_metrics_t *m)
{
    return oq_ready_new_gauge(component, m, "onceq_ready");
}

oq_ready_t *oq_ready_new_gauge(const char *component, oq_metrics_t *m, const char *gauge)
{
    oq_ready_t *r = calloc(1, sizeof(*r));
    if (!r) return NULL;
    snprintf(r->component, sizeof r->component, "%s", component ? component : "onceq");
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca; /* the prober waits with CLOCK_MONOTONIC deadlines: a step of the
                              wall clock back would otherwise stall it (and /readyz) that long */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    r->was_ready = -1;
    if (m) {
        r->m_ready = oq_metrics_gauge(m, gauge ? gauge : "onceq_ready",
                                      "1 while GET /readyz answers 200 (every check passed)", NULL);
        if (!r->m_ready) {
            oq_ready_destroy(r);
            return NULL;
        }
    }
    return r;
}

int oq_ready_add(oq_ready_t *r, const char *name, oq_ready_check_fn *fn, void *arg)
{
    if (!r || !fn || r->n >= READY_MAX_CHECKS || r->started) return OQ_EINVAL;
    check_t *c = &r->checks[r->n++];
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->text, sizeof c->text, "not probed yet");
    c->fn = fn;
    c->arg = arg;
    return 0;
}

/* --- built-in checks ----------------------------------------------------------------------- */

/* PostgreSQL: connected (again, after a restart) and not a read-only standby. */
static int check_pg(oq_ready_t *r, char *out, size_t cap)
{
    oq_error_t err = {0};
    PGresult *res = NULL;
    if (r->pg && PQstatus(r->pg) != CONNECTION_OK) {
        PQfinish(r->pg);
        r->pg = NULL;
    }
    if (!r->pg && oq_pg_connect(r->db_path, &r->pg, &err) != 0) {
        snprintf(out, cap, "cannot connect: %.200s", err.msg);
        return OQ_EDB;
    }
    if (oq_pg_query(r->pg, "SELECT pg_is_in_recovery()", 0, NULL, &res, &err) != 0) {
        snprintf(out, cap, "unreachable: %.200s", err.msg);
        PQfinish(r->pg);
        r->pg = NULL;
        return OQ_EDB;
    }
    int standby = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
    PQclear(res);
    if (standby) {
        snprintf(out, cap, "read-only: the server is a standby");
        return OQ_EDB;
    }
    snprintf(out, cap, "ok");
    return 0;
}

static int check_db(void *arg, char *out, size_t cap)
{
    oq_ready_t *r = arg;
    oq_error_t err = {0};
    if (oq_backend_of(r->db_path) == OQ_BACKEND_POSTGRES) return check_pg(r, out, cap);
    if (!r->db) {
        oq_db_opts_t o = {NULL, READY_PERIOD_MS, 0};
        if (oq_db_open(r->db_path, &o, &r->db, &err) != 0) {
            snprintf(out, cap, "cannot open: %.200s", err.msg);
            r->db = NULL;
            return OQ_EDB;
        }
    }
    if (sqlite3_db_readonly(r->db, "main") == 1) {
        snprintf(out, cap, "read-only: the database file cannot be written");
        sqlite3_close_v2(r->db);
        r->db = NULL;
        return OQ_EDB;
    }
    int rc = oq_db_begin_immediate(r->db, READY_PERIOD_MS, &err);
    if (rc == OQ_EBUSY) {
        /* another writer held the lock for the whole second: once is load, twice is a fault */
        if (++r->busy_streak < 2) {
            snprintf(out, cap, "ok");
            return 0;
        }
        snprintf(out, cap, "locked: the write lock was not free for %d s", r->busy_streak);
        return OQ_EBUSY;
    }
    r->busy_streak = 0;
    if (rc != 0) {
        snprintf(out, cap, "cannot take the write lock: %.200s", err.msg);
        sqlite3_close_v2(r->db);
        r->db = NULL;
        return rc;
    }
    oq_db_rollback(r->db);
    snprintf(out, cap, "ok");
    return 0;
}

int oq_ready_add_db(oq_ready_t *r, const char *path)
{
    if (!r || !path || r->db_path) return OQ_EINVAL;
    if (!(r->db_path = strdup(path))) return OQ_ENOMEM;
    return oq_ready_add(r, "database", check_db, r);
}

static int check_kafka(void *arg, char *out, size_t cap)
{
    oq_ready_t *r = arg;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_poll(r->rk, 0); /* nothing else polls this handle: its statistics (common/kafka.c) */
    rd_kafka_resp_err_t e = rd_kafka_metadata(r->rk, 0, NULL, &md, READY_PERIOD_MS);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(out, cap, "unreachable: no broker answered within %d ms: %s", READY_PERIOD_MS,
                 rd_kafka_err2str(e));
        return OQ_EKAFKA;
    }
    int brokers = md->broker_cnt;
    rd_kafka_metadata_destroy(md);
    if (brokers == 0) {
        snprintf(out, cap, "unreachable: the cluster lists no broker");
        return OQ_EKAFKA;
    }
    snprintf(out, cap, "ok");
    return 0;
}

int oq_ready_add_kafka(oq_ready_t *r, const char *brokers, const oq_config_t *cfg, oq_error_t *err)
{
    if (!r || r->rk) return oq_error_set(err, OQ_EINVAL, 0, "readiness: kafka check added twice");
    rd_kafka_conf_t *conf = oq_kafka_conf_new(OQ_KAFKA_PRODUCER, brokers, cfg, err);
    if (!conf) return err && err->code ? err->code : OQ_EINVAL;
    char errstr[256];
    r->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    if (!r->rk) {
        rd_kafka_conf_destroy(conf);
        return oq_error_set(err, OQ_EKAFKA, 0, "readiness: rd_kafka_new: %s", errstr);
    }
    return oq_ready_add(r, "kafka", check_kafka, r);
}

/* --- the prober ----------------------------------------------------------------------------- */

static void *ready_main(void *arg)
{
    oq_ready_t *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        pthread_mutex_unlock(&r->mu);
        char texts[READY_MAX_CHECKS][256];
        int oks[READY_MAX_CHECKS], ready = 1;
        for (int i = 0; i < r->n; i++) {
            texts[i][0] = '\0';
            oks[i] = r->checks[i].fn(r->checks[i].arg, texts[i], sizeof texts[i]) == 0;
            if (!oks[i]) ready = 0;
        }
        pthread_mutex_lock(&r->mu);
        char summary[1024];
        size_t sn = 0;
        summary[0] = '\0';
        for (int i = 0; i < r->n; i++) {
            memcpy(r->checks[i].text, texts[i], sizeof texts[i]);
            r->checks[i].ok = oks[i];
            if (sn < sizeof summary)
                sn += (size_t)snprintf(summary + sn, sizeof summary - sn, " %s=\"%s\"",
                                       r->checks[i].name, texts[i]);
        }
        if (ready != r->was_ready) {
            if (ready)
                OQ_LOG_INFO(r->component, "ready%s", summary);
            else if (r->was_ready < 0) /* starting up: joining a group, a broker not seen yet */
                OQ_LOG_INFO(r->component, "not ready yet%s", summary);
            else
                OQ_LOG_WARN(r->component, "not ready%s", summary);
            r->was_ready = ready;
        }
        r->probed_us = oq_mono_us();
        oq_gauge_set(r->m_ready, ready ? 1 : 0);
        if (r->stop) break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += READY_PERIOD_MS / 1000;
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int oq_ready_start(oq_ready_t *r, oq_error_t *err)
{
    if (!r || r->started) return oq_error_set(err, OQ_EINVAL, 0, "readiness: started twice");
    if (pthread_create(&r->th, NULL, ready_main, r) != 0)
        return oq_error_set(err, OQ_ENOMEM, 0, "readiness: cannot start its thread");
    r->started = 1;
    return 0;
}

int oq_ready_render(oq_ready_t *r, char **body, size_t *len)
{
    *body = NULL;
    json_t *o = json_object();
    if (!o) return OQ_ENOMEM;
    int64_t now = oq_mono_us();
    pthread_mutex_lock(&r->mu);
    int ready = r->probed_us != 0;
    for (int i = 0; i < r->n; i++) {
        json_object_set_new(o, r->checks[i].name, json_string(r->checks[i].text));
        if (!r->checks[i].ok) ready = 0;
    }
    if (r->probed_us && now - r->probed_us > READY_STALE_US) {
        char why[96];
        snprintf(why, sizeof why, "the readiness probe has not finished for %lld s",
                 (long long)((now - r->probed_us) / 1000000));
        json_object_set_new(o, "probe", json_string(why));
        ready = 0;
    }
    pthread_mutex_unlock(&r->mu);
    json_object_set_new(o, "status", json_string(ready ? "ready" : "unready"));
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    if (!s) return OQ_ENOMEM;
    size_t n = strlen(s);
    char *b = malloc(n + 2);
    if (!b) {
        free(s);
        return OQ_ENOMEM;
    }
    memcpy(b, s, n);
    b[n++] = '\n';
    b[n] = '\0';
    free(s);
    *body = b;
    if (len) *len = n;
    return ready;
}

void oq_ready_probe_now(oq_ready_t *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The metrics server's /readyz renderer (oq_metrics.h knows only its shape). */
static int render_cb(void *ctx, char **body, size_t *len)
{
    return oq_ready_render(ctx, body, len);
}

void oq_metrics_server_set_ready(oq_metrics_server_t *s, oq_ready_t *r)
{
    oq_metrics_server_set_readyz(s, r ? render_cb : NULL, r);
}

oq_metrics_server_t *oq_metrics_serve_ready(oq_metrics_t *m, const char *listen, oq_ready_t *ready,
                                            oq_error_t *err)
{
    return oq_metrics_serve_readyz(m, listen, ready ? render_cb : NULL, ready, err);
}

void oq_ready_destroy(oq_ready_t *r)
{
    if (!r) return;
    if (r->started) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->th, NULL);
    }
    if (r->db) sqlite3_close_v2(r->db);
    if (r->pg) PQfinish(r->pg);
    if (r->rk) rd_kafka_destroy(r->rk);
    free(r->db_path);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}
