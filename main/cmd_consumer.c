/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq consumer --db effects.db --group onceq-workers --brokers B [-X k=v]... [--lease 30s]
 *  [--max-attempts 5] [--metrics-listen 127.0.0.1:P] [--batch N] [--tools tools.json]`: one
 * consumer-group worker (consumer/oq_consumer.h). A tools file that does not load is refused
 * before anything starts (exit 2). SIGTERM/SIGINT only set the worker's stop flag; the worker
 * then finishes its batch, lets its outside requests answer (up to 5 s), commits, leaves the
 * group, and the command exits 0.
 */
#include <signal.h>
#include <stdio.h>

#include "cmds.h"
#include "oq_config.h"
#include "oq_consumer.h"
#include "oq_log.h"
#include "oq_pg.h"
#include "oq_service.h"

static oq_consumer_t *volatile cons_running;
static volatile sig_atomic_t cons_signalled;

static void cons_on_signal(int sig)
{
    (void)sig;
    cons_signalled = 1;
    if (cons_running) oq_consumer_stop(cons_running);
}

int oq__cmd_consumer(int argc, char **argv)
{
    const char *usage =
        "onceq consumer --brokers host:port --db effects.db [--group onceq-workers] "
        "[-X k=v]... [--lease 30s] [--max-attempts 5] [--metrics-listen 127.0.0.1:P] "
        "[--batch N] [--tools tools.json] [--token-file F] [--metrics-only-listen H:P]";
    oq_consumer_t *c = NULL;
    oq_error_t err = {0};
    oq_config_t *cfg = oq_config_new(oq_consumer_settings, oq_consumer_nsettings);
    if (!cfg) return OQ_EXIT_FAIL;
    int rc = oq_cli_parse(cfg, "onceq", usage, argc, argv);
    if (rc >= 0) goto out;
    if (!oq_config_str(cfg, "brokers") || oq_config_npositional(cfg) > 0) {
        fprintf(stderr,
                "onceq consumer: --brokers is required and no positional arguments "
                "are taken\nusage: %s\n",
                usage);
        rc = OQ_EXIT_USAGE;
        goto out;
    }
    oq_consumer_opts_t o;
    oq_consumer_opts_from_config(cfg, &o);
    /* a command line is visible to every user of the host: no password in --db */
    if (o.db_path && oq_backend_of(o.db_path) == OQ_BACKEND_POSTGRES &&
        oq_pg_conninfo_has_password(o.db_path)) {
        fprintf(stderr, "onceq consumer: --db holds a password: put it in a passfile "
                        "(passfile=... in the string, or PGPASSFILE)\n");
        rc = OQ_EXIT_USAGE;
        goto out;
    }
    if (o.tools_path && oq_consumer_check_tools(o.tools_path, &err) != 0) {
        fprintf(stderr, "onceq consumer: %s\n", err.msg);
        rc = OQ_EXIT_USAGE;
        goto out;
    }

    struct sigaction sa, old_term, old_int;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sa.sa_handler = cons_on_signal;
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
    signal(SIGPIPE, SIG_IGN);

    if (oq_consumer_new(&o, &c, &err) != 0) {
        fprintf(stderr, "onceq consumer: %s\n", err.msg);
        rc = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto restore;
    }
    cons_running = c;
    if (cons_signalled) oq_consumer_stop(c);
    oq_service_ready("consumer running (subscribes to the group next)");
    oq_service_watchdog_thread_start();
    rc = oq_consumer_run(c, oq_config_int(cfg, "exit-idle"), &err) == 0 ? OQ_EXIT_OK : OQ_EXIT_FAIL;
    oq_service_watchdog_thread_stop();
    if (rc != OQ_EXIT_OK) fprintf(stderr, "onceq consumer: %s\n", err.msg);
    oq_consumer_stats_t st;
    oq_consumer_get_stats(c, &st);
    OQ_LOG_INFO("consumer",
                "exit consumed=%llu duplicates=%llu effects=%llu dlq=%llu terminal=%llu",
                (unsigned long long)st.consumed, (unsigned long long)st.duplicates,
                (unsigned long long)st.effects, (unsigned long long)st.dlq,
                (unsigned long long)st.terminal);
    cons_running = NULL;
    oq_consumer_destroy(c);
restore:
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
out:
    oq_config_destroy(cfg);
    return rc;
}
