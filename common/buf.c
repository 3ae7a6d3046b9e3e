/* SPDX-License-Identifier: Apache-2.0 */
/*
 * buf.c: the growable byte buffer (oq_buf.h) that the JSON writers, the metrics renderer, the
 * HTTP and MCP clients and the producer's call rendering append to, instead of one hand-grown
 * char array each. The capacity doubles from 64 bytes (amortised O(1) appends), or jumps to
 * what is asked when doubling would pass SIZE_MAX; every size is checked for overflow before
 * it is computed, and the first failure sticks (oq_buf.h), so a writer checks once at the end.
 */
#include "oq_buf.h"
#include "oq_error.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int oq_buf_reserve(oq_buf_t *b, size_t n)
{
    if (b->err) return b->err;
    if (n >= SIZE_MAX - b->len) return b->err = OQ_ERANGE; /* len + n + 1 would wrap */
    size_t need = b->len + n + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p) return b->err = OQ_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int oq_buf_put(oq_buf_t *b, const void *s, size_t n)
{
    int rc = oq_buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int oq_buf_puts(oq_buf_t *b, const char *s)
{
    return oq_buf_put(b, s, strlen(s));
}

int oq_buf_putc(oq_buf_t *b, char c)
{
    return oq_buf_put(b, &c, 1);
}

int oq_buf_printf(oq_buf_t *b, const char *fmt, ...)
{
    if (b->err) return b->err;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (w < 0) return b->err = OQ_ERANGE;
    if (b->p && (size_t)w < b->cap - b->len) {
        b->len += (size_t)w;
        return 0;
    }
    int rc = oq_buf_reserve(b, (size_t)w);
    if (rc) return rc;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)w;
    return 0;
}

int oq_buf_read(oq_buf_t *b, FILE *f, size_t limit)
{
    size_t start = b->len;
    for (;;) {
        size_t room = b->cap > b->len + 1 ? b->cap - b->len - 1 : 0;
        if (room < 4096) {
            int rc = oq_buf_reserve(b, 4096);
            if (rc) return rc;
            room = b->cap - b->len - 1;
        }
        size_t left = limit - (b->len - start);
        size_t want =
            left == SIZE_MAX ? left : left + 1; /* one past the limit tells it is passed */
        size_t r = fread(b->p + b->len, 1, room < want ? room : want, f);
        b->len += r;
        b->p[b->len] = '\0';
        if (b->len - start > limit) return OQ_ETOOBIG;
        if (r == 0) return ferror(f) ? OQ_EIO : 0;
    }
}

char *oq_buf_take(oq_buf_t *b, size_t *len)
{
    if (!b->err && !b->p) oq_buf_reserve(b, 0);
    if (b->err) {
        oq_buf_free(b);
        if (len) *len = 0;
        return NULL;
    }
    b->p[b->len] = '\0';
    char *p = b->p;
    if (len) *len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

void oq_buf_free(oq_buf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->err = 0;
}
