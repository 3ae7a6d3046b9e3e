/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file store_pg.h
 * @brief Internal: the relay's row operations on PostgreSQL (relay/store_pg.c), called by
 *        relay/store.c when the database setting names PostgreSQL. Same contracts as
 *        relay_store.h, except that lease times are the database server's (the relay's now_ms
 *        is not used) and the row numbers passed as seq are outbox.pub_seq.
 * @locality one connection per store, one thread at a time.
 */
#ifndef OQ_RELAY_STORE_PG_H
#define OQ_RELAY_STORE_PG_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "oq_error.h"
#include "relay_store.h"

typedef struct oq__relay_pg oq__relay_pg_t;

int oq__relay_pg_open(const char *conninfo, oq__relay_pg_t **out, oq_error_t *err);
void oq__relay_pg_close(oq__relay_pg_t *p);
int oq__relay_pg_data_version(oq__relay_pg_t *p, int64_t *out, oq_error_t *err);
int oq__relay_pg_notify_fd(oq__relay_pg_t *p);
/** The store's connection (tests: what it listens to, what libpq holds for it). */
PGconn *oq__relay_pg_conn(oq__relay_pg_t *p);
int oq__relay_pg_lease_acquire(oq__relay_pg_t *p, const char *name, const char *owner,
                               int64_t lease_ms, int64_t *fence, int *held, char *holder,
                               size_t holder_cap, int64_t *published_seq, oq_error_t *err);
int oq__relay_pg_lease_renew(oq__relay_pg_t *p, const char *name, const char *owner, int64_t fence,
                             int64_t lease_ms, oq_error_t *err);
int oq__relay_pg_lease_release(oq__relay_pg_t *p, const char *name, const char *owner,
                               int64_t fence, oq_error_t *err);
int oq__relay_pg_read(oq__relay_pg_t *p, int64_t after, int max_rows, int64_t max_bytes,
                      oq__relay_row_cb cb, void *ctx, int *nread, oq_error_t *err);
/** Reads so far (oq__relay_pg_read) and the round trips they took (tests). */
void oq__relay_pg_counts(oq__relay_pg_t *p, int64_t *reads, int64_t *round_trips);
int oq__relay_pg_mark_dead(oq__relay_pg_t *p, const char *name, const char *owner, int64_t fence,
                           int64_t lease_ms, int64_t now_ms, int64_t upto,
                           const oq__relay_dead_t *dead, size_t ndead, oq_error_t *err);
int oq__relay_pg_cleanup(oq__relay_pg_t *p, int64_t cutoff_ms, int limit, int64_t *deleted,
                         oq_error_t *err);
int oq__relay_pg_pending(oq__relay_pg_t *p, int64_t *count, int64_t *oldest_created_at,
                         oq_error_t *err);

/* The operators' views, on any connection (no lease, no relay object). */
int oq__relay_pg_status(PGconn *c, oq__relay_status_t *out, oq_error_t *err);
int oq__relay_pg_dead_read(PGconn *c, int64_t seq, int limit,
                           void (*cb)(const oq__relay_dead_read_t *row, void *opaque), void *opaque,
                           oq_error_t *err);

#endif
