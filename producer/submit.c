/* SPDX-License-Identifier: Apache-2.0 */
/*
 * submit.c: a submit request prepared outside the writer (oq_submit_job_t).
 *
 * Everything a submit needs that does not touch the database is done here, on the submitter's
 * thread (an HTTP epoll thread, a caller of the blocking API): validation with the project's
 * one rule for keys and names (oq_envelope_valid_*), the RFC 8785 canonical args, the
 * fingerprint of that text (oq_fingerprint_canon), a fresh call id and message id, and the
 * tool_call envelope of attempt 1 (oq_envelope_encode_canon: the same encoder as every other
 * envelope, fed the args text it already has). The writer thread then runs only prepared
 * statements (decide.c, store.c).
 *
 * Call ids come from oq_id_call(): time-ordered (48 bits of ms, then 80 random bits).
 * calls.call_id is a B-tree index: a random id dirties a random leaf page per submit (a 4 KiB
 * WAL frame written and fsynced by every group commit, and another page write at the
 * checkpoint), while time-ordered ids all land on the right-most leaf. A collision (the same 80
 * bits in one ms) is in practice impossible, but it would be reported by the store and the
 * decision draws new ids (oq__job_new_ids).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "producer_int.h"

/* The envelope of attempt 1 (job->call_id, job->message_id) into job->payload. */
int oq__call_message_encode(const oq__call_message_t *m, char **out, size_t *out_len,
                            oq_error_t *err)
{
    oq_envelope_t e;
    memset(&e, 0, sizeof e);
    e.v = OQ_ENVELOPE_VERSION;
    e.kind = OQ_KIND_TOOL_CALL;
    snprintf(e.message_id, sizeof e.message_id, "%s", m->message_id);
    snprintf(e.call_id, sizeof e.call_id, "%s", m->call_id);
    e.tenant = (char *)m->tenant;
    e.idem_key = (char *)m->idem_key;
    snprintf(e.fingerprint, sizeof e.fingerprint, "%s", m->fingerprint);
    e.tool = (char *)m->tool;
    e.attempt = m->attempt;
    e.created_at = m->created_at;
    return oq_envelope_encode_canon(&e, m->args, m->args_len, out, out_len, err);
}

static int encode_first(oq_submit_job_t *job, oq_error_t *err)
{
    oq__call_message_t m = {
        job->message_id, job->call_id,  job->tenant, job->idem_key,  job->fingerprint, job->tool,
        job->args,       job->args_len, 1,           job->created_at};
    char *payload = NULL;
    size_t len = 0;
    int ret = oq__call_message_encode(&m, &payload, &len, err);
    if (ret) return ret;
    free(job->payload);
    job->payload = payload;
    job->payload_len = len;
    return 0;
}

void oq_submit_job_destroy(oq_submit_job_t *job)
{
    if (!job) return;
    free(job->tenant);
    free(job->idem_key);
    free(job->tool);
    free(job->args);
    free(job->client_id);
    free(job->callback_url);
    free(job->payload);
    oq_call_clear(&job->call);
    free(job);
}

int oq_submit_job_new(const oq_submit_req_t *req, oq_submit_job_t **out, oq_error_t *err)
{
    const char *tenant = req->tenant && *req->tenant ? req->tenant : OQ_DEFAULT_TENANT;
    if (!oq_envelope_valid_key(req->idem_key))
        return oq_error_set(err, OQ_EINVAL, 0, "idempotency key must be 1-%d printable ASCII bytes",
                            OQ_MAX_KEY_LEN);
    if (!oq_envelope_valid_name(tenant))
        return oq_error_set(err, OQ_EINVAL, 0, "tenant must be 1-%d printable ASCII bytes",
                            OQ_MAX_NAME_LEN);
    if (!oq_envelope_valid_tool(req->tool))
        return oq_error_set(err, OQ_EINVAL, 0, "tool must be 1-%d bytes of [A-Za-z0-9_.:-]",
                            OQ_MAX_NAME_LEN);
    if (!req->args || !json_is_object(req->args))
        return oq_error_set(err, OQ_EINVAL, 0, "args must be a JSON object");
    if (req->client_id && !oq_envelope_valid_name(req->client_id))
        return oq_error_set(err, OQ_EINVAL, 0, "client_id must be 1-%d printable ASCII bytes",
                            OQ_MAX_NAME_LEN);
    int ret = req->callback_url ? oq_callback_url_check(req->callback_url, err) : 0;
    if (ret) return ret;

    oq_submit_job_t *job = calloc(1, sizeof *job);
    if (!job) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    job->work.kind = OQ__WORK_SUBMIT;
    job->tenant = strdup(tenant);
    job->idem_key = strdup(req->idem_key);
    job->tool = strdup(req->tool);
    job->client_id = req->client_id ? strdup(req->client_id) : NULL;
    job->callback_url = req->callback_url ? strdup(req->callback_url) : NULL;
    if (!job->tenant || !job->idem_key || !job->tool || (req->client_id && !job->client_id) ||
        (req->callback_url && !job->callback_url)) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    job->seq = req->seq;
    job->has_seq = req->has_seq;
    if ((ret = oq_jcs_canonicalize(req->args, &job->args, &job->args_len, err))) goto out;
    if ((ret = oq_fingerprint_canon(job->tenant, job->tool, job->args, job->args_len,
                                    job->fingerprint, err)))
        goto out;
    oq_id_call(job->call_id);
    oq_id_uuid(job->message_id);
    job->created_at = oq_now_ms();
    ret = encode_first(job, err);
out:
    if (ret) {
        oq_submit_job_destroy(job);
        return ret;
    }
    *out = job;
    return 0;
}

int oq__job_new_ids(oq_submit_job_t *job, oq_error_t *err)
{
    oq_id_call(job->call_id);
    oq_id_uuid(job->message_id);
    return encode_first(job, err);
}

void oq__job_finish_new(oq_submit_job_t *job)
{
    if (!job->call_from_job) return;
    oq_call_t *c = &job->call;
    memcpy(c->call_id, job->call_id, sizeof c->call_id);
    memcpy(c->fingerprint, job->fingerprint, sizeof c->fingerprint);
    snprintf(c->state, sizeof c->state, "pending");
    c->attempt = 1;
    c->tenant = job->tenant;
    c->idem_key = job->idem_key;
    c->tool = job->tool;
    c->args = job->args;
    c->client_id = job->client_id;
    c->callback_url = job->callback_url;
    c->seq = job->seq;
    c->has_seq = job->has_seq;
    job->tenant = job->idem_key = job->tool = job->args = job->client_id = NULL;
    job->callback_url = NULL;
    job->call_from_job = 0;
}

int oq_submit_job_result(const oq_submit_job_t *job, oq_submit_outcome_t *outcome,
                         const oq_call_t **call, oq_error_t *err)
{
    if (outcome) *outcome = job->outcome;
    if (call) *call = &job->call;
    if (err) *err = job->work.err;
    return job->work.rc;
}
