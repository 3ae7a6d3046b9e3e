/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq call`: the well-behaved client. Submits one call over HTTP(S) with ONE
 * Idempotency-Key, retries what may succeed later (connection errors, timeouts, 429, 503,
 * other 5xx) with exponential backoff and full jitter under a retry budget, never changes the
 * key (so a retry after a lost response is a replay, not a second call), then waits for the
 * call with long polls, GET /v1/tool-calls/{id}?wait= (--long-poll, 30 s each, capped by what
 * is left of --timeout: the producer answers as soon as the call is terminal), printing each
 * state change on stderr and the final call JSON on stdout. Two GETs start at least
 * --poll-interval apart, so a server that answers without waiting is polled, not hammered.
 *
 * A `Retry-After` from the server (seconds or an HTTP-date) is a floor on the next wait, for
 * the submit retries and for the polling alike; --timeout is the budget of the whole command,
 * so a wait that would end past it is not started: the command gives up at once (the key is
 * unchanged: running it again later resumes the same call). The HTTP client is the common
 * one (oq_httpc, libcurl): http and https, IPv4 and IPv6 (`--url http://[::1]:8081`), one
 * connection kept alive across the retries and polls. A bearer token (the producer's
 * --token-file) comes from --token-file or the environment's ONCEQ_TOKEN, never from the
 * command line, where any user of the host could read it; it is sent on the submit and on
 * every poll. Exit codes: 0 succeeded, 1 runtime failure, 2 bad usage or 4xx, 5 idempotency
 * conflict (422), 6 the call failed, 7 it needs review, 8 gave up (budget or --timeout spent;
 * the key is unchanged, the same command resumes).
 */
#include <errno.h>
#include <sys/stat.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "oq_httpc.h"
#include "oq_json.h"
#include "oq_log.h"
#include "oq_util.h"

static const oq_setting_t call_settings[] = {
    {"url", OQ_SET_STRING, "http://127.0.0.1:8081", 8, 512, NULL,
     "producer base URL (http:// or https://; IPv6 as http://[::1]:8081)"},
    {"key", OQ_SET_STRING, NULL, 0, 255, NULL, "idempotency key (required; never changed)"},
    {"tool", OQ_SET_STRING, NULL, 0, 128, NULL, "tool name (required)"},
    {"args", OQ_SET_STRING, "{}", 0, 0, NULL, "tool arguments, a JSON object"},
    {"tenant", OQ_SET_STRING, NULL, 0, 128, NULL, "tenant (default: the server's default)"},
    {"cacert", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "https: CA bundle to verify the server with (default: the system's)"},
    {"token-file", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "file holding the bearer token to send (one line; mode 0600); default: the environment's "
     "ONCEQ_TOKEN; a token is never taken from the command line"},
    {"request-timeout", OQ_SET_DURATION, "5s", 10, 600000, NULL, "deadline of one HTTP request"},
    {"retry-budget", OQ_SET_INT, "8", 0, 1000, NULL, "retries allowed for the submit"},
    {"backoff", OQ_SET_DURATION, "100ms", 1, 60000, NULL, "first backoff (doubles, full jitter)"},
    {"max-backoff", OQ_SET_DURATION, "5s", 1, 600000, NULL,
     "backoff cap (a longer Retry-After from the server is still honoured)"},
    {"poll-interval", OQ_SET_DURATION, "200ms", 10, 60000, NULL,
     "least time between two status requests (after an error, or a server that did not wait)"},
    {"long-poll", OQ_SET_DURATION, "30s", 1000, 60000, NULL,
     "how long one status request waits on the server (GET ?wait=) for the call to finish"},
    {"timeout", OQ_SET_DURATION, "60s", 100, 86400000, NULL,
     "budget of the whole command (submit retries and polling); the call goes on after it"},
    {"wait", OQ_SET_BOOL, "true", 0, 0, NULL, "wait until terminal (--no-wait: submit only)"},
    {"task", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "submit the task in this file ({\"steps\": [...]}, POST /v1/tasks) instead of one call, "
     "then wait for the task's end (exit 0 succeeded, 6 failed or compensated, 7 needs review)"},
};

static const char call_usage[] =
    "usage: onceq call --url http://127.0.0.1:8081 --key K --tool T --args JSON [--tenant X]\n"
    "       onceq call --url http://127.0.0.1:8081 --key K --task FILE [--tenant X]\n"
    "                  [--token-file F]   (or the token in the environment: ONCEQ_TOKEN)\n"
    "Exit codes: 0 succeeded (or accepted with --no-wait), 1 runtime failure (e.g. an\n"
    "            untrusted certificate), 2 bad usage or a 4xx answer (401: no valid token),\n"
    "            5 idempotency conflict, 6 the call failed, 7 the call needs review,\n"
    "            8 gave up: retry budget or --timeout spent before an answer or a terminal\n"
    "            state (the key is unchanged: the same command later resumes the call).";

/* The bearer token: --token-file, else ONCEQ_TOKEN. 0 none, 1 found (in \p out), -1 bad (a
 * message said why, never the token). */
static int read_token(const char *path, char *out, size_t n)
{
    const char *src = "environment ONCEQ_TOKEN";
    char buf[1024] = "";
    if (path) {
        FILE *f = fopen(path, "r");
        if (!f) {
            fprintf(stderr, "onceq call: --token-file %s: %s\n", path, strerror(errno));
            return -1;
        }
        struct stat st;
        if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
            fprintf(stderr,
                    "onceq call: warning: token file %s is readable by group or others "
                    "(mode %03o)\n",
                    path, (unsigned)(st.st_mode & 0777));
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        int bad = ferror(f) || !feof(f);
        fclose(f);
        buf[got] = '\0';
        if (bad) {
            fprintf(stderr, "onceq call: --token-file %s: unreadable or over 1 KiB\n", path);
            return -1;
        }
        src = "--token-file";
    } else {
        const char *e = getenv("ONCEQ_TOKEN");
        if (!e || !*e) return 0;
        snprintf(buf, sizeof buf, "%s", e);
    }
    size_t len = strlen(buf);
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
        buf[--len] = '\0';
    /* RFC 6750 b64token: what the producer accepts, and nothing that could end the header */
    size_t i = 0;
    while (i < len && (isalnum((unsigned char)buf[i]) || strchr("-._~+/", buf[i])))
        i++;
    while (i > 0 && i < len && buf[i] == '=')
        i++;
    int ok = len > 0 && i == len && len + 1 <= n;
    if (ok) memcpy(out, buf, len + 1);
    explicit_bzero(buf, sizeof buf);
    if (!ok) {
        fprintf(stderr,
                "onceq call: %s: not a bearer token (one line of A-Z a-z 0-9 - . _ ~ + /, then "
                "optional '=')\n",
                src);
        return -1;
    }
    return 1;
}

static int retriable_status(long st)
{
    return st == 429 || st >= 500;
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* The next wait: \p want ms, at least the server's Retry-After. -1 when it would end past
 * \p deadline_us (the budget): give up instead of waiting. */
/* A final state: of a call, or with --task of a task. */
static int terminal(int task, const char *st)
{
    if (task)
        return strcmp(st, "succeeded") == 0 || strcmp(st, "compensated") == 0 ||
               strcmp(st, "failed") == 0 || strcmp(st, "needs_review") == 0;
    return strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 ||
           strcmp(st, "needs_review") == 0;
}

static int64_t next_wait_ms(int64_t want, const oq_httpc_resp_t *r, int64_t deadline_us)
{
    if (r && r->retry_after_ms > want) want = r->retry_after_ms;
    int64_t left_ms = (deadline_us - oq_mono_us()) / 1000;
    return want > left_ms ? -1 : want;
}

int oq__cmd_call(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    json_t *args = NULL, *body = NULL, *call = NULL;
    char *body_text = NULL, *url = NULL;
    oq_httpc_t *http = NULL, *waitc = NULL;
    oq_httpc_resp_t r = {0};
    oq_config_t *cfg = oq_config_new(call_settings, sizeof call_settings / sizeof call_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq", call_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    int64_t deadline = oq_mono_us() + oq_config_int(cfg, "timeout") * 1000;
    const char *key = oq_config_str(cfg, "key"), *tool = oq_config_str(cfg, "tool");
    const char *a = oq_config_str(cfg, "args"), *tenant = oq_config_str(cfg, "tenant");
    const char *base = oq_config_str(cfg, "url"), *task_file = oq_config_str(cfg, "task");
    const int task = task_file != NULL;
    size_t blen = strlen(base);
    while (blen > 0 && base[blen - 1] == '/')
        blen--;
    if (!key || (!tool && !task) ||
        (strncmp(base, "http://", 7) != 0 && strncmp(base, "https://", 8) != 0)) {
        fprintf(stderr,
                "%s\n(--key and --tool are required; --url must be http://host:port or "
                "https://host:port)\n",
                call_usage);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    for (const char *p = key; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f) {
            fprintf(stderr, "onceq call: --key: control characters are not allowed\n");
            ret = OQ_EXIT_USAGE;
            goto out;
        }
    }
    if (task) { /* the task file is the body; --tenant, when given, is set in it */
        json_error_t je;
        if (!(body = json_load_file(task_file, JSON_REJECT_DUPLICATES, &je)) ||
            !json_is_object(body)) {
            fprintf(stderr, "onceq call: --task %s: %s\n", task_file,
                    body ? "not a JSON object" : je.text);
            ret = OQ_EXIT_USAGE;
            goto out;
        }
    } else if (oq_json_parse(a, strlen(a), 0, &args, &err) != 0) {
        fprintf(stderr, "onceq call: --args: %s\n", err.msg);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (!task) body = json_pack("{s:s,s:O}", "tool", tool, "args", args);
    if (body && tenant) json_object_set_new(body, "tenant", json_string(tenant));
    body_text = body ? oq_json_dumps(body, JSON_COMPACT) : NULL;
    size_t ucap = blen + 64 + 128;
    url = malloc(ucap);
    if (!body_text || !url) goto out;
    oq_httpc_opts_t ho = {oq_config_int(cfg, "request-timeout"), oq_config_str(cfg, "cacert")};
    if (!(http = oq_httpc_new(&ho, &err))) {
        fprintf(stderr, "onceq call: %s\n", err.msg);
        goto out;
    }
    int budget = (int)oq_config_int(cfg, "retry-budget");
    int64_t backoff = oq_config_int(cfg, "backoff"),
            max_backoff = oq_config_int(cfg, "max-backoff");
    char key_hdr[300], token[520], auth_hdr[560] = "";
    int have_token = read_token(oq_config_str(cfg, "token-file"), token, sizeof token);
    if (have_token < 0) {
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (have_token) snprintf(auth_hdr, sizeof auth_hdr, "Authorization: Bearer %s", token);
    explicit_bzero(token, sizeof token);
    snprintf(key_hdr, sizeof key_hdr, "Idempotency-Key: %s", key);
    const char *const hdrs[] = {key_hdr, have_token ? auth_hdr : NULL, NULL};
    const char *const poll_hdrs[] = {have_token ? auth_hdr : NULL, NULL};
    snprintf(url, ucap, "%.*s/v1/%s", (int)blen, base, task ? "tasks" : "tool-calls");

    /* Submit, retrying with the same key. */
    for (int attempt = 0;; attempt++) {
        oq_httpc_resp_clear(&r);
        oq_error_clear(&err);
        int rc = oq_httpc_request(http, "POST", url, hdrs, body_text, &r, &err);
        if (rc == OQ_EINVAL) {
            fprintf(stderr, "onceq call: %s\n", err.msg);
            ret = OQ_EXIT_USAGE;
            goto out;
        }
        if (rc != 0 && !err.retriable) {
            fprintf(stderr, "onceq call: %s\n", err.msg);
            goto out;
        }
        if (rc == 0 && !retriable_status(r.status)) break;
        if (attempt >= budget) {
            fprintf(stderr, "onceq call: giving up after %d retries: %s\n", attempt,
                    rc == 0 ? "server unavailable" : err.msg);
            ret = OQ_EXIT_GAVE_UP;
            goto out;
        }
        int64_t cap = backoff << (attempt < 20 ? attempt : 20);
        if (cap > max_backoff || cap <= 0) cap = max_backoff;
        uint32_t rnd;
        oq_random_bytes(&rnd, sizeof rnd);
        int64_t sleep_ms = next_wait_ms((int64_t)(rnd % (uint32_t)(cap + 1)), /* full jitter */
                                        rc == 0 ? &r : NULL, deadline);
        if (sleep_ms < 0) {
            fprintf(stderr,
                    "onceq call: giving up: the next try would start past --timeout; the key "
                    "is unchanged, run the same command later to resume\n");
            if (rc == 0)
                fprintf(stderr, "  HTTP %ld (Retry-After %lld ms) %s\n", r.status,
                        (long long)r.retry_after_ms, r.body);
            ret = OQ_EXIT_GAVE_UP;
            goto out;
        }
        fprintf(stderr, "retry %d/%d in %lld ms (same key): %s\n", attempt + 1, budget,
                (long long)sleep_ms, rc == 0 ? "HTTP error" : err.msg);
        if (rc == 0)
            fprintf(stderr, "  HTTP %ld%s %s\n", r.status,
                    r.retry_after_ms >= 0 ? " (Retry-After)" : "", r.body);
        oq_sleep_ms(sleep_ms, NULL);
    }
    if (r.status == 422) {
        fprintf(stderr, "onceq call: idempotency_conflict: %s\n", r.body);
        ret = OQ_EXIT_CONFLICT;
        goto out;
    }
    if (r.status != 200 && r.status != 202) {
        fprintf(stderr, "onceq call: HTTP %ld %s\n", r.status, r.body);
        ret = r.status >= 400 && r.status < 500 ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    call = json_loads(r.body, 0, NULL);
    if (!call) {
        fprintf(stderr, "onceq call: unparseable response: %s\n", r.body);
        goto out;
    }
    char id[64];
    snprintf(id, sizeof id, "%s", jstr(call, task ? "task_id" : "call_id"));
    char last[32];
    snprintf(last, sizeof last, "%s", jstr(call, "status"));
    char replayed[8] = "";
    oq_httpc_header(http, "Idempotent-Replayed", replayed, sizeof replayed);
    fprintf(stderr, "%s %s=%s status=%s\n", strcmp(replayed, "true") == 0 ? "replayed" : "accepted",
            task ? "task_id" : "call_id", id, last);

    /* Wait for a terminal state: long polls, each answered by the producer as soon as the call
     * is terminal or after ?wait= with the call as it stands. */
    if (oq_config_int(cfg, "wait")) {
        int64_t poll = oq_config_int(cfg, "poll-interval");
        int64_t long_poll = oq_config_int(cfg, "long-poll");
        /* a client of its own: one request may last the wait plus --request-timeout */
        oq_httpc_opts_t wo = {ho.timeout_ms + long_poll, ho.cacert};
        if (!(waitc = oq_httpc_new(&wo, &err))) {
            fprintf(stderr, "onceq call: %s\n", err.msg);
            goto out;
        }
        int have = 0;         /* r holds the answer to a status request */
        int64_t last_get = 0; /* when the last one started (oq_mono_us) */
        while (!terminal(task, last)) {
            int64_t since_ms = last_get ? (oq_mono_us() - last_get) / 1000 : poll;
            int64_t pause =
                next_wait_ms(since_ms < poll ? poll - since_ms : 0, have ? &r : NULL, deadline);
            int64_t left_ms = pause < 0 ? 0 : (deadline - oq_mono_us()) / 1000 - pause;
            if (pause < 0 || left_ms < 10) {
                fprintf(stderr,
                        "onceq call: still %s after --timeout; it goes on (query with onceq "
                        "%s %s)\n",
                        last, task ? "tasks show" : "get", id);
                ret = OQ_EXIT_GAVE_UP;
                goto print;
            }
            if (pause > 0) oq_sleep_ms(pause, NULL);
            if (task) /* no long poll on a task: polled every --poll-interval */
                snprintf(url, ucap, "%.*s/v1/tasks/%s", (int)blen, base, id);
            else
                snprintf(url, ucap, "%.*s/v1/tool-calls/%s?wait=%lldms", (int)blen, base, id,
                         (long long)(left_ms < long_poll ? left_ms : long_poll));
            oq_httpc_resp_clear(&r);
            last_get = oq_mono_us();
            have = oq_httpc_request(waitc, "GET", url, poll_hdrs, NULL, &r, NULL) == 0;
            if (!have || r.status != 200) continue; /* transient: poll until the deadline */
            json_t *c = json_loads(r.body, 0, NULL);
            if (!c) continue;
            json_decref(call);
            call = c;
            if (strcmp(jstr(call, "status"), last) != 0) {
                snprintf(last, sizeof last, "%s", jstr(call, "status"));
                if (task)
                    fprintf(stderr, "status=%s\n", last);
                else
                    fprintf(stderr, "status=%s attempt=%lld\n", last,
                            (long long)json_integer_value(json_object_get(call, "attempt")));
            }
        }
        ret = strcmp(last, "succeeded") == 0      ? OQ_EXIT_OK
              : strcmp(last, "needs_review") == 0 ? OQ_EXIT_CALL_REVIEW
                                                  : OQ_EXIT_CALL_FAILED;
    } else {
        ret = OQ_EXIT_OK;
    }
print:;
    char *text = oq_json_dumps(call, JSON_INDENT(2));
    if (text) printf("%s\n", text);
    free(text);
out:
    oq_httpc_resp_clear(&r);
    oq_httpc_destroy(http);
    oq_httpc_destroy(waitc);
    free(url);
    free(body_text);
    json_decref(call);
    json_decref(body);
    json_decref(args);
    oq_config_destroy(cfg);
    return ret;
}
