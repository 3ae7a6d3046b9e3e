/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The growable buffer (common/oq_buf.h): growth keeps every byte and the NUL, printf of any
 * length, a size past SIZE_MAX refused with OQ_ERANGE before anything is allocated, and a
 * failed realloc (this executable is linked with -Wl,--wrap=realloc, so fail_realloc makes the
 * buffer's realloc return NULL) returns OQ_ENOMEM, sticks, and leaves the bytes already
 * written intact and freeable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_buf.h"
#include "oq_error.h"

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);

static int fail_realloc;
static size_t realloc_calls;

void *__wrap_realloc(void *p, size_t n)
{
    realloc_calls++;
    if (fail_realloc) return NULL;
    return __real_realloc(p, n);
}

static void test_growth(void **state)
{
    (void)state;
    oq_buf_t b = {0};
    char expect[5000];
    for (size_t i = 0; i < sizeof expect - 1; i++) {
        expect[i] = (char)('a' + i % 26);
        assert_int_equal(oq_buf_putc(&b, expect[i]), 0);
        assert_int_equal(b.len, i + 1);
        assert_true(b.cap > b.len);
        assert_int_equal(b.p[b.len], '\0');
    }
    expect[sizeof expect - 1] = '\0';
    assert_string_equal(b.p, expect);
    assert_true(b.cap <= 2 * (sizeof expect)); /* doubling, not one realloc a byte */
    assert_int_equal(oq_buf_put(&b, "", 0), 0);
    assert_int_equal(oq_buf_puts(&b, "xyz"), 0);
    size_t len = 0;
    char *t = oq_buf_take(&b, &len);
    assert_non_null(t);
    assert_int_equal(len, sizeof expect + 2);
    assert_memory_equal(t, expect, sizeof expect - 1);
    assert_string_equal(t + sizeof expect - 1, "xyz");
    assert_null(b.p);
    assert_int_equal(b.len, 0);
    free(t);
    t = oq_buf_take(&b, &len); /* nothing put: an empty string */
    assert_non_null(t);
    assert_string_equal(t, "");
    assert_int_equal(len, 0);
    free(t);
}

static void test_printf(void **state)
{
    (void)state;
    oq_buf_t b = {0};
    assert_int_equal(oq_buf_printf(&b, "%s=%d;", "a", 1), 0);
    char big[3000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(oq_buf_printf(&b, "[%s]", big), 0); /* longer than the room left */
    assert_int_equal(oq_buf_printf(&b, "%zu", (size_t)42), 0);
    assert_int_equal(b.len, 4 + 2 + sizeof big - 1 + 2);
    assert_memory_equal(b.p, "a=1;[q", 6);
    assert_string_equal(b.p + b.len - 4, "q]42");
    oq_buf_free(&b);
    assert_null(b.p);
}

static void test_size_overflow(void **state)
{
    (void)state;
    oq_buf_t b = {0};
    assert_int_equal(oq_buf_puts(&b, "abc"), 0);
    size_t calls = realloc_calls;
    assert_int_equal(oq_buf_reserve(&b, SIZE_MAX - 3), OQ_ERANGE); /* len + n + 1 wraps */
    assert_int_equal(realloc_calls, calls);                        /* nothing was asked for */
    assert_int_equal(b.err, OQ_ERANGE);
    assert_int_equal(oq_buf_puts(&b, "d"), OQ_ERANGE); /* sticky */
    assert_string_equal(b.p, "abc");
    assert_null(oq_buf_take(&b, NULL));
    assert_null(b.p);
    assert_int_equal(b.err, 0);

    oq_buf_t c = {0};
    assert_int_equal(oq_buf_put(&c, "x", 1), 0);
    assert_int_equal(oq_buf_put(&c, "y", SIZE_MAX), OQ_ERANGE);
    oq_buf_free(&c);
}

static void test_oom(void **state)
{
    (void)state;
    oq_buf_t b = {0};
    assert_int_equal(oq_buf_puts(&b, "kept"), 0);
    char pad[200];
    memset(pad, 'p', sizeof pad);
    fail_realloc = 1;
    assert_int_equal(oq_buf_put(&b, pad, sizeof pad), OQ_ENOMEM);
    assert_int_equal(oq_buf_printf(&b, "%s", "more"), OQ_ENOMEM);
    fail_realloc = 0;
    assert_int_equal(oq_buf_putc(&b, 'z'), OQ_ENOMEM); /* sticky though memory is back */
    assert_string_equal(b.p, "kept");                  /* what was written is intact */
    size_t len = 7;
    assert_null(oq_buf_take(&b, &len));
    assert_int_equal(len, 0);

    fail_realloc = 1; /* the very first allocation fails */
    oq_buf_t e = {0};
    assert_int_equal(oq_buf_printf(&e, "%d", 5), OQ_ENOMEM);
    assert_null(oq_buf_take(&e, NULL));
    fail_realloc = 0;
}

static void test_read(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    for (int i = 0; i < 3000; i++)
        fputs("0123456789", f);
    rewind(f);
    oq_buf_t b = {0};
    assert_int_equal(oq_buf_puts(&b, "<"), 0);
    assert_int_equal(oq_buf_read(&b, f, 30000), 0); /* exactly the limit */
    assert_int_equal(b.len, 30001);
    assert_memory_equal(b.p, "<0123456789", 11);
    assert_int_equal(b.p[b.len], '\0');
    oq_buf_free(&b);
    rewind(f);
    assert_int_equal(oq_buf_read(&b, f, 29999), OQ_ETOOBIG); /* one byte over */
    assert_int_equal(b.len, 30000);                          /* read no further than that */
    oq_buf_free(&b);
    fclose(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_growth),        cmocka_unit_test(test_printf),
        cmocka_unit_test(test_size_overflow), cmocka_unit_test(test_oom),
        cmocka_unit_test(test_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
