/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tasks.c: the rules of tasks, an agent's run of steps (oq_tasks.h), top to bottom: what a
 * request may be, how a step's arguments cite earlier results, the state machine of a task
 * and of its steps, and where each transition is written. Rows go through producer_store.h.
 *
 * A step is an ordinary call with a derived key: the task's key + "/" + the step's name (its
 * compensation: + "/compensate"), in the task's tenant. It is written by the same submit
 * decision as any call (decide.c), so every single-call guarantee holds per step: one call per
 * key, one effect per call at the consumer, UNKNOWN outcomes reconciled there, review. The
 * consumer never learns that a call belongs to a task.
 *
 * The orchestrator lives where results arrive. The results ingest applies a tool_result
 * through the result inbox (decide.c); when the call belongs to a task (task_calls, one probe
 * of a primary key), oq__task_on_result runs in the SAME transaction: it records the step's
 * status (the checkpoint) and writes the next step's call and outbox row, or the next
 * compensation, or the task's end. A crash leaves both or neither; a result delivered again is
 * a duplicate in the inbox and never reaches this file. So resume is not a separate path: after
 * a crash the relay publishes what was committed, the consumer answers, the result is applied
 * and the run goes on from the first step that is not `succeeded`. A step whose outcome is
 * UNKNOWN stays `running` here until the consumer's reconciliation (or an operator) gives its
 * call a final state: nothing after it starts before that.
 *
 * Arguments: any string in a step's (or a compensation's) args may cite
 * `{steps.NAME.result.PATH}` (a dotted path into the step's result; array indexes are numbers)
 * or `{steps.NAME.object_id}` (result.object_id, the downstream's id). A string that is exactly
 * one reference takes the cited JSON value with its type; a reference inside a longer string
 * is spliced as text. A step may cite only earlier steps, a compensation also its own step
 * (checked at submit: 400 bad_reference). They are resolved when the step is written, from the
 * results in calls.result, which are durable by then: a replay computes the same arguments and
 * so the same fingerprint. A path missing from the result fails the step (reason says which).
 *
 * The state machine. Task: running -> succeeded | compensating | failed | needs_review;
 * compensating -> compensated | needs_review. Step: pending -> running -> succeeded | failed |
 * needs_review; pending -> skipped (an earlier step failed); succeeded -> compensating ->
 * compensated | needs_review.
 *  - A step succeeded: the next pending step is written; none left: the task succeeded.
 *  - A step failed: the later steps are skipped. If an `irreversible` step before it succeeded,
 *    nothing can be undone: needs_review. Else if a succeeded step has a compensation: the task
 *    is compensating, and the compensations run in reverse step order, one at a time. Else the
 *    task failed (nothing to undo).
 *  - A step needs review (its call does): the task needs review, later steps skipped.
 *  - A compensation failed: tried again (a new attempt of the same call, so still one effect
 *    id) after OQ_TASK_COMP_BACKOFF_MS * 2^(attempt-1), up to OQ_TASK_COMP_ATTEMPTS attempts;
 *    past that, or when the compensation needs review, the task needs review with the reason,
 *    never `compensated`. The retries are due rows (comp_next_at) the writer looks at once a
 *    second (oq__task_retry_due).
 * Validation puts every irreversible step after every step that has a compensation, and an
 * irreversible step has none itself (400 bad_task).
 *
 * An operator's hand (oq__task_review, `onceq review resolve t_...`). A pending step with
 * "approval": true that is next puts the task in awaiting_approval instead of being written;
 * approve writes it, reject skips it and the later steps and takes the failed-step path. A
 * task in needs_review is settled compensated / succeeded by the operator, or its compensation
 * that failed past its budget gets a fresh budget (retry-compensation). tasks.review_fence
 * moves on each entry into awaiting_approval or needs_review (set_task); a decision made on
 * another fence is refused (OQ_ECONFLICT, review_moved). Each decision is audited under the
 * task id (event task_review).
 */
#include "tasks.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_db.h"
#include "oq_log.h"
#include "oq_util.h"

struct oq_task_job {
    oq__work_t work; /**< first member: a job is a work item (OQ__WORK_TASK) */
    char *tenant, *idem_key;
    char *spec; /**< canonical {"steps":[...]} */
    char fingerprint[OQ_FINGERPRINT_LEN + 1];
    char task_id[OQ_TASK_ID_LEN + 1];
    oq_task_outcome_t outcome;
    json_t *task; /**< the task as committed */
    oq_task_done_cb cb;
};

static int is(const char *a, const char *b)
{
    return a && strcmp(a, b) == 0;
}

int oq_task_status_terminal(const char *st)
{
    return is(st, "succeeded") || is(st, "compensated") || is(st, "failed") ||
           is(st, "needs_review");
}

/* --- references ------------------------------------------------------------------------------ */

/* One `{steps.NAME.result[.PATH]}` or `{steps.NAME.object_id}` inside a string. */
typedef struct ref {
    size_t at, len; /**< offset of '{' and length through '}' */
    const char *name;
    size_t name_len;
    int object_id;
    const char *path; /**< after "result.", NULL for the whole result */
    size_t path_len;
} ref_t;

static int name_char(int c)
{
    return isalnum(c) || c == '_' || c == '-';
}

/* The next reference in \p s from \p from: 1 found, 0 none, -1 malformed (\p msg says why). */
static int next_ref(const char *s, size_t from, ref_t *r, char *msg, size_t cap)
{
    const char *p = strstr(s + from, "{steps.");
    if (!p) return 0;
    const char *end = strchr(p, '}');
    if (!end) {
        snprintf(msg, cap, "reference \"%.40s\" has no closing brace", p);
        return -1;
    }
    memset(r, 0, sizeof *r);
    r->at = (size_t)(p - s);
    r->len = (size_t)(end - p) + 1;
    const char *q = p + 7; /* after "{steps." */
    r->name = q;
    while (q < end && name_char((unsigned char)*q))
        q++;
    r->name_len = (size_t)(q - r->name);
    if (r->name_len == 0 || q == end || *q != '.') goto bad;
    q++;
    if ((size_t)(end - q) == 9 && strncmp(q, "object_id", 9) == 0) {
        r->object_id = 1;
        return 1;
    }
    if ((size_t)(end - q) < 6 || strncmp(q, "result", 6) != 0) goto bad;
    q += 6;
    if (q == end) return 1;
    if (*q != '.' || q + 1 == end) goto bad;
    r->path = q + 1;
    r->path_len = (size_t)(end - r->path);
    for (size_t i = 0; i < r->path_len; i++) /* no empty segment */
        if (r->path[i] == '.' && (i == 0 || i + 1 == r->path_len || r->path[i + 1] == '.'))
            goto bad;
    return 1;
bad:
    snprintf(msg, cap,
             "malformed reference \"%.*s\" (expected {steps.NAME.result.PATH} or "
             "{steps.NAME.object_id})",
             (int)(r->len > 80 ? 80 : r->len), p);
    return -1;
}

/* The index of step \p name among the first \p n of \p steps (spec array), or -1. */
static int step_index(const json_t *steps, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++) {
        const char *nm = json_string_value(json_object_get(json_array_get(steps, i), "name"));
        if (nm && strlen(nm) == len && strncmp(nm, name, len) == 0) return (int)i;
    }
    return -1;
}

/* Every reference in \p v must name one of the first \p n steps. */
static int check_refs(const json_t *v, const json_t *steps, size_t n, const char *where,
                      oq_error_t *err)
{
    const char *k;
    json_t *x;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, x)
        {
            int rc = check_refs(x, steps, n, where, err);
            if (rc) return rc;
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, x)
        {
            int rc = check_refs(x, steps, n, where, err);
            if (rc) return rc;
        }
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        ref_t r;
        char msg[200];
        size_t from = 0;
        int f;
        while ((f = next_ref(s, from, &r, msg, sizeof msg)) == 1) {
            if (step_index(steps, n, r.name, r.name_len) < 0)
                return oq_error_set(err, OQ_EINVAL, 0,
                                    "%s: {steps.%.*s...} cites no earlier step of that name", where,
                                    (int)r.name_len, r.name);
            from = r.at + r.len;
        }
        if (f < 0) return oq_error_set(err, OQ_EINVAL, 0, "%s: %s", where, msg);
    }
    return 0;
}

/* The value \p r cites in \p t (borrowed), or NULL with \p msg. */
static const json_t *ref_value(const oq__task_t *t, size_t n, const ref_t *r, char *msg, size_t cap)
{
    int i = step_index(json_object_get(t->spec, "steps"), n, r->name, r->name_len);
    const oq__task_step_t *st = i < 0 ? NULL : &t->steps[i];
    if (!st || !st->result) {
        snprintf(msg, cap, "step %.*s has no result", (int)r->name_len, r->name);
        return NULL;
    }
    if (r->object_id) {
        const json_t *v = json_object_get(st->result, "object_id");
        if (!json_is_string(v) && !json_is_integer(v)) {
            snprintf(msg, cap, "step %.*s: its result has no object_id", (int)r->name_len, r->name);
            return NULL;
        }
        return v;
    }
    const json_t *v = st->result;
    size_t at = 0;
    while (r->path && at < r->path_len && v) {
        const char *seg = r->path + at;
        const char *dot = memchr(seg, '.', r->path_len - at);
        size_t sl = dot ? (size_t)(dot - seg) : r->path_len - at;
        char key[256];
        if (sl >= sizeof key) {
            v = NULL;
            break;
        }
        memcpy(key, seg, sl);
        key[sl] = '\0';
        if (json_is_array(v)) {
            char *e;
            unsigned long ix = strtoul(key, &e, 10);
            v = *e || !isdigit((unsigned char)key[0]) ? NULL : json_array_get(v, ix);
        } else {
            v = json_object_get(v, key);
        }
        at += sl + 1;
    }
    if (!v)
        snprintf(msg, cap, "step %.*s: its result has nothing at %.*s", (int)r->name_len, r->name,
                 (int)r->path_len, r->path);
    return v;
}

static json_t *resolve_string(const oq__task_t *t, size_t n, const char *s, char *msg, size_t cap)
{
    ref_t r;
    int f = next_ref(s, 0, &r, msg, cap);
    if (f < 0) return NULL;
    if (f == 0) return json_string(s);
    if (r.at == 0 && r.len == strlen(s)) { /* a whole-string reference keeps the JSON type */
        const json_t *v = ref_value(t, n, &r, msg, cap);
        return v ? json_deep_copy(v) : NULL;
    }
    size_t from = 0, len = 0, bcap = strlen(s) + 64;
    char *out = malloc(bcap);
    if (!out) return NULL;
    for (;;) {
        size_t upto = f == 1 ? r.at : strlen(s);
        char *piece = NULL;
        size_t plen = 0;
        if (f == 1) {
            const json_t *v = ref_value(t, n, &r, msg, cap);
            if (!v) {
                free(out);
                return NULL;
            }
            piece = json_is_string(v) ? strdup(json_string_value(v))
                                      : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!piece) {
                free(out);
                return NULL;
            }
            plen = strlen(piece);
        }
        size_t need = len + (upto - from) + plen + 1;
        if (need > bcap) {
            char *nb = realloc(out, bcap = need * 2);
            if (!nb) {
                free(piece);
                free(out);
                return NULL;
            }
            out = nb;
        }
        memcpy(out + len, s + from, upto - from);
        len += upto - from;
        if (piece) memcpy(out + len, piece, plen);
        len += plen;
        free(piece);
        if (f != 1) break;
        from = r.at + r.len;
        f = next_ref(s, from, &r, msg, cap);
        if (f < 0) {
            free(out);
            return NULL;
        }
    }
    out[len] = '\0';
    json_t *j = json_string(out);
    free(out);
    if (!j) snprintf(msg, cap, "a spliced reference made a string that is not UTF-8");
    return j;
}

static json_t *resolve_value(const oq__task_t *t, size_t n, const json_t *v, char *msg, size_t cap)
{
    const char *k;
    json_t *x;
    size_t i;
    if (json_is_string(v)) return resolve_string(t, n, json_string_value(v), msg, cap);
    if (json_is_object(v)) {
        json_t *o = json_object();
        json_object_foreach((json_t *)v, k, x)
        {
            json_t *y = resolve_value(t, n, x, msg, cap);
            if (!y || !o || json_object_set_new(o, k, y)) {
                json_decref(o);
                return NULL;
            }
        }
        return o;
    }
    if (json_is_array(v)) {
        json_t *a = json_array();
        json_array_foreach(v, i, x)
        {
            json_t *y = resolve_value(t, n, x, msg, cap);
            if (!y || !a || json_array_append_new(a, y)) {
                json_decref(a);
                return NULL;
            }
        }
        return a;
    }
    return json_deep_copy(v);
}

int oq__task_resolve(const oq__task_t *t, const json_t *args, size_t upto, int self, json_t **out,
                     oq_error_t *err)
{
    char msg[256] = "out of memory";
    for (size_t i = 0; i < upto + (self ? 1 : 0) && i < t->n; i++) {
        oq__task_step_t *st = (oq__task_step_t *)&t->steps[i];
        if (!st->result && st->row.result) st->result = json_loads(st->row.result, 0, NULL);
    }
    *out = resolve_value(t, upto + (self ? 1 : 0), args, msg, sizeof msg);
    return *out ? 0 : oq_error_set(err, OQ_EINVAL, 0, "%s", msg);
}

/* --- validation ------------------------------------------------------------------------------ */

/* Refuse with the stable \p c code (in \p code, when given). */
#define BAD(c, ...)                                                                                \
    ((code ? (void)(*code = (c)) : (void)0), oq_error_set(err, OQ_EINVAL, 0, __VA_ARGS__))

int oq__task_validate(const json_t *steps, size_t key_len, const char **code, oq_error_t *err)
{
    char where[96];
    if (!json_is_array(steps) || json_array_size(steps) == 0)
        return BAD("bad_request", "field steps: expected a non-empty array%s%s", "", "");
    size_t n = json_array_size(steps);
    if (n > OQ_TASK_MAX_STEPS) return BAD("bad_task", "a task has at most 64 steps%s%s", "", "");
    int last_comp = -1, first_irrev = -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *st = json_array_get(steps, i);
        const char *k;
        json_t *v;
        snprintf(where, sizeof where, "steps[%zu]", i);
        if (!json_is_object(st)) return BAD("bad_request", "%s: expected an object%s", where, "");
        json_object_foreach((json_t *)st, k, v)
        {
            if (strcmp(k, "name") && strcmp(k, "tool") && strcmp(k, "args") &&
                strcmp(k, "compensate") && strcmp(k, "irreversible") && strcmp(k, "approval"))
                return BAD("bad_request", "%s: unknown field %.64s", where, k);
        }
        const char *name = json_string_value(json_object_get(st, "name"));
        size_t nl = name ? strlen(name) : 0;
        int ok = nl > 0 && nl <= OQ_TASK_MAX_NAME;
        for (size_t c = 0; ok && c < nl; c++)
            ok = name_char((unsigned char)name[c]);
        if (!ok)
            return BAD("bad_request", "%s: field name: expected 1-64 characters of [A-Za-z0-9_-]%s",
                       where, "");
        snprintf(where, sizeof where, "step %s", name);
        if (step_index(steps, i, name, nl) >= 0)
            return BAD("bad_task", "%s: the name is used by an earlier step%s", where, "");
        if (key_len + 1 + nl + strlen("/compensate") > OQ_MAX_KEY_LEN)
            return BAD("bad_task",
                       "%s: the step's key (task key + \"/\" + name + \"/compensate\") would be "
                       "over 255 bytes%s",
                       where, "");
        const char *tool = json_string_value(json_object_get(st, "tool"));
        if (!tool || !oq_envelope_valid_tool(tool))
            return BAD("bad_request",
                       "%s: field tool: expected 1-128 characters of [A-Za-z0-9_.:-]%s", where, "");
        if (!json_is_object(json_object_get(st, "args")))
            return BAD("bad_request", "%s: field args: expected an object%s", where, "");
        const json_t *irr = json_object_get(st, "irreversible");
        if (irr && !json_is_boolean(irr))
            return BAD("bad_request", "%s: field irreversible: expected a boolean%s", where, "");
        const json_t *appr = json_object_get(st, "approval");
        if (appr && !json_is_boolean(appr))
            return BAD("bad_request", "%s: field approval: expected a boolean%s", where, "");
        const json_t *comp = json_object_get(st, "compensate");
        if (comp) {
            if (!json_is_object(comp))
                return BAD("bad_request", "%s: field compensate: expected an object%s", where, "");
            json_object_foreach((json_t *)comp, k, v)
            {
                if (strcmp(k, "tool") && strcmp(k, "args"))
                    return BAD("bad_request", "%s: compensate: unknown field %.64s", where, k);
            }
            const char *ct = json_string_value(json_object_get(comp, "tool"));
            if (!ct || !oq_envelope_valid_tool(ct))
                return BAD("bad_request", "%s: compensate.tool: expected a tool name%s", where, "");
            if (!json_is_object(json_object_get(comp, "args")))
                return BAD("bad_request", "%s: compensate.args: expected an object%s", where, "");
            if (json_is_true(irr))
                return BAD("bad_task", "%s: an irreversible step cannot have a compensation%s",
                           where, "");
            last_comp = (int)i;
        }
        if (json_is_true(irr) && first_irrev < 0) first_irrev = (int)i;
        if (check_refs(json_object_get(st, "args"), steps, i, where, err)) {
            if (code) *code = "bad_reference";
            return OQ_EINVAL;
        }
        if (comp && check_refs(json_object_get(comp, "args"), steps, i + 1, where, err)) {
            if (code) *code = "bad_reference";
            return OQ_EINVAL;
        }
    }
    if (first_irrev >= 0 && last_comp > first_irrev) {
        const char *a =
            json_string_value(json_object_get(json_array_get(steps, first_irrev), "name"));
        const char *b =
            json_string_value(json_object_get(json_array_get(steps, last_comp), "name"));
        return BAD("bad_task",
                   "irreversible step %s comes before step %s, which has a compensation: "
                   "irreversible steps must come after every compensated step",
                   a, b);
    }
    return 0;
}

/* --- the task in memory ---------------------------------------------------------------------- */

int oq__task_from_spec(oq__task_t *t, json_t *spec, oq_error_t *err)
{
    const json_t *steps = json_object_get(spec, "steps");
    size_t n = json_array_size(steps);
    t->spec = spec;
    t->n = 0;
    if (!(t->steps = calloc(n ? n : 1, sizeof *t->steps)))
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *j = json_array_get(steps, i);
        oq__task_step_t *st = &t->steps[i];
        st->row.idx = (int)i;
        if (!(st->row.name = strdup(json_string_value(json_object_get(j, "name")))))
            return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        snprintf(st->row.status, sizeof st->row.status, "pending");
        st->tool = json_string_value(json_object_get(j, "tool"));
        st->args = json_object_get(j, "args");
        const json_t *c = json_object_get(j, "compensate");
        st->comp_tool = c ? json_string_value(json_object_get(c, "tool")) : NULL;
        st->comp_args = c ? json_object_get(c, "args") : NULL;
        st->irreversible = json_is_true(json_object_get(j, "irreversible"));
        st->approval = json_is_true(json_object_get(j, "approval"));
        t->n++;
    }
    return 0;
}

void oq__task_clear(oq__task_t *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) {
        oq__task_step_row_t *r = &t->steps[i].row;
        free(r->name);
        free(r->result);
        free(r->error);
        free(r->comp_result);
        free(r->comp_error);
        json_decref(t->steps[i].result);
    }
    free(t->steps);
    json_decref(t->spec);
    oq__task_row_clear(&t->row);
    memset(t, 0, sizeof *t);
}

/* --- the state machine ----------------------------------------------------------------------- */

static void set_step(oq__task_t *t, size_t i, const char *status)
{
    snprintf(t->steps[i].row.status, sizeof t->steps[i].row.status, "%s", status);
    t->steps[i].dirty = 1;
}

static void set_task(oq__task_t *t, const char *status, const char *reason)
{
    /* a new episode for an operator: a decision made on the previous one is refused */
    if ((is(status, "awaiting_approval") || is(status, "needs_review")) &&
        !is(t->row.status, status))
        t->row.review_fence++;
    snprintf(t->row.status, sizeof t->row.status, "%s", status);
    if (reason) {
        free(t->row.reason);
        t->row.reason = strdup(reason);
    }
    t->dirty = 1;
}

static void skip_after(oq__task_t *t, size_t i)
{
    for (size_t j = i + 1; j < t->n; j++)
        if (is(t->steps[j].row.status, "pending")) set_step(t, j, "skipped");
}

/* What ran before step \p i and cannot simply be left: the first succeeded irreversible step
 * (\p *irrev, NULL if none) and whether a succeeded step has a compensation (\p *undo). */
static void what_ran_before(const oq__task_t *t, size_t i, const char **irrev, int *undo)
{
    for (size_t j = 0; j < i; j++) {
        if (!is(t->steps[j].row.status, "succeeded")) continue;
        if (t->steps[j].irreversible && !*irrev) *irrev = t->steps[j].row.name;
        if (t->steps[j].comp_tool) *undo = 1;
    }
}

void oq__task_on_step(oq__task_t *t, size_t i, const char *status, const char *why)
{
    char reason[512];
    if (i >= t->n || !is(t->steps[i].row.status, "running") || !is(t->row.status, "running"))
        return;
    const char *name = t->steps[i].row.name;
    if (is(status, "succeeded")) {
        set_step(t, i, "succeeded");
    } else if (is(status, "needs_review")) {
        set_step(t, i, "needs_review");
        skip_after(t, i);
        snprintf(reason, sizeof reason,
                 "step %s needs review: its outcome is not known for sure (onceq review)", name);
        set_task(t, "needs_review", reason);
    } else if (is(status, "failed")) {
        set_step(t, i, "failed");
        skip_after(t, i);
        const char *irrev = NULL;
        int undo = 0;
        what_ran_before(t, i, &irrev, &undo);
        const char *w = why ? why : "its call failed";
        if (irrev) {
            snprintf(reason, sizeof reason,
                     "step %s failed (%s) after the irreversible step %s succeeded: it cannot be "
                     "undone",
                     name, w, irrev);
            set_task(t, "needs_review", reason);
        } else {
            snprintf(reason, sizeof reason, "step %s failed (%s)", name, w);
            set_task(t, undo ? "compensating" : "failed", reason);
        }
    }
}

void oq__task_on_comp(oq__task_t *t, size_t i, const char *status, int64_t now_ms)
{
    char reason[512];
    if (i >= t->n) return;
    oq__task_step_t *st = &t->steps[i];
    if (!is(st->row.status, "compensating") || st->row.comp_next_at ||
        !is(t->row.status, "compensating"))
        return;
    if (is(status, "succeeded")) {
        set_step(t, i, "compensated");
    } else if (is(status, "needs_review")) {
        set_step(t, i, "needs_review");
        snprintf(reason, sizeof reason, "the compensation of step %s needs review", st->row.name);
        set_task(t, "needs_review", reason);
    } else if (is(status, "failed")) {
        if (st->row.comp_attempts >= OQ_TASK_COMP_ATTEMPTS) {
            set_step(t, i, "needs_review");
            snprintf(reason, sizeof reason,
                     "the compensation of step %s failed %lld times (its retry budget): the "
                     "step's effect stands",
                     st->row.name, (long long)st->row.comp_attempts);
            set_task(t, "needs_review", reason);
        } else {
            int64_t d = OQ_TASK_COMP_BACKOFF_MS;
            for (int64_t a = 1; a < st->row.comp_attempts && d < OQ_TASK_COMP_BACKOFF_MAX_MS; a++)
                d *= 2;
            st->row.comp_next_at =
                now_ms + (d < OQ_TASK_COMP_BACKOFF_MAX_MS ? d : OQ_TASK_COMP_BACKOFF_MAX_MS);
            st->dirty = 1;
        }
    }
}

oq__task_act_t oq__task_next(oq__task_t *t, size_t *idx)
{
    if (is(t->row.status, "running")) {
        for (size_t i = 0; i < t->n; i++) {
            const char *s = t->steps[i].row.status;
            if (is(s, "succeeded")) continue;
            if (is(s, "pending")) {
                if (t->steps[i].approval) { /* an operator approves first (oq__task_review) */
                    char reason[160];
                    snprintf(reason, sizeof reason, "step %s waits for an operator's approval",
                             t->steps[i].row.name);
                    set_task(t, "awaiting_approval", reason);
                    return OQ__TASK_WAIT;
                }
                *idx = i;
                return OQ__TASK_START_STEP;
            }
            return OQ__TASK_WAIT; /* running: its result comes */
        }
        set_task(t, "succeeded", NULL);
        return OQ__TASK_WAIT;
    }
    if (is(t->row.status, "compensating")) {
        for (size_t i = t->n; i-- > 0;) {
            const oq__task_step_t *st = &t->steps[i];
            if (is(st->row.status, "compensating")) return OQ__TASK_WAIT;
            if (is(st->row.status, "succeeded") && st->comp_tool) {
                *idx = i;
                return OQ__TASK_START_COMP;
            }
        }
        set_task(t, "compensated", NULL);
    }
    return OQ__TASK_WAIT;
}

/* --- JSON ------------------------------------------------------------------------------------ */

static json_t *text_or_null(const char *json_text)
{
    json_t *v = json_text ? json_loads(json_text, JSON_DECODE_ANY, NULL) : NULL;
    return v ? v : json_null();
}

static json_t *time_json(int64_t ms)
{
    char b[32];
    oq_time_format(ms, b);
    return json_string(b);
}

json_t *oq__task_render(const oq__task_t *t)
{
    json_t *steps = json_array();
    for (size_t i = 0; steps && i < t->n; i++) {
        const oq__task_step_t *st = &t->steps[i];
        const oq__task_step_row_t *r = &st->row;
        json_t *result = text_or_null(r->result);
        json_t *oid = json_object_get(result, "object_id");
        json_t *comp = json_null();
        if (st->comp_tool) {
            const char *cs = r->comp_call_id[0] ? (r->comp_next_at    ? "retry_scheduled"
                                                   : r->comp_state[0] ? r->comp_state
                                                                      : "pending")
                                                : "not_started";
            comp = json_pack("{s:s,s:s?,s:s,s:I,s:o,s:o}", "tool", st->comp_tool, "call_id",
                             r->comp_call_id[0] ? r->comp_call_id : NULL, "status", cs, "attempts",
                             (json_int_t)r->comp_attempts, "result", text_or_null(r->comp_result),
                             "error", text_or_null(r->comp_error));
            if (comp && r->comp_next_at)
                json_object_set_new(comp, "next_attempt_at", time_json(r->comp_next_at));
        }
        json_t *o = json_pack(
            "{s:s,s:s,s:s,s:s?,s:o,s:O,s:o,s:b,s:b,s:o}", "name", r->name, "tool", st->tool,
            "status", r->status, "call_id", r->call_id[0] ? r->call_id : NULL, "result", result,
            "object_id", oid ? oid : json_null(), "error", text_or_null(r->error), "irreversible",
            st->irreversible, "approval", st->approval, "compensation", comp ? comp : json_null());
        if (!o || json_array_append_new(steps, o)) {
            json_decref(steps);
            return NULL;
        }
    }
    if (!steps) return NULL;
    return json_pack("{s:s,s:s,s:s,s:s,s:s?,s:I,s:o,s:o,s:o}", "task_id", t->row.task_id, "tenant",
                     t->row.tenant, "idem_key", t->row.idem_key, "status", t->row.status, "reason",
                     t->row.reason, "fence", (json_int_t)t->row.review_fence, "created_at",
                     time_json(t->row.created_at), "updated_at", time_json(t->row.updated_at),
                     "steps", steps);
}

/* --- rows ------------------------------------------------------------------------------------ */

/* Load the task \p task_id (or of tenant + key) with its steps and their calls. */
static int load(oq__producer_store_t *s, const char *task_id, const char *tenant, const char *key,
                oq__task_t *t, oq_error_t *err)
{
    memset(t, 0, sizeof *t);
    int ret = oq__task_store_get(s, task_id, tenant, key, &t->row, err);
    if (ret) return ret;
    json_t *spec = json_loads(t->row.spec, 0, NULL);
    if (!spec) {
        oq__task_row_clear(&t->row);
        return oq_error_set(err, OQ_EDB, 0, "task %s: stored request unreadable", task_id);
    }
    oq__task_row_t keep = t->row;
    memset(&t->row, 0, sizeof t->row);
    if ((ret = oq__task_from_spec(t, spec, err))) {
        t->row = keep;
        oq__task_clear(t);
        return ret;
    }
    t->row = keep;
    oq__task_step_row_t *rows = NULL;
    size_t n = 0;
    if ((ret = oq__task_store_steps(s, t->row.task_id, &rows, &n, err))) {
        oq__task_clear(t);
        return ret;
    }
    for (size_t i = 0; i < n; i++) {
        if (rows[i].idx < 0 || (size_t)rows[i].idx >= t->n) continue;
        oq__task_step_row_t *r = &t->steps[rows[i].idx].row;
        free(r->name);
        *r = rows[i];
        memset(&rows[i], 0, sizeof rows[i]);
    }
    oq__task_steps_free(rows, n);
    return 0;
}

static int save(oq__producer_store_t *s, oq__task_t *t, int64_t now_ms, oq_error_t *err)
{
    int ret = 0;
    for (size_t i = 0; i < t->n && !ret; i++)
        if (t->steps[i].dirty) {
            ret = oq__task_store_step_put(s, t->row.task_id, &t->steps[i].row, err);
            t->steps[i].dirty = 0;
            t->dirty = 1; /* the task's updated_at moves with any step */
        }
    if (!ret && t->dirty) {
        t->row.updated_at = now_ms;
        ret = oq__task_store_update(s, &t->row, err);
        t->dirty = 0;
        if (!ret && oq_task_status_terminal(t->row.status))
            OQ_LOG_INFO("producer", "task %s %s%s%s", t->row.task_id, t->row.status,
                        t->row.reason ? ": " : "", t->row.reason ? t->row.reason : "");
    }
    return ret;
}

/* The step's (or compensation's) call could not be written for \p why (not a database error). */
static void start_failed(oq__task_t *t, size_t i, int comp, const char *why)
{
    char reason[512];
    if (!comp) {
        oq__task_on_step(t, i, "failed", why);
        return;
    }
    set_step(t, i, "needs_review");
    snprintf(reason, sizeof reason, "the compensation of step %s could not be written: %s",
             t->steps[i].row.name, why);
    set_task(t, "needs_review", reason);
}

/* Write the call of step \p i (or its compensation) through the submit decision. */
static int start(oq__producer_store_t *s, oq__task_t *t, size_t i, int comp, int64_t now_ms,
                 int64_t ttl, int64_t max_bytes, oq_error_t *err)
{
    oq__task_step_t *st = &t->steps[i];
    if (!comp) set_step(t, i, "running"); /* before on_step() may look at it */
    oq_error_t rerr = {0};
    json_t *args = NULL;
    if (oq__task_resolve(t, comp ? st->comp_args : st->args, i, comp, &args, &rerr)) {
        start_failed(t, i, comp, rerr.msg);
        return 0;
    }
    char key[OQ_MAX_KEY_LEN + 1];
    snprintf(key, sizeof key, "%s/%s%s", t->row.idem_key, st->row.name, comp ? "/compensate" : "");
    oq_submit_req_t req = {.tenant = t->row.tenant,
                           .idem_key = key,
                           .tool = comp ? st->comp_tool : st->tool,
                           .args = args};
    oq_submit_job_t *job = NULL;
    int ret = oq_submit_job_new(&req, &job, &rerr);
    json_decref(args);
    if (ret == OQ_EINVAL || ret == OQ_ETOOBIG || ret == OQ_EDEPTH || ret == OQ_ERANGE) {
        start_failed(t, i, comp, rerr.msg);
        return 0;
    }
    if (ret) return oq_error_set(err, ret, 0, "%s", rerr.msg);
    ret = oq__decide_submit(s, job, now_ms, ttl, max_bytes, &rerr);
    if (ret == OQ_ETOOBIG) {
        start_failed(t, i, comp, rerr.msg);
        ret = 0;
        goto out;
    }
    if (ret == OQ_ECONFLICT) {
        char reason[400];
        snprintf(reason, sizeof reason, "the key %s is used by another request (call %s)", key,
                 job->call.call_id);
        set_step(t, i, "needs_review");
        if (!comp) skip_after(t, i);
        set_task(t, "needs_review", reason);
        ret = 0;
        goto out;
    }
    if (ret) {
        if (err) *err = rerr;
        goto out;
    }
    const char *call_id = job->outcome == OQ_SUBMIT_NEW ? job->call_id : job->call.call_id;
    char state[16];
    snprintf(state, sizeof state, "%s", job->outcome == OQ_SUBMIT_REPLAY ? job->call.state : "");
    if ((ret = oq__task_store_link(s, call_id, t->row.task_id, (int)i, comp ? "compensate" : "step",
                                   err)))
        goto out;
    char detail[200];
    snprintf(detail, sizeof detail, "{\"task_id\":\"%s\",\"step\":\"%s\",\"role\":\"%s\"}",
             t->row.task_id, st->row.name, comp ? "compensate" : "step");
    if ((ret = oq__producer_store_audit_add(s, now_ms, call_id, "task_step", detail, err)))
        goto out;
    /* crash points (ONCEQ_CRASH_AT), inside the transaction: a kill here must leave neither
     * the call nor the checkpoint that wrote it */
    if (comp)
        OQ_CRASH_POINT("producer.task_after_compensation_written");
    else
        OQ_CRASH_POINT("producer.task_after_step_written");
    if (comp) {
        snprintf(st->row.comp_call_id, sizeof st->row.comp_call_id, "%s", call_id);
        st->row.comp_attempts = 1;
        st->row.comp_next_at = 0;
        set_step(t, i, "compensating");
    } else {
        snprintf(st->row.call_id, sizeof st->row.call_id, "%s", call_id);
    }
    /* the derived key already had this very call, finished: its outcome is the step's */
    if (oq_call_state_terminal(state)) {
        if (!comp) {
            free(st->row.result);
            st->row.result = job->call.result ? strdup(job->call.result) : NULL;
            oq__task_on_step(t, i, state, NULL);
        } else {
            oq__task_on_comp(t, i, state, now_ms);
        }
    }
out:
    oq_submit_job_destroy(job);
    return ret;
}

/* Write what comes next until the task waits for a result or ends. */
static int advance(oq__producer_store_t *s, oq__task_t *t, int64_t now_ms, int64_t ttl,
                   int64_t max_bytes, oq_error_t *err)
{
    for (size_t guard = 0; guard < 4 * t->n + 4; guard++) {
        size_t i = 0;
        oq__task_act_t a = oq__task_next(t, &i);
        if (a == OQ__TASK_WAIT) return 0;
        int ret = start(s, t, i, a == OQ__TASK_START_COMP, now_ms, ttl, max_bytes, err);
        if (ret) return ret;
    }
    return 0;
}

/* --- the hooks ------------------------------------------------------------------------------- */

int oq__task_on_result(oq__producer_store_t *s, const char *call_id, const char *status,
                       int64_t now_ms, int64_t ttl, oq_error_t *err)
{
    if (!oq_call_state_terminal(status)) return 0; /* running: nothing to checkpoint */
    char task_id[OQ_TASK_ID_LEN + 1];
    int idx = 0, is_comp = 0, found = 0;
    int ret = oq__task_store_of_call(s, call_id, task_id, &idx, &is_comp, &found, err);
    if (ret || !found) return ret;
    oq__task_t t;
    if ((ret = load(s, task_id, NULL, NULL, &t, err))) return ret;
    if (is_comp)
        oq__task_on_comp(&t, (size_t)idx, status, now_ms);
    else
        oq__task_on_step(&t, (size_t)idx, status, NULL);
    ret = advance(s, &t, now_ms, ttl, OQ_DEFAULT_MAX_MESSAGE_BYTES, err);
    if (!ret) ret = save(s, &t, now_ms, err);
    OQ_CRASH_POINT("producer.task_after_checkpoint");
    oq__task_clear(&t);
    return ret;
}

/* A new attempt of the failed compensation call of step \p i. */
static int retry_comp(oq__producer_store_t *s, oq__task_t *t, size_t i, int64_t now_ms, int64_t ttl,
                      oq_error_t *err)
{
    oq__task_step_t *st = &t->steps[i];
    st->row.comp_next_at = 0;
    st->dirty = 1;
    if (!is(st->row.status, "compensating") || !is(st->row.comp_state, "failed")) return 0;
    oq_call_t c;
    memset(&c, 0, sizeof c);
    int ret = oq__producer_store_get(s, st->row.comp_call_id, &c, err);
    if (ret) return ret;
    char message_id[OQ_UUID_LEN + 1];
    oq_id_uuid(message_id);
    int64_t attempt = c.attempt + 1;
    oq__call_message_t m = {message_id, c.call_id, c.tenant,       c.idem_key, c.fingerprint,
                            c.tool,     c.args,    strlen(c.args), attempt,    now_ms};
    char *payload = NULL;
    size_t len = 0;
    if ((ret = oq__call_message_encode(&m, &payload, &len, err))) goto out;
    oq__producer_attempt_t a = {c.call_id, attempt, now_ms, now_ms + ttl, message_id, payload, len};
    if ((ret = oq__producer_store_reset_call(s, &a, err))) goto out;
    char detail[160];
    snprintf(detail, sizeof detail, "{\"attempt\":%lld,\"task_id\":\"%s\",\"step\":\"%s\"}",
             (long long)attempt, t->row.task_id, st->row.name);
    if ((ret = oq__producer_store_audit_add(s, now_ms, c.call_id, "task_compensation_retry", detail,
                                            err)))
        goto out;
    st->row.comp_attempts++;
    snprintf(st->row.comp_state, sizeof st->row.comp_state, "pending");
    OQ_LOGC_INFO("producer", c.call_id, "task %s: compensation of step %s tried again attempt=%lld",
                 t->row.task_id, st->row.name, (long long)attempt);
out:
    free(payload);
    oq_call_clear(&c);
    return ret;
}

int oq__task_retry_due(oq__producer_store_t *s, int64_t now_ms, int64_t ttl, int *n,
                       oq_error_t *err)
{
    enum { CAP = 32 };
    char ids[CAP][OQ_TASK_ID_LEN + 1];
    int idx[CAP], got = 0;
    *n = 0;
    if (ttl <= 0) ttl = OQ_DEFAULT_KEY_TTL_MS;
    int ret = oq__task_store_due(s, now_ms, CAP, ids, idx, &got, err);
    for (int k = 0; k < got && !ret; k++) {
        oq__task_t t;
        if ((ret = load(s, ids[k], NULL, NULL, &t, err))) break;
        if (idx[k] >= 0 && (size_t)idx[k] < t.n) {
            ret = retry_comp(s, &t, (size_t)idx[k], now_ms, ttl, err);
            if (!ret) ret = save(s, &t, now_ms, err);
            if (!ret) (*n)++;
        }
        oq__task_clear(&t);
    }
    return ret;
}

/* --- an operator's decision ------------------------------------------------------------------ */

/* Step \p i, next and waiting for approval, was rejected: it and every later pending step are
 * skipped, and what ran is undone as after a failed step (an earlier irreversible step that
 * succeeded: needs_review; a compensated step: compensating; nothing to undo: failed). */
static void reject_step(oq__task_t *t, size_t i, const char *by, const char *note)
{
    char reason[512];
    set_step(t, i, "skipped");
    skip_after(t, i);
    const char *irrev = NULL;
    int undo = 0;
    what_ran_before(t, i, &irrev, &undo);
    if (irrev) {
        snprintf(reason, sizeof reason,
                 "step %s rejected by %s (%s) after the irreversible step %s succeeded: it cannot "
                 "be undone",
                 t->steps[i].row.name, by, note, irrev);
        set_task(t, "needs_review", reason);
    } else {
        snprintf(reason, sizeof reason, "step %s rejected by %s (%s)", t->steps[i].row.name, by,
                 note);
        set_task(t, undo ? "compensating" : "failed", reason);
    }
}

int oq__task_review(oq__producer_store_t *s, const char *task_id, int64_t fence, const char *as,
                    const char *by, const char *note, int64_t now_ms, int64_t ttl, json_t **out,
                    const char **code, oq_error_t *err)
{
    const char *dummy;
    if (!code) code = &dummy;
    *code = "bad_request";
    if (out) *out = NULL;
    if (!as || !by || !*by || !note || !*note)
        return oq_error_set(err, OQ_EINVAL, 0, "a decision (--as), --by and --note are required");
    if (ttl <= 0) ttl = OQ_DEFAULT_KEY_TTL_MS;
    int approval = is(as, "approve") || is(as, "reject");
    int resolve = is(as, "compensated") || is(as, "succeeded") || is(as, "retry-compensation");
    if (!approval && !resolve)
        return oq_error_set(err, OQ_EINVAL, 0,
                            "--as %.40s: a task takes approve, reject (awaiting_approval) or "
                            "compensated, succeeded, retry-compensation (needs_review)",
                            as);
    oq__task_t t;
    int ret = load(s, task_id, NULL, NULL, &t, err);
    if (ret) {
        if (ret == OQ_ENOTFOUND) *code = "not_found";
        return ret;
    }
    const char *want = approval ? "awaiting_approval" : "needs_review";
    if (!is(t.row.status, want)) {
        *code = approval ? "not_awaiting_approval" : "not_in_review";
        ret = oq_error_set(err, OQ_ESTATE, 0, "task %s is %s, not %s: --as %s does not apply",
                           task_id, t.row.status, want, as);
        goto out;
    }
    if (fence != t.row.review_fence) {
        *code = "review_moved";
        ret = oq_error_set(err, OQ_ECONFLICT, 0,
                           "task %s: the review moved (fence %lld, decided on %lld): look again, "
                           "nothing changed",
                           task_id, (long long)t.row.review_fence, (long long)fence);
        goto out;
    }
    size_t i = t.n;
    if (approval) { /* the step that waits: the first one not succeeded, pending, approval */
        for (i = 0; i < t.n && is(t.steps[i].row.status, "succeeded"); i++)
            ;
        if (i == t.n || !is(t.steps[i].row.status, "pending") || !t.steps[i].approval) {
            *code = "not_awaiting_approval";
            ret = oq_error_set(err, OQ_ESTATE, 0, "task %s: no step waits for approval", task_id);
            goto out;
        }
    }
    char reason[512];
    if (is(as, "approve")) {
        free(t.row.reason);
        t.row.reason = NULL;
        set_task(&t, "running", NULL);
        if (!(ret = start(s, &t, i, 0, now_ms, ttl, OQ_DEFAULT_MAX_MESSAGE_BYTES, err)))
            ret = advance(s, &t, now_ms, ttl, OQ_DEFAULT_MAX_MESSAGE_BYTES, err);
    } else if (is(as, "reject")) {
        reject_step(&t, i, by, note);
        ret = advance(s, &t, now_ms, ttl, OQ_DEFAULT_MAX_MESSAGE_BYTES, err);
    } else if (is(as, "retry-compensation")) {
        /* the compensation that spent its budget: a fresh budget, a new attempt now */
        for (i = t.n; i-- > 0;)
            if (is(t.steps[i].row.status, "needs_review") && t.steps[i].row.comp_call_id[0] &&
                is(t.steps[i].row.comp_state, "failed"))
                break;
        if (i == (size_t)-1) {
            *code = "not_retryable";
            ret = oq_error_set(err, OQ_ESTATE, 0,
                               "task %s: no compensation failed for good (retry-compensation "
                               "retries one whose call failed; a compensation whose call needs "
                               "review is resolved with onceq review on that call)",
                               task_id);
            goto out;
        }
        free(t.row.reason);
        t.row.reason = NULL;
        snprintf(reason, sizeof reason, "compensation of step %s retried by %s (%s)",
                 t.steps[i].row.name, by, note);
        set_task(&t, "compensating", reason);
        set_step(&t, i, "compensating");
        t.steps[i].row.comp_attempts = 0;
        ret = retry_comp(s, &t, i, now_ms, ttl, err);
    } else { /* compensated | succeeded: the operator settled it outside onceq */
        snprintf(reason, sizeof reason, "resolved %s by %s (%s)", as, by, note);
        set_task(&t, as, reason);
    }
    if (ret) goto out;
    char *db = NULL;
    json_t *d = json_pack("{s:s,s:s,s:s,s:I,s:s?}", "as", as, "by", by, "note", note, "fence",
                          (json_int_t)fence, "step", i < t.n ? t.steps[i].row.name : NULL);
    db = d ? json_dumps(d, JSON_COMPACT) : NULL;
    json_decref(d);
    if (!db) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    ret = oq__producer_store_audit_add(s, now_ms, task_id, "task_review", db, err);
    free(db);
    if (!ret) ret = save(s, &t, now_ms, err);
    if (!ret) OQ_LOG_INFO("producer", "task %s: %s by %s: %s", task_id, as, by, note);
    if (!ret && out && !(*out = oq__task_render(&t)))
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
out:
    oq__task_clear(&t);
    return ret;
}

int oq_store_task_review(sqlite3 *db, const char *task_id, int64_t fence, const char *as,
                         const char *by, const char *note, json_t **out, const char **code,
                         oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    int ret = oq_db_begin_immediate(db, 30000, err);
    if (ret) return ret;
    ret = oq__task_review(&s, task_id, fence, as, by, note, oq_now_ms(), 0, out, code, err);
    if (!ret) ret = oq_db_commit(db, err); /* (the writer gate goes back with it) */
    if (ret) {
        oq_db_rollback(db);
        if (out) {
            json_decref(*out);
            *out = NULL;
        }
    }
    return ret;
}

int oq_producer_db_task_review(const oq_dbh_t *h, const char *task_id, int64_t fence,
                               const char *as, const char *by, const char *note, json_t **out,
                               const char **code, oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    if (out) *out = NULL;
    int ret = oq__producer_store_begin(&s, 30000, err);
    if (ret) return ret;
    ret = oq__task_review(&s, task_id, fence, as, by, note, oq_now_ms(), 0, out, code, err);
    if (!ret) ret = oq__producer_store_commit(&s, err);
    if (ret) {
        oq__producer_store_rollback(&s);
        if (out) {
            json_decref(*out);
            *out = NULL;
        }
    }
    return ret;
}

/* The same decision through the producer's writer (POST /v1/tasks/{id}/resolve): a job that
 * carries its inputs and, after the commit, the task or the refusal's code. A refusal
 * (bad_request .. not_retryable) is decided before anything is written; any other error is a
 * database error, and the writer rolls its batch back. */
struct oq_task_review_job {
    oq__work_t work; /**< first member: a job is a work item (OQ__WORK_TASK_REVIEW) */
    char task_id[OQ_TASK_ID_LEN + 1];
    int64_t fence;
    char *as, *by, *note;
    json_t *task;     /**< the task as committed */
    const char *code; /**< the refusal's stable code */
    oq_task_review_done_cb cb;
};

int oq_task_review_job_new(const char *task_id, int64_t fence, const char *as, const char *by,
                           const char *note, oq_task_review_job_t **out, oq_error_t *err)
{
    *out = NULL;
    if (!task_id || strlen(task_id) != OQ_TASK_ID_LEN || strncmp(task_id, "t_", 2) != 0)
        return oq_error_set(err, OQ_ENOTFOUND, 0, "no such task");
    if (!as || !by || !*by || !note || !*note || fence < 0)
        return oq_error_set(err, OQ_EINVAL, 0, "as, fence (>= 0), by and note are required");
    oq_task_review_job_t *j = calloc(1, sizeof *j);
    if (!j || !(j->as = strdup(as)) || !(j->by = strdup(by)) || !(j->note = strdup(note))) {
        oq_task_review_job_destroy(j);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    memcpy(j->task_id, task_id, sizeof j->task_id);
    j->fence = fence;
    *out = j;
    return 0;
}

void oq_task_review_job_destroy(oq_task_review_job_t *job)
{
    if (!job) return;
    free(job->as);
    free(job->by);
    free(job->note);
    json_decref(job->task);
    free(job);
}

static void review_job_done(oq__work_t *w, void *opaque)
{
    oq_task_review_job_t *job = (oq_task_review_job_t *)w;
    job->cb(job, opaque);
}

oq__work_t *oq__task_review_job_prepare(oq_task_review_job_t *job, oq_task_review_done_cb cb,
                                        void *opaque)
{
    job->work.kind = OQ__WORK_TASK_REVIEW;
    job->cb = cb;
    if (cb) {
        job->work.done = review_job_done;
        job->work.opaque = opaque;
    }
    return &job->work;
}

int oq__task_review_job_run(oq__producer_store_t *s, oq_task_review_job_t *job, int64_t now_ms,
                            int64_t ttl, oq_error_t *err)
{
    json_decref(job->task); /* a batch run again after a failure starts afresh */
    job->task = NULL;
    job->code = NULL;
    return oq__task_review(s, job->task_id, job->fence, job->as, job->by, job->note, now_ms, ttl,
                           &job->task, &job->code, err);
}

int oq_task_review_job_result(oq_task_review_job_t *job, const json_t **task, const char **code,
                              oq_error_t *err)
{
    if (task) *task = job->work.rc ? NULL : job->task;
    int refused = job->work.rc == OQ_EINVAL || job->work.rc == OQ_ENOTFOUND ||
                  job->work.rc == OQ_ESTATE || job->work.rc == OQ_ECONFLICT;
    if (code) *code = refused ? job->code : NULL;
    if (job->work.rc && err) *err = job->work.err;
    return job->work.rc;
}

/* --- submit ---------------------------------------------------------------------------------- */

int oq_task_job_new(const char *tenant, const char *idem_key, const json_t *body,
                    oq_task_job_t **out, const char **code, oq_error_t *err)
{
    const char *dummy;
    if (!code) code = &dummy;
    *code = "bad_request";
    *out = NULL;
    if (!idem_key || !oq_envelope_valid_key(idem_key)) {
        *code = "invalid_idempotency_key";
        return oq_error_set(err, OQ_EINVAL, 0, "Idempotency-Key must be 1-255 printable ASCII");
    }
    if (!json_is_object(body)) return oq_error_set(err, OQ_EINVAL, 0, "body must be an object");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)body, k, v)
    {
        if (strcmp(k, "steps") && strcmp(k, "tenant"))
            return oq_error_set(err, OQ_EINVAL, 0, "unknown field %.64s", k);
    }
    const json_t *bt = json_object_get(body, "tenant");
    if (bt && (!json_is_string(bt) || !oq_envelope_valid_name(json_string_value(bt))))
        return oq_error_set(err, OQ_EINVAL, 0, "field tenant: 1-128 printable ASCII bytes");
    if (tenant && bt && strcmp(tenant, json_string_value(bt)) != 0) {
        *code = "tenant_mismatch";
        return oq_error_set(err, OQ_EINVAL, 0, "field tenant differs from the token's tenant");
    }
    if (!tenant) tenant = bt ? json_string_value(bt) : OQ_DEFAULT_TENANT;
    const json_t *steps = json_object_get(body, "steps");
    int ret = oq__task_validate(steps, strlen(idem_key), code, err);
    if (ret) return ret;
    oq_task_job_t *j = calloc(1, sizeof *j);
    json_t *spec = json_pack("{s:O}", "steps", steps);
    size_t len = 0;
    if (!j || !spec || !(j->tenant = strdup(tenant)) || !(j->idem_key = strdup(idem_key))) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto fail;
    }
    if ((ret = oq_jcs_canonicalize(spec, &j->spec, &len, err))) {
        *code = "bad_request";
        goto fail;
    }
    unsigned char d[32];
    if ((ret = oq_sha256(j->spec, len, d))) goto fail;
    oq_hex(d, sizeof d, j->fingerprint);
    oq_id_call(j->task_id);
    j->task_id[0] = 't';
    json_decref(spec);
    *out = j;
    return 0;
fail:
    json_decref(spec);
    oq_task_job_destroy(j);
    return ret;
}

void oq_task_job_destroy(oq_task_job_t *job)
{
    if (!job) return;
    free(job->tenant);
    free(job->idem_key);
    free(job->spec);
    json_decref(job->task);
    free(job);
}

static void job_done(oq__work_t *w, void *opaque)
{
    oq_task_job_t *job = (oq_task_job_t *)w;
    job->cb(job, opaque);
}

oq__work_t *oq__task_job_prepare(oq_task_job_t *job, oq_task_done_cb cb, void *opaque)
{
    job->work.kind = OQ__WORK_TASK;
    job->cb = cb;
    if (cb) {
        job->work.done = job_done;
        job->work.opaque = opaque;
    }
    return &job->work;
}

int oq_task_job_result(oq_task_job_t *job, oq_task_outcome_t *outcome, const json_t **task,
                       oq_error_t *err)
{
    if (outcome) *outcome = job->outcome;
    if (task) *task = job->task;
    if (job->work.rc && err) *err = job->work.err;
    return job->work.rc;
}

static int render_into(oq__producer_store_t *s, const char *task_id, json_t **out, oq_error_t *err)
{
    oq__task_t t;
    int ret = load(s, task_id, NULL, NULL, &t, err);
    if (ret) return ret;
    *out = oq__task_render(&t);
    oq__task_clear(&t);
    return *out ? 0 : oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
}

int oq__task_decide_submit(oq__producer_store_t *s, oq_task_job_t *job, int64_t now_ms, int64_t ttl,
                           int64_t max_bytes, oq_error_t *err)
{
    json_decref(job->task);
    job->task = NULL;
    job->outcome = 0;
    oq__task_row_t row = {0};
    snprintf(row.task_id, sizeof row.task_id, "%s", job->task_id);
    row.tenant = job->tenant;
    row.idem_key = job->idem_key;
    snprintf(row.fingerprint, sizeof row.fingerprint, "%s", job->fingerprint);
    row.spec = job->spec;
    snprintf(row.status, sizeof row.status, "running");
    row.created_at = row.updated_at = now_ms;
    int exists = 0;
    int ret = oq__task_store_insert(s, &row, &exists, err);
    if (ret) return ret;
    if (exists) {
        oq__task_row_t old;
        if ((ret = oq__task_store_get(s, NULL, job->tenant, job->idem_key, &old, err))) return ret;
        int same = strcmp(old.fingerprint, job->fingerprint) == 0;
        char id[OQ_TASK_ID_LEN + 1];
        snprintf(id, sizeof id, "%s", old.task_id);
        oq__task_row_clear(&old);
        if (!same) {
            job->outcome = OQ_TASK_CONFLICT;
            return oq_error_set(err, OQ_ECONFLICT, 0,
                                "idempotency key reused with a different task (task %s)", id);
        }
        job->outcome = OQ_TASK_REPLAY;
        return render_into(s, id, &job->task, err);
    }
    oq__task_t t;
    memset(&t, 0, sizeof t);
    json_t *spec = json_loads(job->spec, 0, NULL);
    if (!spec) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if ((ret = oq__task_from_spec(&t, spec, err))) goto out;
    t.row = row;
    if (!(t.row.tenant = strdup(job->tenant)) || !(t.row.idem_key = strdup(job->idem_key)) ||
        !(t.row.spec = strdup(job->spec))) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < t.n && !ret; i++)
        t.steps[i].dirty = 1;
    if (!(ret = advance(s, &t, now_ms, ttl, max_bytes, err))) ret = save(s, &t, now_ms, err);
    if (!ret && !(job->task = oq__task_render(&t)))
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (!ret) job->outcome = OQ_TASK_NEW;
out:
    oq__task_clear(&t);
    return ret;
}

int oq_producer_task_submit_in_tx(sqlite3 *db, const char *tenant, const char *idem_key,
                                  const json_t *body, int64_t key_ttl_ms, json_t **task,
                                  int *replayed, const char **code, oq_error_t *err)
{
    const char *dummy;
    if (!code) code = &dummy;
    *code = NULL;
    if (task) *task = NULL;
    if (replayed) *replayed = 0;
    oq__producer_store_t s = {db, NULL, NULL};
    if (!db || !oq__producer_store_in_tx(&s)) {
        *code = "bad_request";
        return oq_error_set(err, OQ_ESTATE, 0,
                            "oq_producer_task_submit_in_tx needs an open write transaction "
                            "(BEGIN IMMEDIATE) on the caller's connection");
    }
    oq_task_job_t *job = NULL;
    int ret = oq_task_job_new(tenant, idem_key, body, &job, code, err);
    if (ret) return ret;
    *code = NULL;
    ret = oq__task_decide_submit(&s, job, oq_now_ms(),
                                 key_ttl_ms > 0 ? key_ttl_ms : OQ_DEFAULT_KEY_TTL_MS,
                                 OQ_DEFAULT_MAX_MESSAGE_BYTES, err);
    if (ret == OQ_ECONFLICT) *code = "idempotency_conflict";
    if (!ret && replayed) *replayed = job->outcome == OQ_TASK_REPLAY;
    if (!ret && task) {
        *task = job->task;
        job->task = NULL;
    }
    oq_task_job_destroy(job);
    return ret;
}

/* --- reads ----------------------------------------------------------------------------------- */

int oq__task_get_json(oq__producer_store_t *s, const char *task_id, const char *tenant,
                      const char *key, json_t **out, oq_error_t *err)
{
    oq__task_t t;
    int ret = load(s, task_id, tenant, key, &t, err);
    if (ret) return ret;
    *out = oq__task_render(&t);
    oq__task_clear(&t);
    return *out ? 0 : oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
}

int oq_store_task_get(sqlite3 *db, const char *task_id, const char *tenant, const char *idem_key,
                      json_t **out, oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    return oq__task_get_json(&s, task_id, tenant, idem_key, out, err);
}

static int tasks_in_store(oq__producer_store_t *s, const oq_task_query_t *q, json_t **out,
                          oq_error_t *err);

int oq_store_task_list(sqlite3 *db, const char *status, int limit, json_t **out, oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    oq_task_query_t q = {status, NULL, NULL, NULL, 0, limit};
    json_t *page = NULL;
    int ret = tasks_in_store(&s, &q, &page, err);
    if (ret) return ret;
    *out = json_incref(json_object_get(page, "tasks"));
    json_decref(page);
    return 0;
}

/* 1 when \p t passes the query's filters (a task found by id or key). */
static int task_matches(const json_t *t, const oq_task_query_t *q)
{
    const char *tenant = json_string_value(json_object_get(t, "tenant"));
    const char *status = json_string_value(json_object_get(t, "status"));
    return (!q->tenant || (tenant && strcmp(q->tenant, tenant) == 0)) &&
           (!q->status || (status && strcmp(q->status, status) == 0));
}

int oq_producer_db_tasks(const oq_dbh_t *h, const oq_task_query_t *q, json_t **out, oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    return tasks_in_store(&s, q, out, err);
}

static int tasks_in_store(oq__producer_store_t *s, const oq_task_query_t *q, json_t **out,
                          oq_error_t *err)
{
    json_t *a = json_array(), *t = NULL;
    char **ids = NULL;
    size_t n = 0;
    int64_t next = 0;
    int ret = 0;
    if (!a) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (q->task_id || (q->idem_key && q->tenant)) { /* one task: its primary or unique key */
        ret = oq__task_get_json(s, q->task_id, q->tenant, q->task_id ? NULL : q->idem_key, &t, err);
        if (ret == OQ_ENOTFOUND) ret = 0;
        if (!ret && t && task_matches(t, q) &&
            (!q->idem_key ||
             strcmp(q->idem_key, json_string_value(json_object_get(t, "idem_key"))) == 0))
            ret = json_array_append(a, t) ? oq_error_set(err, OQ_ENOMEM, 0, "out of memory") : 0;
        json_decref(t);
    } else {
        oq__task_list_q_t lq = {q->status, q->tenant, q->idem_key, q->before, q->limit};
        ret = oq__task_store_list(s, &lq, &ids, &n, &next, err);
        for (size_t i = 0; i < n; i++) {
            if (!ret && !(ret = oq__task_get_json(s, ids[i], NULL, NULL, &t, err)))
                json_array_append_new(a, t);
            free(ids[i]);
        }
        free(ids);
    }
    if (ret) {
        json_decref(a);
        return ret;
    }
    *out = json_pack("{s:o,s:o}", "tasks", a, "next", next ? json_integer(next) : json_null());
    return *out ? 0 : oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
}

int oq_producer_db_task_get(const oq_dbh_t *h, const char *task_id, const char *tenant,
                            const char *idem_key, json_t **out, oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    return oq__task_get_json(&s, task_id, tenant, idem_key, out, err);
}

int oq_producer_db_task_counts(const oq_dbh_t *h, const char *tenant, json_t **out, oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    int64_t by[OQ_TASK_NSTATUS], ok = 0, review = 0;
    int ret = oq__task_store_counts(&s, tenant, by, &ok, &review, err);
    if (ret) return ret;
    json_t *o = json_object();
    for (int i = 0; o && i < OQ_TASK_NSTATUS; i++)
        if (json_object_set_new(o, oq__task_statuses[i], json_integer(by[i]))) {
            json_decref(o);
            o = NULL;
        }
    if (o && json_object_set_new(o, "compensations",
                                 json_pack("{s:I,s:I}", "compensated", (json_int_t)ok,
                                           "needs_review", (json_int_t)review))) {
        json_decref(o);
        o = NULL;
    }
    if (!o) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    *out = o;
    return 0;
}
