/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_relay_db: small read-only queries on an outbox database for the relay test scripts, so
 * they do not depend on the sqlite3 command-line shell.
 *
 *   oq_relay_db PATH pending        unpublished row count
 *   oq_relay_db PATH published      published row count
 *   oq_relay_db PATH total          row count
 *   oq_relay_db PATH unmarked-ids   message_id of every unpublished row, one a line
 *   oq_relay_db PATH fence          fencing token of lease 'outbox' (0 if none)
 *   oq_relay_db PATH owner          owner of lease 'outbox' ("" if none)
 *   oq_relay_db PATH status         oq_relay_status_line()
 *
 * Exit 0 on success, 1 on a database error, 2 on bad usage. A test tool: prints to stdout.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "oq_db.h"
#include "oq_log.h"
#include "oq_relay.h"

static int print_rows(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        fprintf(stderr, "oq_relay_db: %s\n", sqlite3_errmsg(db));
        return 1;
    }
    int rc, n = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        printf("%s\n", t ? (const char *)t : "");
        n++;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        fprintf(stderr, "oq_relay_db: %s\n", sqlite3_errmsg(db));
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: oq_relay_db PATH pending|published|total|unmarked-ids|fence|"
                        "owner|status\n");
        return 2;
    }
    oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 1);
    oq_error_t err = {0};
    sqlite3 *db = NULL;
    oq_db_opts_t o = {.readonly = 1};
    if (oq_db_open(argv[1], &o, &db, &err) != 0) {
        fprintf(stderr, "oq_relay_db: %s\n", err.msg);
        return 1;
    }
    const char *q = argv[2];
    int rc;
    if (strcmp(q, "pending") == 0)
        rc = print_rows(db, "SELECT count(*) FROM outbox_unpublished");
    else if (strcmp(q, "published") == 0)
        rc = print_rows(
            db,
            "SELECT count(*) FROM outbox WHERE seq NOT IN (SELECT seq FROM outbox_unpublished)");
    else if (strcmp(q, "total") == 0)
        rc = print_rows(db, "SELECT count(*) FROM outbox");
    else if (strcmp(q, "unmarked-ids") == 0)
        rc = print_rows(db, "SELECT message_id FROM outbox_unpublished ORDER BY seq");
    else if (strcmp(q, "fence") == 0)
        rc = print_rows(db,
                        "SELECT coalesce((SELECT fence FROM relay_lease WHERE name='outbox'), 0)");
    else if (strcmp(q, "owner") == 0)
        rc = print_rows(
            db, "SELECT coalesce((SELECT owner FROM relay_lease WHERE name='outbox' AND "
                "expires_at > CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), '')");
    else if (strcmp(q, "status") == 0) {
        char line[1024];
        rc = oq_relay_status_line(db, line, sizeof(line), &err);
        if (rc == 0)
            printf("%s\n", line);
        else
            fprintf(stderr, "oq_relay_db: %s\n", err.msg);
        rc = rc ? 1 : 0;
    } else {
        fprintf(stderr, "oq_relay_db: unknown query '%s'\n", q);
        rc = 2;
    }
    sqlite3_close_v2(db);
    return rc;
}
