/* SPDX-License-Identifier: Apache-2.0 */
/*
 * PostgreSQL for unit tests: ONCEQ_TEST_PG_URL names a server (./quickstart test starts one with
 * scripts/pg.sh). Each test file gets a database of its own, created fresh (tests of one run go
 * in parallel, and some change the schema's version on purpose). Without the variable a test
 * that needs PostgreSQL is skipped (exit 77, reported as skipped by ctest) with a clear message;
 * under CI=true it fails instead. Also the small helpers the PostgreSQL tests share (a
 * connection of their own, a statement that must succeed, one integer read, waiting for the
 * other sessions to end, a fresh database migrated). Include after cmocka.h.
 */
#ifndef OQ_TEST_PG_FIXTURE_H
#define OQ_TEST_PG_FIXTURE_H

#include <libpq-fe.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oq_pg.h"

/* Is a server given? Exits 77 (skip) or 1 (CI=true) when not and \p required. */
static int pgfx_available(int required)
{
    const char *u = getenv("ONCEQ_TEST_PG_URL");
    if (u && *u) return 1;
    if (!required) return 0;
    const char *ci = getenv("CI");
    if (ci && strcmp(ci, "true") == 0) {
        fprintf(stderr, "FAIL: ONCEQ_TEST_PG_URL is not set under CI=true (scripts/pg.sh start)\n");
        exit(1);
    }
    fprintf(stderr, "SKIP: needs PostgreSQL: scripts/pg.sh start && "
                    "export ONCEQ_TEST_PG_URL=$(scripts/pg.sh url)\n");
    exit(77);
}

/* Appends key='value' (quoted as libpq wants) to \p out. */
static void pgfx_kv(char *out, size_t n, const char *k, const char *v)
{
    size_t l = strlen(out);
    l += (size_t)snprintf(out + l, n - l, "%s%s='", l ? " " : "", k);
    for (; *v && l + 3 < n; v++) {
        if (*v == '\'' || *v == '\\') out[l++] = '\\';
        out[l++] = *v;
    }
    snprintf(out + l, n - l, "'");
}

/* A fresh database \p name (dropped first) on the test server; its keyword connection string
 * into \p out. The password stays in the passfile the URL names. */
static void pgfx_fresh_db(const char *name, char *out, size_t n)
{
    PGconn *c = PQconnectdb(getenv("ONCEQ_TEST_PG_URL"));
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "FAIL: cannot connect to ONCEQ_TEST_PG_URL: %s", PQerrorMessage(c));
        exit(1);
    }
    char sql[256];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", name);
    PQclear(PQexec(c, sql));
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", name);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "FAIL: %s: %s", sql, PQerrorMessage(c));
        exit(1);
    }
    PQclear(r);
    out[0] = '\0';
    PQconninfoOption *o = PQconninfo(c);
    for (PQconninfoOption *p = o; p && p->keyword; p++) {
        if (!p->val || !*p->val || strcmp(p->keyword, "dbname") == 0 ||
            strcmp(p->keyword, "password") == 0)
            continue;
        pgfx_kv(out, n, p->keyword, p->val);
    }
    pgfx_kv(out, n, "dbname", name);
    PQconninfoFree(o);
    PQfinish(c);
}

/* A connection of the test's own to \p conninfo (asserted). */
static inline PGconn *pgfx_connect(const char *conninfo)
{
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) fprintf(stderr, "connect: %s", PQerrorMessage(c));
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    return c;
}

/* Runs \p sql on \p c; it must succeed. */
static inline void pgfx_exec(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        fprintf(stderr, "%s: %s", sql, PQerrorMessage(c));
    assert_true(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK);
    PQclear(r);
}

/* The integer in the first column of the first row of \p sql. */
static inline int64_t pgfx_one(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fprintf(stderr, "%s: %s", sql, PQerrorMessage(c));
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    int64_t v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

/* Waits (up to 5 s) until no other client session of this database is left: a closed store's
 * statistics are flushed as its session ends. */
static inline void pgfx_others_gone(PGconn *c)
{
    for (int i = 0; i < 100 && pgfx_one(c, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                           "current_database() AND pid <> pg_backend_pid() AND "
                                           "backend_type = 'client backend'") > 0;
         i++)
        usleep(50000);
}

/* pgfx_fresh_db(), then onceq's schema migrated into it. Exits 1 when the migration fails. */
static inline void pgfx_migrated_db(const char *name, char *out, size_t n)
{
    pgfx_fresh_db(name, out, n);
    PGconn *c = NULL;
    oq_error_t err = {0};
    if (oq_pg_connect(out, &c, &err) || oq_pg_migrate(c, &err)) {
        fprintf(stderr, "FAIL: migrate: %s\n", err.msg);
        exit(1);
    }
    PQfinish(c);
}

#endif
