/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Logger. Each line is formatted into a stack buffer and written with a single write(2) to
 * stderr, so lines from several threads (and from librdkafka's threads, via the log callback)
 * never interleave. Levels are checked by the macros before any formatting happens.
 * Timestamps are wall-clock UTC with milliseconds.
 *
 * In libonceq (built with ONCEQ_LIBRARY) the threshold starts at OQ_LOG_OFF: a library stays
 * silent in its host until the host sets a level (oq_log_set_level) and, usually, a callback
 * (oq_log_set_callback) that receives each formatted line instead of stderr.
 */
#include "oq_log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#ifdef ONCEQ_LIBRARY
oq_log_level_t oq_log_threshold = OQ_LOG_OFF;
#else
oq_log_level_t oq_log_threshold = OQ_LOG_INFO;
#endif
static oq_log_format_t log_format = OQ_LOG_FMT_LOGFMT;
static oq_log_cb log_cb;
static void *log_cb_opaque;

void oq_log_set_level(oq_log_level_t level)
{
    oq_log_threshold = level <= OQ_LOG_OFF ? level : OQ_LOG_OFF;
}

void oq_log_set_callback(oq_log_cb cb, void *opaque)
{
    log_cb_opaque = opaque;
    log_cb = cb;
}

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

/* --- fields: the message's trailing key=value words ------------------------------------------ */

#define LOG_MAX_FIELDS 24

typedef struct {
    const char *k, *v; /* into the field buffer, NUL-terminated, v unescaped */
} field_t;

static int key_char(char c, int first)
{
    return (c >= 'a' && c <= 'z') || c == '_' || (!first && ((c >= '0' && c <= '9') || c == '.'));
}

/* Parses "k=v k=\"v w\" ..." from \p p to the end into \p buf (unescaped copies) and \p f.
 * @returns the number of fields, or -1 when the text is not fields only. */
static int parse_fields(const char *p, char *buf, size_t cap, field_t *f)
{
    int n = 0;
    size_t o = 0;
    while (*p) {
        if (n == LOG_MAX_FIELDS || !key_char(*p, 1)) return -1;
        const char *k = p;
        while (key_char(*p, 0))
            p++;
        if (*p != '=' || p - k > 40 || o + (size_t)(p - k) + 1 >= cap) return -1;
        f[n].k = buf + o;
        memcpy(buf + o, k, (size_t)(p - k));
        o += (size_t)(p - k);
        buf[o++] = '\0';
        p++;
        f[n].v = buf + o;
        if (*p == '"') {
            for (p++; *p && *p != '"'; p++) {
                if (*p == '\\' && p[1]) p++;
                if (o + 1 >= cap) return -1;
                buf[o++] = *p;
            }
            if (*p != '"') return -1;
            p++;
        } else {
            for (; *p && *p != ' '; p++) {
                if (*p == '"' || o + 1 >= cap) return -1;
                buf[o++] = *p;
            }
        }
        if (o + 1 >= cap) return -1;
        buf[o++] = '\0';
        n++;
        if (*p == ' ')
            p++;
        else if (*p)
            return -1;
    }
    return n;
}

/* Splits \p msg in place: the longest run of key=value words at its end becomes fields, the
 * text before it stays the message. A message that is only fields keeps the first word's
 * text as its message. */
static int split_fields(char *msg, char *buf, size_t cap, field_t *f)
{
    for (char *p = msg; *p; p++) {
        if (p != msg && p[-1] != ' ') continue;
        if (!key_char(*p, 1)) continue;
        int n = parse_fields(p, buf, cap, f);
        if (n <= 0) continue;
        if (p == msg) return 0; /* nothing left to call the message */
        char *e = p;
        while (e > msg && (e[-1] == ' ' || e[-1] == ':'))
            e--;
        *e = '\0';
        return n;
    }
    return 0;
}

static int reserved_key(const char *k)
{
    static const char *const names[] = {"ts", "level", "pid", "component", "call_id", "msg"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(k, names[i]) == 0) return 1;
    return 0;
}

/* A JSON number as JSON writes it (no leading zeros, no exponent needed). */
static int json_number(const char *v)
{
    const char *p = v;
    if (*p == '-') p++;
    if (!(*p >= '0' && *p <= '9')) return 0;
    if (*p == '0' && p[1] >= '0' && p[1] <= '9') return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) return 0;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return *p == '\0' && p - v <= 20;
}

static void log_emit(oq_log_level_t level, const char *component, const char *call_id, char *msg)
{
    char fbuf[2048];
    field_t fields[LOG_MAX_FIELDS];
    int nf = split_fields(msg, fbuf, sizeof fbuf, fields);
    for (int i = 0; i < nf && !call_id; i++) /* a call_id=... word is the line's call id */
        if (strcmp(fields[i].k, "call_id") == 0) call_id = fields[i].v;
    char line[8192];
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
        for (int i = 0; i < nf && pos + 8 < sizeof(line); i++) {
            if (strcmp(fields[i].k, "call_id") == 0 && fields[i].v == call_id) continue;
            line[pos++] = ',';
            char key[48];
            snprintf(key, sizeof key, "%s%s", reserved_key(fields[i].k) ? "x_" : "", fields[i].k);
            pos = log_quote(line, sizeof(line), pos, key);
            if (pos + 1 < sizeof(line)) line[pos++] = ':';
            if (json_number(fields[i].v))
                pos += (size_t)snprintf(line + pos, sizeof(line) - pos, "%s", fields[i].v);
            else
                pos = log_quote(line, sizeof(line), pos, fields[i].v);
            if (pos >= sizeof(line)) pos = sizeof(line) - 1;
        }
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
        for (int i = 0; i < nf && pos + 8 < sizeof(line); i++) {
            if (strcmp(fields[i].k, "call_id") == 0 && fields[i].v == call_id) continue;
            const char *v = fields[i].v;
            pos += (size_t)snprintf(line + pos, sizeof(line) - pos,
                                    " %s%s=", reserved_key(fields[i].k) ? "x_" : "", fields[i].k);
            if (pos >= sizeof(line)) break;
            if (*v && !strpbrk(v, " \"=\\\n\t"))
                pos += (size_t)snprintf(line + pos, sizeof(line) - pos, "%s", v);
            else
                pos = log_quote(line, sizeof(line), pos, v);
            if (pos >= sizeof(line)) pos = sizeof(line) - 1;
        }
    }
    if (pos >= sizeof(line)) pos = sizeof(line) - 1;
    if (log_cb) {
        line[pos] = '\0';
        log_cb(level, component ? component : "onceq", line, pos, log_cb_opaque);
        return;
    }
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
    /* The relay sets enable.gapless.guarantee=true on purpose (relay/oq_relay.h: a batch
     * failure that would leave a gap stops the producer, which is rebuilt and re-sends from
     * the first undelivered row); librdkafka flags the property as experimental on every
     * producer it builds. Said once per process, at info, with the reason. */
    if (fac && buf && strcmp(fac, "CONFWARN") == 0 &&
        strstr(buf, "enable.gapless.guarantee is experimental")) {
        static atomic_flag said = ATOMIC_FLAG_INIT;
        if (atomic_flag_test_and_set(&said) || OQ_LOG_INFO < oq_log_threshold) return;
        oq_log_write(OQ_LOG_INFO, "rdkafka", NULL,
                     "enable.gapless.guarantee=true is set on purpose by the relay (per-"
                     "partition order after a failed batch: the producer is rebuilt and "
                     "re-sends from the first undelivered row); librdkafka calls the "
                     "property experimental, which needs no action");
        return;
    }
    if (l < oq_log_threshold) return;
    oq_log_write(l, "rdkafka", NULL, "%s: %s", fac ? fac : "", buf ? buf : "");
}
