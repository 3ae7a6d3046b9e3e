/**
 * @file oq_kafka.h
 * @brief librdkafka configuration shared by every onceq Kafka client.
 */
#ifndef OQ_KAFKA_H
#define OQ_KAFKA_H

#include <librdkafka/rdkafka.h>

#include "oq_config.h"
#include "oq_error.h"

/**
 * @brief New librdkafka conf: bootstrap.servers = \p brokers, the onceq logger as log_cb,
 *        low-latency defaults (fetch.wait.max.ms=10, socket.nagle.disable=true), then the
 *        user's -X / kafka.* properties from \p cfg (may be NULL), which override defaults.
 * @returns the conf (caller owns it until passed to rd_kafka_new), or NULL with \p err filled
 *          (OQ_EINVAL for an unknown property or bad value).
 */
rd_kafka_conf_t *oq_kafka_conf_new(const char *brokers, const oq_config_t *cfg, oq_error_t *err);

/** @brief Set one property, mapping failure to OQ_EINVAL with librdkafka's message. */
int oq_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value,
                      oq_error_t *err);

#endif
