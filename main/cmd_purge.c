/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq purge`: retention. Deletes calls whose key expired (expires_at <= now: settled more
 * than key_ttl ago) and that are settled (succeeded, failed), with their audit and result_inbox
 * rows, and published outbox rows (at or below the relay's watermark) created more than
 * --key-ttl ago, in batches of --batch rows, each its own short transaction (the daemon's writer
 * waits at most one batch). Pending, running and needs_review calls are never deleted. A key
 * used again after its call was purged (or expired) is a new call. Prints what was deleted as
 * JSON. --db is an SQLite file or PostgreSQL (schema onceq, the same rule: settled calls only).
 *
 * With --consumer-db: retention on the consumer database instead (or as well, when --db is
 * given too): inbox rows and published dead letters older than --inbox-retention, settled
 * executions with their effects and audit rows older than max(--retention, --inbox-retention),
 * never an execution in review; the rule and why it cannot reopen a duplicate are in
 * consumer/execution.c ("what retention deletes"). One more JSON line.
 */
#include <stdio.h>

#include "cmds.h"
#include "oq_consumer.h"
#include "oq_dbh.h"
#include "oq_producer.h"
#include "oq_util.h"

static const oq_setting_t purge_settings[] = {
    {"db", OQ_SET_STRING, "calls.db", 1, 4096, NULL,
     "producer database: a file (SQLite) or a postgres:// URI / libpq keyword string"},
    {"key-ttl", OQ_SET_DURATION, "24h", 1000, 365LL * 24 * 3600 * 1000, NULL,
     "retention: calls expire, and published outbox rows created longer ago are deleted"},
    {"batch", OQ_SET_INT, "500", 1, 100000, NULL, "rows per transaction"},
    {"consumer-db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "consumer database (a file, or a postgres:// URI / libpq keyword string): purge it (the "
     "producer's only when --db is given too)"},
    {"retention", OQ_SET_DURATION, "7d", 1000, 3650LL * 86400000, NULL,
     "--consumer-db: settled executions, effects, audit older than this (at least "
     "--inbox-retention) go"},
    {"inbox-retention", OQ_SET_DURATION, "7d", 1000, 3650LL * 86400000, NULL,
     "--consumer-db: inbox rows and published dead letters older than this go"},
};

static const char purge_usage[] =
    "usage: onceq purge [--db calls.db] [--key-ttl 24h] [--batch 500]\n"
    "       onceq purge --consumer-db effects.db [--retention 7d] [--inbox-retention 7d] "
    "[--batch 500]";

int oq__cmd_purge(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    oq_dbh_t db = {0};
    oq_config_t *cfg =
        oq_config_new(purge_settings, sizeof purge_settings / sizeof purge_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq", purge_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    const char *cdb = oq_config_str(cfg, "consumer-db");
    if ((ret = oq__cmd_consumer_db_refused("onceq purge", cdb)) != 0) goto out;
    ret = OQ_EXIT_FAIL;
    if (cdb) {
        oq_consumer_purge_stats_t cs;
        if (oq_consumer_purge(cdb, oq_config_int(cfg, "retention"),
                              oq_config_int(cfg, "inbox-retention"),
                              (int)oq_config_int(cfg, "batch"), &cs, &err) != 0) {
            fprintf(stderr, "onceq purge: %s: %s\n", oq_dbh_label(cdb), err.msg);
            ret = oq_cli_exit_for(err.code);
            goto out;
        }
        printf("{\"consumer_db\":true,\"executions\":%lld,\"effects\":%lld,\"audit\":%lld,"
               "\"inbox\":%lld,\"outbox\":%lld,\"batches\":%d}\n",
               (long long)cs.executions, (long long)cs.effects, (long long)cs.audit,
               (long long)cs.inbox, (long long)cs.outbox, cs.batches);
        if (!oq_config_is_set(cfg, "db")) {
            ret = OQ_EXIT_OK;
            goto out;
        }
    }
    oq_purge_stats_t ps = {0};
    if (oq_dbh_open(oq_config_str(cfg, "db"), NULL, &db, &err) != 0 ||
        (db.db && oq_producer_migrate(db.db, &err) != 0) ||
        oq_producer_db_purge(&db, oq_now_ms(), oq_config_int(cfg, "key-ttl"),
                             (int)oq_config_int(cfg, "batch"), &ps, &err) != 0) {
        fprintf(stderr, "onceq purge: %s: %s\n", oq_dbh_label(oq_config_str(cfg, "db")), err.msg);
        ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    printf("{\"calls\":%lld,\"audit\":%lld,\"result_inbox\":%lld,\"outbox\":%lld,\"batches\":%d}\n",
           (long long)ps.calls, (long long)ps.audit, (long long)ps.result_inbox,
           (long long)ps.outbox, ps.batches);
    ret = OQ_EXIT_OK;
out:
    oq_dbh_close(&db);
    oq_config_destroy(cfg);
    return ret;
}
