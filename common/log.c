/*
 * Logger. Each line is formatted into a stack buffer and written with a single write(2) to
 * stderr, so lines from several threads (and from librdkafka's threads, via the log callback)
 * never interleave. Levels are checked by the macros before any formatting happens.
 * Timestamps are wall-clock UTC with milliseconds.
 */
#include "oq_log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

oq_log_level_t oq_log_threshold = OQ_LOG_INFO;
static oq_log_format_t log_format = OQ_LOG_FMT_LOGFMT;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

int oq_log_level_parse(const char *s)
{
    for (int i = 0; i <= OQ_LOG_OFF; i++)
        if (s && strcasecmp(s, level_names[i]) == 0) return i;
    return -1;
}

void oq_log_init(oq_log_level_t level, oq_log_format_t fmt, int from_env)
{
    oq_log_threshold = level;
    log_format = fmt;
    if (!from_env) return;
    const char *e = getenv("ONCEQ_LOG_LEVEL");
    int l = oq_log_level_parse(e);
    if (l >= 0) oq_log_threshold = (oq_log_level_t)l;
    e = getenv("ONCEQ_LOG_FORMAT");
    if (e && strcasecmp(e, "json") == 0) log_format = OQ_LOG_FMT_JSON;
}

/* Appends \p s quoted for logfmt or JSON (both accept a JSON-style escaped string). */
static size_t log_quote(char *out, size_t cap, size_t pos, const char *s)
{
    if (pos + 1 < cap) out[pos++] = '"';
    for (; *s && pos + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[pos++] = '\\';
            out[pos++] = (char)c;
        } else if (c == '\n') {
            out[pos++] = '\\';
            out[pos++] = 'n';
        } else if (c < 0x20) {
            pos += (size_t)snprintf(out + pos, cap - pos, "\\u%04x", c);
        } else {
            out[pos++] = (char)c;
        }
    }
    if (pos + 1 < cap) out[pos++] = '"';
    return pos;
}

static void log_emit(oq_log_level_t level, const char *component, const char *call_id,
                     const char *msg)
{
    char line[4096];
    size_t pos = 0;
    struct timespec ts;
    struct tm tm;
    char tbuf[40];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    /* Moduli make the field widths provable for -Wformat-truncation. */
    snprintf(tbuf, sizeof(tbuf), "%04u-%02u-%02uT%02u:%02u:%02u.%03uZ",
             (unsigned)(tm.tm_year + 1900) % 10000u, (unsigned)(tm.tm_mon + 1) % 100u,
             (unsigned)tm.tm_mday % 100u, (unsigned)tm.tm_hour % 100u, (unsigned)tm.tm_min % 100u,
             (unsigned)tm.tm_sec % 100u, (unsigned)(ts.tv_nsec / 1000000) % 1000u);
    const char *lvl = level_names[level < OQ_LOG_OFF ? level : OQ_LOG_ERROR];
    if (log_format == OQ_LOG_FMT_JSON) {
        pos = (size_t)snprintf(line, sizeof(line),
                               "{\"ts\":\"%s\",\"level\":\"%s\",\"pid\":%d,\"component\":", tbuf,
                               lvl, (int)getpid());
        pos = log_quote(line, sizeof(line), pos, component ? component : "onceq");
        if (call_id) {
            pos += (size_t)snprintf(line + pos, sizeof(line) - pos, ",\"call_id\":");
            pos = log_quote(line, sizeof(line), pos, call_id);
        }
        pos += (size_t)snprintf(line + pos, sizeof(line) - pos, ",\"msg\":");
        pos = log_quote(line, sizeof(line), pos, msg);
        if (pos + 2 < sizeof(line)) line[pos++] = '}';
    } else {
        pos = (size_t)snprintf(line, sizeof(line), "ts=%s level=%s pid=%d component=%s", tbuf, lvl,
                               (int)getpid(), component ? component : "onceq");
        if (call_id && pos < sizeof(line))
            pos += (size_t)snprintf(line + pos, sizeof(line) - pos, " call_id=%s", call_id);
        if (pos + 5 < sizeof(line)) {
            memcpy(line + pos, " msg=", 5);
            pos += 5;
        }
        pos = log_quote(line, sizeof(line), pos, msg);
    }
    if (pos >= sizeof(line)) pos = sizeof(line) - 1;
    line[pos++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, pos);
    (void)w;
}

void oq_log_write(oq_log_level_t level, const char *component, const char *call_id, const char *fmt,
                  ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log_emit(level, component, call_id, msg);
}

void oq_log_rdkafka_cb(const struct rd_kafka_s *rk, int level, const char *fac, const char *buf)
{
    (void)rk;
    /* syslog levels: 0..3 error, 4 warning, 5..6 info, 7 debug */
    oq_log_level_t l = level <= 3   ? OQ_LOG_ERROR
                       : level == 4 ? OQ_LOG_WARN
                       : level <= 6 ? OQ_LOG_INFO
                                    : OQ_LOG_DEBUG;
    if (l < oq_log_threshold) return;
    oq_log_write(l, "rdkafka", NULL, "%s: %s", fac ? fac : "", buf ? buf : "");
}
