-- SPDX-License-Identifier: Apache-2.0
-- The lease clock of effects.db (consumer/store.c, oq__consumer_store_now; docs/DESIGN.md,
-- "Clocks"): every time the consumer's rules store and compare (leases, next_attempt_at,
-- started_at + settle_ms, unknown_at, updated_at) is anchor_ms + CLOCK_BOOTTIME in ms, not the
-- wall clock, so that a step of the host's clock cannot lapse a lease or age a lookup's
-- "absent". One row per boot of the host: the first process of a boot writes it, every other
-- process of that boot reads the same anchor, so all of them read the same clock.
-- anchor_ms = wall clock minus CLOCK_BOOTTIME at that first open, but never less than what the
-- previous boot wrote (max(executions.updated_at) + 1 - CLOCK_BOOTTIME): the clock never runs
-- backwards across a reboot, and every lease of an earlier boot has lapsed by the time it is
-- read (its holder is gone).
CREATE TABLE clock_anchor (
    boot_id    TEXT PRIMARY KEY,    -- /proc/sys/kernel/random/boot_id
    anchor_ms  INTEGER NOT NULL,
    created_at INTEGER NOT NULL     -- unix ms (wall clock), for people
) WITHOUT ROWID;
