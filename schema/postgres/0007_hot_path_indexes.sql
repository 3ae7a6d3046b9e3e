-- SPDX-License-Identifier: Apache-2.0
-- PostgreSQL schema `onceq`: fewer index entries per call on the hot path (docs/SCALING.md,
-- "Index entries per call"). A submit inserts a calls row and an outbox row, the relay numbers
-- the outbox row (pub_seq), the result settles the call: neither UPDATE can be HOT (each changes
-- an indexed column), so each writes one entry into every index whose predicate the new row
-- version matches. Indexes no query reads, or read only for a subset of the rows, cost that on
-- every call for nothing:
--   calls_settled  (state) WHERE state <> 'pending': every query it served on SQLite (a status
--                  page, the counts) reads calls_state_id (0005) or the whole table here
--   calls_effect   (effect_id): no PostgreSQL query looks a call up by its effect id (the counts'
--                  count(DISTINCT effect_id) reads the whole table in the same statement)
--   calls_expires  read only by the retention (producer/store_pg.c, purge: expires_at <= now
--                  AND state IN ('succeeded','failed') ORDER BY expires_at): partial on those
--                  states, so a submit (pending) writes no entry; the settling UPDATE writes it
--   outbox_pub_seq_key  UNIQUE (pub_seq) held a NULL entry for every row not numbered yet; every
--                  query on pub_seq has a strict condition on it (=, >, <=), so a partial index
--                  WHERE pub_seq IS NOT NULL answers them all and keeps the uniqueness the
--                  relay's watermark relies on (outbox_unassigned still finds the unnumbered)
-- Entries per call: calls 11 -> 8 (submit 5 -> 4, settle 6 -> 4), outbox 14 -> 12 (2 rows,
-- insert 4 -> 3, number 3 -> 3). Kept: calls_pkey, UNIQUE (tenant, idem_key), calls_state_id,
-- calls_unheard, calls_redrive, the outbox's primary key, UNIQUE (message_id), outbox_unassigned.
-- tests/unit/test_pg_indexes.c checks that each query whose index changed reads no table whole.
DROP INDEX onceq.calls_settled;
DROP INDEX onceq.calls_effect;
DROP INDEX onceq.calls_expires;
CREATE INDEX calls_expires ON onceq.calls (expires_at) WHERE state IN ('succeeded', 'failed');
ALTER TABLE onceq.outbox DROP CONSTRAINT outbox_pub_seq_key;
CREATE UNIQUE INDEX outbox_pub_seq_key ON onceq.outbox (pub_seq) WHERE pub_seq IS NOT NULL;
