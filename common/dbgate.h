/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dbgate.h: the writer gate of a SQLite file (dbgate.c): the writers of one database on one
 * host hand the write lock to each other through a process-shared mutex instead of sleeping in
 * SQLite's busy handler. Internal to common/db.c; the counters are public (oq_db.h).
 */
#ifndef OQ_DBGATE_H
#define OQ_DBGATE_H

#include <sqlite3.h>
#include <stdint.h>

#include "oq_db.h"

/** Map the gate of \p db's file (a read-write connection, at open); silent when it cannot. */
void oq__dbgate_attach(sqlite3 *db);
/** Take the gate of \p db's file before BEGIN IMMEDIATE, waiting at most until the
 *  CLOCK_MONOTONIC deadline (us), and at most 250 ms. @returns 1 taken (or held already), 0 go
 *  on as without one (no gate, not usable, or held 250 ms by a writer that may be stopped),
 *  -1 the deadline passed while another writer held it
 *  (the caller's time is spent: it tries BEGIN IMMEDIATE once, without the busy handler's
 *  sleeps, so its deadline holds as it did without a gate). */
int oq__dbgate_enter(sqlite3 *db, int64_t deadline_mono_us);
/** Give the gate back once \p db's transaction ended (no-op when this thread does not hold it). */
void oq__dbgate_leave(sqlite3 *db);

#endif
