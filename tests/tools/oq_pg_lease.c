/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_pg_lease: one consumer worker's lease steps on a consumer store, as the worker takes them
 * (consumer/execution.c with the store's clock, oq__consumer_store_now), for the lease-clock
 * test (tests/integration/test_pg_consumer_clock.sh), which runs some of them under faketime.
 *
 *   oq_pg_lease DB plan                  a new call PLANNED, due now; prints its call id
 *   oq_pg_lease DB claim CALL LEASE_MS   claim it (STARTED, fence + 1); prints the fence
 *   oq_pg_lease DB recover               recovery: lapsed leases -> UNKNOWN (and onwards)
 *
 * Exit 0 on success, 1 on an error (printed), 2 on bad usage.
 */
#include <jansson.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "consumer_store.h"
#include "execution.h"
#include "oq_envelope.h"
#include "oq_json.h"
#include "oq_util.h"

static int fail(const char *what, const oq_error_t *err)
{
    fprintf(stderr, "oq_pg_lease: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: oq_pg_lease DB plan|claim CALL LEASE_MS|recover\n");
        return 2;
    }
    oq_error_t err = {0};
    oq__consumer_store_t *s = NULL;
    oq_db_opts_t o = {.busy_timeout_ms = 10000};
    char who[64];
    snprintf(who, sizeof who, "lease-tool:%d", (int)getpid());
    if (oq__consumer_store_open(argv[1], &o, who, &s, &err)) return fail("open", &err);
    int64_t now = oq__consumer_store_now(s);
    int rc = 0;
    if (strcmp(argv[2], "plan") == 0) {
        oq_envelope_t e;
        memset(&e, 0, sizeof e);
        e.v = 1;
        e.kind = OQ_KIND_TOOL_CALL;
        oq_id_uuid(e.message_id);
        oq_id_call(e.call_id);
        e.tenant = strdup("t1");
        e.idem_key = strdup(e.call_id);
        e.tool = strdup("charge");
        e.args = json_pack("{s:i, s:s}", "amount", 100, "currency", "EUR");
        e.attempt = 1;
        e.created_at = now;
        oq__msg_src_t src = {.topic = OQ_TOPIC_CALLS, .partition = 0, .offset = 1};
        int decision = -1;
        if ((rc = oq_fingerprint(e.tenant, e.tool, e.args, e.fingerprint, &err)) ||
            (rc = oq__consumer_store_begin(s, &err)) ||
            (rc = oq__exec_intake(s, &e, &src, now, &decision, &err)) ||
            (decision == OQ__INTAKE_NEW && (rc = oq__exec_plan(s, &e, now, &err))) ||
            (rc = oq__consumer_store_commit(s, &err))) {
            oq__consumer_store_rollback(s);
            rc = fail("plan", &err);
        } else {
            printf("%s\n", e.call_id);
        }
        oq_envelope_clear(&e);
    } else if (strcmp(argv[2], "claim") == 0 && argc == 5) {
        oq__exec_row_t x;
        memset(&x, 0, sizeof x);
        if ((rc = oq__consumer_store_begin(s, &err)) ||
            (rc = oq__exec_claim(s, argv[3], strtoll(argv[4], NULL, 10), now, &x, &err)) ||
            (rc = oq__consumer_store_commit(s, &err))) {
            oq__consumer_store_rollback(s);
            rc = fail("claim", &err);
        } else {
            printf("%" PRId64 "\n", x.fence);
        }
        oq__exec_row_clear(&x);
    } else if (strcmp(argv[2], "recover") == 0) {
        static const oq__retry_policy_t policy = {
            .max_attempts = 3, .base_ms = 100, .max_ms = 1000};
        oq__exec_row_t lookups[16];
        int nl = 0, nr = 0;
        memset(lookups, 0, sizeof lookups);
        if ((rc = oq__consumer_store_begin(s, &err)) ||
            (rc = oq__exec_recover(s, now, &policy, 16, lookups, &nl, &nr, &err)) ||
            (rc = oq__consumer_store_commit(s, &err))) {
            oq__consumer_store_rollback(s);
            rc = fail("recover", &err);
        }
        for (int i = 0; i < nl; i++)
            oq__exec_row_clear(&lookups[i]);
    } else {
        fprintf(stderr, "oq_pg_lease: unknown step %s\n", argv[2]);
        rc = 2;
    }
    oq__consumer_store_close(s);
    return rc;
}
