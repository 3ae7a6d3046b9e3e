/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Service-manager notifications. Under systemd (Type=notify) a daemon says READY=1 once it
 * serves, and, when the unit sets WatchdogSec=, pings WATCHDOG=1 more often than that or is
 * killed and restarted. libsystemd's sd_notify() does the protocol (a datagram to
 * $NOTIFY_SOCKET); sd_watchdog_enabled() reads the interval from $WATCHDOG_USEC. Pings go out
 * at half the interval, from the command's own main loop, so a hung loop stops them. Without
 * NOTIFY_SOCKET, or built without libsystemd, every call does nothing.
 */
#include "oq_service.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#ifdef ONCEQ_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* 0 = not read yet, -1 = no watchdog, else the interval in us. */
static _Atomic int64_t wd_usec;
static _Atomic int64_t wd_last;

static int64_t watchdog_usec(void)
{
    int64_t u = atomic_load(&wd_usec);
    if (u != 0) return u;
    u = -1;
#ifdef ONCEQ_HAVE_SYSTEMD
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) u = (int64_t)usec;
#endif
    atomic_store(&wd_usec, u);
    return u;
}

void oq_service_ready(const char *status)
{
#ifdef ONCEQ_HAVE_SYSTEMD
    sd_notifyf(0, "READY=1\nSTATUS=%s", status ? status : "ready");
    if (watchdog_usec() > 0) {
        sd_notify(0, "WATCHDOG=1");
        atomic_store(&wd_last, mono_us());
    }
#else
    (void)status;
#endif
}

void oq_service_watchdog(void)
{
    int64_t u = watchdog_usec();
    if (u <= 0) return;
    int64_t now = mono_us();
    if (now - atomic_load(&wd_last) < u / 2) return;
    atomic_store(&wd_last, now);
#ifdef ONCEQ_HAVE_SYSTEMD
    sd_notify(0, "WATCHDOG=1");
#endif
}

void oq_service_group_joined(const char *group, int partitions)
{
#ifdef ONCEQ_HAVE_SYSTEMD
    sd_notifyf(0, "STATUS=assigned %d partition(s) of group %s\nX_ONCEQ_GROUP=joined", partitions,
               group ? group : "");
#else
    (void)group;
    (void)partitions;
#endif
}

int oq_service_can_notify(void)
{
#ifdef ONCEQ_HAVE_SYSTEMD
    return 1;
#else
    return 0;
#endif
}

void oq_service_stopping(void)
{
#ifdef ONCEQ_HAVE_SYSTEMD
    sd_notify(0, "STOPPING=1");
#endif
}

static pthread_t wd_thread;
static atomic_int wd_thread_run;

static void *watchdog_main(void *arg)
{
    (void)arg;
    int64_t step_us = watchdog_usec() / 4;
    if (step_us > 1000000) step_us = 1000000;
    while (atomic_load(&wd_thread_run)) {
        oq_service_watchdog();
        struct timespec ts = {(time_t)(step_us / 1000000), (long)(step_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int oq_service_watchdog_thread_start(void)
{
    if (watchdog_usec() <= 0 || atomic_load(&wd_thread_run)) return 0;
    atomic_store(&wd_thread_run, 1);
    if (pthread_create(&wd_thread, NULL, watchdog_main, NULL) != 0) {
        atomic_store(&wd_thread_run, 0);
        return -1;
    }
    return 0;
}

void oq_service_watchdog_thread_stop(void)
{
    if (!atomic_exchange(&wd_thread_run, 0)) return;
    pthread_join(wd_thread, NULL);
}
