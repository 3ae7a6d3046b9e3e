/* SPDX-License-Identifier: Apache-2.0 */
/*
 * jschema.c: a JSON Schema (draft 2020-12) validator for the subset oq_jschema.h documents.
 *
 * Why hand-written. The tool catalogue needs input_schema checked at submit, in C, on jansson
 * values, from several HTTP threads at once. Debian ships no C JSON Schema library (`apt-cache
 * search json schema` lists Go, Perl, Python and JavaScript validators, the language-neutral
 * JSON-Schema-Test-Suite data, nothing for C); the C libraries that exist elsewhere are tied to
 * another JSON tree (json-c), unpackaged, or cover old drafts. What tool schemas use is small
 * and well defined, so this file implements that subset exactly and refuses the rest at load:
 * a schema is never silently weaker than written, which matters more here than coverage.
 *
 * Design. A schema is compiled once into a tree of nodes (keyword values checked, patterns
 * compiled with regcomp, $ref resolved against the root's $defs), then validated without
 * allocation. Nodes borrow their JSON values (enum, const, bounds) from a deep copy the
 * compiled schema owns. Compilation recursion is bounded by a depth limit; a cycle of $ref
 * (or allOf/anyOf/oneOf/not) that does not descend into the instance is refused, so every
 * recursion of the validator consumes instance depth or schema nodes; on top of that the
 * validator counts recursion depth and steps and reports a "$limit" violation past either
 * bound (fuzz-friendly: no input makes it loop or blow the stack). The first violation is
 * reported: keywords are checked in one fixed order (type, enum, const, numbers, strings,
 * arrays, objects, then allOf, anyOf, oneOf, not, $ref), objects' required before properties.
 */
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_jschema.h"

#define MAX_COMPILE_DEPTH 64
#define MAX_INPLACE_CHAIN 256
#define MAX_VALIDATE_DEPTH 128
#define MAX_STEPS 10000000L
#define MAX_EQUAL_DEPTH 256

enum {
    T_NULL = 1,
    T_BOOL = 2,
    T_OBJ = 4,
    T_ARR = 8,
    T_NUM = 16,
    T_STR = 32,
    T_INT = 64,
};

static const struct {
    const char *name;
    unsigned bit;
} type_names[] = {{"null", T_NULL},  {"boolean", T_BOOL}, {"object", T_OBJ}, {"array", T_ARR},
                  {"number", T_NUM}, {"string", T_STR},   {"integer", T_INT}};

typedef struct node node_t;

typedef struct prop {
    const char *name; /* borrowed from the schema copy */
    node_t *s;
} prop_t;

struct node {
    int boolean; /* -1: an object schema; 0: false; 1: true */
    unsigned types;
    const json_t *enum_, *const_;
    const json_t *min, *max, *xmin, *xmax, *mult;
    int64_t min_len, max_len, min_items, max_items, min_props, max_props; /* -1: none */
    int unique;
    int has_re;
    regex_t re;
    prop_t *props;
    size_t nprops;
    const json_t *required;
    node_t *addl;
    node_t *items;
    node_t **prefix, **all, **any, **one;
    size_t nprefix, nall, nany, none;
    node_t *not_;
    const char *ref_text; /* "#/$defs/..." as written (borrowed) */
    node_t *ref;
    prop_t *defs;
    size_t ndefs;
    int mark; /* cycle check: 0 new, 1 on the stack, 2 done */
};

struct oq_jschema {
    json_t *src;
    node_t *root;
    node_t **nodes; /* every node, for freeing and for resolving refs */
    size_t nnodes, cap;
};

/* --- compile ---------------------------------------------------------------------------- */

typedef struct cctx {
    oq_jschema_t *s;
    oq_error_t *err;
    char ptr[512];
    size_t plen;
} cctx_t;

static void u8trim(char *s);

static int cerr(cctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cerr(cctx_t *c, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    u8trim(msg);
    const char *at = c->plen ? c->ptr : "the root";
    if (c->plen > 120) { /* keep the reason readable: the pointer's tail is the useful part */
        at = c->ptr + c->plen - 100;
        while (((unsigned char)*at & 0xC0) == 0x80) /* start on a character */
            at++;
    }
    int rc = oq_error_set(c->err, OQ_EINVAL, 0, "at %s%s: %s", c->plen > 120 ? "..." : "", at, msg);
    if (c->err) u8trim(c->err->msg); /* messages stay UTF-8, cut or not */
    return rc;
}

/* Length of the UTF-8 sequence that lead byte \p b starts (1 for anything else). */
static size_t u8seq(unsigned char b)
{
    return b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
}

/* The longest prefix of \p s, at most \p max bytes, that ends on a character boundary: what
 * is printed with "%.*s" stays UTF-8 (the HTTP API puts it in JSON). */
static int u8cut(const char *s, size_t max)
{
    size_t n = 0;
    while (s[n] && n + u8seq((unsigned char)s[n]) <= max)
        n += u8seq((unsigned char)s[n]);
    return (int)n;
}

/* Drop an incomplete UTF-8 sequence a truncation left at the end of \p s. */
static void u8trim(char *s)
{
    size_t n = strlen(s), i = n;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80)
        i--;
    if (i > 0 && (unsigned char)s[i - 1] >= 0xC0 && i - 1 + u8seq((unsigned char)s[i - 1]) > n)
        s[i - 1] = 0;
}

/* Append "/seg" (escaped as a JSON pointer) to buf[*len], within cap; returns the old length. */
static size_t ptr_push(char *buf, size_t cap, size_t *len, const char *seg)
{
    size_t old = *len, n = *len;
    if (n + 1 < cap) buf[n++] = '/';
    for (const char *p = seg; *p && n + 2 < cap; p++) {
        size_t q = u8seq((unsigned char)*p);
        if (q > 1) { /* a whole character or nothing */
            if (n + q + 1 > cap) break;
            memcpy(buf + n, p, q);
            n += q;
            p += q - 1;
            continue;
        }
        if (*p == '~' || *p == '/') {
            buf[n++] = '~';
            buf[n++] = *p == '~' ? '0' : '1';
        } else {
            buf[n++] = *p;
        }
    }
    buf[n] = 0;
    *len = n;
    return old;
}

static size_t ptr_push_index(char *buf, size_t cap, size_t *len, size_t i)
{
    char seg[24];
    snprintf(seg, sizeof seg, "%zu", i);
    return ptr_push(buf, cap, len, seg);
}

static void ptr_pop(char *buf, size_t *len, size_t old)
{
    *len = old;
    buf[old] = 0;
}

static node_t *node_new(cctx_t *c)
{
    oq_jschema_t *s = c->s;
    if (s->nnodes == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 16;
        node_t **nn = realloc(s->nodes, nc * sizeof *nn);
        if (!nn) return NULL;
        s->nodes = nn;
        s->cap = nc;
    }
    node_t *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->boolean = -1;
    n->min_len = n->max_len = n->min_items = n->max_items = n->min_props = n->max_props = -1;
    s->nodes[s->nnodes++] = n;
    return n;
}

static int compile(cctx_t *c, const json_t *j, int depth, node_t **out);

static int oom(cctx_t *c)
{
    return oq_error_set(c->err, OQ_ENOMEM, 0, "out of memory");
}

static int compile_child(cctx_t *c, const char *kw, const json_t *v, int depth, node_t **out)
{
    size_t old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, kw);
    int rc = compile(c, v, depth + 1, out);
    if (rc == 0) ptr_pop(c->ptr, &c->plen, old);
    return rc;
}

/* A non-empty array of schemas (prefixItems, allOf, anyOf, oneOf). */
static int compile_list(cctx_t *c, const char *kw, const json_t *v, int depth, node_t ***out,
                        size_t *n)
{
    size_t old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, kw);
    if (!json_is_array(v) || json_array_size(v) == 0)
        return cerr(c, "expected a non-empty array of schemas");
    size_t k = json_array_size(v);
    if (!(*out = calloc(k, sizeof **out))) return oom(c);
    *n = k;
    for (size_t i = 0; i < k; i++) {
        size_t o2 = ptr_push_index(c->ptr, sizeof c->ptr, &c->plen, i);
        int rc = compile(c, json_array_get(v, i), depth + 1, &(*out)[i]);
        if (rc) return rc;
        ptr_pop(c->ptr, &c->plen, o2);
    }
    ptr_pop(c->ptr, &c->plen, old);
    return 0;
}

/* An object of schemas (properties, $defs). */
static int compile_map(cctx_t *c, const char *kw, const json_t *v, int depth, prop_t **out,
                       size_t *n)
{
    size_t old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, kw);
    if (!json_is_object(v)) return cerr(c, "expected an object of schemas");
    size_t k = json_object_size(v), i = 0;
    if (k && !(*out = calloc(k, sizeof **out))) return oom(c);
    const char *name;
    json_t *sub;
    json_object_foreach((json_t *)v, name, sub)
    {
        size_t o2 = ptr_push(c->ptr, sizeof c->ptr, &c->plen, name);
        (*out)[i].name = name;
        int rc = compile(c, sub, depth + 1, &(*out)[i].s);
        if (rc) return rc;
        *n = ++i;
        ptr_pop(c->ptr, &c->plen, o2);
    }
    ptr_pop(c->ptr, &c->plen, old);
    return 0;
}

static int get_count(cctx_t *c, const char *kw, const json_t *v, int64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        size_t old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, kw);
        (void)old;
        return cerr(c, "expected a non-negative integer");
    }
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int type_bit(const json_t *v, unsigned *bit)
{
    if (!json_is_string(v)) return -1;
    for (size_t i = 0; i < sizeof type_names / sizeof type_names[0]; i++)
        if (strcmp(json_string_value(v), type_names[i].name) == 0) {
            *bit = type_names[i].bit;
            return 0;
        }
    return -1;
}

static int is_annotation(const char *k)
{
    static const char *const names[] = {"title",     "description", "default",    "examples",
                                        "$comment",  "format",      "deprecated", "readOnly",
                                        "writeOnly", NULL};
    for (const char *const *n = names; *n; n++)
        if (strcmp(*n, k) == 0) return 1;
    return 0;
}

#define MAX_PATTERN_LEN 1024
#define MAX_PATTERN_WEIGHT 20000L
#define MAX_PATTERN_GROUPS 32

/*
 * What glibc's regcomp/regexec accept but cannot do in bounded time or memory, refused before
 * regcomp sees it: back-references (\1: not ERE, and exponential to match), adjacent
 * quantifiers ("a+*": undefined in POSIX, and exponential in glibc's regcomp), and patterns
 * whose bounded repetitions expand too far (regcomp copies "x{1,100}" a hundred times, nested
 * ones multiply: the weight below is the expanded size). Returns NULL or the reason.
 */
static const char *pattern_problem(const char *p)
{
    long sum[MAX_PATTERN_GROUPS + 1] = {0}, last = 0;
    int depth = 0, quantified = 1; /* a quantifier at the start quantifies nothing */
    if (strlen(p) > MAX_PATTERN_LEN) return "longer than 1024 bytes";
    for (const char *q = p; *q; q++) {
        if (*q == '*' || *q == '+' || *q == '?' || (*q == '{' && q[1] >= '0' && q[1] <= '9')) {
            if (quantified) return "a quantifier follows another (undefined in POSIX)";
            quantified = 1;
            long hi = *q == '+' ? 2 : 1;
            if (*q == '{') {
                long lo = strtol(q + 1, (char **)&q, 10), up = lo;
                if (*q == ',')
                    up = (q[1] >= '0' && q[1] <= '9') ? strtol(q + 1, (char **)&q, 10)
                                                      : (q++, lo + 1);
                if (*q != '}') return "a bound {m,n} is not closed";
                if (lo > 255 || up > 255) return "a repetition bound over 255";
                hi = up > 1 ? up : 1;
            }
            sum[depth] += last * (hi - 1);
            if (sum[depth] > MAX_PATTERN_WEIGHT) goto heavy;
            continue;
        }
        quantified = 0;
        if (*q == '\\') {
            if (q[1] >= '1' && q[1] <= '9') return "back-references are not supported";
            if (q[1]) q++;
            last = 1;
        } else if (*q == '[') { /* a bracket expression: one atom */
            q++;
            if (*q == '^') q++;
            if (*q == ']') q++;
            while (*q && *q != ']') {
                if (*q == '[' && (q[1] == ':' || q[1] == '.' || q[1] == '=')) {
                    char end = q[1];
                    for (q += 2; *q && !(q[0] == end && q[1] == ']'); q++) {
                    }
                    if (*q) q++;
                }
                if (*q) q++;
            }
            if (!*q) return "a bracket expression is not closed";
            last = 1;
        } else if (*q == '(') {
            if (depth == MAX_PATTERN_GROUPS) return "groups nested deeper than 32";
            sum[++depth] = 0;
            quantified = 1; /* "(*" quantifies nothing */
            continue;
        } else if (*q == ')') {
            if (depth == 0) return "')' without '('";
            last = sum[depth--];
        } else if (*q == '|') {
            quantified = 1;
            continue;
        } else {
            last = 1;
        }
        sum[depth] += last;
        if (sum[depth] > MAX_PATTERN_WEIGHT) goto heavy;
    }
    return NULL;
heavy:
    return "its repetitions expand to over 20000 atoms";
}

static int compile_keyword(cctx_t *c, node_t *n, const char *k, const json_t *v, int depth)
{
    size_t old;
    if (strcmp(k, "type") == 0) {
        unsigned bit;
        if (json_is_array(v) && json_array_size(v) > 0) {
            for (size_t i = 0; i < json_array_size(v); i++) {
                if (type_bit(json_array_get(v, i), &bit) || (n->types & bit)) goto bad_type;
                n->types |= bit;
            }
            return 0;
        }
        if (type_bit(v, &bit) == 0) {
            n->types = bit;
            return 0;
        }
    bad_type:
        old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, k);
        return cerr(c, "expected one of null, boolean, object, array, number, string, integer, "
                       "or a non-empty array of distinct ones");
    }
    if (strcmp(k, "enum") == 0) {
        if (!json_is_array(v)) goto bad;
        n->enum_ = v;
        return 0;
    }
    if (strcmp(k, "const") == 0) {
        n->const_ = v;
        return 0;
    }
    if (strcmp(k, "minimum") == 0 || strcmp(k, "maximum") == 0 ||
        strcmp(k, "exclusiveMinimum") == 0 || strcmp(k, "exclusiveMaximum") == 0 ||
        strcmp(k, "multipleOf") == 0) {
        if (!json_is_number(v)) goto bad;
        if (k[0] == 'm' && k[1] == 'i')
            n->min = v;
        else if (k[0] == 'm' && k[1] == 'a')
            n->max = v;
        else if (k[0] == 'e' && k[9] == 'M' && k[10] == 'i')
            n->xmin = v;
        else if (k[0] == 'e')
            n->xmax = v;
        else {
            if (json_number_value(v) <= 0) {
                old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, k);
                return cerr(c, "expected a number > 0");
            }
            n->mult = v;
        }
        return 0;
    }
    if (strcmp(k, "minLength") == 0) return get_count(c, k, v, &n->min_len);
    if (strcmp(k, "maxLength") == 0) return get_count(c, k, v, &n->max_len);
    if (strcmp(k, "minItems") == 0) return get_count(c, k, v, &n->min_items);
    if (strcmp(k, "maxItems") == 0) return get_count(c, k, v, &n->max_items);
    if (strcmp(k, "minProperties") == 0) return get_count(c, k, v, &n->min_props);
    if (strcmp(k, "maxProperties") == 0) return get_count(c, k, v, &n->max_props);
    if (strcmp(k, "uniqueItems") == 0) {
        if (!json_is_boolean(v)) goto bad;
        n->unique = json_is_true(v);
        return 0;
    }
    if (strcmp(k, "pattern") == 0) {
        if (!json_is_string(v)) goto bad;
        old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, k);
        if (strlen(json_string_value(v)) != json_string_length(v))
            return cerr(c, "a pattern cannot hold U+0000");
        const char *why_not = pattern_problem(json_string_value(v));
        if (why_not) return cerr(c, "%s", why_not);
        int e = regcomp(&n->re, json_string_value(v), REG_EXTENDED | REG_NOSUB);
        if (e) {
            char why[120];
            regerror(e, NULL, why, sizeof why);
            return cerr(c, "not a POSIX extended regular expression (%s)", why);
        }
        n->has_re = 1;
        ptr_pop(c->ptr, &c->plen, old);
        return 0;
    }
    if (strcmp(k, "required") == 0) {
        if (!json_is_array(v)) goto bad;
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *a = json_array_get(v, i);
            if (!json_is_string(a)) goto bad;
            for (size_t j = 0; j < i; j++)
                if (json_equal(json_array_get(v, j), (json_t *)a)) goto bad;
        }
        n->required = v;
        return 0;
    }
    if (strcmp(k, "properties") == 0) return compile_map(c, k, v, depth, &n->props, &n->nprops);
    if (strcmp(k, "$defs") == 0) return compile_map(c, k, v, depth, &n->defs, &n->ndefs);
    if (strcmp(k, "additionalProperties") == 0) return compile_child(c, k, v, depth, &n->addl);
    if (strcmp(k, "items") == 0) return compile_child(c, k, v, depth, &n->items);
    if (strcmp(k, "not") == 0) return compile_child(c, k, v, depth, &n->not_);
    if (strcmp(k, "prefixItems") == 0) return compile_list(c, k, v, depth, &n->prefix, &n->nprefix);
    if (strcmp(k, "allOf") == 0) return compile_list(c, k, v, depth, &n->all, &n->nall);
    if (strcmp(k, "anyOf") == 0) return compile_list(c, k, v, depth, &n->any, &n->nany);
    if (strcmp(k, "oneOf") == 0) return compile_list(c, k, v, depth, &n->one, &n->none);
    if (strcmp(k, "$ref") == 0) {
        if (!json_is_string(v) || strncmp(json_string_value(v), "#/$defs/", 8) != 0 ||
            json_string_value(v)[8] == 0 || strchr(json_string_value(v) + 8, '/') ||
            strchr(json_string_value(v) + 8, '%')) {
            old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, k);
            return cerr(c, "only \"#/$defs/NAME\" is supported");
        }
        n->ref_text = json_string_value(v);
        return 0;
    }
    if (strcmp(k, "$schema") == 0 || strcmp(k, "$id") == 0) {
        old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, k);
        if (depth > 0) return cerr(c, "only allowed at the root");
        if (!json_is_string(v)) return cerr(c, "expected a string");
        const char *u = json_string_value(v);
        if (k[1] == 's' && strcmp(u, "https://json-schema.org/draft/2020-12/schema") != 0 &&
            strcmp(u, "https://json-schema.org/draft/2020-12/schema#") != 0)
            return cerr(c, "only https://json-schema.org/draft/2020-12/schema is supported");
        ptr_pop(c->ptr, &c->plen, old);
        return 0;
    }
    if (is_annotation(k)) {
        int ok = 1;
        if (!strcmp(k, "title") || !strcmp(k, "description") || !strcmp(k, "$comment") ||
            !strcmp(k, "format"))
            ok = json_is_string(v);
        else if (!strcmp(k, "examples"))
            ok = json_is_array(v);
        else if (strcmp(k, "default") != 0)
            ok = json_is_boolean(v);
        if (!ok) goto bad;
        return 0;
    }
    old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, k);
    return cerr(c,
                "keyword \"%.*s\" is not supported (README, \"The tools file\": the JSON "
                "Schema subset)",
                u8cut(k, 60), k);
bad:
    old = ptr_push(c->ptr, sizeof c->ptr, &c->plen, k);
    (void)old;
    return cerr(c, "bad value for %s", k);
}

static int compile(cctx_t *c, const json_t *j, int depth, node_t **out)
{
    if (depth > MAX_COMPILE_DEPTH) return cerr(c, "schemas nested deeper than 64 levels");
    node_t *n = node_new(c);
    if (!n) return oom(c);
    *out = n;
    if (json_is_boolean(j)) {
        n->boolean = json_is_true(j);
        return 0;
    }
    if (!json_is_object(j)) return cerr(c, "expected a schema (an object or true/false)");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)j, k, v)
    {
        int rc = compile_keyword(c, n, k, v, depth);
        if (rc) return rc;
    }
    return 0;
}

/* Decode a pointer segment (~1 -> '/', ~0 -> '~') into out; -1 on a bad escape. */
static int unescape(const char *seg, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = seg; *p; p++) {
        char ch = *p;
        if (ch == '~') {
            if (p[1] == '0')
                ch = '~';
            else if (p[1] == '1')
                ch = '/';
            else
                return -1;
            p++;
        }
        if (n + 1 >= cap) return -1;
        out[n++] = ch;
    }
    out[n] = 0;
    return 0;
}

/* Depth-first over the edges that apply to the same instance; a cycle there never ends. */
static int inplace_cycle(node_t *n, int depth)
{
    if (!n || n->mark == 2) return 0;
    if (n->mark == 1 || depth > MAX_INPLACE_CHAIN) return 1;
    n->mark = 1;
    int bad = inplace_cycle(n->ref, depth + 1) || inplace_cycle(n->not_, depth + 1);
    for (size_t i = 0; !bad && i < n->nall; i++)
        bad = inplace_cycle(n->all[i], depth + 1);
    for (size_t i = 0; !bad && i < n->nany; i++)
        bad = inplace_cycle(n->any[i], depth + 1);
    for (size_t i = 0; !bad && i < n->none; i++)
        bad = inplace_cycle(n->one[i], depth + 1);
    n->mark = 2;
    return bad;
}

void oq_jschema_destroy(oq_jschema_t *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->nnodes; i++) {
        node_t *n = s->nodes[i];
        if (n->has_re) regfree(&n->re);
        free(n->props);
        free(n->defs);
        free(n->prefix);
        free(n->all);
        free(n->any);
        free(n->one);
        free(n);
    }
    free(s->nodes);
    json_decref(s->src);
    free(s);
}

int oq_jschema_compile(const json_t *schema, oq_jschema_t **out, oq_error_t *err)
{
    oq_jschema_t *s = calloc(1, sizeof *s);
    if (!s || !schema || !(s->src = json_deep_copy(schema))) {
        free(s);
        return oq_error_set(err, schema ? OQ_ENOMEM : OQ_EINVAL, 0,
                            schema ? "out of memory" : "no schema");
    }
    cctx_t c = {s, err, "", 0};
    int rc = compile(&c, s->src, 0, &s->root);
    for (size_t i = 0; rc == 0 && i < s->nnodes; i++) {
        node_t *n = s->nodes[i];
        if (!n->ref_text) continue;
        char name[256];
        const node_t *r = s->root;
        if (unescape(n->ref_text + 8, name, sizeof name) == 0)
            for (size_t d = 0; d < r->ndefs && !n->ref; d++)
                if (strcmp(r->defs[d].name, name) == 0) n->ref = r->defs[d].s;
        if (!n->ref)
            rc = oq_error_set(err, OQ_EINVAL, 0, "$ref \"%.*s\": no such entry in the root's $defs",
                              u8cut(n->ref_text, 100), n->ref_text);
    }
    for (size_t i = 0; rc == 0 && i < s->nnodes; i++)
        if (inplace_cycle(s->nodes[i], 0))
            rc = oq_error_set(err, OQ_EINVAL, 0,
                              "a $ref cycle (through $ref/allOf/anyOf/oneOf/not) that never "
                              "descends into the instance, or a chain over %d long",
                              MAX_INPLACE_CHAIN);
    if (rc) {
        oq_jschema_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

const json_t *oq_jschema_source(const oq_jschema_t *s)
{
    return s ? s->src : NULL;
}

/* --- validate --------------------------------------------------------------------------- */

typedef struct vctx {
    oq_jschema_violation_t *v;
    long steps;
    int aborted;
    char ptr[512];
    size_t plen;
} vctx_t;

static int fail(vctx_t *x, const char *kw, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(vctx_t *x, const char *kw, const char *fmt, ...)
{
    if (x->aborted) return 1;
    memcpy(x->v->pointer, x->ptr, x->plen + 1);
    snprintf(x->v->keyword, sizeof x->v->keyword, "%s", kw);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->v->reason, sizeof x->v->reason, fmt, ap);
    va_end(ap);
    u8trim(x->v->reason);
    return 1;
}

static long double num(const json_t *v)
{
    return json_is_integer(v) ? (long double)json_integer_value(v)
                              : (long double)json_real_value(v);
}

static int num_cmp(const json_t *a, const json_t *b)
{
    if (json_is_integer(a) && json_is_integer(b)) {
        json_int_t x = json_integer_value(a), y = json_integer_value(b);
        return x < y ? -1 : x > y;
    }
    long double x = num(a), y = num(b);
    return x < y ? -1 : x > y;
}

static int equal_d(const json_t *a, const json_t *b, int depth)
{
    if (depth > MAX_EQUAL_DEPTH) return 0;
    if (json_is_number(a) && json_is_number(b)) return num_cmp(a, b) == 0;
    if (json_typeof(a) != json_typeof(b)) return 0;
    switch (json_typeof(a)) {
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!equal_d(json_array_get(a, i), json_array_get(b, i), depth + 1)) return 0;
        return 1;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b)) return 0;
        const char *k;
        json_t *va;
        json_object_foreach((json_t *)a, k, va)
        {
            const json_t *vb = json_object_get(b, k);
            if (!vb || !equal_d(va, vb, depth + 1)) return 0;
        }
        return 1;
    }
    default: /* true, false, null: same type is equal */
        return 1;
    }
}

int oq_jschema_equal(const json_t *a, const json_t *b)
{
    return a && b && equal_d(a, b, 0);
}

static unsigned type_of(const json_t *i)
{
    switch (json_typeof(i)) {
    case JSON_NULL:
        return T_NULL;
    case JSON_TRUE:
    case JSON_FALSE:
        return T_BOOL;
    case JSON_OBJECT:
        return T_OBJ;
    case JSON_ARRAY:
        return T_ARR;
    case JSON_STRING:
        return T_STR;
    case JSON_INTEGER:
        return T_NUM | T_INT;
    case JSON_REAL: {
        double d = json_real_value(i);
        return T_NUM | (isfinite(d) && d == floor(d) ? T_INT : 0);
    }
    }
    return 0;
}

static const char *type_name(const json_t *i)
{
    unsigned t = type_of(i);
    if (t & T_INT) return "integer";
    for (size_t k = 0; k < sizeof type_names / sizeof type_names[0]; k++)
        if (t & type_names[k].bit) return type_names[k].name;
    return "?";
}

static void types_text(unsigned types, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (size_t k = 0; k < sizeof type_names / sizeof type_names[0]; k++)
        if (types & type_names[k].bit)
            n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? " or " : "",
                                  type_names[k].name);
}

static size_t code_points(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) n++;
    return n;
}

static int multiple_of(const json_t *i, const json_t *m)
{
    if (json_is_integer(i) && json_is_integer(m))
        return json_integer_value(i) % json_integer_value(m) == 0;
    long double q = num(i) / num(m);
    if (!isfinite(q)) return 0;
    long double r = fabsl(q - nearbyintl(q));
    return r <= 1e-9L * (fabsl(q) > 1 ? fabsl(q) : 1);
}

static int validate(vctx_t *x, const node_t *n, const json_t *i, int depth);

static int sub(vctx_t *x, const node_t *n, const json_t *i, int depth, const char *seg, size_t idx)
{
    size_t old = seg ? ptr_push(x->ptr, sizeof x->ptr, &x->plen, seg)
                     : ptr_push_index(x->ptr, sizeof x->ptr, &x->plen, idx);
    int bad = validate(x, n, i, depth + 1);
    ptr_pop(x->ptr, &x->plen, old);
    return bad;
}

static const char *num_text(const json_t *v, char b[40])
{
    if (json_is_integer(v))
        snprintf(b, 40, "%lld", (long long)json_integer_value(v));
    else
        snprintf(b, 40, "%.17g", json_real_value(v));
    return b;
}

static int check_number(vctx_t *x, const node_t *n, const json_t *i)
{
    char a[40], b[40];
    if (n->min && num_cmp(i, n->min) < 0)
        return fail(x, "minimum", "%s is less than the minimum %s", num_text(i, a),
                    num_text(n->min, b));
    if (n->max && num_cmp(i, n->max) > 0)
        return fail(x, "maximum", "%s is greater than the maximum %s", num_text(i, a),
                    num_text(n->max, b));
    if (n->xmin && num_cmp(i, n->xmin) <= 0)
        return fail(x, "exclusiveMinimum", "%s is not greater than %s", num_text(i, a),
                    num_text(n->xmin, b));
    if (n->xmax && num_cmp(i, n->xmax) >= 0)
        return fail(x, "exclusiveMaximum", "%s is not less than %s", num_text(i, a),
                    num_text(n->xmax, b));
    if (n->mult && !multiple_of(i, n->mult))
        return fail(x, "multipleOf", "%s is not a multiple of %s", num_text(i, a),
                    num_text(n->mult, b));
    return 0;
}

static int check_string(vctx_t *x, const node_t *n, const json_t *i)
{
    if (n->min_len >= 0 || n->max_len >= 0) {
        size_t len = code_points(json_string_value(i), json_string_length(i));
        if (n->min_len >= 0 && len < (size_t)n->min_len)
            return fail(x, "minLength", "shorter than %lld characters", (long long)n->min_len);
        if (n->max_len >= 0 && len > (size_t)n->max_len)
            return fail(x, "maxLength", "longer than %lld characters", (long long)n->max_len);
    }
    if (n->has_re && regexec(&n->re, json_string_value(i), 0, NULL, 0) != 0)
        return fail(x, "pattern", "does not match the pattern");
    return 0;
}

static int check_array(vctx_t *x, const node_t *n, const json_t *i, int depth)
{
    size_t len = json_array_size(i);
    if (n->min_items >= 0 && len < (size_t)n->min_items)
        return fail(x, "minItems", "fewer than %lld items", (long long)n->min_items);
    if (n->max_items >= 0 && len > (size_t)n->max_items)
        return fail(x, "maxItems", "more than %lld items", (long long)n->max_items);
    if (n->unique)
        for (size_t a = 1; a < len; a++)
            for (size_t b = 0; b < a; b++) {
                if (++x->steps > MAX_STEPS) {
                    fail(x, "$limit", "validation too expensive (over %ld steps)", MAX_STEPS);
                    x->aborted = 1;
                    return 1;
                }
                if (equal_d(json_array_get(i, a), json_array_get(i, b), 0)) {
                    size_t old = ptr_push_index(x->ptr, sizeof x->ptr, &x->plen, a);
                    fail(x, "uniqueItems", "equal to item %zu", b);
                    ptr_pop(x->ptr, &x->plen, old);
                    return 1;
                }
            }
    for (size_t k = 0; k < len; k++) {
        const node_t *s = k < n->nprefix ? n->prefix[k] : n->items;
        if (s && sub(x, s, json_array_get(i, k), depth, NULL, k)) return 1;
    }
    return 0;
}

static int check_object(vctx_t *x, const node_t *n, const json_t *i, int depth)
{
    for (size_t k = 0; n->required && k < json_array_size(n->required); k++) {
        const char *name = json_string_value(json_array_get(n->required, k));
        if (!json_object_get(i, name)) {
            size_t old = ptr_push(x->ptr, sizeof x->ptr, &x->plen, name);
            fail(x, "required", "required property \"%.*s\" is missing", u8cut(name, 100), name);
            ptr_pop(x->ptr, &x->plen, old);
            return 1;
        }
    }
    for (size_t k = 0; k < n->nprops; k++) {
        const json_t *v = json_object_get(i, n->props[k].name);
        if (v && sub(x, n->props[k].s, v, depth, n->props[k].name, 0)) return 1;
    }
    if (n->addl) {
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)i, key, v)
        {
            int declared = 0;
            for (size_t k = 0; k < n->nprops && !declared; k++)
                declared = strcmp(n->props[k].name, key) == 0;
            if (declared) continue;
            if (n->addl->boolean == 0) {
                size_t old = ptr_push(x->ptr, sizeof x->ptr, &x->plen, key);
                fail(x, "additionalProperties", "property \"%.*s\" is not allowed", u8cut(key, 100),
                     key);
                ptr_pop(x->ptr, &x->plen, old);
                return 1;
            }
            if (sub(x, n->addl, v, depth, key, 0)) return 1;
        }
    }
    size_t np = json_object_size(i);
    if (n->min_props >= 0 && np < (size_t)n->min_props)
        return fail(x, "minProperties", "fewer than %lld properties", (long long)n->min_props);
    if (n->max_props >= 0 && np > (size_t)n->max_props)
        return fail(x, "maxProperties", "more than %lld properties", (long long)n->max_props);
    return 0;
}

/* Returns 0 when valid, 1 when not (x->v filled). */
static int validate(vctx_t *x, const node_t *n, const json_t *i, int depth)
{
    if (x->aborted) return 1;
    if (depth > MAX_VALIDATE_DEPTH || ++x->steps > MAX_STEPS) {
        if (depth > MAX_VALIDATE_DEPTH)
            fail(x, "$limit", "nested deeper than %d levels", MAX_VALIDATE_DEPTH);
        else
            fail(x, "$limit", "validation too expensive (over %ld steps)", MAX_STEPS);
        x->aborted = 1;
        return 1;
    }
    if (n->boolean == 1) return 0;
    if (n->boolean == 0) return fail(x, "false", "no value is allowed here");
    unsigned t = type_of(i);
    if (n->types && !(n->types & t)) {
        char want[96];
        types_text(n->types, want, sizeof want);
        return fail(x, "type", "expected %s, got %s", want, type_name(i));
    }
    if (n->enum_) {
        int found = 0;
        for (size_t k = 0; !found && k < json_array_size(n->enum_); k++)
            found = equal_d(i, json_array_get(n->enum_, k), 0);
        if (!found) return fail(x, "enum", "not one of the allowed values");
    }
    if (n->const_ && !equal_d(i, n->const_, 0))
        return fail(x, "const", "not the required constant");
    if ((t & T_NUM) && check_number(x, n, i)) return 1;
    if ((t & T_STR) && check_string(x, n, i)) return 1;
    if ((t & T_ARR) && check_array(x, n, i, depth)) return 1;
    if ((t & T_OBJ) && check_object(x, n, i, depth)) return 1;
    for (size_t k = 0; k < n->nall; k++)
        if (validate(x, n->all[k], i, depth + 1)) return 1;
    if (n->nany) {
        int ok = 0;
        for (size_t k = 0; !ok && k < n->nany; k++)
            ok = !validate(x, n->any[k], i, depth + 1);
        if (x->aborted) return 1;
        if (!ok) return fail(x, "anyOf", "matches none of the %zu anyOf schemas", n->nany);
    }
    if (n->none) {
        size_t ok = 0, first = 0;
        for (size_t k = 0; k < n->none && ok < 2; k++)
            if (!validate(x, n->one[k], i, depth + 1)) {
                if (!ok) first = k;
                ok++;
            }
        if (x->aborted) return 1;
        if (ok == 0) return fail(x, "oneOf", "matches none of the %zu oneOf schemas", n->none);
        if (ok > 1)
            return fail(x, "oneOf", "matches more than one oneOf schema (%zu and another)", first);
    }
    if (n->not_) {
        int bad = validate(x, n->not_, i, depth + 1);
        if (x->aborted) return 1;
        if (!bad) return fail(x, "not", "matches the schema under not");
    }
    if (n->ref && validate(x, n->ref, i, depth + 1)) return 1;
    return 0;
}

int oq_jschema_validate(const oq_jschema_t *s, const json_t *instance, oq_jschema_violation_t *v)
{
    oq_jschema_violation_t scratch;
    vctx_t x = {v ? v : &scratch, 0, 0, "", 0};
    memset(x.v, 0, sizeof *x.v);
    if (!s || !instance) {
        fail(&x, "$limit", "no schema or no instance");
        return OQ_EINVAL;
    }
    return validate(&x, s->root, instance, 0) ? OQ_EINVAL : 0;
}
