/**
 * @file oq_mhd.h
 * @brief The one libmicrohttpd logger of the onceq servers (producer API, consumer admin,
 *        metrics listeners, the test downstream).
 */
#ifndef OQ_MHD_H
#define OQ_MHD_H

#include <stdarg.h>
#include <stddef.h>

#include "oq_log.h"

/** What oq_mhd_log writes with: pass a pointer to one (static) as the logger's closure. */
typedef struct oq_mhd_log_ctx {
    const char *component; /**< the log line's component */
    oq_log_level_t level;  /**< the level of libmicrohttpd's messages there */
} oq_mhd_log_ctx_t;

/** @brief MHD_OPTION_EXTERNAL_LOGGER: one log line (trailing newlines cut) per message, with
 *         \p cls an oq_mhd_log_ctx_t. */
void oq_mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

struct MHD_Connection;
/**
 * @brief MHD_OPTION_UNESCAPE_CALLBACK: libmicrohttpd's own percent-decoding, except that a
 *        decoded NUL (%00) becomes 0x7f. libmicrohttpd hands the path to the handler as a C
 *        string, so a %00 would cut it there (by-key/a%00b read as the key "a"); 0x7f is a byte
 *        that no key, tenant or call id accepts, so such a request is refused instead.
 */
size_t oq_mhd_unescape(void *cls, struct MHD_Connection *c, char *s);

#endif
