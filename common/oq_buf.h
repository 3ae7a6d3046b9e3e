/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_buf.h
 * @brief The one growable byte buffer of onceq's internals (never part of libonceq's API).
 *
 * Zero-initialise (`oq_buf_t b = {0};`); every put appends and keeps the text NUL-terminated
 * (p[len] == '\0' once anything was put). A failure (no memory, or a size past SIZE_MAX) is
 * sticky: it is returned by the put that met it, every later put does nothing and returns it
 * again, and oq_buf_take() hands out NULL; so a writer may put many pieces and look once.
 */
#ifndef OQ_BUF_H
#define OQ_BUF_H

#include <stddef.h>
#include <stdio.h>

typedef struct oq_buf {
    char *p;    /**< the bytes, NUL-terminated; NULL until the first put */
    size_t len; /**< bytes written, the NUL not counted */
    size_t cap; /**< bytes allocated */
    int err;    /**< 0, or the first failure: OQ_ENOMEM or OQ_ERANGE (sticky) */
} oq_buf_t;

/** @brief Room for \p n more bytes and the NUL. @returns 0, OQ_ERANGE when len + n + 1 passes
 *         SIZE_MAX, OQ_ENOMEM when realloc fails (either also kept in b->err). */
int oq_buf_reserve(oq_buf_t *b, size_t n);
/** @brief Appends \p n bytes of \p s. @returns 0 or b->err. */
int oq_buf_put(oq_buf_t *b, const void *s, size_t n);
/** @brief Appends the C string \p s. */
int oq_buf_puts(oq_buf_t *b, const char *s);
/** @brief Appends one byte. */
int oq_buf_putc(oq_buf_t *b, char c);
/** @brief Appends printf-formatted text (OQ_ERANGE also when vsnprintf fails). */
int oq_buf_printf(oq_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** @brief Appends the rest of \p f, reading at most \p limit + 1 bytes. @returns 0, OQ_ETOOBIG
 *         when \p f holds more than \p limit bytes, OQ_EIO on a read error, or b->err. */
int oq_buf_read(oq_buf_t *b, FILE *f, size_t limit);
/** @brief Hands the text over (\p len may be NULL) and leaves the buffer empty; NULL after a
 *         failure (the bytes are freed) or when nothing was put and no memory can be had for
 *         an empty string. */
char *oq_buf_take(oq_buf_t *b, size_t *len);
/** @brief Frees the bytes and empties the buffer (its error too). */
void oq_buf_free(oq_buf_t *b);

#endif
