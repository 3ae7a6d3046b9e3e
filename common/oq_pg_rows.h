/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_pg_rows.h
 * @brief Internal: the small helpers every PostgreSQL store file (producer, relay, consumer
 *        store_pg.c) uses to pass int64 parameters as text and read result columns. Static
 *        inline: included only by those files, so the short names stay local to them.
 */
#ifndef OQ_PG_ROWS_H
#define OQ_PG_ROWS_H

#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/** An int64 as a text parameter. */
typedef struct {
    char s[24];
} num_t;

static inline const char *num(num_t *n, int64_t v)
{
    snprintf(n->s, sizeof n->s, "%" PRId64, v);
    return n->s;
}

/** A column as int64 (NULL: 0). */
static inline int64_t col_i64(PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/** A column as a new string (NULL: NULL, or out of memory). */
static inline char *col_dup(PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : strdup(PQgetvalue(r, row, col));
}

/** A column into \p out (NULL: ""), cut to \p n - 1 bytes. */
static inline void col_copy(PGresult *r, int row, int col, char *out, size_t n)
{
    snprintf(out, n, "%s", PQgetisnull(r, row, col) ? "" : PQgetvalue(r, row, col));
}

#endif
