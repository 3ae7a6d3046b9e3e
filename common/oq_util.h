/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_util.h
 * @brief Ids from a CSPRNG, time helpers, and named crash points for the chaos suite.
 */
#ifndef OQ_UTIL_H
#define OQ_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "oq_error.h"

#define OQ_CALL_ID_LEN 34    /**< "c_" + 32 lowercase hex: the ids written now. */
#define OQ_CALL_ID_LEN_V1 18 /**< "c_" + 16 lowercase hex: the first format, still accepted. */
#define OQ_UUID_LEN 36       /**< 8-4-4-4-12. */

/** @brief Fill \p n bytes from the OS CSPRNG (getrandom). Aborts only if the kernel refuses. */
void oq_random_bytes(void *buf, size_t n);

/**
 * @brief As oq_random_bytes(), from a per-thread buffer refilled from the CSPRNG 256 bytes at a
 * time (ids on hot paths no longer cost a getrandom() system call each). A forked child drops
 * the bytes it inherited, so parent and child never hand out the same ones. \p n <= 256.
 */
void oq_random_bytes_buffered(void *buf, size_t n);

/**
 * @brief Write a new call id into \p out (OQ_CALL_ID_LEN+1 bytes): "c_" + 32 lowercase hex of
 *        48 bits of wall-clock milliseconds (big-endian, so ids sort by time and B-tree inserts
 *        stay on the right-most leaf) followed by 80 bits from the CSPRNG.
 */
void oq_id_call(char out[OQ_CALL_ID_LEN + 1]);

/**
 * @brief Non-zero when \p s is a call id: "c_" + 32 lowercase hex (oq_id_call), or "c_" + 16
 *        lowercase hex, the first format (42 bits of ms + 22 random bits), which databases and
 *        messages written before the change still hold. Buffers of OQ_CALL_ID_LEN+1 hold both.
 */
int oq_call_id_valid(const char *s);

/**
 * @brief Write a new message id: a UUIDv7 (time-ordered, 74 random bits), lowercase.
 * Time ordering keeps inbox B-tree inserts local; uniqueness comes from the random bits.
 */
void oq_id_uuid(char out[OQ_UUID_LEN + 1]);

/** @brief Wall-clock time, milliseconds since the Unix epoch. */
int64_t oq_now_ms(void);

/** @brief Monotonic time in microseconds (for durations, deadlines, latencies). */
int64_t oq_mono_us(void);

struct timespec;
/**
 * @brief \p ts = CLOCK_MONOTONIC now + \p us_from_now: the absolute deadline of a
 *        pthread_cond_timedwait on a condition variable set to CLOCK_MONOTONIC.
 */
void oq_mono_deadline(struct timespec *ts, int64_t us_from_now);

/**
 * @brief CLOCK_BOOTTIME in milliseconds: never stepped (NTP, `date -s`), counts suspend, and is
 *        the same clock for every process of one host; it starts again near 0 at each boot.
 *        The base of the consumer's lease clock (see oq__consumer_store_now).
 */
int64_t oq_boot_ms(void);

/**
 * @brief The kernel's id of the current boot (/proc/sys/kernel/random/boot_id, a UUID shared
 *        by every process and container of the host until the next boot), NUL-terminated.
 * @returns 0, or OQ_ENOTFOUND (\p out is "") when it cannot be read.
 */
int oq_boot_id(char out[40]);

/** @brief Format unix ms as RFC 3339 UTC with milliseconds: "2026-11-30T02:23:24.123Z". */
void oq_time_format(int64_t unix_ms, char out[32]);

/** @brief Sleep for \p ms milliseconds (restarts after EINTR unless \p stop becomes non-zero). */
void oq_sleep_ms(int64_t ms, volatile int *stop);

/** @brief Lowercase hex of \p n bytes into \p out (2n+1 bytes). */
void oq_hex(const unsigned char *in, size_t n, char *out);

/**
 * @brief Parse a duration such as "250ms", "30s", "5m", "24h", "1d" or a bare number of
 *        milliseconds. @returns 0 or OQ_EINVAL.
 */
int oq_parse_duration_ms(const char *s, int64_t *out);

/** @brief Parse a size such as "1048576", "64k", "1MiB", "5MB". @returns 0 or OQ_EINVAL. */
int oq_parse_size(const char *s, int64_t *out);

/* --- crash points ---------------------------------------------------------------------------
 * OQ_CRASH_POINT("relay.after_delivery_before_mark") kills the process with SIGKILL when the
 * environment variable ONCEQ_CRASH_AT names that point (a comma-separated list is allowed;
 * "name@N" fires on the N-th time the point is reached; "name@N!stop" pauses the process with
 * SIGSTOP on the N-th hit instead, once, for a test to resume). Always compiled in; when the
 * variable is unset the cost is one predictable branch on a cached flag.
 */
extern int oq__crash_armed; /**< -1 unknown, 0 off, 1 armed. */
void oq__crash_check(const char *point);
#define OQ_CRASH_POINT(name)                                                                       \
    do {                                                                                           \
        if (oq__crash_armed != 0) oq__crash_check(name);                                           \
    } while (0)

#endif
