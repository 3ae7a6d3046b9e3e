/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Relay store (relay/store.c): lease take/renew/release with fencing, the fenced mark (a
 * relay whose lease was taken over marks nothing), ranged marks over gaps, batch reads in seq
 * order with row/byte limits, retention cleanup in bounded batches, the status line.
 * Two store handles on one file stand for two relay processes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_db.h"
#include "oq_log.h"
#include "oq_relay.h"
#include "oq_util.h"
#include "relay_store.h"

static char dir[64], path[128];
static sqlite3 *db; /* the "producer" connection appending rows */

static int setup(void **state)
{
    (void)state;
    oq_error_t err = {0};
    snprintf(dir, sizeof(dir), "/tmp/oq_test_relay_store_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof(path), "%s/calls.db", dir);
    if (oq_db_open(path, NULL, &db, &err) != 0) return -1;
    if (oq_db_migrate(db, oq_migrations_producer, &err) != 0) return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char p[200];
    sqlite3_close_v2(db);
    db = NULL;
    const char *sfx[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s%s", path, sfx[i]);
        unlink(p);
    }
    rmdir(dir);
    return 0;
}

static void append_rows(int n, const char *key, int64_t created_at)
{
    oq_error_t err = {0};
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    for (int i = 0; i < n; i++) {
        char mid[OQ_UUID_LEN + 1];
        oq_id_uuid(mid);
        oq_outbox_row_t row = {.message_id = mid,
                               .topic = "t",
                               .key = key,
                               .payload = "{\"x\":1}",
                               .payload_len = 7,
                               .created_at = created_at};
        assert_int_equal(oq_outbox_append(db, NULL, &row, &err), 0);
    }
    assert_int_equal(oq_db_commit(db, &err), 0);
}

static int64_t scalar(const char *sql)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static oq__relay_store_t *open_store(void)
{
    oq_error_t err = {0};
    oq__relay_store_t *s = NULL;
    assert_int_equal(oq__relay_store_open(path, NULL, &s, &err), 0);
    return s;
}

static void test_open_requires_tables(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq__relay_store_t *s = NULL;
    char p[160];
    snprintf(p, sizeof(p), "%s/empty.db", dir);
    assert_int_equal(oq__relay_store_open(p, NULL, &s, &err), OQ_EDB);
    assert_null(s);
    assert_non_null(strstr(err.msg, "outbox"));
    unlink(p);
    snprintf(p, sizeof(p), "%s/empty.db-wal", dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/empty.db-shm", dir);
    unlink(p);
}

static void test_lease_exclusive_and_takeover(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq__relay_store_t *a = open_store(), *b = open_store();
    int64_t now = 1000000, fa = 0, fb = 0;
    int held;
    char holder[256];

    assert_int_equal(oq__relay_lease_acquire(a, "outbox", "A", 5000, now, &fa, &held, holder,
                                             sizeof(holder), NULL, &err),
                     0);
    assert_true(held);
    assert_int_equal(fa, 1);
    /* B cannot take a live lease; it learns who holds it. */
    assert_int_equal(oq__relay_lease_acquire(b, "outbox", "B", 5000, now + 10, &fb, &held, holder,
                                             sizeof(holder), NULL, &err),
                     0);
    assert_false(held);
    assert_string_equal(holder, "A");
    /* A renews: same fence. */
    assert_int_equal(oq__relay_lease_renew(a, "outbox", "A", 1, 5000, now + 2000, &err), 0);
    assert_int_equal(oq__relay_lease_acquire(a, "outbox", "A", 5000, now + 2500, &fa, &held, NULL,
                                             0, NULL, &err),
                     0);
    assert_true(held);
    assert_int_equal(fa, 1);
    /* Lease lapses (last renewal at now+2500 -> expires now+7500): B takes it, fence 2. */
    assert_int_equal(oq__relay_lease_acquire(b, "outbox", "B", 5000, now + 7400, &fb, &held, NULL,
                                             0, NULL, &err),
                     0);
    assert_false(held);
    assert_int_equal(oq__relay_lease_acquire(b, "outbox", "B", 5000, now + 7500, &fb, &held, NULL,
                                             0, NULL, &err),
                     0);
    assert_true(held);
    assert_int_equal(fb, 2);
    /* A's renewal is refused even though A's clock thinks it is early. */
    assert_int_equal(oq__relay_lease_renew(a, "outbox", "A", 1, 5000, now + 7600, &err),
                     OQ_EFENCED);
    /* Release makes it free at once; A re-takes with fence 3. */
    assert_int_equal(oq__relay_lease_release(b, "outbox", "B", 2, &err), 0);
    fa = 1;
    assert_int_equal(oq__relay_lease_acquire(a, "outbox", "A", 5000, now + 7700, &fa, &held, NULL,
                                             0, NULL, &err),
                     0);
    assert_true(held);
    assert_int_equal(fa, 3);
    /* Release by a stale fence changes nothing. */
    assert_int_equal(oq__relay_lease_release(b, "outbox", "B", 2, &err), 0);
    assert_int_equal(scalar("SELECT fence FROM relay_lease WHERE name='outbox'"), 3);
    assert_int_equal(scalar("SELECT expires_at FROM relay_lease WHERE name='outbox'"),
                     now + 7700 + 5000);
    oq__relay_store_close(a);
    oq__relay_store_close(b);
}

static void test_fenced_mark_changes_nothing(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq__relay_store_t *a = open_store(), *b = open_store();
    int64_t now = oq_now_ms(), fa = 0, fb = 0, wm = -1;
    int held;
    append_rows(10, "k1", now);
    assert_int_equal(
        oq__relay_lease_acquire(a, "outbox", "A", 1000, now, &fa, &held, NULL, 0, &wm, &err), 0);
    assert_true(held);
    assert_int_equal(wm, 0); /* a new lease row: everything is pending */
    assert_int_equal(oq__relay_store_mark(a, "outbox", "A", fa, 1000, now + 10, 3, &err), 0);
    assert_int_equal(scalar("SELECT published_seq FROM relay_lease WHERE name='outbox'"), 3);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_unpublished"), 7);
    /* A is "paused" past its lease; B takes over and starts from A's watermark. */
    assert_int_equal(
        oq__relay_lease_acquire(b, "outbox", "B", 1000, now + 2000, &fb, &held, NULL, 0, &wm, &err),
        0);
    assert_true(held);
    assert_int_equal(fb, fa + 1);
    assert_int_equal(wm, 3);
    /* A resumes and tries to store what it delivered: refused, nothing changes. */
    assert_int_equal(oq__relay_store_mark(a, "outbox", "A", fa, 1000, now + 2001, 6, &err),
                     OQ_EFENCED);
    assert_int_equal(scalar("SELECT published_seq FROM relay_lease WHERE name='outbox'"), 3);
    /* Even with a forged "now" before B's take-over, the fence does not match. */
    assert_int_equal(oq__relay_store_mark(a, "outbox", "A", fa, 1000, now + 500, 6, &err),
                     OQ_EFENCED);
    /* B advances it. */
    assert_int_equal(oq__relay_store_mark(b, "outbox", "B", fb, 1000, now + 2002, 6, &err), 0);
    assert_int_equal(scalar("SELECT published_seq FROM relay_lease WHERE name='outbox'"), 6);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_unpublished"), 4);
    oq__relay_store_close(a);
    oq__relay_store_close(b);
}
static void test_mark_never_moves_back(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq__relay_store_t *a = open_store();
    int64_t now = oq_now_ms(), f = 0;
    int held;
    append_rows(20, "k", now);
    assert_int_equal(
        oq__relay_lease_acquire(a, "outbox", "A", 5000, now, &f, &held, NULL, 0, NULL, &err), 0);
    assert_int_equal(oq__relay_store_mark(a, "outbox", "A", f, 5000, now, 9, &err), 0);
    /* An older value (a late job) does not move it back; the lease is still renewed. */
    assert_int_equal(oq__relay_store_mark(a, "outbox", "A", f, 5000, now + 100, 5, &err), 0);
    assert_int_equal(scalar("SELECT published_seq FROM relay_lease WHERE name='outbox'"), 9);
    assert_int_equal(scalar("SELECT expires_at FROM relay_lease WHERE name='outbox'"),
                     now + 100 + 5000);
    assert_int_equal(scalar("SELECT group_concat(seq) = '10,11,12,13,14,15,16,17,18,19,20' FROM "
                            "(SELECT seq FROM outbox_unpublished ORDER BY seq)"),
                     1);
    oq__relay_store_close(a);
}

typedef struct {
    int64_t seqs[100];
    int n, stop_after;
    size_t bytes;
} collect_t;

static int collect(void *ctx, const oq__relay_row_t *row)
{
    collect_t *c = ctx;
    if (c->stop_after && c->n == c->stop_after) return 1;
    c->seqs[c->n++] = row->seq;
    c->bytes += row->payload_len;
    assert_string_equal(row->topic, "t");
    assert_int_equal(row->payload_len, 7);
    assert_int_equal(strlen(row->message_id), OQ_UUID_LEN);
    return 0;
}

static void test_read_order_and_limits(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq__relay_store_t *a = open_store();
    int64_t now = oq_now_ms(), f = 0;
    int held, n;
    append_rows(30, "k", now);
    assert_int_equal(
        oq__relay_lease_acquire(a, "outbox", "A", 5000, now, &f, &held, NULL, 0, NULL, &err), 0);
    collect_t c = {0};
    assert_int_equal(oq__relay_store_read(a, 0, 5, 1 << 20, collect, &c, &n, &err), 0);
    assert_int_equal(n, 5);
    int64_t want[] = {1, 2, 3, 4, 5};
    for (int i = 0; i < 5; i++)
        assert_int_equal(c.seqs[i], want[i]);
    /* after the cursor */
    memset(&c, 0, sizeof(c));
    assert_int_equal(oq__relay_store_read(a, 25, 100, 1 << 20, collect, &c, &n, &err), 0);
    assert_int_equal(n, 5);
    assert_int_equal(c.seqs[0], 26);
    /* byte limit: 7-byte payloads, 20 bytes -> 3 rows (the one crossing the limit included) */
    memset(&c, 0, sizeof(c));
    assert_int_equal(oq__relay_store_read(a, 0, 100, 20, collect, &c, &n, &err), 0);
    assert_int_equal(n, 3);
    /* the callback stops the read; the refused row is not counted */
    memset(&c, 0, sizeof(c));
    c.stop_after = 2;
    assert_int_equal(oq__relay_store_read(a, 0, 100, 1 << 20, collect, &c, &n, &err), 0);
    assert_int_equal(n, 2);
    /* data_version moves when another connection commits */
    int64_t v1, v2;
    assert_int_equal(oq__relay_store_data_version(a, &v1, &err), 0);
    assert_int_equal(oq__relay_store_data_version(a, &v2, &err), 0);
    assert_int_equal(v1, v2);
    append_rows(1, "k", now);
    assert_int_equal(oq__relay_store_data_version(a, &v2, &err), 0);
    assert_true(v2 != v1);
    oq__relay_store_close(a);
}

static void test_cleanup_and_status(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq__relay_store_t *a = open_store();
    int64_t now = oq_now_ms(), f = 0, deleted;
    int held;
    append_rows(25, "k", now - 60000);
    assert_int_equal(
        oq__relay_lease_acquire(a, "outbox", "relay-A", 5000, now, &f, &held, NULL, 0, NULL, &err),
        0);
    /* 20 rows delivered; 15 of them old, 5 created just now; 5 old rows still pending */
    assert_int_equal(oq__relay_store_mark(a, "outbox", "relay-A", f, 5000, now, 20, &err), 0);
    char upd[128];
    snprintf(upd, sizeof(upd), "UPDATE outbox SET created_at = %lld WHERE seq BETWEEN 16 AND 20",
             (long long)now);
    assert_int_equal(oq_db_exec(db, upd, &err), 0);
    int64_t count, oldest;
    assert_int_equal(oq__relay_store_pending(a, &count, &oldest, &err), 0);
    assert_int_equal(count, 5);
    assert_int_equal(oldest, now - 60000);

    char line[512];
    assert_int_equal(oq_relay_status_line(db, line, sizeof(line), &err), 0);
    assert_non_null(strstr(line, "pending=5"));
    assert_non_null(strstr(line, "published=20"));
    assert_non_null(strstr(line, "published_seq=20"));
    assert_non_null(strstr(line, "holder=relay-A"));
    assert_non_null(strstr(line, "fence=1"));
    assert_non_null(strstr(line, "oldest_pending_age=60."));

    /* bounded batches over the oldest rows: 15 old published rows, limit 10 -> 10 then 5 then 0;
     * recent published rows and old pending ones stay */
    assert_int_equal(oq__relay_store_cleanup(a, now - 1000, 10, &deleted, &err), 0);
    assert_int_equal(deleted, 10);
    assert_int_equal(oq__relay_store_cleanup(a, now - 1000, 10, &deleted, &err), 0);
    assert_int_equal(deleted, 5);
    assert_int_equal(oq__relay_store_cleanup(a, now - 1000, 10, &deleted, &err), 0);
    assert_int_equal(deleted, 0);
    assert_int_equal(scalar("SELECT count(*) FROM outbox"), 10);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_unpublished"), 5);
    assert_int_equal(scalar("SELECT min(seq) FROM outbox"), 16);

    /* released lease -> status says so */
    assert_int_equal(oq__relay_lease_release(a, "outbox", "relay-A", f, &err), 0);
    assert_int_equal(oq_relay_status_line(db, line, sizeof(line), &err), 0);
    assert_non_null(strstr(line, "holder=none"));
    /* tiny buffer: truncated, still NUL-terminated */
    char small[16];
    assert_int_equal(oq_relay_status_line(db, small, sizeof(small), &err), 0);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    oq__relay_store_close(a);
}

int main(void)
{
    oq_log_init(OQ_LOG_ERROR, OQ_LOG_FMT_LOGFMT, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_requires_tables, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_exclusive_and_takeover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fenced_mark_changes_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mark_never_moves_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_order_and_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cleanup_and_status, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
