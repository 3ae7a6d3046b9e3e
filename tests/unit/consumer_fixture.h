/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared fixture of the consumer unit tests (test_consumer_store.c, test_consumer_fast.c): a
 * temporary effects.db opened by two "workers" (two store connections), a retry policy, a
 * message source, a valid tool_call envelope builder, a counting query, and the tool run the
 * worker does (registry tool + classification). Include after cmocka.h.
 */
#ifndef OQ_TEST_CONSUMER_FIXTURE_H
#define OQ_TEST_CONSUMER_FIXTURE_H

#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consumer_store.h"
#include "execution.h"
#include "oq_envelope.h"
#include "oq_json.h"
#include "oq_util.h"

typedef struct {
    char dir[64];
    char path[1024];             /* effects.db, or the connection string on PostgreSQL */
    oq__consumer_store_t *a, *b; /* two workers sharing one database file */
} fx_t;

static const oq__retry_policy_t policy = {.max_attempts = 3, .base_ms = 100, .max_ms = 1000};
static const oq__msg_src_t src = {.topic = "onceq.tool-calls", .partition = 0, .offset = 7};

#ifdef OQ_TEST_CONSUMER_PG
/*
 * The same test bodies on PostgreSQL: a file that defines OQ_TEST_CONSUMER_PG (the database
 * name) before including its SQLite twin opens both "workers" on a fresh database of the test
 * server (pg_fixture.h: skipped without ONCEQ_TEST_PG_URL, a failure under CI=true). The raw
 * SQL the tests read rows with is written for SQLite; pg_sql() maps it: the table names to
 * schema onceq's (consumer_*, the shared outbox), ?1 to $1, and the few SQLite functions the
 * tests use are defined in the test database's public schema (json_extract, json_type,
 * group_concat, ifnull).
 */
#include <ctype.h>
#include <libpq-fe.h>

#include "pg_fixture.h"

#define FX_PG 1
/* an outbox row's publish position: seq on SQLite, the relay's pub_seq here (NULL: next) */
#define FX_POS "coalesce(pub_seq, 9223372036854775807)"

static const char *const pg_names[][2] = {{"inbox", "onceq.consumer_inbox"},
                                          {"executions", "onceq.consumer_executions"},
                                          {"effects", "onceq.consumer_effects"},
                                          {"audit", "onceq.consumer_audit"},
                                          {"dlq", "onceq.consumer_dlq"},
                                          {"outbox", "onceq.outbox"},
                                          {"relay_lease", "onceq.relay_lease"},
                                          {"retention", "onceq.consumer_retention"},
                                          {"BLOB", "bytea"}};

static char *pg_sql(const char *in)
{
    size_t cap = strlen(in) * 3 + 64, o = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    for (const char *p = in; *p;) {
        if (p[0] == '?' && isdigit((unsigned char)p[1])) {
            out[o++] = '$';
            p++;
            continue;
        }
        if (isalpha((unsigned char)*p) || *p == '_') {
            const char *w = p;
            while (isalnum((unsigned char)*p) || *p == '_')
                p++;
            size_t n = (size_t)(p - w);
            const char *rep = NULL;
            int after_dot = w > in && (w[-1] == '.' || w[-1] == '\'');
            for (size_t i = 0; !after_dot && *p != '.' && i < sizeof pg_names / sizeof pg_names[0];
                 i++)
                if (strlen(pg_names[i][0]) == n && strncmp(w, pg_names[i][0], n) == 0)
                    rep = pg_names[i][1];
            if (rep) {
                memcpy(out + o, rep, strlen(rep));
                o += strlen(rep);
            } else {
                memcpy(out + o, w, n);
                o += n;
            }
            continue;
        }
        out[o++] = *p++;
    }
    out[o] = '\0';
    return out;
}

static PGresult *pg_run(oq__consumer_store_t *s, const char *sql, const char *call_id)
{
    char *t = pg_sql(sql);
    const char *pr[] = {call_id};
    PGresult *r = call_id
                      ? PQexecParams(oq__consumer_store_pgconn(s), t, 1, NULL, pr, NULL, NULL, 0)
                      : PQexec(oq__consumer_store_pgconn(s), t);
    if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
        fprintf(stderr, "pg_run: %s\n%s", t, PQresultErrorMessage(r));
    free(t);
    assert_true(PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK);
    return r;
}

/* Run \p sql (no rows kept). */
static inline void fx_exec(oq__consumer_store_t *s, const char *sql)
{
    PQclear(pg_run(s, sql, NULL));
}

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    char *conninfo = f->path;
    pgfx_available(1);
    pgfx_fresh_db(OQ_TEST_CONSUMER_PG, conninfo, sizeof f->path);
    oq_error_t err = {0};
    oq_db_opts_t o = {.synchronous = "OFF"};
    assert_int_equal(oq__consumer_store_open(conninfo, &o, "worker-a", &f->a, &err), 0);
    assert_int_equal(oq__consumer_store_open(conninfo, &o, "worker-b", &f->b, &err), 0);
    fx_exec(f->a,
            "CREATE FUNCTION json_extract(t text, p text) RETURNS text LANGUAGE sql IMMUTABLE "
            "AS $$ SELECT (t::jsonb) #>> string_to_array(substr(p, 3), '.') $$;"
            "CREATE FUNCTION json_type(t text, p text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ "
            "SELECT CASE jsonb_typeof(x) WHEN 'boolean' THEN x::text WHEN 'string' THEN 'text' "
            "WHEN 'number' THEN CASE WHEN x::text ~ '^-?[0-9]+$' THEN 'integer' ELSE 'real' END "
            "ELSE jsonb_typeof(x) END FROM (SELECT (t::jsonb) #> string_to_array(substr(p, 3), "
            "'.') AS x) z $$;"
            "CREATE FUNCTION gc_step(a text, b text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ "
            "SELECT CASE WHEN a IS NULL THEN b ELSE a || ',' || b END $$;"
            "CREATE AGGREGATE group_concat(text) (SFUNC = gc_step, STYPE = text);"
            "CREATE FUNCTION ifnull(a anyelement, b anyelement) RETURNS anyelement LANGUAGE sql "
            "IMMUTABLE AS $$ SELECT coalesce(a, b) $$");
    *state = f;
    return 0;
}
#else
#define FX_PG 0
#define FX_POS "seq"

/* Run \p sql (no rows kept). */
static inline void fx_exec(oq__consumer_store_t *s, const char *sql)
{
    assert_int_equal(sqlite3_exec(oq__consumer_store_db(s), sql, NULL, NULL, NULL), SQLITE_OK);
}

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "/tmp/oq-consumer-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof(f->path), "%s/effects.db", f->dir);
    oq_error_t err = {0};
    oq_db_opts_t o = {.synchronous = "OFF"};
    assert_int_equal(oq__consumer_store_open(f->path, &o, "worker-a", &f->a, &err), 0);
    assert_int_equal(oq__consumer_store_open(f->path, &o, "worker-b", &f->b, &err), 0);
    *state = f;
    return 0;
}
#endif

static int teardown(void **state)
{
    fx_t *f = *state;
    char cmd[200];
    oq__consumer_store_close(f->a);
    oq__consumer_store_close(f->b);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
    if (f->dir[0] && system(cmd) != 0) return -1;
    free(f);
    return 0;
}

/* A valid tool_call envelope; args given as JSON text. */
static void mk_env(oq_envelope_t *e, const char *tool, const char *args_json, int64_t attempt)
{
    oq_error_t err = {0};
    memset(e, 0, sizeof(*e));
    e->v = 1;
    e->kind = OQ_KIND_TOOL_CALL;
    oq_id_uuid(e->message_id);
    oq_id_call(e->call_id);
    e->tenant = strdup("t1");
    e->idem_key = strdup("key-1");
    e->tool = strdup(tool);
    e->args = json_loads(args_json, 0, NULL);
    assert_non_null(e->args);
    e->attempt = attempt;
    e->created_at = oq_now_ms();
    assert_int_equal(oq_fingerprint(e->tenant, e->tool, e->args, e->fingerprint, &err), 0);
}

/* One integer from \p sql with ?1 bound to \p call_id (may be NULL: unbound). */
static int64_t q_count(oq__consumer_store_t *s, const char *sql, const char *call_id)
{
#if FX_PG
    PGresult *r = pg_run(s, sql, call_id);
    int64_t v = -1;
    if (PQntuples(r) > 0 && !PQgetisnull(r, 0, 0)) {
        const char *t = PQgetvalue(r, 0, 0);
        v = strcmp(t, "t") == 0 ? 1 : strcmp(t, "f") == 0 ? 0 : strtoll(t, NULL, 10);
    } else if (PQntuples(r) > 0) {
        v = 0; /* NULL reads as 0, as sqlite3_column_int64 has it */
    }
    PQclear(r);
    return v;
#else
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(oq__consumer_store_db(s), sql, -1, &st, NULL), SQLITE_OK);
    if (call_id) sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    int64_t v = -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
#endif
}

/* One text from \p sql with ?1 bound to \p call_id (may be NULL), malloc()ed; NULL if none. */
static inline char *q_text(oq__consumer_store_t *s, const char *sql, const char *call_id)
{
#if FX_PG
    PGresult *r = pg_run(s, sql, call_id);
    char *v = PQntuples(r) > 0 && !PQgetisnull(r, 0, 0) ? strdup(PQgetvalue(r, 0, 0)) : NULL;
    PQclear(r);
    return v;
#else
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(oq__consumer_store_db(s), sql, -1, &st, NULL), SQLITE_OK);
    if (call_id) sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    char *v = NULL;
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        v = strdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return v;
#endif
}

/* As if the result relay had delivered every outbox row so far: its watermark passes them. */
static inline void relay_delivered_all(oq__consumer_store_t *s)
{
#if FX_PG
    /* as the relay's assign step, then its watermark past every number (relay/store_pg.c) */
    fx_exec(s, "UPDATE onceq.outbox SET pub_seq = nextval('onceq.outbox_pub_seq') WHERE pub_seq "
               "IS NULL;"
               "INSERT INTO onceq.relay_lease(name, owner, fence, expires_at, published_seq) "
               "VALUES ('outbox', 'test', 1, '-infinity', (SELECT COALESCE(max(pub_seq), 0) FROM "
               "onceq.outbox)) ON CONFLICT (name) DO UPDATE SET published_seq = "
               "excluded.published_seq");
#else
    assert_int_equal(sqlite3_exec(oq__consumer_store_db(s),
                                  "INSERT OR REPLACE INTO relay_lease(name, owner, fence, "
                                  "expires_at, published_seq) VALUES ('outbox', 'test', 1, 0, "
                                  "(SELECT COALESCE(max(seq), 0) FROM outbox))",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
#endif
}

/* What the worker's run_tool does: the registry tool for the run \p x, classified. \p args may
 * be NULL (parsed from the row). Clear \p o after. */
static void run_registry_tool(const oq__exec_row_t *x, const json_t *args, oq__outcome_t *o)
{
    char eid[OQ_CALL_ID_LEN + 1];
    json_t *own = NULL;
    memset(o, 0, sizeof(*o));
    if (!args) args = own = json_loads(x->args, 0, NULL);
    oq__exec_effect_id(x->call_id, eid);
    oq_tool_call_t call = {.call_id = x->call_id,
                           .effect_id = eid,
                           .tenant = x->tenant,
                           .tool = x->tool,
                           .args = args,
                           .attempt = x->attempt,
                           .try_no = x->tries};
    oq__outcome_classify(oq_tool_invoke(oq_tool_find(x->tool), &call, &o->out), o);
    json_decref(own);
}

#endif
