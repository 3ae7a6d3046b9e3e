/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_kafka.h
 * @brief librdkafka configuration shared by every onceq Kafka client.
 */
#ifndef OQ_KAFKA_H
#define OQ_KAFKA_H

#include <librdkafka/rdkafka.h>

#include "oq_config.h"
#include "oq_error.h"

/** Which kind of client a conf is for: only a consumer gets consumer defaults. */
typedef enum { OQ_KAFKA_PRODUCER = 0, OQ_KAFKA_CONSUMER = 1 } oq_kafka_role_t;

/** Consumers commit their stored offsets (stored only after the database commit) at most this
 *  often, not once per batch: each OffsetCommit is a replicated write on the coordinator. */
#define OQ_KAFKA_COMMIT_INTERVAL_MS 1000

/** @brief 1 when \p cfg (may be NULL) has `kafka-profile` = mock: the embedded broker. */
int oq_kafka_profile_mock(const oq_config_t *cfg);

/**
 * @brief New librdkafka conf: bootstrap.servers = \p brokers, the onceq logger as log_cb,
 *        the defaults of \p cfg's `kafka-profile` (socket.nagle.disable=true; for consumers
 *        fetch.wait.max.ms=500 on real brokers, 5 on the embedded broker: common/kafka.c),
 *        then the user's -X / kafka.* properties from \p cfg (may be NULL) that are for this
 *        kind of client (oq_kafka_conf_apply), which override the defaults. With
 *        ONCEQ_KAFKA_STATS_DIR set, the handle also writes librdkafka's statistics once a
 *        second to DIR/<pid>-<handle name>.json (common/kafka.c, "Request counts").
 * @returns the conf (caller owns it until passed to rd_kafka_new), or NULL with \p err filled
 *          (OQ_EINVAL for an unknown property or bad value).
 */
rd_kafka_conf_t *oq_kafka_conf_new(oq_kafka_role_t role, const char *brokers,
                                   const oq_config_t *cfg, oq_error_t *err);

/**
 * @brief The name under which the user's property \p name reaches a client of \p role, or
 *        NULL when it is for the other kind: `producer.X` / `consumer.X` are X for that kind
 *        only; a bare name librdkafka documents as consumer-only or producer-only goes to that
 *        kind only (so `-X session.timeout.ms=6000` draws no warning from producers); any
 *        other name reaches both.
 */
const char *oq_kafka_prop_for(oq_kafka_role_t role, const char *name);

/** @brief Apply \p cfg's Kafka properties for \p role to \p conf (OQ_EINVAL naming a bad one). */
int oq_kafka_conf_apply(rd_kafka_conf_t *conf, oq_kafka_role_t role, const oq_config_t *cfg,
                        oq_error_t *err);

/** @brief Set one property, mapping failure to OQ_EINVAL with librdkafka's message. */
int oq_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value, oq_error_t *err);

/**
 * @brief From a rebalance callback: take the partitions (RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
 *        or let them go (anything else), incrementally under the COOPERATIVE protocol, eagerly
 *        otherwise: what librdkafka does when no callback is set. A failure is logged under
 *        \p component.
 * @returns 1 under the cooperative protocol, 0 under the eager one.
 * @locality the thread of the rebalance callback.
 */
int oq_kafka_rebalance_apply(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                             rd_kafka_topic_partition_list_t *parts, const char *component);

#endif
