/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Settings. A command describes its settings once, as a table of oq_setting_t (name, type,
 * default, bounds, doc); that table drives the defaults, --help, command-line parsing, config
 * files and validation, so the four can never disagree. Values are parsed and checked when
 * they are set (a bad value is reported with the setting's name and, for files, file:line),
 * and stored by type: integers, booleans, durations (ms) and sizes (bytes) as int64, strings
 * and enum words as owned copies.
 *
 * Kafka properties (-X name=value, or `kafka.name = value` / kcat-style `name=value` in a file)
 * are not validated here: they are kept in order and handed to librdkafka (oq_kafka_conf_apply()
 * scopes `producer.` / `consumer.` names to one kind of client), which knows every property
 * and reports unknown ones. A property given twice keeps its first position and its last
 * value. Only commands that talk to Kafka (their table has a `brokers` setting) take them:
 * elsewhere -X is an error and is not listed in --help. Those commands also take kcat's `-b
 * VALUE` as `--brokers VALUE`.
 *
 * Precedence is flag > environment > file > default, whatever the order on the command line:
 * parsing walks argv twice, first loading the -F files (in their order, a later file wins over
 * an earlier one), then, when oq_config_use_env() gave a prefix, reading one variable per
 * setting of this table (<prefix><NAME>, upper case, '-' -> '_'), and last applying the flags
 * and -X properties. Only names built from the command's own table are read, so unrelated
 * variables that share the prefix (log level, crash points, test harness paths) are never
 * taken for settings. A config file cannot include another one.
 */
#include "oq_config.h"
#include "oq_log.h"
#include "oq_util.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <librdkafka/rdkafka.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    int64_t i;
    char *s;
    int set; /* given explicitly by the user */
} value_t;

typedef struct {
    char *name;
    char *value;
} kv_t;

struct oq_config {
    const oq_setting_t *table;
    size_t n;
    value_t *vals;
    const char **pos; /* borrowed from argv */
    int npos, cappos;
    kv_t *kafka;
    int nkafka, capkafka;
    char env_prefix[32]; /* "" = the environment is not read */
};

/* --- value parsing ------------------------------------------------------------------------ */

static const oq_setting_t *find(const oq_config_t *c, const char *name, size_t *idx)
{
    for (size_t i = 0; i < c->n; i++) {
        if (strcmp(c->table[i].name, name) == 0) {
            if (idx) *idx = i;
            return &c->table[i];
        }
    }
    return NULL;
}

static int parse_bool(const char *v, int64_t *out)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) return (*out = 1), 0;
        if (strcasecmp(v, no[i]) == 0) return (*out = 0), 0;
    }
    return OQ_EINVAL;
}

static int parse_int(const char *v, int64_t *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end != '\0' || isspace((unsigned char)*v)) return OQ_EINVAL;
    *out = (int64_t)x;
    return 0;
}

/* Human form of a duration (ms) or size (bytes) for bound messages and --help. */
static void fmt_value(oq_setting_type_t type, int64_t v, char *out, size_t cap)
{
    if (type == OQ_SET_DURATION && v > 0) {
        static const struct {
            int64_t mult;
            const char *unit;
        } u[] = {{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}};
        for (size_t i = 0; i < sizeof(u) / sizeof(u[0]); i++)
            if (v % u[i].mult == 0) {
                snprintf(out, cap, "%" PRId64 "%s", v / u[i].mult, u[i].unit);
                return;
            }
        snprintf(out, cap, "%" PRId64 "ms", v);
    } else if (type == OQ_SET_SIZE && v > 0) {
        static const struct {
            int64_t mult;
            const char *unit;
        } u[] = {{1073741824, "GiB"}, {1048576, "MiB"}, {1024, "KiB"}};
        for (size_t i = 0; i < sizeof(u) / sizeof(u[0]); i++)
            if (v % u[i].mult == 0) {
                snprintf(out, cap, "%" PRId64 "%s", v / u[i].mult, u[i].unit);
                return;
            }
        snprintf(out, cap, "%" PRId64, v);
    } else if (type == OQ_SET_DURATION && v < 0) {
        snprintf(out, cap, "%" PRId64 "ms", v);
    } else {
        snprintf(out, cap, "%" PRId64, v);
    }
}

/* Finds \p v among the '|'-separated \p choices (case-insensitive); copies the table's
 * spelling into \p out. */
static int match_choice(const char *choices, const char *v, char *out, size_t cap)
{
    size_t vlen = strlen(v);
    for (const char *p = choices; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == vlen && strncasecmp(p, v, len) == 0 && len < cap) {
            memcpy(out, p, len);
            out[len] = '\0';
            return 0;
        }
        p = bar ? bar + 1 : NULL;
    }
    return OQ_EINVAL;
}

/* Parses and checks \p text for setting \p s; on success stores into \p val (freeing the
 * previous string). Error messages name the setting as --name. */
static int store(const oq_setting_t *s, const char *text, value_t *val, oq_error_t *err)
{
    int64_t x = 0;
    int rc = 0;
    const char *expect = NULL;
    switch (s->type) {
    case OQ_SET_BOOL:
        if (parse_bool(text, &x) != 0) expect = "a boolean (true/false/yes/no/on/off/1/0)";
        break;
    case OQ_SET_INT:
        if (parse_int(text, &x) != 0) expect = "integer";
        break;
    case OQ_SET_DURATION:
        if (oq_parse_duration_ms(text, &x) != 0) expect = "a duration such as 250ms, 30s, 5m, 24h";
        break;
    case OQ_SET_SIZE:
        if (oq_parse_size(text, &x) != 0) expect = "a size such as 65536, 64KiB, 1MiB";
        break;
    case OQ_SET_STRING: {
        int64_t len = (int64_t)strlen(text);
        if (s->max > 0 && s->min <= s->max) {
            if (len < s->min)
                return oq_error_set(err, OQ_EINVAL, 0,
                                    "setting --%s: length %" PRId64
                                    " is below the minimum %" PRId64,
                                    s->name, len, s->min);
            if (len > s->max)
                return oq_error_set(err, OQ_EINVAL, 0,
                                    "setting --%s: length %" PRId64
                                    " is above the maximum %" PRId64,
                                    s->name, len, s->max);
        }
        char *dup = strdup(text);
        if (!dup) return oq_error_set(err, OQ_ENOMEM, 0, "setting --%s: out of memory", s->name);
        free(val->s);
        val->s = dup;
        return 0;
    }
    case OQ_SET_ENUM: {
        char word[128];
        if (match_choice(s->choices, text, word, sizeof(word)) != 0)
            return oq_error_set(err, OQ_EINVAL, 0, "setting --%s: expected one of %s, got '%s'",
                                s->name, s->choices ? s->choices : "(none)", text);
        char *dup = strdup(word);
        if (!dup) return oq_error_set(err, OQ_ENOMEM, 0, "setting --%s: out of memory", s->name);
        free(val->s);
        val->s = dup;
        return 0;
    }
    default:
        return oq_error_set(err, OQ_EINVAL, 0, "setting --%s: unknown type %d", s->name,
                            (int)s->type);
    }
    if (expect)
        return oq_error_set(err, OQ_EINVAL, 0, "setting --%s: expected %s, got '%s'", s->name,
                            expect, text);
    if (s->type != OQ_SET_BOOL && s->min <= s->max) {
        char a[48], b[48];
        if (x < s->min) {
            fmt_value(s->type, x, a, sizeof(a));
            fmt_value(s->type, s->min, b, sizeof(b));
            rc = oq_error_set(err, OQ_EINVAL, 0, "setting --%s: %s is below the minimum %s",
                              s->name, a, b);
        } else if (x > s->max) {
            fmt_value(s->type, x, a, sizeof(a));
            fmt_value(s->type, s->max, b, sizeof(b));
            rc = oq_error_set(err, OQ_EINVAL, 0, "setting --%s: %s is above the maximum %s",
                              s->name, a, b);
        }
        if (rc) return rc;
    }
    val->i = x;
    return 0;
}

/* --- lifecycle ---------------------------------------------------------------------------- */

oq_config_t *oq_config_new(const oq_setting_t *table, size_t n)
{
    oq_config_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->table = table;
    c->n = n;
    c->vals = calloc(n ? n : 1, sizeof(*c->vals));
    if (!c->vals) goto fail;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++)
            if (strcmp(table[i].name, table[j].name) == 0) {
                OQ_LOG_ERROR("config", "settings table: --%s appears twice", table[i].name);
                goto fail;
            }
        if (!table[i].def) continue;
        oq_error_t err = {0};
        if (store(&table[i], table[i].def, &c->vals[i], &err) != 0) {
            OQ_LOG_ERROR("config", "settings table: bad default: %s", err.msg);
            goto fail;
        }
    }
    return c;
fail:
    oq_config_destroy(c);
    return NULL;
}

void oq_config_destroy(oq_config_t *c)
{
    if (!c) return;
    if (c->vals)
        for (size_t i = 0; i < c->n; i++)
            free(c->vals[i].s);
    free(c->vals);
    for (int i = 0; i < c->nkafka; i++) {
        free(c->kafka[i].name);
        free(c->kafka[i].value);
    }
    free(c->kafka);
    free(c->pos);
    free(c);
}

/* --- setting ------------------------------------------------------------------------------ */

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    size_t d[64][64];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

static int unknown_setting(const oq_config_t *c, const char *name, oq_error_t *err)
{
    const char *best = NULL;
    size_t bestd = 3;
    for (size_t i = 0; i < c->n; i++) {
        size_t d = edit_distance(name, c->table[i].name);
        if (d < bestd) {
            bestd = d;
            best = c->table[i].name;
        }
    }
    if (best)
        return oq_error_set(err, OQ_EINVAL, 0, "unknown setting --%s (did you mean --%s?)", name,
                            best);
    return oq_error_set(err, OQ_EINVAL, 0, "unknown setting --%s", name);
}

int oq_config_set(oq_config_t *c, const char *name, const char *value, oq_error_t *err)
{
    size_t i;
    const oq_setting_t *s = find(c, name, &i);
    if (!s) return unknown_setting(c, name, err);
    if (!value) return oq_error_set(err, OQ_EINVAL, 0, "setting --%s needs a value", name);
    int rc = store(s, value, &c->vals[i], err);
    if (rc == 0) c->vals[i].set = 1;
    return rc;
}

int oq_config_set_kafka(oq_config_t *c, const char *name, const char *value, oq_error_t *err)
{
    if (!name || !*name || !value)
        return oq_error_set(err, OQ_EINVAL, 0, "kafka property: empty name or missing value");
    char *v = strdup(value);
    if (!v) return oq_error_set(err, OQ_ENOMEM, 0, "kafka property %s: out of memory", name);
    for (int i = 0; i < c->nkafka; i++) {
        if (strcmp(c->kafka[i].name, name) == 0) {
            free(c->kafka[i].value);
            c->kafka[i].value = v;
            return 0;
        }
    }
    if (c->nkafka == c->capkafka) {
        int ncap = c->capkafka ? c->capkafka * 2 : 8;
        kv_t *nk = realloc(c->kafka, (size_t)ncap * sizeof(*nk));
        if (!nk) goto nomem;
        c->kafka = nk;
        c->capkafka = ncap;
    }
    char *nm = strdup(name);
    if (!nm) goto nomem;
    c->kafka[c->nkafka].name = nm;
    c->kafka[c->nkafka].value = v;
    c->nkafka++;
    return 0;
nomem:
    free(v);
    return oq_error_set(err, OQ_ENOMEM, 0, "kafka property %s: out of memory", name);
}

/* Splits "name=value" (from -X) and records it. */
static int set_kafka_pair(oq_config_t *c, const char *pair, oq_error_t *err)
{
    const char *eq = strchr(pair, '=');
    if (!eq || eq == pair)
        return oq_error_set(err, OQ_EINVAL, 0, "-X expects property=value, got '%s'", pair);
    size_t nlen = (size_t)(eq - pair);
    char name[256];
    if (nlen >= sizeof(name))
        return oq_error_set(err, OQ_EINVAL, 0, "-X: property name too long: '%.40s...'", pair);
    memcpy(name, pair, nlen);
    name[nlen] = '\0';
    return oq_config_set_kafka(c, name, eq + 1, err);
}

/* Commands that talk to Kafka have a `brokers` setting; only they take Kafka properties. */
static int kafka_allowed(const oq_config_t *c)
{
    return find(c, "brokers", NULL) != NULL;
}

static int kafka_refused(const char *what, oq_error_t *err)
{
    return oq_error_set(err, OQ_EINVAL, 0,
                        "%s: this command does not talk to Kafka (no Kafka properties)", what);
}

/* --- config file -------------------------------------------------------------------------- */

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

int oq_config_load_file(oq_config_t *c, const char *path, oq_error_t *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return oq_error_set(err, OQ_EINVAL, errno, "cannot read config file %s: %s", path,
                            strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, rc = 0;
    oq_error_t e = {0};
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        char *p = trim(line);
        if (*p == '\0' || *p == '#') continue;
        /* A '#' preceded by whitespace starts a trailing comment. */
        for (char *h = strchr(p, '#'); h; h = strchr(h + 1, '#'))
            if (isspace((unsigned char)h[-1])) {
                *h = '\0';
                break;
            }
        char *eq = strchr(p, '=');
        if (!eq) {
            rc = oq_error_set(err, OQ_EINVAL, 0, "%s:%d: expected 'name = value', got '%.80s'",
                              path, lineno, p);
            goto out;
        }
        *eq = '\0';
        char *name = trim(p), *value = trim(eq + 1);
        size_t vl = strlen(value);
        if (vl >= 2 && ((value[0] == '"' && value[vl - 1] == '"') ||
                        (value[0] == '\'' && value[vl - 1] == '\''))) {
            value[vl - 1] = '\0';
            value++;
        }
        if (*name == '\0') {
            rc = oq_error_set(err, OQ_EINVAL, 0, "%s:%d: missing setting name", path, lineno);
            goto out;
        }
        /* kcat-style property files: a dotted name is a Kafka property (no onceq setting has
         * a dot); bootstrap.servers fills --brokers, at the file's precedence */
        int dotted = strchr(name, '.') != NULL, kafka = strncmp(name, "kafka.", 6) == 0;
        const char *prop = kafka ? name + 6 : name;
        if ((kafka || dotted) && !kafka_allowed(c))
            rc = kafka_refused(name, &e);
        else if ((kafka || dotted) && (strcmp(prop, "bootstrap.servers") == 0 ||
                                       strcmp(prop, "metadata.broker.list") == 0))
            rc = oq_config_set(c, "brokers", value, &e);
        else if (kafka || dotted)
            rc = oq_config_set_kafka(c, prop, value, &e);
        else
            rc = oq_config_set(c, name, value, &e);
        if (rc != 0) {
            oq_error_set(err, rc, e.cause, "%s:%d: %s", path, lineno, e.msg);
            goto out;
        }
    }
    if (ferror(f))
        rc = oq_error_set(err, OQ_EINVAL, errno, "cannot read config file %s: %s", path,
                          strerror(errno));
out:
    free(line);
    fclose(f);
    return rc;
}

/* --- environment ------------------------------------------------------------------------- */

void oq_config_use_env(oq_config_t *c, const char *prefix)
{
    snprintf(c->env_prefix, sizeof(c->env_prefix), "%s", prefix ? prefix : "");
}

int oq_config_env_name(const char *prefix, const char *setting, char *out, size_t cap)
{
    int w = snprintf(out, cap, "%s%s", prefix, setting);
    if (w < 0 || (size_t)w >= cap) return OQ_EINVAL;
    for (char *p = out + strlen(prefix); *p; p++)
        *p = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    return 0;
}

/* Applies every <prefix><NAME> variable that names a setting of this table. An empty value
 * counts as given (it sets an empty string, and fails for a number like any bad value). */
static int apply_env(oq_config_t *c, oq_error_t *err)
{
    if (!c->env_prefix[0]) return 0;
    for (size_t i = 0; i < c->n; i++) {
        char var[160];
        if (oq_config_env_name(c->env_prefix, c->table[i].name, var, sizeof(var)) != 0) continue;
        const char *v = getenv(var);
        if (!v) continue;
        oq_error_t e = {0};
        int rc = oq_config_set(c, c->table[i].name, v, &e);
        if (rc != 0) return oq_error_set(err, rc, e.cause, "environment %s: %s", var, e.msg);
    }
    return 0;
}

/* --- command line ------------------------------------------------------------------------- */

static int add_positional(oq_config_t *c, const char *arg, oq_error_t *err)
{
    if (c->npos == c->cappos) {
        int ncap = c->cappos ? c->cappos * 2 : 8;
        const char **np = realloc(c->pos, (size_t)ncap * sizeof(*np));
        if (!np) return oq_error_set(err, OQ_ENOMEM, 0, "positional arguments: out of memory");
        c->pos = np;
        c->cappos = ncap;
    }
    c->pos[c->npos++] = arg;
    return 0;
}

/* One walk over argv. Both passes tokenize alike (so a value is never taken for a flag); the
 * files pass prints --help and loads -F files, the flags pass applies everything else. */
enum { PASS_FILES, PASS_FLAGS };

static int walk(oq_config_t *c, const char *usage, int argc, char **argv, int first, int pass,
                oq_error_t *err)
{
    int rc = 0, files = pass == PASS_FILES;
    for (int i = first; i < argc && rc == 0; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            for (i++; i < argc && rc == 0 && !files; i++)
                rc = add_positional(c, argv[i], err);
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            if (!files) continue;
            oq_config_print_help(c, usage, stdout);
            return OQ_EHELP;
        }
        if (strncmp(a, "-X", 2) == 0) {
            const char *pair = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
            if (!pair) return oq_error_set(err, OQ_EINVAL, 0, "-X needs property=value");
            if (!kafka_allowed(c)) return kafka_refused("-X", err);
            if (!files) rc = set_kafka_pair(c, pair, err);
            continue;
        }
        if (strncmp(a, "-b", 2) == 0 && find(c, "brokers", NULL)) { /* kcat's -b: --brokers */
            const char *v = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return oq_error_set(err, OQ_EINVAL, 0, "setting -b (--brokers) needs a value");
            if (!files) rc = oq_config_set(c, "brokers", v, err);
            continue;
        }
        if (strcmp(a, "-F") == 0 || strcmp(a, "--config") == 0 || strncmp(a, "--config=", 9) == 0) {
            const char *path = a[1] == 'F'   ? (i + 1 < argc ? argv[++i] : NULL)
                               : a[8] == '=' ? a + 9
                                             : (i + 1 < argc ? argv[++i] : NULL);
            if (!path) return oq_error_set(err, OQ_EINVAL, 0, "%s needs a file name", a);
            if (files) rc = oq_config_load_file(c, path, err);
            continue;
        }
        if (strncmp(a, "--", 2) == 0) {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            char buf[128];
            if (eq) {
                size_t nlen = (size_t)(eq - name);
                if (nlen >= sizeof(buf)) return unknown_setting(c, name, err);
                memcpy(buf, name, nlen);
                buf[nlen] = '\0';
                name = buf;
            }
            const oq_setting_t *s = find(c, name, NULL);
            if (!s && !eq && strncmp(name, "no-", 3) == 0) {
                const oq_setting_t *b = find(c, name + 3, NULL);
                if (b && b->type == OQ_SET_BOOL) {
                    if (!files) rc = oq_config_set(c, name + 3, "false", err);
                    continue;
                }
            }
            if (!s) return unknown_setting(c, name, err);
            const char *value;
            if (eq) {
                value = eq + 1;
            } else if (s->type == OQ_SET_BOOL) {
                value = "true";
            } else {
                if (i + 1 >= argc)
                    return oq_error_set(err, OQ_EINVAL, 0, "setting --%s needs a value", name);
                value = argv[++i];
            }
            if (!files) rc = oq_config_set(c, name, value, err);
            continue;
        }
        if (a[0] == '-' && a[1] != '\0')
            return oq_error_set(err, OQ_EINVAL, 0, "unknown option %s", a);
        if (!files) rc = add_positional(c, a, err);
    }
    return rc;
}

int oq_config_parse_args(oq_config_t *c, const char *usage, int argc, char **argv, int first,
                         oq_error_t *err)
{
    int rc = walk(c, usage, argc, argv, first, PASS_FILES, err);
    if (rc == 0) rc = apply_env(c, err);
    if (rc == 0) rc = walk(c, usage, argc, argv, first, PASS_FLAGS, err);
    return rc;
}

/* --- accessors ---------------------------------------------------------------------------- */

static size_t must_find(const oq_config_t *c, const char *name, const char *accessor)
{
    size_t i;
    if (!find(c, name, &i)) {
        fprintf(stderr, "onceq: BUG: %s(\"%s\"): no such setting in this command's table\n",
                accessor, name);
        abort();
    }
    return i;
}

int64_t oq_config_int(const oq_config_t *c, const char *name)
{
    size_t i = must_find(c, name, "oq_config_int");
    oq_setting_type_t t = c->table[i].type;
    if (t == OQ_SET_STRING || t == OQ_SET_ENUM) {
        fprintf(stderr, "onceq: BUG: oq_config_int(\"%s\"): the setting is a string\n", name);
        abort();
    }
    return c->vals[i].i;
}

const char *oq_config_str(const oq_config_t *c, const char *name)
{
    size_t i = must_find(c, name, "oq_config_str");
    oq_setting_type_t t = c->table[i].type;
    if (t != OQ_SET_STRING && t != OQ_SET_ENUM) {
        fprintf(stderr, "onceq: BUG: oq_config_str(\"%s\"): the setting is not a string\n", name);
        abort();
    }
    return c->vals[i].s;
}

int oq_config_has(const oq_config_t *c, const char *name)
{
    return find(c, name, NULL) != NULL;
}

int oq_config_is_set(const oq_config_t *c, const char *name)
{
    return c->vals[must_find(c, name, "oq_config_is_set")].set;
}

int oq_config_npositional(const oq_config_t *c)
{
    return c->npos;
}

const char *oq_config_positional(const oq_config_t *c, int i)
{
    return (i >= 0 && i < c->npos) ? c->pos[i] : NULL;
}

int oq_config_kafka_count(const oq_config_t *c)
{
    return c->nkafka;
}

void oq_config_kafka_get(const oq_config_t *c, int i, const char **name, const char **value)
{
    int ok = i >= 0 && i < c->nkafka;
    if (name) *name = ok ? c->kafka[i].name : NULL;
    if (value) *value = ok ? c->kafka[i].value : NULL;
}

int oq_config_apply_kafka(const oq_config_t *c, void *rd_kafka_conf, oq_error_t *err)
{
    rd_kafka_conf_t *conf = rd_kafka_conf;
    for (int i = 0; i < c->nkafka; i++) {
        char errstr[256];
        if (rd_kafka_conf_set(conf, c->kafka[i].name, c->kafka[i].value, errstr, sizeof(errstr)) !=
            RD_KAFKA_CONF_OK)
            return oq_error_set(err, OQ_EINVAL, 0, "kafka property %s: %s", c->kafka[i].name,
                                errstr);
    }
    return 0;
}

/* --- help --------------------------------------------------------------------------------- */

/* snprintf that appends and never runs past \p cap. */
static void append(char *buf, size_t cap, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *n, const char *fmt, ...)
{
    if (*n >= cap - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *n, cap - *n, fmt, ap);
    va_end(ap);
    if (w > 0) *n = (*n + (size_t)w < cap) ? *n + (size_t)w : cap - 1;
}

static const char *type_name(oq_setting_type_t t)
{
    switch (t) {
    case OQ_SET_BOOL:
        return "bool";
    case OQ_SET_INT:
        return "int";
    case OQ_SET_DURATION:
        return "duration";
    case OQ_SET_SIZE:
        return "size";
    case OQ_SET_STRING:
        return "string";
    case OQ_SET_ENUM:
        return "enum";
    }
    return "?";
}

void oq_config_print_help(const oq_config_t *c, const char *usage, FILE *out)
{
    if (usage && *usage) fprintf(out, "%s\n", usage);
    int w = 16;
    for (size_t i = 0; i < c->n; i++) {
        int l = (int)strlen(c->table[i].name) + 2;
        if (l > w) w = l;
    }
    fprintf(out, "\nsettings (--name value, --name=value; bools also --name / --no-name):\n");
    for (size_t i = 0; i < c->n; i++) {
        const oq_setting_t *s = &c->table[i];
        char flag[160];
        snprintf(flag, sizeof(flag), "--%s", s->name);
        fprintf(out, "  %-*s %-8s  %s", w, flag, type_name(s->type), s->doc ? s->doc : "");
        char extra[256] = "";
        size_t n = 0;
        if (s->def) append(extra, sizeof(extra), &n, "default: %s", *s->def ? s->def : "\"\"");
        if (s->type == OQ_SET_ENUM && s->choices)
            append(extra, sizeof(extra), &n, "%sone of: %s", n ? "; " : "", s->choices);
        else if ((s->type == OQ_SET_INT || s->type == OQ_SET_DURATION || s->type == OQ_SET_SIZE) &&
                 s->min <= s->max) {
            char a[48], b[48];
            fmt_value(s->type, s->min, a, sizeof(a));
            fmt_value(s->type, s->max, b, sizeof(b));
            append(extra, sizeof(extra), &n, "%srange: %s..%s", n ? "; " : "", a, b);
        } else if (s->type == OQ_SET_STRING && s->max > 0 && s->min <= s->max) {
            append(extra, sizeof(extra), &n, "%slength: %" PRId64 "..%" PRId64, n ? "; " : "",
                   s->min, s->max);
        }
        if (c->env_prefix[0]) {
            char var[160];
            if (oq_config_env_name(c->env_prefix, s->name, var, sizeof(var)) == 0)
                append(extra, sizeof(extra), &n, "%senv %s", n ? "; " : "", var);
        }
        if (n) fprintf(out, " [%s]", extra);
        fputc('\n', out);
    }
    if (kafka_allowed(c)) {
        fprintf(out, "  %-*s %-8s  %s\n", w, "-b VALUE", "", "the same as --brokers (kcat's flag)");
        fprintf(out, "  %-*s %-8s  %s\n", w, "-X prop=value", "kafka",
                "librdkafka property, repeatable (e.g. -X acks=all); producer.PROP / "
                "consumer.PROP reach only that kind of client");
        fprintf(out, "  %-*s %-8s  %s\n", w, "-F, --config", "file",
                "read settings from a file: 'name = value', Kafka properties as 'kafka.prop = "
                "value' or kcat-style 'prop=value' (bootstrap.servers sets --brokers); # "
                "comments");
    } else {
        fprintf(out, "  %-*s %-8s  %s\n", w, "-F, --config", "file",
                "read settings from a file: 'name = value' lines, # comments");
    }
    fprintf(out, "  %-*s %-8s  %s\n", w, "-h, --help", "", "print this help");
    if (c->env_prefix[0])
        fprintf(out,
                "\nevery setting is also read from the environment as %s<NAME> (upper case,"
                " '-' -> '_');\nprecedence: flag > environment > file (-F) > default\n",
                c->env_prefix);
}
