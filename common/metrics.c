/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Metrics registry and Prometheus text exposition (format 0.0.4).
 *
 * Registration takes the registry mutex and appends to a list; updates never lock. Counters
 * are atomic uint64 adds; gauges and histogram sums are doubles kept as uint64 bit patterns
 * and updated with compare-and-swap, because C11 has no portable atomic double add. A
 * histogram keeps one non-cumulative count per bucket (plus +Inf); the renderer accumulates
 * them and derives _count from the same snapshot, so `le="+Inf"` always equals `_count` even
 * while other threads observe. Registering the same name and labels again returns the
 * existing metric (so components can register lazily), a different type under one name is a
 * clash (NULL).
 *
 * The renderer groups samples by family name in order of first registration: one # HELP and
 * # TYPE per family, then every label set. An optional collect callback runs first, under the
 * registry mutex, so daemons can refresh expensive gauges (rows pending, lag) only when
 * scraped.
 *
 * The listener that serves the registry (oq_metrics_serve) is common/metrics_http.c: the
 * registry itself knows nothing of HTTP, so the connection guard (common/mhd.c) can count in
 * it without an include circle.
 */
#include "oq_metrics.h"
#include "oq_buf.h"
#include "oq_log.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

typedef enum { OQ__COUNTER, OQ__GAUGE, OQ__HISTOGRAM } mtype_t;

struct oq_metric {
    char *name;
    char *help;
    char *labels; /* NULL or `k="v",...` */
    mtype_t type;
    _Atomic uint64_t value; /* counter: count; gauge: double bits */
    size_t nb;              /* histogram bounds (excluding +Inf) */
    double *bounds;
    _Atomic uint64_t *buckets; /* nb + 1, non-cumulative */
    _Atomic uint64_t sum;      /* double bits */
    int fcounter;              /* a counter set with oq_counter_set(): value holds double bits */
    _Atomic int absent;        /* oq_metric_set_absent(): no sample rendered */
    struct oq_metric *next;
};

struct oq_metrics {
    pthread_mutex_t mu;
    oq_metric_t *head, *tail;
    oq_metrics_collect_cb_t *collect;
    void *collect_arg;
    /* oq_metrics_add_process(): the standard process_* metrics, refreshed at every render */
    oq_metric_t *p_cpu, *p_rss, *p_vsz, *p_fds, *p_maxfds, *p_start;
};

static uint64_t d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

static double u2d(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

static void atomic_add_double(_Atomic uint64_t *a, double d)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, d2u(u2d(old) + d), memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* --- registry ----------------------------------------------------------------------------- */

oq_metrics_t *oq_metrics_new(void)
{
    oq_metrics_t *m = calloc(1, sizeof(*m));
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

static void metric_free(oq_metric_t *mt)
{
    if (!mt) return;
    free(mt->name);
    free(mt->help);
    free(mt->labels);
    free(mt->bounds);
    free((void *)mt->buckets);
    free(mt);
}

void oq_metrics_destroy(oq_metrics_t *m)
{
    if (!m) return;
    for (oq_metric_t *mt = m->head, *next; mt; mt = next) {
        next = mt->next;
        metric_free(mt);
    }
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void oq_metrics_set_collect_cb(oq_metrics_t *m, oq_metrics_collect_cb_t *cb, void *arg)
{
    pthread_mutex_lock(&m->mu);
    m->collect = cb;
    m->collect_arg = arg;
    pthread_mutex_unlock(&m->mu);
}

static int valid_name(const char *s)
{
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++) {
        char ch = *p;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || ch == ':' ||
                 (p != s && ch >= '0' && ch <= '9');
        if (!ok) return 0;
    }
    return 1;
}

static int same_labels(const char *a, const char *b)
{
    if (!a || !*a) return !b || !*b;
    return b && strcmp(a, b) == 0;
}

static oq_metric_t *metric_register(oq_metrics_t *m, mtype_t type, const char *name,
                                    const char *help, const char *labels, const double *bounds,
                                    size_t nb)
{
    if (!m || !valid_name(name)) {
        OQ_LOG_ERROR("metrics", "invalid metric name '%s'", name ? name : "(null)");
        return NULL;
    }
    oq_metric_t *res = NULL;
    pthread_mutex_lock(&m->mu);
    for (oq_metric_t *mt = m->head; mt; mt = mt->next) {
        if (strcmp(mt->name, name) != 0) continue;
        if (mt->type != type) {
            OQ_LOG_ERROR("metrics", "metric %s registered twice with different types", name);
            goto out;
        }
        if (same_labels(mt->labels, labels)) {
            res = mt;
            goto out;
        }
    }
    oq_metric_t *mt = calloc(1, sizeof(*mt));
    if (!mt) goto out;
    mt->type = type;
    mt->name = strdup(name);
    mt->help = strdup(help ? help : "");
    mt->labels = (labels && *labels) ? strdup(labels) : NULL;
    if (!mt->name || !mt->help || (labels && *labels && !mt->labels)) goto fail;
    if (type == OQ__HISTOGRAM) {
        for (size_t i = 1; i < nb; i++)
            if (!(bounds[i] > bounds[i - 1])) {
                OQ_LOG_ERROR("metrics", "histogram %s: bounds must be ascending", name);
                goto fail;
            }
        mt->nb = nb;
        mt->bounds = malloc((nb ? nb : 1) * sizeof(double));
        mt->buckets = calloc(nb + 1, sizeof(*mt->buckets));
        if (!mt->bounds || !mt->buckets) goto fail;
        if (nb) memcpy(mt->bounds, bounds, nb * sizeof(double));
    }
    if (m->tail)
        m->tail->next = mt;
    else
        m->head = mt;
    m->tail = mt;
    res = mt;
    goto out;
fail:
    metric_free(mt);
out:
    pthread_mutex_unlock(&m->mu);
    return res;
}

oq_metric_t *oq_metrics_counter(oq_metrics_t *m, const char *name, const char *help,
                                const char *labels)
{
    return metric_register(m, OQ__COUNTER, name, help, labels, NULL, 0);
}

oq_metric_t *oq_metrics_gauge(oq_metrics_t *m, const char *name, const char *help,
                              const char *labels)
{
    return metric_register(m, OQ__GAUGE, name, help, labels, NULL, 0);
}

oq_metric_t *oq_metrics_histogram(oq_metrics_t *m, const char *name, const char *help,
                                  const char *labels, const double *bounds, size_t n)
{
    if (n && !bounds) return NULL;
    return metric_register(m, OQ__HISTOGRAM, name, help, labels, bounds, n);
}

/* --- updates ------------------------------------------------------------------------------ */

void oq_counter_add(oq_metric_t *c, uint64_t n)
{
    if (c && c->type == OQ__COUNTER && !c->fcounter)
        atomic_fetch_add_explicit(&c->value, n, memory_order_relaxed);
}

void oq_counter_set(oq_metric_t *c, double v)
{
    if (!c || c->type != OQ__COUNTER || isnan(v)) return;
    if (!c->fcounter) { /* first use: an integer counter never added to becomes a float one */
        if (atomic_load_explicit(&c->value, memory_order_relaxed) != 0) return;
        c->fcounter = 1;
        atomic_store_explicit(&c->value, d2u(0.0), memory_order_relaxed);
    }
    uint64_t old = atomic_load_explicit(&c->value, memory_order_relaxed);
    while (u2d(old) < v && !atomic_compare_exchange_weak_explicit(
                               &c->value, &old, d2u(v), memory_order_relaxed, memory_order_relaxed))
        ;
}

void oq_metric_set_absent(oq_metric_t *mt, int absent)
{
    if (mt) atomic_store_explicit(&mt->absent, absent ? 1 : 0, memory_order_relaxed);
}

void oq_gauge_set(oq_metric_t *g, double v)
{
    if (g && g->type == OQ__GAUGE) atomic_store_explicit(&g->value, d2u(v), memory_order_relaxed);
}

void oq_gauge_add(oq_metric_t *g, double d)
{
    if (g && g->type == OQ__GAUGE) atomic_add_double(&g->value, d);
}

void oq_histogram_observe(oq_metric_t *h, double v)
{
    if (!h || h->type != OQ__HISTOGRAM || isnan(v)) return;
    size_t i = 0;
    while (i < h->nb && v > h->bounds[i])
        i++; /* few buckets: a scan beats bsearch */
    atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
    atomic_add_double(&h->sum, v);
}

double oq_metric_value(const oq_metric_t *mt)
{
    if (!mt) return 0;
    uint64_t u = atomic_load_explicit(&((oq_metric_t *)mt)->value, memory_order_relaxed);
    if (mt->type == OQ__COUNTER) return mt->fcounter ? u2d(u) : (double)u;
    if (mt->type == OQ__GAUGE) return u2d(u);
    uint64_t n = 0;
    for (size_t i = 0; i <= mt->nb; i++)
        n += atomic_load_explicit(&((oq_metric_t *)mt)->buckets[i], memory_order_relaxed);
    return (double)n;
}

/* --- process metrics ---------------------------------------------------------------------- */

int oq_metrics_add_process(oq_metrics_t *m, const char *component)
{
    char labels[160];
    snprintf(labels, sizeof labels, "version=\"%s\",component=\"%s\"", ONCEQ_VERSION,
             component ? component : "onceq");
    oq_metric_t *bi = oq_metrics_gauge(m, "onceq_build_info",
                                       "always 1: the onceq version and the component", labels);
    oq_gauge_set(bi, 1);
    m->p_cpu = oq_metrics_counter(m, "process_cpu_seconds_total",
                                  "user and system CPU time spent in seconds", NULL);
    m->p_rss =
        oq_metrics_gauge(m, "process_resident_memory_bytes", "resident memory size in bytes", NULL);
    m->p_vsz =
        oq_metrics_gauge(m, "process_virtual_memory_bytes", "virtual memory size in bytes", NULL);
    m->p_fds = oq_metrics_gauge(m, "process_open_fds", "number of open file descriptors", NULL);
    m->p_maxfds =
        oq_metrics_gauge(m, "process_max_fds", "maximum number of open file descriptors", NULL);
    m->p_start =
        oq_metrics_gauge(m, "process_start_time_seconds",
                         "start time of the process since the Unix epoch in seconds", NULL);
    if (!bi || !m->p_cpu || !m->p_rss || !m->p_vsz || !m->p_fds || !m->p_maxfds || !m->p_start)
        return OQ_ENOMEM;
    /* /proc/self/stat field 22 is the start time in clock ticks after boot */
    long tck = sysconf(_SC_CLK_TCK);
    FILE *f = fopen("/proc/self/stat", "r");
    char buf[1024];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    unsigned long long start = 0;
    /* after ") ": state(3) ... starttime(22): skip 19 fields */
    if (p &&
        sscanf(p + 2,
               "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
               "%*d %*d %llu",
               &start) == 1 &&
        tck > 0) {
        /* The boot time from the clocks, not /proc/stat's btime: the systemd units run with
         * ProcSubset=pid, which leaves /proc/self but hides /proc/stat. */
        struct timespec real, boot;
        clock_gettime(CLOCK_REALTIME, &real);
        clock_gettime(CLOCK_BOOTTIME, &boot);
        double booted =
            (double)(real.tv_sec - boot.tv_sec) + (double)(real.tv_nsec - boot.tv_nsec) / 1e9;
        oq_gauge_set(m->p_start, booted + (double)start / (double)tck);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        oq_gauge_set(m->p_start, (double)ts.tv_sec);
    }
    return 0;
}

/* Under the registry mutex, before the collect callback: read /proc/self. */
static void process_refresh(oq_metrics_t *m)
{
    if (!m->p_cpu) return;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        oq_counter_set(m->p_cpu, (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                                     (double)ru.ru_stime.tv_sec +
                                     (double)ru.ru_stime.tv_usec / 1e6);
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long vsz = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &vsz, &rss) == 2) {
            double page = (double)sysconf(_SC_PAGESIZE);
            oq_gauge_set(m->p_vsz, (double)vsz * page);
            oq_gauge_set(m->p_rss, (double)rss * page);
        }
        fclose(f);
    }
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        int nfd = 0;
        for (struct dirent *e; (e = readdir(d));)
            if (e->d_name[0] != '.') nfd++;
        closedir(d);
        oq_gauge_set(m->p_fds, (double)(nfd - 1)); /* not the one opendir holds */
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        oq_gauge_set(m->p_maxfds, rl.rlim_cur == RLIM_INFINITY ? -1 : (double)rl.rlim_cur);
}

/* --- rendering ---------------------------------------------------------------------------- */

/* Prometheus number: integers without exponent or fraction, otherwise the shortest %g form
 * that reads back exactly; NaN and infinities spelled as the format wants. */
static void fmt_num(double v, char out[40])
{
    if (isnan(v)) {
        strcpy(out, "NaN");
    } else if (isinf(v)) {
        strcpy(out, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 9.0e15) {
        snprintf(out, 40, "%.0f", v == 0 ? 0.0 : v);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(out, 40, "%.*g", prec, v);
            if (strtod(out, NULL) == v) break;
        }
    }
}

static void sb_escaped_help(oq_buf_t *sb, const char *s)
{
    if (!strpbrk(s, "\\\n")) {
        oq_buf_printf(sb, "%s", s);
        return;
    }
    for (; *s; s++) {
        if (*s == '\\')
            oq_buf_printf(sb, "\\\\");
        else if (*s == '\n')
            oq_buf_printf(sb, "\\n");
        else
            oq_buf_printf(sb, "%c", *s);
    }
}

static void render_metric(oq_buf_t *sb, oq_metric_t *mt)
{
    char num[40];
    const char *lb = mt->labels ? mt->labels : "";
    const char *open = mt->labels ? "{" : "", *close = mt->labels ? "}" : "";
    uint64_t u = atomic_load_explicit(&mt->value, memory_order_relaxed);
    if (atomic_load_explicit(&mt->absent, memory_order_relaxed)) return;
    if (mt->type == OQ__COUNTER && mt->fcounter) {
        fmt_num(u2d(u), num);
        oq_buf_printf(sb, "%s%s%s%s %s\n", mt->name, open, lb, close, num);
        return;
    }
    if (mt->type == OQ__COUNTER) {
        oq_buf_printf(sb, "%s%s%s%s %llu\n", mt->name, open, lb, close, (unsigned long long)u);
        return;
    }
    if (mt->type == OQ__GAUGE) {
        fmt_num(u2d(u), num);
        oq_buf_printf(sb, "%s%s%s%s %s\n", mt->name, open, lb, close, num);
        return;
    }
    uint64_t cum = 0;
    const char *sep = mt->labels ? "," : "";
    for (size_t i = 0; i <= mt->nb; i++) {
        cum += atomic_load_explicit(&mt->buckets[i], memory_order_relaxed);
        if (i < mt->nb)
            fmt_num(mt->bounds[i], num);
        else
            strcpy(num, "+Inf");
        oq_buf_printf(sb, "%s_bucket{%s%sle=\"%s\"} %llu\n", mt->name, lb, sep, num,
                      (unsigned long long)cum);
    }
    fmt_num(u2d(atomic_load_explicit(&mt->sum, memory_order_relaxed)), num);
    oq_buf_printf(sb, "%s_sum%s%s%s %s\n", mt->name, open, lb, close, num);
    oq_buf_printf(sb, "%s_count%s%s%s %llu\n", mt->name, open, lb, close, (unsigned long long)cum);
}

int oq_metrics_render(oq_metrics_t *m, char **out, size_t *out_len)
{
    static const char *const tnames[] = {"counter", "gauge", "histogram"};
    oq_buf_t sb = {0};
    *out = NULL;
    if (out_len) *out_len = 0;
    if (oq_buf_reserve(&sb, 4096)) return OQ_ENOMEM;
    sb.p[0] = '\0';
    pthread_mutex_lock(&m->mu);
    process_refresh(m);
    if (m->collect) m->collect(m, m->collect_arg);
    for (oq_metric_t *fam = m->head; fam; fam = fam->next) {
        /* Skip names already rendered with an earlier family head. */
        int seen = 0;
        for (oq_metric_t *p = m->head; p != fam; p = p->next)
            if (strcmp(p->name, fam->name) == 0) {
                seen = 1;
                break;
            }
        if (seen) continue;
        oq_buf_printf(&sb, "# HELP %s ", fam->name);
        sb_escaped_help(&sb, fam->help);
        oq_buf_printf(&sb, "\n# TYPE %s %s\n", fam->name, tnames[fam->type]);
        for (oq_metric_t *mt = fam; mt; mt = mt->next)
            if (strcmp(mt->name, fam->name) == 0) render_metric(&sb, mt);
    }
    pthread_mutex_unlock(&m->mu);
    if (!(*out = oq_buf_take(&sb, out_len))) return OQ_ENOMEM;
    return 0;
}
