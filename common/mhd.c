/*
 * mhd.c: what the onceq servers on libmicrohttpd share (oq_mhd.h): the logger and the URL
 * unescaper that never lets a %00 truncate a path or a query value.
 */
#include "oq_mhd.h"

#include <microhttpd.h>

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

size_t oq_mhd_unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls, (void)c;
    size_t n = MHD_http_unescape(s);
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\0') s[i] = 0x7f;
    return n;
}
