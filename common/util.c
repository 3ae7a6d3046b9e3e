/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Small shared helpers: CSPRNG ids, clocks, duration/size parsing and crash points.
 *
 * Ids come from getrandom(2), the kernel CSPRNG, which never blocks after boot. Message ids
 * are UUIDv7 so that inbox primary-key inserts land near the end of the B-tree. Call ids are
 * time-ordered for the same reason (48 bits of milliseconds, then 80 random bits: a call id is
 * a capability for reading the call where tokens are off, so it must not be guessable); ids of
 * the first format ("c_" + 16 hex, 22 random bits) stay valid in databases and messages. Crash
 * points read ONCEQ_CRASH_AT once and cache whether any point is armed, so a point that is off
 * costs a single branch.
 */
#include "oq_util.h"
#include "oq_log.h"

#include <ctype.h>
#include <pthread.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

void oq_random_bytes(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            abort(); /* no entropy source: ids would not be unique, refuse to go on */
        }
        p += r;
        n -= (size_t)r;
    }
}

static _Thread_local unsigned char rand_buf[256];
static _Thread_local size_t rand_left;
static pthread_once_t rand_once = PTHREAD_ONCE_INIT;

static void rand_forget(void)
{
    rand_left = 0; /* runs in the child: its only thread is a copy of the forking one */
}

static void rand_init(void)
{
    pthread_atfork(NULL, NULL, rand_forget);
}

void oq_random_bytes_buffered(void *out, size_t n)
{
    if (n > sizeof rand_buf) {
        oq_random_bytes(out, n);
        return;
    }
    if (rand_left < n) {
        pthread_once(&rand_once, rand_init);
        oq_random_bytes(rand_buf, sizeof rand_buf);
        rand_left = sizeof rand_buf;
    }
    memcpy(out, rand_buf + sizeof rand_buf - rand_left, n);
    rand_left -= n;
}

void oq_hex(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

void oq_id_call(char out[OQ_CALL_ID_LEN + 1])
{
    unsigned char b[16];
    uint64_t ms = (uint64_t)oq_now_ms();
    for (int i = 0; i < 6; i++)
        b[i] = (unsigned char)(ms >> (40 - 8 * i));
    oq_random_bytes_buffered(b + 6, 10);
    out[0] = 'c';
    out[1] = '_';
    oq_hex(b, sizeof(b), out + 2);
}

int oq_call_id_valid(const char *s)
{
    if (!s || s[0] != 'c' || s[1] != '_') return 0;
    size_t n = 2;
    for (; s[n]; n++) {
        char c = s[n];
        if (n >= OQ_CALL_ID_LEN || !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
    }
    return n == OQ_CALL_ID_LEN || n == OQ_CALL_ID_LEN_V1;
}

void oq_id_uuid(char out[OQ_UUID_LEN + 1])
{
    unsigned char b[16];
    uint64_t ms = (uint64_t)oq_now_ms();
    oq_random_bytes_buffered(b + 6, 10);
    for (int i = 0; i < 6; i++)
        b[i] = (unsigned char)(ms >> (40 - 8 * i));
    b[6] = (unsigned char)(0x70 | (b[6] & 0x0f)); /* version 7 */
    b[8] = (unsigned char)(0x80 | (b[8] & 0x3f)); /* RFC 4122 variant */
    char hex[33];
    oq_hex(b, 16, hex);
    /* 8-4-4-4-12 without snprintf: this runs once per message */
    int o = 0;
    for (int i = 0; i < 32; i++) {
        if (i == 8 || i == 12 || i == 16 || i == 20) out[o++] = '-';
        out[o++] = hex[i];
    }
    out[o] = '\0';
}

int64_t oq_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t oq_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void oq_mono_deadline(struct timespec *ts, int64_t us_from_now)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += us_from_now / 1000000;
    ts->tv_nsec += (long)(us_from_now % 1000000) * 1000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int64_t oq_boot_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int oq_boot_id(char out[40])
{
    out[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return OQ_ENOTFOUND;
    size_t n = fread(out, 1, 39, f);
    fclose(f);
    out[n] = '\0';
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' '))
        out[--n] = '\0';
    return n > 0 ? 0 : OQ_ENOTFOUND;
}

void oq_time_format(int64_t unix_ms, char out[32])
{
    time_t s = (time_t)(unix_ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    /* Before 1970 the remainder is negative: borrow one second. The moduli below only make
     * every field's width provable for -Wformat-truncation. */
    int64_t ms = unix_ms % 1000;
    if (ms < 0) {
        ms += 1000;
        s -= 1;
        gmtime_r(&s, &tm);
    }
    snprintf(out, 32, "%04u-%02u-%02uT%02u:%02u:%02u.%03uZ", (unsigned)(tm.tm_year + 1900) % 10000u,
             (unsigned)(tm.tm_mon + 1) % 100u, (unsigned)tm.tm_mday % 100u,
             (unsigned)tm.tm_hour % 100u, (unsigned)tm.tm_min % 100u, (unsigned)tm.tm_sec % 100u,
             (unsigned)ms % 1000u);
}

void oq_sleep_ms(int64_t ms, volatile int *stop)
{
    if (ms <= 0) return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        if (stop && *stop) return;
}

typedef struct {
    const char *suffix;
    int64_t mult;
} unit_t;

/* A non-negative decimal number ("1", "1.5", ".5") optionally followed by one of \p units.
 * Only plain decimals are accepted: strtod alone would also take "nan", "inf", hex and
 * exponents, and NaN would then be converted to an integer (undefined behaviour). */
static int parse_scaled(const char *s, int64_t *out, const unit_t *units, size_t nunits)
{
    if (!s || !*s) return OQ_EINVAL;
    size_t span = strspn(s, "0123456789.");
    if (span == 0 || (s[0] == '.' && !isdigit((unsigned char)s[1]))) return OQ_EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end != s + span || !(v >= 0)) return OQ_EINVAL;
    while (isspace((unsigned char)*end))
        end++;
    int64_t mult = -1;
    if (*end == '\0') {
        mult = 1;
    } else {
        for (size_t i = 0; i < nunits; i++)
            if (strcasecmp(end, units[i].suffix) == 0) mult = units[i].mult;
    }
    if (mult < 0) return OQ_EINVAL;
    double r = v * (double)mult;
    if (!(r <= 9.2e18)) return OQ_EINVAL;
    *out = (int64_t)r;
    return 0;
}

int oq_parse_duration_ms(const char *s, int64_t *out)
{
    static const unit_t units[] = {
        {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
    return parse_scaled(s, out, units, sizeof(units) / sizeof(units[0]));
}

int oq_parse_size(const char *s, int64_t *out)
{
    static const unit_t units[] = {{"b", 1},           {"k", 1024},       {"kb", 1000},
                                   {"kib", 1024},      {"m", 1048576},    {"mb", 1000000},
                                   {"mib", 1048576},   {"g", 1073741824}, {"gb", 1000000000},
                                   {"gib", 1073741824}};
    return parse_scaled(s, out, units, sizeof(units) / sizeof(units[0]));
}

/* --- crash points -------------------------------------------------------------------------- */

int oq__crash_armed = -1;
static const char *crash_spec;

void oq__crash_check(const char *point)
{
    if (oq__crash_armed < 0) {
        crash_spec = getenv("ONCEQ_CRASH_AT");
        oq__crash_armed = (crash_spec && *crash_spec) ? 1 : 0;
        if (!oq__crash_armed) return;
    }
    /* spec: name[@N][,name[@N]...]; each entry counts its own hits */
    static _Atomic long hits[32];
    size_t plen = strlen(point);
    size_t entry = 0;
    for (const char *p = crash_spec; p && *p; entry++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *at = memchr(p, '@', len);
        size_t nlen = at ? (size_t)(at - p) : len;
        const char *bang = memchr(p, '!', len);
        if (bang && (!at || bang < at)) nlen = (size_t)(bang - p);
        int stop = bang && (size_t)(p + len - bang) == 5 && memcmp(bang, "!stop", 5) == 0;
        if (nlen == plen && memcmp(p, point, plen) == 0) {
            long nth = at ? strtol(at + 1, NULL, 10) : 1;
            long h = atomic_fetch_add(&hits[entry < 32 ? entry : 31], 1) + 1;
            if (stop && h == nth) {
                /* a pause, not a crash: the test resumes the process with SIGCONT */
                oq_log_write(OQ_LOG_WARN, "crash", NULL,
                             "crash point %s reached (hit %ld): SIGSTOP", point, h);
                raise(SIGSTOP);
            } else if (!stop && h >= nth) {
                oq_log_write(OQ_LOG_WARN, "crash", NULL,
                             "crash point %s reached (hit %ld): SIGKILL", point, h);
                kill(getpid(), SIGKILL);
                _exit(137);
            }
        }
        p = comma ? comma + 1 : NULL;
    }
}
