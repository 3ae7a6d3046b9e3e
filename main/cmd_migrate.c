/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq migrate --db D`: apply the schema migrations explicitly, before any daemon starts (the
 * daemons migrate on start too; a deployment may prefer to do it once, with a role that owns
 * the schema, and run the daemons with fewer rights). D is a file path (SQLite: --stage picks
 * the producer's or a consumer's set) or a PostgreSQL URI / keyword string (schema `onceq`,
 * every stage's tables). A database newer than this binary is refused untouched (exit 1).
 * Prints {"backend":...,"version":N}.
 */
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "oq_db.h"
#include "oq_pg.h"

static const oq_setting_t migrate_settings[] = {
    {"db", OQ_SET_STRING, NULL, 0, 4096, NULL,
     "database: a file path (SQLite) or a postgres:// URI / libpq keyword string"},
    {"stage", OQ_SET_STRING, "producer", 1, 16, NULL,
     "SQLite only: which database the file is (producer or consumer)"},
};

static const char migrate_usage[] = "usage: onceq migrate --db FILE|URL [--stage producer]";

int oq__cmd_migrate(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc, version = 0;
    oq_config_t *cfg =
        oq_config_new(migrate_settings, sizeof migrate_settings / sizeof migrate_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq", migrate_usage, argc, argv)) >= 0) {
        oq_config_destroy(cfg);
        return prc;
    }
    const char *db = oq_config_str(cfg, "db");
    const char *stage = oq_config_str(cfg, "stage");
    if (!db || !*db) {
        fprintf(stderr, "onceq migrate: --db is required\n%s\n", migrate_usage);
        oq_config_destroy(cfg);
        return OQ_EXIT_USAGE;
    }
    if (oq_backend_of(db) == OQ_BACKEND_POSTGRES && oq_pg_conninfo_has_password(db)) {
        fprintf(stderr, "onceq migrate: --db holds a password: put it in a passfile "
                        "(passfile=... in the string, or PGPASSFILE)\n");
        ret = OQ_EXIT_USAGE;
    } else if (oq_backend_of(db) == OQ_BACKEND_POSTGRES) {
        PGconn *c = NULL;
        if (oq_pg_connect(db, &c, &err) || oq_pg_migrate(c, &err) ||
            oq_pg_schema_version(c, &version, &err)) {
            fprintf(stderr, "onceq migrate: postgres: %s\n", err.msg);
        } else {
            printf("{\"backend\":\"postgres\",\"schema\":\"onceq\",\"version\":%d}\n", version);
            ret = OQ_EXIT_OK;
        }
        if (c) PQfinish(c);
    } else {
        const char *const *set = NULL;
        if (strcmp(stage, "producer") == 0) set = oq_migrations_producer;
        if (strcmp(stage, "consumer") == 0) set = oq_migrations_consumer;
        sqlite3 *s = NULL;
        if (!set) {
            fprintf(stderr, "onceq migrate: --stage must be producer or consumer\n");
            ret = OQ_EXIT_USAGE;
        } else if (oq_db_open(db, NULL, &s, &err) || oq_db_migrate(s, set, &err)) {
            fprintf(stderr, "onceq migrate: %s: %s\n", db, err.msg);
        } else {
            printf("{\"backend\":\"sqlite\",\"stage\":\"%s\",\"version\":%d}\n", stage,
                   oq_db_user_version(s));
            ret = OQ_EXIT_OK;
        }
        if (s) sqlite3_close_v2(s);
    }
    oq_config_destroy(cfg);
    return ret;
}
