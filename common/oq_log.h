/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_log.h
 * @brief The one logger: levels checked before formatting, logfmt (default) or JSON lines on
 *        stderr, with a component and optional call_id.
 *
 * Usage: `OQ_LOG_INFO("relay", "published rows=%d", n);` or with a call id:
 * `OQ_LOGC_WARN("consumer", call_id, "lease lost fence=%lld", f);`. The message is free text;
 * it is emitted as the `msg` field. Thread-safe: one write(2) per line.
 * librdkafka logs reach it through oq_log_rdkafka_cb (set with rd_kafka_conf_set_log_cb).
 * A program linking libonceq routes the lines with oq_log_set_callback() (oq_logger.h).
 */
#ifndef OQ_LOG_H
#define OQ_LOG_H

#include <stdio.h>

#include "oq_logger.h" /* the levels; the public level and callback setters */
typedef enum { OQ_LOG_FMT_LOGFMT = 0, OQ_LOG_FMT_JSON } oq_log_format_t;

/** Current threshold; read without locking (a racy read only delays a level change). */
extern oq_log_level_t oq_log_threshold;

/** @brief Set level and format. Also reads ONCEQ_LOG_LEVEL / ONCEQ_LOG_FORMAT if \p from_env. */
void oq_log_init(oq_log_level_t level, oq_log_format_t fmt, int from_env);

/** @brief Parse "debug|info|warn|error|off"; returns -1 when unknown. */
int oq_log_level_parse(const char *s);

/** @brief Emit one line (use the macros so the level is checked before formatting). */
void oq_log_write(oq_log_level_t level, const char *component, const char *call_id, const char *fmt,
                  ...) __attribute__((format(printf, 4, 5)));

/** @brief librdkafka log callback: maps syslog levels into the logger, component "rdkafka". */
struct rd_kafka_s;
void oq_log_rdkafka_cb(const struct rd_kafka_s *rk, int level, const char *fac, const char *buf);

#define OQ_LOG_(lvl, comp, cid, ...)                                                               \
    do {                                                                                           \
        if ((lvl) >= oq_log_threshold) oq_log_write((lvl), (comp), (cid), __VA_ARGS__);            \
    } while (0)

#define OQ_LOG_DEBUG(comp, ...) OQ_LOG_(OQ_LOG_DEBUG, comp, NULL, __VA_ARGS__)
#define OQ_LOG_INFO(comp, ...) OQ_LOG_(OQ_LOG_INFO, comp, NULL, __VA_ARGS__)
#define OQ_LOG_WARN(comp, ...) OQ_LOG_(OQ_LOG_WARN, comp, NULL, __VA_ARGS__)
#define OQ_LOG_ERROR(comp, ...) OQ_LOG_(OQ_LOG_ERROR, comp, NULL, __VA_ARGS__)
#define OQ_LOGC_DEBUG(comp, cid, ...) OQ_LOG_(OQ_LOG_DEBUG, comp, cid, __VA_ARGS__)
#define OQ_LOGC_INFO(comp, cid, ...) OQ_LOG_(OQ_LOG_INFO, comp, cid, __VA_ARGS__)
#define OQ_LOGC_WARN(comp, cid, ...) OQ_LOG_(OQ_LOG_WARN, comp, cid, __VA_ARGS__)
#define OQ_LOGC_ERROR(comp, cid, ...) OQ_LOG_(OQ_LOG_ERROR, comp, cid, __VA_ARGS__)

#endif
