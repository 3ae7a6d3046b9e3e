/* SPDX-License-Identifier: Apache-2.0 */
/*
 * retention.c: `onceq purge --consumer-db` (oq_consumer_purge of oq_consumer.h). Opens the
 * consumer database itself (it must exist: a purge never creates one) under the worker id
 * "purge", runs the retention rule of consumer/execution.c (oq__exec_purge: the inbox, then
 * settled executions behind a raised horizon, then their audit rows, each batch its own short
 * transaction, so running workers wait at most one batch) and closes it. The consumer daemon
 * runs the same rule on its own connection every minute.
 */
#include <string.h>
#include <sys/stat.h>

#include "consumer_store.h"
#include "execution.h"
#include "oq_consumer.h"
#include "oq_pg.h"
#include "oq_util.h"

int oq_consumer_purge(const char *db_path, int64_t retention_ms, int64_t inbox_retention_ms,
                      int batch, oq_consumer_purge_stats_t *stats, oq_error_t *err)
{
    oq_consumer_purge_stats_t local;
    oq__consumer_store_t *s = NULL;
    struct stat sb;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof(*stats));
    if (retention_ms <= 0 || inbox_retention_ms <= 0)
        return oq_error_set(err, OQ_EINVAL, 0, "retention and inbox retention must be > 0");
    if (!db_path || (oq_backend_of(db_path) != OQ_BACKEND_POSTGRES && stat(db_path, &sb) != 0))
        return oq_error_set(err, OQ_EIO, 0, "no consumer database at %s",
                            db_path ? db_path : "(none)");
    oq_db_opts_t o = {.busy_timeout_ms = 10000};
    int rc = oq__consumer_store_open(db_path, &o, "purge", &s, err);
    if (rc == 0)
        rc = oq__exec_purge(s, oq__consumer_store_now(s), retention_ms, inbox_retention_ms, batch,
                            stats, err);
    oq__consumer_store_close(s);
    return rc;
}
