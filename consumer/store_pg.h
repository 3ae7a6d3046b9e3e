/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file store_pg.h
 * @brief Internal: the consumer's row operations on PostgreSQL (consumer/store_pg.c), called by
 *        consumer/store.c when the database setting names PostgreSQL. Same contracts as
 *        consumer_store.h, with these differences: lease lapses are decided on the database
 *        server's clock (clock_timestamp()), the clock oq__consumer_store_now() answers is the
 *        server's, a second execution of a call is OQ_EEXIST, and the result events go to the
 *        shared onceq.outbox, published by the relay's PostgreSQL scheme (relay/store_pg.c).
 * @locality one connection per store, one thread at a time.
 */
#ifndef OQ_CONSUMER_STORE_PG_H
#define OQ_CONSUMER_STORE_PG_H

#include <libpq-fe.h>

#include "consumer_store.h"

typedef struct oq__consumer_pg oq__consumer_pg_t;

/** @brief Connect, migrate schema `onceq` (\p migrate; else only check its version: a reader),
 *  refusing a newer schema (OQ_EVERSION), read the server's clock: *server_ms is its unix ms
 *  at open. */
int oq__consumer_pg_open(const char *conninfo, const char *worker, int migrate,
                         oq__consumer_pg_t **out, int64_t *server_ms, oq_error_t *err);
void oq__consumer_pg_close(oq__consumer_pg_t *p);
PGconn *oq__consumer_pg_conn(oq__consumer_pg_t *p);
int oq__consumer_pg_begin(oq__consumer_pg_t *p, oq_error_t *err);
int oq__consumer_pg_begin_batch(oq__consumer_pg_t *p, const char *const *call_ids,
                                const char *const *message_ids, int n, oq_error_t *err);
void oq__consumer_pg_counts(const oq__consumer_pg_t *p, int64_t *statements, int64_t *round_trips);
int oq__consumer_pg_commit(oq__consumer_pg_t *p, oq_error_t *err);
void oq__consumer_pg_rollback(oq__consumer_pg_t *p);

int oq__consumer_pg_inbox_upsert(oq__consumer_pg_t *p, const oq__inbox_row_t *row, int64_t *seen,
                                 oq_error_t *err);
int oq__consumer_pg_inbox_retake(oq__consumer_pg_t *p, const oq__inbox_row_t *row, int *taken,
                                 oq_error_t *err);
int oq__consumer_pg_exec_get(oq__consumer_pg_t *p, const char *call_id, oq__exec_row_t *out,
                             oq_error_t *err);
int oq__consumer_pg_exec_insert(oq__consumer_pg_t *p, const oq__exec_row_t *x, int64_t now,
                                oq_error_t *err);
int oq__consumer_pg_exec_update(oq__consumer_pg_t *p, const oq__exec_update_t *u, int *updated,
                                oq_error_t *err);
int oq__consumer_pg_exec_set_result(oq__consumer_pg_t *p, const char *call_id, const char *result,
                                    const char *effect_id, oq_error_t *err);
int oq__consumer_pg_lease_renew(oq__consumer_pg_t *p, const char *call_id, int64_t fence,
                                int64_t lease_until, oq_error_t *err);
int oq__consumer_pg_exec_lapsed(oq__consumer_pg_t *p, int64_t now, oq__exec_row_t *rows, int cap,
                                int *n, oq_error_t *err);
int oq__consumer_pg_exec_in_state(oq__consumer_pg_t *p, int state, oq__exec_row_t *rows, int cap,
                                  int *n, oq_error_t *err);
int oq__consumer_pg_exec_held_by(oq__consumer_pg_t *p, const char *owner, oq__exec_row_t *rows,
                                 int cap, int *n, oq_error_t *err);
int oq__consumer_pg_exec_unknown_due(oq__consumer_pg_t *p, int64_t now, oq__exec_row_t *rows,
                                     int cap, int *n, oq_error_t *err);
int oq__consumer_pg_unsettled(oq__consumer_pg_t *p, oq__unsettled_t *out, oq_error_t *err);
int oq__consumer_pg_recovery_pending(oq__consumer_pg_t *p, int64_t now);
int oq__consumer_pg_due(oq__consumer_pg_t *p, int64_t now, int limit,
                        void (*cb)(const oq__due_row_t *row, void *opaque), void *opaque,
                        oq_error_t *err);
int64_t oq__consumer_pg_next_due(oq__consumer_pg_t *p);
int oq__consumer_pg_effect_insert(oq__consumer_pg_t *p, const oq__effect_row_t *e, int *inserted,
                                  oq_error_t *err);
int oq__consumer_pg_effect_get(oq__consumer_pg_t *p, const char *call_id, int *found,
                               char **effect_id, char **detail, oq_error_t *err);
int oq__consumer_pg_effect_read(oq__consumer_pg_t *p, const char *call_id, int *found,
                                oq__effect_read_t *out, oq_error_t *err);
int oq__consumer_pg_audit_list(oq__consumer_pg_t *p, const char *call_id,
                               void (*cb)(const oq__audit_read_t *row, void *opaque), void *opaque,
                               oq_error_t *err);
int oq__consumer_pg_unknown_story(oq__consumer_pg_t *p,
                                  void (*cb)(const oq__call_event_t *row, void *opaque),
                                  void *opaque, oq_error_t *err);
int64_t oq__consumer_pg_effect_count(oq__consumer_pg_t *p, const char *call_id);
int oq__consumer_pg_audit_add(oq__consumer_pg_t *p, const oq__audit_row_t *a, oq_error_t *err);
int oq__consumer_pg_outbox_append(oq__consumer_pg_t *p, const oq_outbox_row_t *row,
                                  oq_error_t *err);
int oq__consumer_pg_outbox_republish(oq__consumer_pg_t *p, const oq_outbox_row_t *row,
                                     oq_outbox_republish_t *what, oq_error_t *err);
int oq__consumer_pg_dlq_insert(oq__consumer_pg_t *p, const oq__dlq_row_t *r, oq_error_t *err);
int oq__consumer_pg_dlq_pending(oq__consumer_pg_t *p, int limit,
                                void (*cb)(const oq__dlq_row_t *row, void *opaque), void *opaque,
                                oq_error_t *err);
int oq__consumer_pg_dlq_mark(oq__consumer_pg_t *p, int64_t id, int64_t now, oq_error_t *err);
int oq__consumer_pg_state_counts(oq__consumer_pg_t *p, int64_t counts[OQ_X__COUNT],
                                 oq_error_t *err);
int oq__consumer_pg_purge(oq__consumer_pg_t *p, int64_t before, int limit, int64_t *n_deleted,
                          oq_error_t *err);
int oq__consumer_pg_purge_outbox(oq__consumer_pg_t *p, int64_t before, int limit,
                                 int64_t *n_deleted, oq_error_t *err);
int oq__consumer_pg_horizon(oq__consumer_pg_t *p, int64_t *horizon, oq_error_t *err);
int oq__consumer_pg_purge_bounds(oq__consumer_pg_t *p, int64_t before, int64_t *max_rowid,
                                 int64_t *max_audit_id, oq_error_t *err);
int oq__consumer_pg_purge_settled(oq__consumer_pg_t *p, const oq__purge_batch_t *b, int64_t *last,
                                  int64_t *n_exec, int64_t *n_eff, oq_error_t *err);
int oq__consumer_pg_purge_audit(oq__consumer_pg_t *p, const oq__purge_batch_t *b, int64_t *last,
                                int64_t *n_deleted, oq_error_t *err);
/** @brief Copy the rows `onceq verify` reads into \p dst, an empty SQLite consumer database,
 *  from one snapshot (store.c: oq__consumer_store_export). */
int oq__consumer_pg_export(oq__consumer_pg_t *p, sqlite3 *dst, oq_error_t *err);

#endif
