/* SPDX-License-Identifier: Apache-2.0 */
/*
 * catalog.c: the tool catalogue, read from the tools file (see oq_catalog.h).
 *
 * Design. The tools file has one parser, in layers: this file parses the JSON (strictly:
 * duplicate keys, bad UTF-8 are errors), the top level ({"version": 1, "tools": [...]}), and
 * of every tool what any front door needs: its name (unique, not a compiled tool's), its
 * description, its input_schema (compiled by common/jschema.c, so a schema onceq cannot
 * enforce fails the start, not a call), its MCP annotations, whether it is idempotent and has
 * a lookup, and the field names (an unknown field is an error, for the producer too). The
 * consumer's HTTP tools parser (consumer/http_tools.c) then reads the request fields of the
 * same JSON objects, which this catalogue keeps. The compiled tools' entries are a table
 * here, because the producer must know them without linking the consumer; the unit test
 * checks that each one names a tool the consumer's registry has.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_buf.h"
#include "oq_catalog.h"
#include "oq_json.h"
#include "oq_log.h"
#include "oq_mcpc.h"

#define MAX_FILE (16 * 1024 * 1024)

typedef struct cat_tool {
    const char *name;        /* borrowed from the JSON */
    const char *description; /* borrowed, or NULL */
    oq_jschema_t *schema;    /* NULL: any object */
    const json_t *annotations;
    int honours_keys, has_lookup, compiled;
    const json_t *src; /* the declaring object (file tools) */
} cat_tool_t;

struct oq_catalog {
    json_t *root;     /* the file */
    json_t *builtins; /* the compiled tools' entries, parsed from the table below */
    cat_tool_t *tools;
    size_t n, nfile;
};

/* The compiled tools (consumer/tools.c implements them; keep the two in step). */
static const char builtin_json[] =
    "["
    "{\"name\":\"charge\",\"description\":\"Charge an amount (minor units) once per key.\","
    "\"input_schema\":{\"type\":\"object\",\"properties\":{"
    "\"amount\":{\"type\":\"integer\",\"minimum\":1},"
    "\"currency\":{\"type\":\"string\"},"
    "\"delay_ms\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":10000},"
    "\"fail_times\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":100}},"
    "\"required\":[\"amount\"]},"
    "\"annotations\":{\"title\":\"Charge\",\"readOnlyHint\":false,\"destructiveHint\":false,"
    "\"idempotentHint\":true,\"openWorldHint\":true}},"
    "{\"name\":\"send_email\",\"description\":\"Send one email once per key.\","
    "\"input_schema\":{\"type\":\"object\",\"properties\":{"
    "\"to\":{\"type\":\"string\",\"pattern\":\"@\",\"maxLength\":254},"
    "\"subject\":{\"type\":\"string\",\"maxLength\":998}},"
    "\"required\":[\"to\",\"subject\"]},"
    "\"annotations\":{\"title\":\"Send email\",\"readOnlyHint\":false,"
    "\"destructiveHint\":false,\"idempotentHint\":true,\"openWorldHint\":true}},"
    "{\"name\":\"sleep\",\"description\":\"Wait ms milliseconds; no side effect (tests).\","
    "\"input_schema\":{\"type\":\"object\",\"properties\":{"
    "\"ms\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":10000}},\"required\":[\"ms\"]},"
    "\"annotations\":{\"title\":\"Sleep\",\"readOnlyHint\":true,\"idempotentHint\":true,"
    "\"openWorldHint\":false}},"
    "{\"name\":\"fail\",\"description\":\"Always fail, retryable or not (tests).\","
    "\"input_schema\":{\"type\":\"object\",\"properties\":{"
    "\"retryable\":{\"type\":\"boolean\"}}},"
    "\"annotations\":{\"title\":\"Fail\",\"readOnlyHint\":true,\"idempotentHint\":true,"
    "\"openWorldHint\":false}}"
    "]";

/* Every field a tool may have: the catalogue's, then the HTTP kind's (consumer/http_tools.c). */
static const char *const tool_fields[] = {"name",
                                          "description",
                                          "input_schema",
                                          "annotations",
                                          "method",
                                          "url",
                                          "body",
                                          "headers",
                                          "idempotency_header",
                                          "idempotent",
                                          "connect_timeout_ms",
                                          "timeout_ms",
                                          "object_id",
                                          "success",
                                          "final",
                                          "retryable",
                                          "lookup",
                                          "ca_file",
                                          "client_cert",
                                          "client_key",
                                          "kind",
                                          "tool",
                                          NULL};

typedef struct pctx {
    const char *origin;
    char where[128];
    oq_error_t *err;
} pctx_t;

static int perr(pctx_t *p, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int perr(pctx_t *p, const char *field, const char *fmt, ...)
{
    char msg[224];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (field)
        return oq_error_set(p->err, OQ_EINVAL, 0, "%s: %s: field %s: %s", p->origin, p->where,
                            field, msg);
    return oq_error_set(p->err, OQ_EINVAL, 0, "%s: %s: %s", p->origin, p->where, msg);
}

static int check_fields(pctx_t *p, const json_t *obj, const char *const *allowed)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v)
    {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(*a, k) == 0;
        if (!ok) {
            char list[400] = "";
            for (const char *const *a = allowed; *a; a++) {
                size_t n = strlen(list);
                snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", *a);
            }
            char f[80];
            snprintf(f, sizeof f, "%.64s", k);
            return perr(p, f, "unknown field (allowed: %.180s)", list);
        }
    }
    (void)v;
    return 0;
}

static int parse_annotations(pctx_t *p, const json_t *a)
{
    static const char *const fields[] = {"title",          "readOnlyHint",  "destructiveHint",
                                         "idempotentHint", "openWorldHint", NULL};
    if (!json_is_object(a)) return perr(p, "annotations", "expected an object");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)a, k, v)
    {
        int known = 0;
        for (const char *const *f = fields; *f && !known; f++)
            known = strcmp(*f, k) == 0;
        char f[96];
        snprintf(f, sizeof f, "annotations.%.64s", k);
        if (!known)
            return perr(p, f,
                        "unknown field (allowed: title, readOnlyHint, destructiveHint, "
                        "idempotentHint, openWorldHint)");
        if (strcmp(k, "title") == 0 ? !json_is_string(v) : !json_is_boolean(v))
            return perr(p, f,
                        strcmp(k, "title") == 0 ? "expected a string" : "expected true or false");
    }
    return 0;
}

/* The catalogue's part of one tool; \p builtin: an entry of the compiled table. */
static int parse_tool(pctx_t *p, const json_t *o, int builtin, cat_tool_t *t)
{
    int rc;
    const json_t *v;
    if (!json_is_object(o)) return perr(p, NULL, "expected an object");
    v = json_object_get(o, "name");
    if (!v) return perr(p, "name", "missing (a string is required)");
    if (!json_is_string(v) || json_string_length(v) == 0)
        return perr(p, "name", "expected a non-empty string");
    t->name = json_string_value(v);
    for (const char *s = t->name; *s; s++)
        if (!(isalnum((unsigned char)*s) || strchr("_.-", *s)) || s - t->name >= 64)
            return perr(p, "name", "use 1-64 letters, digits, '_', '.', '-'");
    char idx[sizeof p->where];
    snprintf(idx, sizeof idx, "%s", p->where);
    snprintf(p->where, sizeof p->where, "tool \"%s\" (%.40s)", t->name, idx);
    if ((rc = check_fields(p, o, tool_fields))) return rc;
    if ((v = json_object_get(o, "description"))) {
        if (!json_is_string(v)) return perr(p, "description", "expected a string");
        t->description = json_string_value(v);
    }
    if ((v = json_object_get(o, "input_schema"))) {
        oq_error_t serr = {0};
        if ((rc = oq_jschema_compile(v, &t->schema, &serr)))
            return rc == OQ_ENOMEM ? oq_error_set(p->err, rc, 0, "out of memory")
                                   : perr(p, "input_schema", "%s", serr.msg);
    }
    if ((v = json_object_get(o, "annotations")) && (rc = parse_annotations(p, v))) return rc;
    t->annotations = v;
    if (builtin) {
        t->compiled = 1;
        t->honours_keys = 1;
        return 0;
    }
    if ((v = json_object_get(o, "kind")) &&
        !(json_is_string(v) &&
          (strcmp(json_string_value(v), "http") == 0 || strcmp(json_string_value(v), "mcp") == 0)))
        return perr(p, "kind", "expected \"http\" (the default) or \"mcp\"");
    if ((v = json_object_get(o, "idempotent"))) {
        if (!json_is_boolean(v)) return perr(p, "idempotent", "expected true or false");
        t->honours_keys = json_is_true(v);
    }
    v = json_object_get(o, "lookup");
    t->has_lookup = v && !json_is_null(v);
    t->src = o;
    return 0;
}

/* The tools of an entry {"import": {"mcp": URL, "prefix": P}, ...}: the upstream's tools/list,
 * each as a tool of kind "mcp" named P + its name, with its description, inputSchema (dropped,
 * with a warning, when onceq cannot enforce it) and annotations, and the entry's other fields
 * (idempotent, timeouts). Appended to \p out. */
static int import_mcp(pctx_t *p, const json_t *e, json_t *out)
{
    static const char *const entry_fields[] = {"import", "idempotent", "timeout_ms",
                                               "connect_timeout_ms", NULL};
    static const char *const import_fields[] = {"mcp", "prefix", NULL};
    static const char *const ann_keys[] = {"title",          "readOnlyHint",  "destructiveHint",
                                           "idempotentHint", "openWorldHint", NULL};
    int rc;
    const json_t *im = json_object_get(e, "import");
    if ((rc = check_fields(p, e, entry_fields))) return rc;
    if (!json_is_object(im)) return perr(p, "import", "expected {\"mcp\": URL}");
    if ((rc = check_fields(p, im, import_fields))) return rc;
    const char *url = json_string_value(json_object_get(im, "mcp"));
    const json_t *pv = json_object_get(im, "prefix");
    const char *prefix = pv ? json_string_value(pv) : "";
    if (!url || (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0))
        return perr(p, "import.mcp", "expected the http(s) URL of an MCP server");
    if (!prefix) return perr(p, "import.prefix", "expected a string");
    json_t *list = NULL;
    oq_error_t lerr = {0};
    if ((rc = oq__mcpc_list_tools(url, 10000, &list, &lerr)))
        return oq_error_set(p->err, rc, 0,
                            "%s: %s: import: cannot list the tools of %.200s (%.200s): the "
                            "tools file is not loaded while its upstream is down",
                            p->origin, p->where, url, lerr.msg);
    size_t i;
    json_t *u;
    json_array_foreach(list, i, u)
    {
        const char *name = json_string_value(json_object_get(u, "name"));
        if (!name) continue;
        char full[160];
        snprintf(full, sizeof full, "%s%s", prefix, name);
        json_t *t =
            json_pack("{s:s,s:s,s:s,s:s}", "name", full, "kind", "mcp", "url", url, "tool", name);
        if (!t) goto nomem;
        const json_t *d = json_object_get(u, "description");
        if (json_is_string(d)) json_object_set(t, "description", (json_t *)d);
        json_t *schema = json_object_get(u, "inputSchema");
        oq_jschema_t *compiled = NULL;
        oq_error_t serr = {0};
        if (json_is_object(schema) && oq_jschema_compile(schema, &compiled, &serr) == 0)
            json_object_set(t, "input_schema", schema);
        else if (schema)
            OQ_LOG_WARN("tools", "%s: import %s: tool %s: inputSchema not enforced (%s)", p->origin,
                        url, name, serr.msg);
        oq_jschema_destroy(compiled);
        const json_t *ann = json_object_get(u, "annotations");
        if (json_is_object(ann)) {
            json_t *a = json_object();
            for (const char *const *k = ann_keys; a && *k; k++) {
                json_t *v = json_object_get(ann, *k);
                if (v && (strcmp(*k, "title") == 0 ? json_is_string(v) : json_is_boolean(v)))
                    json_object_set(a, *k, v);
            }
            if (a) json_object_set_new(t, "annotations", a);
        }
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)e, k, v)
        {
            if (strcmp(k, "import") != 0) json_object_set(t, k, v);
        }
        if (json_array_append_new(out, t) != 0) goto nomem;
    }
    OQ_LOG_INFO("tools", "%s: imported %zu tools from the MCP server %s", p->origin,
                json_array_size(list), url);
    json_decref(list);
    return 0;
nomem:
    json_decref(list);
    return oq_error_set(p->err, OQ_ENOMEM, 0, "out of memory");
}

/* The tools array with its import entries replaced by the tools they import (\p root's
 * "tools" is replaced when there is any). */
static int expand_imports(pctx_t *p, json_t *root)
{
    json_t *tools = json_object_get(root, "tools");
    size_t i;
    json_t *e;
    int any = 0;
    json_array_foreach(tools, i, e) any |= json_is_object(e) && json_object_get(e, "import");
    if (!any) return 0;
    json_t *out = json_array();
    if (!out) return oq_error_set(p->err, OQ_ENOMEM, 0, "out of memory");
    json_array_foreach(tools, i, e)
    {
        int rc;
        snprintf(p->where, sizeof p->where, "tools[%zu]", i);
        if (json_is_object(e) && json_object_get(e, "import"))
            rc = import_mcp(p, e, out);
        else
            rc =
                json_array_append(out, e) ? oq_error_set(p->err, OQ_ENOMEM, 0, "out of memory") : 0;
        if (rc) {
            json_decref(out);
            return rc;
        }
    }
    snprintf(p->where, sizeof p->where, "top level");
    return json_object_set_new(root, "tools", out) ? oq_error_set(p->err, OQ_ENOMEM, 0, "oom") : 0;
}

void oq_catalog_destroy(oq_catalog_t *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->n; i++)
        oq_jschema_destroy(c->tools[i].schema);
    free(c->tools);
    json_decref(c->root);
    json_decref(c->builtins);
    free(c);
}

int oq_catalog_parse(const char *text, size_t len, const char *origin, oq_catalog_t **out,
                     oq_error_t *err)
{
    pctx_t p = {origin ? origin : "tools", "top level", err};
    oq_error_t jerr = {0};
    int rc;
    oq_catalog_t *c = calloc(1, sizeof *c);
    if (!c) return oq_error_set(err, OQ_ENOMEM, 0, "%s: out of memory", p.origin);
    if (oq_json_parse(text, len, 64, &c->root, &jerr) != 0) {
        rc = oq_error_set(err, jerr.code == OQ_ENOMEM ? OQ_ENOMEM : OQ_EINVAL, 0, "%s: %s",
                          p.origin, jerr.msg);
        goto out;
    }
    static const char *const top[] = {"version", "tools", NULL};
    if (!json_is_object(c->root)) {
        rc = perr(&p, NULL, "expected an object {\"version\":1,\"tools\":[...]}");
        goto out;
    }
    if ((rc = check_fields(&p, c->root, top))) goto out;
    const json_t *ver = json_object_get(c->root, "version");
    if (ver && !(json_is_integer(ver) && json_integer_value(ver) == 1)) {
        rc = perr(&p, "version", "only version 1 is known");
        goto out;
    }
    if (!json_is_array(json_object_get(c->root, "tools"))) {
        rc = perr(&p, "tools", "expected an array of tools");
        goto out;
    }
    if ((rc = expand_imports(&p, c->root))) goto out;
    const json_t *tools = json_object_get(c->root, "tools");
    json_error_t je;
    if (!(c->builtins = json_loads(builtin_json, 0, &je))) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "compiled tools: %s", je.text);
        goto out;
    }
    size_t nf = json_array_size(tools), nb = json_array_size(c->builtins);
    if (!(c->tools = calloc(nf + nb, sizeof *c->tools))) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "%s: out of memory", p.origin);
        goto out;
    }
    for (size_t i = 0; i < nb; i++) {
        snprintf(p.where, sizeof p.where, "compiled tool %zu", i);
        c->n = nf + i + 1;
        if ((rc = parse_tool(&p, json_array_get(c->builtins, i), 1, &c->tools[nf + i]))) goto out;
    }
    for (size_t i = 0; i < nf; i++) {
        snprintf(p.where, sizeof p.where, "tools[%zu]", i);
        c->nfile = i + 1;
        cat_tool_t *t = &c->tools[i];
        if ((rc = parse_tool(&p, json_array_get(tools, i), 0, t))) goto out;
        for (size_t j = 0; j < i; j++)
            if (strcmp(c->tools[j].name, t->name) == 0) {
                rc = perr(&p, "name", "declared twice (also tools[%zu])", j);
                goto out;
            }
        for (size_t j = nf; j < nf + nb; j++)
            if (strcmp(c->tools[j].name, t->name) == 0) {
                rc = oq_error_set(err, OQ_EINVAL, 0,
                                  "%s: tool \"%s\" is declared there and compiled into onceq: "
                                  "rename one of them",
                                  p.origin, t->name);
                goto out;
            }
    }
    c->n = nf + nb;
    *out = c;
    c = NULL;
    rc = 0;
out:
    oq_catalog_destroy(c);
    return rc;
}

int oq__catalog_read_file(const char *path, char **out, size_t *out_len, oq_error_t *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return oq_error_set(err, OQ_EIO, 0, "cannot read tools file %s", path);
    oq_buf_t b = {0};
    int rc = oq_buf_read(&b, f, MAX_FILE);
    if (rc == OQ_ETOOBIG)
        rc = oq_error_set(err, OQ_ETOOBIG, 0, "tools file %s is over 16 MiB", path);
    else if (rc == OQ_EIO)
        rc = oq_error_set(err, OQ_EIO, 0, "cannot read tools file %s", path);
    else if (rc || !(*out = oq_buf_take(&b, out_len)))
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    oq_buf_free(&b);
    fclose(f);
    return rc;
}

int oq_catalog_load(const char *path, oq_catalog_t **out, oq_error_t *err)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = oq__catalog_read_file(path, &buf, &len, err);
    if (rc == 0) rc = oq_catalog_parse(buf, len, path, out, err);
    free(buf);
    return rc;
}

static const cat_tool_t *find(const oq_catalog_t *c, const char *name)
{
    for (size_t i = 0; c && name && i < c->n; i++)
        if (strcmp(c->tools[i].name, name) == 0) return &c->tools[i];
    return NULL;
}

int oq_catalog_has(const oq_catalog_t *c, const char *tool)
{
    return find(c, tool) != NULL;
}

int oq_catalog_check(const oq_catalog_t *c, const char *tool, const json_t *args,
                     oq_jschema_violation_t *v)
{
    const cat_tool_t *t = find(c, tool);
    if (!t) return OQ_ENOTFOUND;
    if (!json_is_object(args)) {
        if (v) {
            memset(v, 0, sizeof *v);
            snprintf(v->keyword, sizeof v->keyword, "type");
            snprintf(v->reason, sizeof v->reason, "the arguments must be an object");
        }
        return OQ_EINVAL;
    }
    return t->schema ? oq_jschema_validate(t->schema, args, v) : 0;
}

json_t *oq_catalog_list(const oq_catalog_t *c)
{
    json_t *a = json_array();
    for (size_t i = 0; a && c && i < c->n; i++) {
        const cat_tool_t *t = &c->tools[i];
        json_t *schema = t->schema ? json_deep_copy(oq_jschema_source(t->schema))
                                   : json_pack("{s:s}", "type", "object");
        json_t *ann = t->annotations ? json_deep_copy(t->annotations) : json_object();
        json_t *o =
            json_pack("{s:s, s:s, s:o*, s:o*, s:b, s:b, s:s}", "name", t->name, "description",
                      t->description ? t->description : "", "input_schema", schema, "annotations",
                      ann, "honours_keys", t->honours_keys, "has_lookup", t->has_lookup, "kind",
                      t->compiled ? "compiled" : "http");
        if (!schema || !ann || !o || json_array_append_new(a, o) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

size_t oq_catalog_size(const oq_catalog_t *c)
{
    return c ? c->n : 0;
}

size_t oq__catalog_nfile(const oq_catalog_t *c)
{
    return c ? c->nfile : 0;
}

const json_t *oq__catalog_file_tool(const oq_catalog_t *c, size_t i)
{
    return c && i < c->nfile ? c->tools[i].src : NULL;
}
