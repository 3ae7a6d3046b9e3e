/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_logger.h
 * @brief Where onceq's log lines go, for a program that links libonceq. Installed as
 *        <onceq/oq_logger.h>.
 *
 * In libonceq the logger is silent until the host program asks for lines: the level starts at
 * OQ_LOG_OFF and ONCEQ_LOG_LEVEL is not read (a library does not write to its host's stderr).
 * oq_log_set_level() lowers it, and oq_log_set_callback() receives each line; with a level but
 * no callback the lines go to stderr. The onceq daemons set both from their settings
 * (`--log-level`, `ONCEQ_LOG_LEVEL`) and log to stderr.
 */
#ifndef OQ_LOGGER_H
#define OQ_LOGGER_H

#include <stddef.h>

typedef enum {
    OQ_LOG_DEBUG = 0,
    OQ_LOG_INFO,
    OQ_LOG_WARN,
    OQ_LOG_ERROR,
    OQ_LOG_OFF
} oq_log_level_t;

/**
 * A log sink. \p line is one formatted line (logfmt: `ts=... level=warn pid=... component=db
 * msg="..." key=value ...`), \p len bytes without a newline, NUL-terminated, valid for the
 * call only. Called on the thread that logs; it must not call back into onceq.
 */
typedef void (*oq_log_cb)(oq_log_level_t level, const char *component, const char *line, size_t len,
                          void *opaque);

/** @brief Emit lines at \p level and above (OQ_LOG_OFF: none, the library's default). */
void oq_log_set_level(oq_log_level_t level);

/**
 * @brief Send every line to \p cb (NULL: back to stderr). \p opaque is passed through.
 * @remark Set it before other threads use onceq; it is read without a lock.
 */
void oq_log_set_callback(oq_log_cb cb, void *opaque);

#endif
