/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Token files (common/tokens.c), the one parser of the producer's --token-file, its
 * --metrics-token-file and the consumer's --token-file: the two-column format as before, the
 * optional `operator` role, what is refused (with the line, never the token), the digest
 * form, and the bearer header parser (a NUL inside the value is refused).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_log.h"
#include "oq_tokens.h"

static char path[64];

static void write_file(const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **st)
{
    (void)st;
    snprintf(path, sizeof path, "/tmp/oq_tokens_%d", (int)getpid());
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    unlink(path);
    return 0;
}

static void test_roles(void **st)
{
    (void)st;
    oq_error_t err = {0};
    oq_token_table_t *t = NULL;
    write_file("# TOKEN TENANT [operator]\n"
               "tenant-token-0123456789 shop\n"
               "\n"
               "operator-token-0123456789 ops operator\n"
               "sha256:a4f8264b14c1cd5a53c3bc69186c07412b947694701fbe7008dd7fadb80ec9c1 billing\n");
    assert_int_equal(oq_tokens_load(path, 1, &t, &err), 0);
    assert_int_equal(t->n, 3);
    long i = oq_tokens_find(t, "tenant-token-0123456789", 23);
    assert_int_equal(i, 0);
    assert_string_equal(t->v[i].tenant, "shop");
    assert_int_equal(t->v[i].roles, 0);
    i = oq_tokens_find(t, "operator-token-0123456789", 25);
    assert_int_equal(i, 1);
    assert_string_equal(t->v[i].tenant, "ops");
    assert_true(t->v[i].roles & OQ_TOKEN_ROLE_OPERATOR);
    assert_int_equal(oq_tokens_find(t, "operator-token-012345678", 24), -1);
    oq_tokens_free(t);
}

/* Webhook settings of a tenant: callback_url= and webhook_secret=, in any order, after the
 * role; on any one line of the tenant, or repeated with the same value. */
static void test_webhook_settings(void **st)
{
    (void)st;
    oq_error_t err = {0};
    oq_token_table_t *t = NULL;
    write_file("shop-token-0123456789 shop webhook_secret=whsec_shop_0123456789 "
               "callback_url=https://shop.example.com/hooks\n"
               "shop-token-9876543210 shop operator callback_url=https://shop.example.com/hooks\n"
               "plain-token-0123456789 plain\n");
    assert_int_equal(oq_tokens_load(path, 1, &t, &err), 0);
    assert_int_equal(t->n, 3);
    const oq_tenant_hook_t *h = oq_tokens_hook(t, "shop");
    assert_non_null(h);
    assert_string_equal(h->callback_url, "https://shop.example.com/hooks");
    assert_string_equal(h->secret, "whsec_shop_0123456789");
    assert_true(t->v[oq_tokens_find(t, "shop-token-9876543210", 21)].roles &
                OQ_TOKEN_ROLE_OPERATOR);
    assert_null(oq_tokens_hook(t, "plain"));
    oq_tokens_free(t);
    static const char *const bad[] = {
        "a-token-0123456789 shop callback_url=ftp://x/y\n", /* not http(s) */
        "a-token-0123456789 shop webhook_secret=short\n",   /* under 16 bytes */
        "a-token-0123456789 shop webhook_secret=\n",        /* empty */
        "a-token-0123456789 shop callback_url=http://a/ callback_url=http://b/\n", /* twice */
        "a-token-0123456789 shop webhook_secret=whsec_one_0123456789\n"
        "b-token-0123456789 shop webhook_secret=whsec_two_0123456789\n", /* two secrets */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        oq_error_t e = {0};
        oq_token_table_t *u = NULL;
        write_file(bad[k]);
        assert_int_equal(oq_tokens_load(path, 1, &u, &e), OQ_EINVAL);
        assert_null(u);
        assert_null(strstr(e.msg, "0123456789 ")); /* never the token */
    }
}

static void test_refused(void **st)
{
    (void)st;
    static const char *const bad[] = {
        "operator-token-0123456789 ops admin\n",      /* an unknown role */
        "operator-token-0123456789 ops operator x\n", /* a fourth word */
        "operator-token-0123456789\n",                /* no tenant */
        "short shop\n",                               /* too short */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        oq_error_t err = {0};
        oq_token_table_t *t = NULL;
        write_file(bad[k]);
        assert_int_equal(oq_tokens_load(path, 1, &t, &err), OQ_EINVAL);
        assert_null(t);
        assert_non_null(strstr(err.msg, "line 1"));
        assert_null(strstr(err.msg, "0123456789")); /* never the token */
    }
    /* a file without tenants takes no second word, a role included */
    oq_error_t err = {0};
    oq_token_table_t *t = NULL;
    write_file("metrics-token-0123456789 operator\n");
    assert_int_equal(oq_tokens_load(path, 0, &t, &err), OQ_EINVAL);
}

static void test_bearer(void **st)
{
    (void)st;
    const char *tok = NULL;
    size_t n = 0;
    const char *v = "Bearer  abcdefghijklmnop \t";
    assert_int_equal(oq_tokens_bearer(v, strlen(v), &tok, &n), 0);
    assert_int_equal(n, 16);
    assert_memory_equal(tok, "abcdefghijklmnop", 16);
    v = "bearer abcdefghijklmnop==";
    assert_int_equal(oq_tokens_bearer(v, strlen(v), &tok, &n), 0);
    static const char nul[] = "Bearer abcdefgh\0ijklmnop";
    assert_int_equal(oq_tokens_bearer(nul, sizeof nul - 1, &tok, &n), -1);
    v = "Basic abcdefghijklmnop";
    assert_int_equal(oq_tokens_bearer(v, strlen(v), &tok, &n), -1);
    v = "Bearer abc def";
    assert_int_equal(oq_tokens_bearer(v, strlen(v), &tok, &n), -1);
    v = "Bearer ";
    assert_int_equal(oq_tokens_bearer(v, strlen(v), &tok, &n), -1);
}

int main(void)
{
    oq_log_init(OQ_LOG_OFF, OQ_LOG_FMT_LOGFMT, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roles),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_webhook_settings),
        cmocka_unit_test(test_bearer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
