/*
 * libmicrohttpd's messages into the onceq log (oq_mhd.h).
 */
#include "oq_mhd.h"

#include <stdio.h>
#include <string.h>

void oq_mhd_log(void *cls, const char *fmt, va_list ap)
{
    const oq_mhd_log_ctx_t *c = cls;
    if (!c || c->level < oq_log_threshold) return;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    oq_log_write(c->level, c->component, NULL, "libmicrohttpd: %s", buf);
}
