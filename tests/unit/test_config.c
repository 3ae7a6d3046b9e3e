/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Settings table: defaults, every type, bounds, unknown names, bad values, -X collection and
 * its application to a real rd_kafka_conf_t, config files (with file:line errors), --help,
 * positionals and `--`, the environment (ONCEQ_<NAME>) and the precedence flag > environment
 * > file > default.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>

#include "oq_cli.h"
#include "oq_config.h"
#include "oq_envelope.h"
#include "oq_kafka.h"
#include "oq_log.h"

static const oq_setting_t table[] = {
    {"db", OQ_SET_STRING, "calls.db", 0, 0, NULL, "database path"},
    {"port", OQ_SET_INT, "8080", 0, 65535, NULL, "HTTP port"},
    {"batch", OQ_SET_INT, "64", 1, 1000, NULL, "max items per commit"},
    {"lease", OQ_SET_DURATION, "30s", 1000, 3600000, NULL, "execution lease"},
    {"max-body", OQ_SET_SIZE, "1MiB", 1024, 64 * 1048576, NULL, "largest request body"},
    {"fsync", OQ_SET_BOOL, "true", 0, -1, NULL, "fsync each commit"},
    {"verbose", OQ_SET_BOOL, "false", 0, -1, NULL, "chatty logs"},
    {"synchronous", OQ_SET_ENUM, "full", 0, -1, "full|normal|off", "SQLite synchronous"},
    {"brokers", OQ_SET_STRING, NULL, 0, -1, NULL, "bootstrap servers"},
    {"tenant", OQ_SET_STRING, "default", 1, 8, NULL, "tenant name"},
};
#define NT (sizeof(table) / sizeof(table[0]))

static char tmpdir[64];

static int group_setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/oq_test_config_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    char p[128];
    for (int i = 0; i < 8; i++) {
        snprintf(p, sizeof(p), "%s/f%d.conf", tmpdir, i);
        unlink(p);
    }
    rmdir(tmpdir);
    return 0;
}

static const char *write_file(int i, const char *text)
{
    static char p[128];
    snprintf(p, sizeof(p), "%s/f%d.conf", tmpdir, i);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

/* Parses a NULL-terminated list of arguments (argv[0] is the command name). */
static int parse(oq_config_t *c, oq_error_t *err, ...)
{
    static char *argv[64];
    int argc = 0;
    va_list ap;
    va_start(ap, err);
    argv[argc++] = "cmd";
    for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 63;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    oq_error_clear(err);
    return oq_config_parse_args(c, "usage: onceq cmd [options]", argc, argv, 1, err);
}

static void test_defaults(void **state)
{
    (void)state;
    oq_config_t *c = oq_config_new(table, NT);
    assert_non_null(c);
    assert_string_equal(oq_config_str(c, "db"), "calls.db");
    assert_int_equal(oq_config_int(c, "port"), 8080);
    assert_int_equal(oq_config_int(c, "lease"), 30000);
    assert_int_equal(oq_config_int(c, "max-body"), 1048576);
    assert_int_equal(oq_config_int(c, "fsync"), 1);
    assert_int_equal(oq_config_int(c, "verbose"), 0);
    assert_string_equal(oq_config_str(c, "synchronous"), "full");
    assert_null(oq_config_str(c, "brokers"));
    assert_int_equal(oq_config_is_set(c, "port"), 0);
    assert_int_equal(oq_config_npositional(c), 0);
    assert_int_equal(oq_config_kafka_count(c), 0);
    oq_config_destroy(c);
    oq_config_destroy(NULL);

    /* a table whose default breaks its own bounds is refused */
    static const oq_setting_t bad[] = {{"n", OQ_SET_INT, "0", 1, 5, NULL, "n"}};
    assert_null(oq_config_new(bad, 1));
}

static void test_each_type(void **state)
{
    (void)state;
    oq_config_t *c = oq_config_new(table, NT);
    oq_error_t err;
    assert_int_equal(parse(c, &err, "--db", "/tmp/x.db", "--port=9100", "--lease", "2s",
                           "--max-body=64KiB", "--no-fsync", "--verbose", "--synchronous", "NORMAL",
                           "--brokers", "127.0.0.1:9092", NULL),
                     0);
    assert_string_equal(oq_config_str(c, "db"), "/tmp/x.db");
    assert_int_equal(oq_config_int(c, "port"), 9100);
    assert_int_equal(oq_config_int(c, "lease"), 2000);
    assert_string_equal(oq_config_str(c, "brokers"), "127.0.0.1:9092");
    oq_config_destroy(c);

    /* durations and sizes in range */
    c = oq_config_new(table, NT);
    assert_int_equal(parse(c, &err, "--lease", "5m", "--max-body=64KiB", "--no-fsync", "--verbose",
                           "--synchronous", "NORMAL", NULL),
                     0);
    assert_int_equal(oq_config_int(c, "lease"), 300000);
    assert_int_equal(oq_config_int(c, "max-body"), 65536);
    assert_int_equal(oq_config_int(c, "fsync"), 0);
    assert_int_equal(oq_config_int(c, "verbose"), 1);
    assert_string_equal(oq_config_str(c, "synchronous"), "normal"); /* table spelling */
    assert_int_equal(oq_config_is_set(c, "lease"), 1);
    assert_int_equal(oq_config_is_set(c, "port"), 0);
    /* bool values spelled out; later wins */
    assert_int_equal(parse(c, &err, "--fsync=yes", "--verbose=off", "--fsync", NULL), 0);
    assert_int_equal(oq_config_int(c, "fsync"), 1);
    assert_int_equal(oq_config_int(c, "verbose"), 0);
    assert_int_equal(oq_config_set(c, "lease", "1h", &err), 0);
    assert_int_equal(oq_config_int(c, "lease"), 3600000);
    assert_int_equal(oq_config_set(c, "tenant", "acme", &err), 0);
    assert_string_equal(oq_config_str(c, "tenant"), "acme");
    oq_config_destroy(c);
}

static void test_bounds_and_bad_values(void **state)
{
    (void)state;
    oq_config_t *c = oq_config_new(table, NT);
    oq_error_t err;
    assert_int_equal(parse(c, &err, "--port", "abc", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "setting --port: expected integer, got 'abc'");
    assert_int_equal(parse(c, &err, "--port", "12x", NULL), OQ_EINVAL);
    assert_int_equal(parse(c, &err, "--port", "", NULL), OQ_EINVAL);
    assert_int_equal(parse(c, &err, "--batch", "0", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "setting --batch: 0 is below the minimum 1");
    assert_int_equal(parse(c, &err, "--batch=1001", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "setting --batch: 1001 is above the maximum 1000");
    assert_int_equal(parse(c, &err, "--batch", "1000", NULL), 0);
    assert_int_equal(parse(c, &err, "--port", "99999999999999999999", NULL), OQ_EINVAL);
    assert_int_equal(parse(c, &err, "--lease", "10ms", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "setting --lease: 10ms is below the minimum 1s");
    assert_int_equal(parse(c, &err, "--lease", "2h", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "setting --lease: 2h is above the maximum 1h");
    assert_int_equal(parse(c, &err, "--lease", "soon", NULL), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "got 'soon'"));
    assert_int_equal(parse(c, &err, "--lease", "nan", NULL), OQ_EINVAL);
    assert_int_equal(parse(c, &err, "--max-body", "1GiB", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "setting --max-body: 1GiB is above the maximum 64MiB");
    assert_int_equal(parse(c, &err, "--fsync=maybe", NULL), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "setting --fsync"));
    assert_int_equal(parse(c, &err, "--synchronous", "fast", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "setting --synchronous: expected one of full|normal|off, got "
                                 "'fast'");
    assert_int_equal(parse(c, &err, "--tenant", "waytoolongname", NULL), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "above the maximum 8"));
    assert_int_equal(parse(c, &err, "--tenant=", NULL), OQ_EINVAL);
    assert_int_equal(parse(c, &err, "--port", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "setting --port needs a value");
    /* failed sets leave the previous value */
    assert_int_equal(oq_config_int(c, "port"), 8080);
    assert_int_equal(oq_config_int(c, "batch"), 1000);
    assert_int_equal(oq_config_int(c, "lease"), 30000);
    oq_config_destroy(c);
}

static void test_unknown(void **state)
{
    (void)state;
    oq_config_t *c = oq_config_new(table, NT);
    oq_error_t err;
    assert_int_equal(parse(c, &err, "--foo", "1", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "unknown setting --foo");
    assert_int_equal(parse(c, &err, "--prot=1", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "unknown setting --prot (did you mean --port?)");
    assert_int_equal(parse(c, &err, "--no-port", NULL), OQ_EINVAL); /* --no- only for bools */
    assert_int_equal(parse(c, &err, "-q", NULL), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "-q"));
    assert_int_equal(oq_config_set(c, "nope", "1", &err), OQ_EINVAL);
    oq_config_destroy(c);
}

static void test_kafka_props(void **state)
{
    (void)state;
    oq_config_t *c = oq_config_new(table, NT);
    oq_error_t err;
    assert_int_equal(parse(c, &err, "-X", "acks=all", "-Xlinger.ms=5", "-X", "client.id=a=b", "-X",
                           "linger.ms=7", NULL),
                     0);
    assert_int_equal(oq_config_kafka_count(c), 3);
    const char *n, *v;
    oq_config_kafka_get(c, 0, &n, &v);
    assert_string_equal(n, "acks");
    assert_string_equal(v, "all");
    oq_config_kafka_get(c, 1, &n, &v);
    assert_string_equal(n, "linger.ms");
    assert_string_equal(v, "7"); /* later value wins, first position kept */
    oq_config_kafka_get(c, 2, &n, &v);
    assert_string_equal(n, "client.id");
    assert_string_equal(v, "a=b");
    oq_config_kafka_get(c, 3, &n, &v);
    assert_null(n);

    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(oq_config_apply_kafka(c, conf, &err), 0);
    char buf[64];
    size_t sz = sizeof(buf);
    assert_int_equal(rd_kafka_conf_get(conf, "linger.ms", buf, &sz), RD_KAFKA_CONF_OK);
    assert_string_equal(buf, "7");
    sz = sizeof(buf);
    assert_int_equal(rd_kafka_conf_get(conf, "client.id", buf, &sz), RD_KAFKA_CONF_OK);
    assert_string_equal(buf, "a=b");
    rd_kafka_conf_destroy(conf);

    /* unknown property: librdkafka says so, we return OQ_EINVAL naming it */
    assert_int_equal(parse(c, &err, "-X", "no.such.property=1", NULL), 0);
    conf = rd_kafka_conf_new();
    assert_int_equal(oq_config_apply_kafka(c, conf, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "no.such.property"));
    rd_kafka_conf_destroy(conf);

    /* malformed -X */
    assert_int_equal(parse(c, &err, "-X", "novalue", NULL), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "property=value"));
    assert_int_equal(parse(c, &err, "-X", NULL), OQ_EINVAL);
    assert_int_equal(parse(c, &err, "-X", "=x", NULL), OQ_EINVAL);
    oq_config_destroy(c);
}

static void test_config_file(void **state)
{
    (void)state;
    oq_config_t *c = oq_config_new(table, NT);
    oq_error_t err;
    const char *p = write_file(0, "# a comment\n"
                                  "\n"
                                  "port = 9000\n"
                                  "   db=\"/var/lib/onceq/calls.db\"   # trailing comment\n"
                                  "kafka.acks = all\n"
                                  "kafka.sasl.password = pa#ss\n"
                                  "verbose = on\n"
                                  "lease = 2m\n");
    /* a flag wins over the file wherever it stands on the command line */
    assert_int_equal(parse(c, &err, "--port", "1", "-F", p, "--lease", "90s", NULL), 0);
    assert_int_equal(oq_config_int(c, "port"), 1);
    assert_string_equal(oq_config_str(c, "db"), "/var/lib/onceq/calls.db");
    assert_int_equal(oq_config_int(c, "verbose"), 1);
    assert_int_equal(oq_config_int(c, "lease"), 90000);
    assert_int_equal(oq_config_is_set(c, "db"), 1);
    assert_int_equal(oq_config_kafka_count(c), 2);
    const char *n, *v;
    oq_config_kafka_get(c, 1, &n, &v);
    assert_string_equal(n, "sasl.password");
    assert_string_equal(v, "pa#ss");
    oq_config_destroy(c);

    c = oq_config_new(table, NT);
    p = write_file(1, "port = 1\n# ok\nbatch = 0\n");
    assert_int_equal(parse(c, &err, "--config", p, NULL), OQ_EINVAL);
    char want[256];
    snprintf(want, sizeof(want), "%s:3: setting --batch: 0 is below the minimum 1", p);
    assert_string_equal(err.msg, want);

    p = write_file(2, "\n\nport 9000\n");
    assert_int_equal(oq_config_load_file(c, p, &err), OQ_EINVAL);
    snprintf(want, sizeof(want), "%s:3:", p);
    assert_memory_equal(err.msg, want, strlen(want));

    p = write_file(3, "port = 1\nbogus = 2\n");
    assert_int_equal(parse(c, &err, "--config=", NULL), OQ_EINVAL);
    assert_int_equal(oq_config_load_file(c, p, &err), OQ_EINVAL);
    snprintf(want, sizeof(want), "%s:2: unknown setting --bogus", p);
    assert_string_equal(err.msg, want);

    assert_int_equal(parse(c, &err, "-F", "/nonexistent/oq.conf", NULL), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "/nonexistent/oq.conf"));
    assert_int_equal(parse(c, &err, "-F", NULL), OQ_EINVAL);
    oq_config_destroy(c);
}

static void test_help(void **state)
{
    (void)state;
    oq_config_t *c = oq_config_new(table, NT);
    oq_error_t err;
    /* capture stdout into a temp file */
    fflush(stdout);
    int saved = dup(1);
    char p[128];
    snprintf(p, sizeof(p), "%s/help.txt", tmpdir);
    FILE *f = fopen(p, "w+");
    assert_non_null(f);
    dup2(fileno(f), 1);
    int rc = parse(c, &err, "--port", "1", "--help", "--bogus", NULL);
    int rc2 = parse(c, &err, "-h", NULL);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    assert_int_equal(rc, OQ_EHELP);
    char text[16384];
    rewind(f);
    size_t len = fread(text, 1, sizeof(text) - 1, f);
    text[len] = '\0';
    fclose(f);
    unlink(p);
    assert_non_null(strstr(text, "usage: onceq cmd [options]"));
    assert_non_null(strstr(text, "--port"));
    assert_non_null(strstr(text, "HTTP port"));
    assert_non_null(strstr(text, "default: 8080"));
    assert_non_null(strstr(text, "range: 0..65535"));
    assert_non_null(strstr(text, "range: 1s..1h"));
    assert_non_null(strstr(text, "one of: full|normal|off"));
    assert_non_null(strstr(text, "duration"));
    assert_non_null(strstr(text, "-X prop=value"));
    for (size_t i = 0; i < NT; i++)
        assert_non_null(strstr(text, table[i].name));
    assert_int_equal(rc2, OQ_EHELP);
    oq_config_destroy(c);
}

/* Runs \p cmd through sh, returns its exit status and the first bytes of its stderr. */
static int run_sh(const char *cmd, char *errtext, size_t cap)
{
    char full[1024], p[128];
    snprintf(p, sizeof(p), "%s/stderr.txt", tmpdir);
    snprintf(full, sizeof(full), "%s 2>%s >/dev/null", cmd, p);
    int st = system(full);
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(errtext, 1, cap - 1, f) : 0;
    errtext[n] = '\0';
    if (f) fclose(f);
    unlink(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void clear_env(void)
{
    const char *names[] = {"ONCEQ_DB",       "ONCEQ_PORT",   "ONCEQ_LEASE",       "ONCEQ_BATCH",
                           "ONCEQ_MAX_BODY", "ONCEQ_FSYNC",  "ONCEQ_SYNCHRONOUS", "ONCEQ_BROKERS",
                           "ONCEQ_TENANT",   "ONCEQ_VERBOSE"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        unsetenv(names[i]);
}

static void test_env_names(void **state)
{
    (void)state;
    char v[64];
    assert_int_equal(oq_config_env_name("ONCEQ_", "key-ttl", v, sizeof(v)), 0);
    assert_string_equal(v, "ONCEQ_KEY_TTL");
    assert_int_equal(oq_config_env_name("ONCEQ_", "db", v, sizeof(v)), 0);
    assert_string_equal(v, "ONCEQ_DB");
    assert_int_equal(oq_config_env_name("ONCEQ_", "max-connections-per-ip", v, 8), OQ_EINVAL);
}

static void test_env_precedence(void **state)
{
    (void)state;
    clear_env();
    oq_error_t err;
    const char *p = write_file(4, "port = 9000\nlease = 2m\nbatch = 10\ndb = file.db\n");

    /* environment not enabled: ignored */
    setenv("ONCEQ_PORT", "7000", 1);
    oq_config_t *c = oq_config_new(table, NT);
    assert_int_equal(parse(c, &err, NULL), 0);
    assert_int_equal(oq_config_int(c, "port"), 8080);
    assert_int_equal(oq_config_is_set(c, "port"), 0);
    oq_config_destroy(c);

    /* default < file < environment < flag, whatever the order on the command line */
    setenv("ONCEQ_LEASE", "45s", 1);
    setenv("ONCEQ_MAX_BODY", "2MiB", 1);
    setenv("ONCEQ_FSYNC", "off", 1);
    setenv("ONCEQ_SYNCHRONOUS", "NORMAL", 1);
    c = oq_config_new(table, NT);
    oq_config_use_env(c, "ONCEQ_");
    assert_int_equal(parse(c, &err, "--port", "1", "-F", p, NULL), 0);
    assert_int_equal(oq_config_int(c, "port"), 1);           /* flag over env and file */
    assert_int_equal(oq_config_int(c, "lease"), 45000);      /* env over file */
    assert_int_equal(oq_config_int(c, "batch"), 10);         /* file over default */
    assert_string_equal(oq_config_str(c, "db"), "file.db");  /* file over default */
    assert_int_equal(oq_config_int(c, "max-body"), 2 << 20); /* env over default, dash -> _ */
    assert_int_equal(oq_config_int(c, "fsync"), 0);
    assert_string_equal(oq_config_str(c, "synchronous"), "normal");
    assert_int_equal(oq_config_is_set(c, "lease"), 1);
    assert_int_equal(oq_config_is_set(c, "verbose"), 0);
    oq_config_destroy(c);

    /* the file after a flag still loses to it; --no-fsync beats the environment */
    c = oq_config_new(table, NT);
    oq_config_use_env(c, "ONCEQ_");
    assert_int_equal(parse(c, &err, "--lease=5s", "--config", p, "--fsync", NULL), 0);
    assert_int_equal(oq_config_int(c, "lease"), 5000);
    assert_int_equal(oq_config_int(c, "port"), 7000);
    assert_int_equal(oq_config_int(c, "fsync"), 1);
    oq_config_destroy(c);

    /* variables that share the prefix but name no setting of this table are not read */
    setenv("ONCEQ_LOG_LEVEL", "debug", 1);
    setenv("ONCEQ_CRASH_AT", "nowhere", 1);
    setenv("ONCEQ_NO_SUCH_SETTING", "x", 1);
    c = oq_config_new(table, NT);
    oq_config_use_env(c, "ONCEQ_");
    assert_int_equal(parse(c, &err, NULL), 0);
    oq_config_destroy(c);
    unsetenv("ONCEQ_NO_SUCH_SETTING");
    unsetenv("ONCEQ_CRASH_AT");
    unsetenv("ONCEQ_LOG_LEVEL");
    clear_env();
}

static void test_env_bad_value(void **state)
{
    (void)state;
    clear_env();
    oq_error_t err;
    oq_config_t *c = oq_config_new(table, NT);
    oq_config_use_env(c, "ONCEQ_");
    setenv("ONCEQ_LEASE", "soon", 1);
    assert_int_equal(parse(c, &err, "--port", "2", NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "environment ONCEQ_LEASE: setting --lease: expected a duration "
                                 "such as 250ms, 30s, 5m, 24h, got 'soon'");
    /* a flag does not hide a bad environment value: the operator sees it */
    assert_int_equal(parse(c, &err, "--lease", "3s", NULL), OQ_EINVAL);
    unsetenv("ONCEQ_LEASE");
    setenv("ONCEQ_BATCH", "0", 1);
    assert_int_equal(parse(c, &err, NULL), OQ_EINVAL);
    assert_string_equal(err.msg, "environment ONCEQ_BATCH: setting --batch: 0 is below the "
                                 "minimum 1");
    unsetenv("ONCEQ_BATCH");
    setenv("ONCEQ_TENANT", "", 1); /* empty counts as given: length 0 is below 1 */
    assert_int_equal(parse(c, &err, NULL), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "ONCEQ_TENANT"));
    unsetenv("ONCEQ_TENANT");
    oq_config_destroy(c);

    /* oq_cli_parse (what every command runs) turns it into exit 2 and names the variable */
    c = oq_config_new(table, NT);
    char *argv[] = {"cmd", NULL};
    setenv("ONCEQ_PORT", "eighty", 1);
    fflush(stderr);
    int saved = dup(2), devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    int rc = oq_cli_parse(c, "onceq", "usage", 1, argv);
    dup2(saved, 2);
    close(saved);
    close(devnull);
    assert_int_equal(rc, OQ_EXIT_USAGE);
    unsetenv("ONCEQ_PORT");
    oq_config_destroy(c);

    /* and the real binary: exit 2, the message names the variable, nothing starts */
    const char *bin = getenv("ONCEQ_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        fprintf(stderr, "ONCEQ_BIN not set: the binary check is skipped\n");
        return;
    }
    char cmd[512], text[1024];
    snprintf(cmd, sizeof(cmd), "ONCEQ_KEY_TTL=forever '%s' producer --db %s/never.db", bin, tmpdir);
    assert_int_equal(run_sh(cmd, text, sizeof(text)), OQ_EXIT_USAGE);
    assert_non_null(strstr(text, "environment ONCEQ_KEY_TTL: setting --key-ttl"));
    snprintf(cmd, sizeof(cmd), "%s/never.db", tmpdir);
    assert_int_equal(access(cmd, F_OK), -1);
    /* help lists the variable next to its setting */
    snprintf(cmd, sizeof(cmd), "'%s' producer --help | grep -q 'env ONCEQ_KEY_TTL'", bin);
    assert_int_equal(run_sh(cmd, text, sizeof(text)), 0);
}

static void test_positionals(void **state)
{
    (void)state;
    oq_config_t *c = oq_config_new(table, NT);
    oq_error_t err;
    assert_int_equal(
        parse(c, &err, "first", "--port", "5", "-", "second", "--", "--port", "-X", NULL), 0);
    assert_int_equal(oq_config_int(c, "port"), 5);
    assert_int_equal(oq_config_npositional(c), 5);
    assert_string_equal(oq_config_positional(c, 0), "first");
    assert_string_equal(oq_config_positional(c, 1), "-");
    assert_string_equal(oq_config_positional(c, 2), "second");
    assert_string_equal(oq_config_positional(c, 3), "--port");
    assert_string_equal(oq_config_positional(c, 4), "-X");
    assert_null(oq_config_positional(c, 5));
    assert_null(oq_config_positional(c, -1));
    assert_int_equal(oq_config_kafka_count(c), 0);
    oq_config_destroy(c);
}

static void test_unknown_accessor_aborts(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 2);
        oq_config_t *c = oq_config_new(table, NT);
        (void)oq_config_int(c, "no-such-setting");
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
}

/* kcat-style property files: dotted names are Kafka properties, bootstrap.servers fills
 * --brokers at the file's precedence (a flag still wins). */
static void test_kcat_file(void **state)
{
    (void)state;
    oq_config_t *c = oq_config_new(table, NT);
    oq_error_t err;
    const char *p = write_file(5, "# kcat -F style\n"
                                  "bootstrap.servers=k1:9092,k2:9092\n"
                                  "security.protocol=sasl_ssl\n"
                                  "sasl.password=s#cret\n"
                                  "consumer.session.timeout.ms=6000\n"
                                  "port=9000\n");
    assert_int_equal(parse(c, &err, "-F", p, NULL), 0);
    assert_string_equal(oq_config_str(c, "brokers"), "k1:9092,k2:9092");
    assert_int_equal(oq_config_int(c, "port"), 9000);
    assert_int_equal(oq_config_kafka_count(c), 3);
    const char *n, *v;
    oq_config_kafka_get(c, 1, &n, &v);
    assert_string_equal(n, "sasl.password");
    assert_string_equal(v, "s#cret");
    oq_config_destroy(c);
    c = oq_config_new(table, NT);
    assert_int_equal(parse(c, &err, "--brokers", "flag:1", "-F", p, NULL), 0);
    assert_string_equal(oq_config_str(c, "brokers"), "flag:1");
    oq_config_destroy(c);
}

/* A command without --brokers takes no Kafka property: -X, kafka.* and dotted file lines are
 * errors, and --help does not offer -X. */
static void test_kafka_refused(void **state)
{
    (void)state;
    static const oq_setting_t nok[] = {{"db", OQ_SET_STRING, "calls.db", 0, 0, NULL, "db"}};
    oq_config_t *c = oq_config_new(nok, 1);
    oq_error_t err;
    assert_int_equal(parse(c, &err, "-X", "acks=all", NULL), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "does not talk to Kafka"));
    const char *p = write_file(6, "db = x.db\nkafka.acks = all\n");
    assert_int_equal(parse(c, &err, "-F", p, NULL), OQ_EINVAL);
    assert_non_null(strstr(err.msg, ":2:"));
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    oq_config_print_help(c, "usage", f);
    fclose(f);
    assert_null(strstr(out, "-X"));
    free(out);
    oq_config_destroy(c);
}

/* producer./consumer. scope a property to one kind of client; a bare consumer-only or
 * producer-only name reaches only its kind; others reach both. */
static void test_kafka_scope(void **state)
{
    (void)state;
    assert_null(oq_kafka_prop_for(OQ_KAFKA_PRODUCER, "session.timeout.ms"));
    assert_string_equal(oq_kafka_prop_for(OQ_KAFKA_CONSUMER, "session.timeout.ms"),
                        "session.timeout.ms");
    assert_null(oq_kafka_prop_for(OQ_KAFKA_CONSUMER, "linger.ms"));
    assert_string_equal(oq_kafka_prop_for(OQ_KAFKA_PRODUCER, "producer.linger.ms"), "linger.ms");
    assert_null(oq_kafka_prop_for(OQ_KAFKA_CONSUMER, "producer.linger.ms"));
    assert_string_equal(oq_kafka_prop_for(OQ_KAFKA_CONSUMER, "consumer.client.id"), "client.id");
    assert_null(oq_kafka_prop_for(OQ_KAFKA_PRODUCER, "consumer.client.id"));
    assert_string_equal(oq_kafka_prop_for(OQ_KAFKA_PRODUCER, "client.id"), "client.id");
    assert_string_equal(oq_kafka_prop_for(OQ_KAFKA_CONSUMER, "client.id"), "client.id");

    oq_config_t *c = oq_config_new(table, NT);
    oq_error_t err;
    assert_int_equal(parse(c, &err, "-X", "session.timeout.ms=6000", "-X", "producer.linger.ms=7",
                           "-X", "consumer.client.id=cc", NULL),
                     0);
    rd_kafka_conf_t *pc = oq_kafka_conf_new(OQ_KAFKA_PRODUCER, "h:1", c, &err);
    rd_kafka_conf_t *cc = oq_kafka_conf_new(OQ_KAFKA_CONSUMER, "h:1", c, &err);
    assert_non_null(pc);
    assert_non_null(cc);
    char buf[64];
    size_t sz = sizeof buf;
    assert_int_equal(rd_kafka_conf_get(pc, "linger.ms", buf, &sz), RD_KAFKA_CONF_OK);
    assert_string_equal(buf, "7");
    sz = sizeof buf;
    assert_int_equal(rd_kafka_conf_get(pc, "session.timeout.ms", buf, &sz), RD_KAFKA_CONF_OK);
    assert_string_equal(buf, "45000"); /* librdkafka's default: not applied to a producer */
    sz = sizeof buf;
    assert_int_equal(rd_kafka_conf_get(cc, "session.timeout.ms", buf, &sz), RD_KAFKA_CONF_OK);
    assert_string_equal(buf, "6000");
    sz = sizeof buf;
    assert_int_equal(rd_kafka_conf_get(cc, "client.id", buf, &sz), RD_KAFKA_CONF_OK);
    assert_string_equal(buf, "cc");
    rd_kafka_conf_destroy(pc);
    rd_kafka_conf_destroy(cc);
    oq_config_destroy(c);
}

/* kafka-profile: consumers fetch with a long wait on real brokers, a short one on the embedded
 * broker; producers get neither; the user's -X wins over both; a table without the setting
 * (and a NULL config) is `real`. */
static const oq_setting_t profile_table[] = {
    {"brokers", OQ_SET_STRING, NULL, 0, -1, NULL, "bootstrap servers"},
    OQ_SETTING_KAFKA_PROFILE,
};

static void expect_fetch_wait(oq_kafka_role_t role, const oq_config_t *c, const char *want)
{
    oq_error_t err;
    rd_kafka_conf_t *conf = oq_kafka_conf_new(role, "h:1", c, &err);
    assert_non_null(conf);
    char buf[64];
    size_t sz = sizeof buf;
    assert_int_equal(rd_kafka_conf_get(conf, "fetch.wait.max.ms", buf, &sz), RD_KAFKA_CONF_OK);
    assert_string_equal(buf, want);
    rd_kafka_conf_destroy(conf);
}

static void test_kafka_profile(void **state)
{
    (void)state;
    expect_fetch_wait(OQ_KAFKA_CONSUMER, NULL, "500");
    oq_config_t *plain = oq_config_new(table, NT); /* no kafka-profile setting */
    expect_fetch_wait(OQ_KAFKA_CONSUMER, plain, "500");
    oq_config_destroy(plain);

    oq_config_t *c = oq_config_new(profile_table, 2);
    oq_error_t err;
    assert_int_equal(parse(c, &err, NULL), 0);
    assert_int_equal(oq_kafka_profile_mock(c), 0);
    expect_fetch_wait(OQ_KAFKA_CONSUMER, c, "500"); /* default: real */
    oq_config_destroy(c);

    c = oq_config_new(profile_table, 2);
    assert_int_equal(parse(c, &err, "--kafka-profile", "mock", NULL), 0);
    assert_int_equal(oq_kafka_profile_mock(c), 1);
    expect_fetch_wait(OQ_KAFKA_CONSUMER, c, "1");
    oq_config_destroy(c);

    c = oq_config_new(profile_table, 2); /* the user's -X wins over the profile */
    assert_int_equal(parse(c, &err, "--kafka-profile", "mock", "-X", "fetch.wait.max.ms=77", NULL),
                     0);
    expect_fetch_wait(OQ_KAFKA_CONSUMER, c, "77");
    oq_config_destroy(c);

    c = oq_config_new(profile_table, 2);
    assert_int_equal(parse(c, &err, "--kafka-profile", "fast", NULL), OQ_EINVAL);
    oq_config_destroy(c);
}

int main(void)
{
    oq_log_init(OQ_LOG_OFF, OQ_LOG_FMT_LOGFMT, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_each_type),
        cmocka_unit_test(test_bounds_and_bad_values),
        cmocka_unit_test(test_unknown),
        cmocka_unit_test(test_kafka_props),
        cmocka_unit_test(test_config_file),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_positionals),
        cmocka_unit_test(test_env_names),
        cmocka_unit_test(test_env_precedence),
        cmocka_unit_test(test_env_bad_value),
        cmocka_unit_test(test_unknown_accessor_aborts),
        cmocka_unit_test(test_kcat_file),
        cmocka_unit_test(test_kafka_refused),
        cmocka_unit_test(test_kafka_scope),
        cmocka_unit_test(test_kafka_profile),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
