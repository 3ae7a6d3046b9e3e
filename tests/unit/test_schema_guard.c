/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The schema-version guard (issue 14, item 5): a database whose PRAGMA user_version is newer
 * than this binary is refused by every opener, clearly, and nothing is written to it.
 *
 * A producer database and a consumer database are migrated, given a row, checkpointed and
 * closed, then stamped user_version = 99. After that:
 *  - the library openers refuse with OQ_EVERSION and a message naming the file and both
 *    versions: oq_db_open (read-write and read-only), oq_producer_open, oq_relay_new (the one
 *    that used to start, take a lease and publish), oq__consumer_store_open;
 *  - every command that opens a database exits 1 with that message, through ONCEQ_BIN:
 *    relay, producer, consumer, purge, submit, stats, get, inspect, verify;
 *  - both files are byte for byte what they were, and no -wal file was left behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_consumer.h"
#include "consumer_store.h"
#include "oq_db.h"
#include "oq_log.h"
#include "oq_producer.h"
#include "oq_relay.h"

static char dir[64], pdb[128], cdb[128];

/* Reads a whole file (malloc()ed, *n bytes); NULL when missing. */
static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* Migrates \p path with \p set, adds an outbox row, stamps user_version 99, closes. */
static void make_newer(const char *path, const char *const *set)
{
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(path, NULL, &db, &err), 0);
    assert_int_equal(oq_db_migrate(db, set, &err), 0);
    assert_int_equal(oq_db_exec(db,
                                "INSERT INTO outbox(message_id,topic,key,payload,created_at) "
                                "VALUES ('m1','onceq.tool-calls','k','{}',1);"
                                "PRAGMA journal_mode=DELETE; PRAGMA user_version=99",
                                &err),
                     0);
    sqlite3_close_v2(db);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/oq_test_guard_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(pdb, sizeof pdb, "%s/calls.db", dir);
    snprintf(cdb, sizeof cdb, "%s/effects.db", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void refused(int rc, const oq_error_t *err, const char *path)
{
    assert_int_equal(rc, OQ_EVERSION);
    assert_non_null(strstr(err->msg, path));
    assert_non_null(strstr(err->msg, "schema version 99 is newer than this binary"));
}

/* Runs `$ONCEQ_BIN ARGS` (bounded); returns its exit code, stderr into \p errtxt. */
static int run(const char *args, char *errtxt, size_t cap)
{
    const char *bin = getenv("ONCEQ_BIN");
    assert_non_null(bin);
    char out[200], cmd[1024];
    snprintf(out, sizeof out, "%s/cmd.err", dir);
    snprintf(cmd, sizeof cmd, "timeout 20 %s %s >/dev/null 2>%s", bin, args, out);
    int st = system(cmd);
    size_t n = 0;
    char *t = slurp(out, &n);
    snprintf(errtxt, cap, "%.*s", t ? (int)n : 0, t ? t : "");
    free(t);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* \p tmpl with @P -> the producer database, @C -> the consumer database. */
static void expand(const char *tmpl, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *t = tmpl; *t && o + 1 < cap; t++) {
        const char *sub = NULL;
        if (t[0] == '@' && t[1] == 'P') sub = pdb;
        if (t[0] == '@' && t[1] == 'C') sub = cdb;
        if (!sub) {
            out[o++] = *t;
            continue;
        }
        o += (size_t)snprintf(out + o, cap - o, "%s", sub);
        t++;
    }
    out[o < cap ? o : cap - 1] = '\0';
}

static void test_every_opener_refuses_a_newer_schema(void **state)
{
    (void)state;
    oq_error_t err = {0};
    make_newer(pdb, oq_migrations_producer);
    make_newer(cdb, oq_migrations_consumer);
    size_t pn = 0, cn = 0;
    char *pbefore = slurp(pdb, &pn), *cbefore = slurp(cdb, &cn);
    assert_non_null(pbefore);
    assert_non_null(cbefore);

    /* the library */
    sqlite3 *db = NULL;
    refused(oq_db_open(pdb, NULL, &db, &err), &err, pdb);
    assert_null(db);
    oq_db_opts_t ro = {.readonly = 1};
    refused(oq_db_open(cdb, &ro, &db, &err), &err, cdb);
    oq_producer_t *p = NULL;
    refused(oq_producer_open(pdb, NULL, &p, &err), &err, pdb);
    assert_null(p);
    oq_relay_opts_t o;
    oq_relay_opts_init(&o);
    o.db_path = pdb;
    o.brokers = "127.0.0.1:1";
    oq_error_clear(&err);
    assert_null(oq_relay_new(&o, &err));
    refused(err.code, &err, pdb);
    o.db_path = cdb;
    oq_error_clear(&err);
    assert_null(oq_relay_new(&o, &err));
    refused(err.code, &err, cdb);
    oq__consumer_store_t *cs = NULL;
    refused(oq__consumer_store_open(cdb, NULL, "w", &cs, &err), &err, cdb);

    /* the commands */
    static const char *const cmds[] = {
        "relay --db @P --brokers 127.0.0.1:1 --wait-db 10s",
        "producer --db @P --listen 127.0.0.1:0",
        "consumer --db @C --brokers 127.0.0.1:1",
        "relay --db @C --brokers 127.0.0.1:1",
        "purge --db @P",
        "submit --db @P --key k --tool charge --args {\\\"amount\\\":1}",
        "stats --db @P",
        "get --db @P c_0000000000000001",
        "inspect --db @P c_0000000000000001",
        "verify --producer-db @P --consumer-db @C",
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char args[512], etxt[2048];
        expand(cmds[i], args, sizeof args);
        int rc = run(args, etxt, sizeof etxt);
        if (rc != 1 || !strstr(etxt, "schema version 99 is newer than this binary"))
            print_error("onceq %s: exit %d, stderr: %s\n", args, rc, etxt);
        assert_int_equal(rc, 1);
        assert_non_null(strstr(etxt, "schema version 99 is newer than this binary"));
    }

    /* nothing was written */
    size_t pn2 = 0, cn2 = 0;
    char *pafter = slurp(pdb, &pn2), *cafter = slurp(cdb, &cn2);
    assert_int_equal(pn2, pn);
    assert_int_equal(cn2, cn);
    assert_memory_equal(pafter, pbefore, pn);
    assert_memory_equal(cafter, cbefore, cn);
    char wal[160];
    size_t wn = 0;
    snprintf(wal, sizeof wal, "%s-wal", pdb);
    char *w = slurp(wal, &wn);
    assert_true(w == NULL || wn == 0);
    free(w);
    free(pbefore);
    free(cbefore);
    free(pafter);
    free(cafter);
}

/* Version 0 (fresh) and the current version still open; one below the current too. */
static void test_current_and_older_open(void **state)
{
    (void)state;
    oq_error_t err = {0};
    sqlite3 *db = NULL;
    assert_int_equal(oq_db_open(pdb, NULL, &db, &err), 0);
    assert_int_equal(oq_db_migrate(db, oq_migrations_producer, &err), 0);
    sqlite3_close_v2(db);
    assert_int_equal(oq_db_open(pdb, NULL, &db, &err), 0);
    assert_int_equal(oq_db_check_version(db, NULL, pdb, &err), 0);
    /* a stamp one above the producer set is refused even though the consumer set is shorter */
    char sql[64];
    int n = 0;
    while (oq_migrations_producer[n])
        n++;
    snprintf(sql, sizeof sql, "PRAGMA user_version=%d", n + 1);
    assert_int_equal(oq_db_exec(db, sql, &err), 0);
    assert_int_equal(oq_db_check_version(db, NULL, pdb, &err), OQ_EVERSION);
    snprintf(sql, sizeof sql, "PRAGMA user_version=%d", n - 1);
    assert_int_equal(oq_db_exec(db, sql, &err), 0);
    assert_int_equal(oq_db_check_version(db, NULL, pdb, &err), 0);
    sqlite3_close_v2(db);
}

int main(void)
{
    oq_log_init(OQ_LOG_OFF, OQ_LOG_FMT_LOGFMT, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_opener_refuses_a_newer_schema, setup, teardown),
        cmocka_unit_test_setup_teardown(test_current_and_older_open, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
