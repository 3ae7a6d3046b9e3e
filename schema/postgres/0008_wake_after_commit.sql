-- SPDX-License-Identifier: Apache-2.0
-- PostgreSQL schema `onceq`: the relay's wake-up leaves the durable commit (docs/SCALING.md,
-- "NOTIFY serialized the commits").
--
-- A transaction that NOTIFYs takes a cluster-wide lock at pre-commit and holds it until its
-- commit is done, WAL flush included (PostgreSQL's async.c: queue entries in commit order).
-- Every submit batch and every consumer batch inserted outbox rows, so the statement trigger
-- NOTIFYed from inside each of those durable commits: they went through that lock one at a
-- time, each waiting for its own fsync, never sharing one. Measured on this machine, 8 clients
-- committing 10 rows each: 9,000 commits/s without the NOTIFY, 4,600 with it.
--
-- onceq's own writers now set `onceq.wake = 'after'` on their sessions: the trigger leaves the
-- NOTIFY out, and right after the COMMIT (in the same round trip) the writer calls
-- onceq.wake(), a transaction of its own that commits without waiting for the flush. A wake-up
-- lost in a crash costs the relay one poll (at most a second), never a row: the rows' commit
-- was durable before it. Every other session (a service calling onceq.submit() in its own
-- transaction) keeps the trigger's NOTIFY, unchanged.
CREATE OR REPLACE FUNCTION onceq.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('onceq.wake', true) IS DISTINCT FROM 'after' THEN
        PERFORM pg_notify('onceq_outbox', TG_TABLE_NAME);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION onceq.wake() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true); -- this transaction only
    PERFORM pg_notify('onceq_outbox', 'wake');
END $$;
