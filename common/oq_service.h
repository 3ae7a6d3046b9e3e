/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_service.h
 * @brief Service-manager notifications (systemd's sd_notify protocol): readiness, watchdog
 *        pings and stopping. Every function is a no-op when the process was not started with
 *        NOTIFY_SOCKET, or when onceq was built without libsystemd (ONCEQ_SYSTEMD=OFF).
 */
#ifndef OQ_SERVICE_H
#define OQ_SERVICE_H

/** @brief Tell the manager the service is ready (READY=1) with a one-line \p status. */
void oq_service_ready(const char *status);

/**
 * @brief Ping the watchdog (WATCHDOG=1) when half of WatchdogSec has passed since the last
 *        ping; cheap otherwise. Call it from the loop whose progress the ping vouches for.
 * @locality the one thread that runs that loop.
 */
void oq_service_watchdog(void);

/**
 * @brief Tell the manager that this process's Kafka consumer has been given its share of
 *        \p group (\p partitions, maybe 0) by a rebalance: a STATUS line for people and
 *        X_ONCEQ_GROUP=joined for `onceq up`, which says "pipeline running" only once every
 *        consumer it started has joined (before that a call waits for the group to form: 3 s on
 *        the embedded broker). Sent at every assignment; systemd ignores the X_ variable.
 * @locality any thread (librdkafka's rebalance callback).
 */
void oq_service_group_joined(const char *group, int partitions);

/** @brief 1 when this build can send notifications (libsystemd), else 0. */
int oq_service_can_notify(void);

/** @brief Tell the manager the service is stopping (STOPPING=1). */
void oq_service_stopping(void);

/**
 * @brief For a command whose loop runs inside a library call: a thread that calls
 *        oq_service_watchdog() until oq_service_watchdog_thread_stop(). It vouches for the
 *        process being scheduled, not for the loop's progress. No thread without a watchdog.
 * @returns 0, or -1 when the thread could not start (no pings then).
 */
int oq_service_watchdog_thread_start(void);
void oq_service_watchdog_thread_stop(void);

#endif
