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
    char path[128];
    oq__consumer_store_t *a, *b; /* two workers sharing one database file */
} fx_t;

static const oq__retry_policy_t policy = {.max_attempts = 3, .base_ms = 100, .max_ms = 1000};
static const oq__msg_src_t src = {.topic = "onceq.tool-calls", .partition = 0, .offset = 7};

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

static int teardown(void **state)
{
    fx_t *f = *state;
    char cmd[200];
    oq__consumer_store_close(f->a);
    oq__consumer_store_close(f->b);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
    if (system(cmd) != 0) return -1;
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
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(oq__consumer_store_db(s), sql, -1, &st, NULL), SQLITE_OK);
    if (call_id) sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    int64_t v = -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* One text from \p sql with ?1 bound to \p call_id (may be NULL), malloc()ed; NULL if none. */
static inline char *q_text(oq__consumer_store_t *s, const char *sql, const char *call_id)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(oq__consumer_store_db(s), sql, -1, &st, NULL), SQLITE_OK);
    if (call_id) sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    char *v = NULL;
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        v = strdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return v;
}

/* As if the result relay had delivered every outbox row so far: its watermark passes them. */
static inline void relay_delivered_all(oq__consumer_store_t *s)
{
    assert_int_equal(sqlite3_exec(oq__consumer_store_db(s),
                                  "INSERT OR REPLACE INTO relay_lease(name, owner, fence, "
                                  "expires_at, published_seq) VALUES ('outbox', 'test', 1, 0, "
                                  "(SELECT COALESCE(max(seq), 0) FROM outbox))",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
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
