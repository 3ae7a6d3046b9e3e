-- SPDX-License-Identifier: Apache-2.0
-- Producer database, migration 8: calls_expires holds only the settled calls.
--
-- Its one reader is the retention (producer/store.c, purge): expires_at <= now AND
-- (state='succeeded' OR state='failed') ORDER BY expires_at. Only a settled call expires
-- (0004_settled_expiry.sql); the expires_at written at submit is read by nothing. Yet every
-- submit wrote an entry for it, and the result that settled the call moved that entry (a
-- delete and an insert in one b-tree). Partial on the settled states, a submit writes no entry
-- and the settling result one. The purge's WHERE repeats the condition word for word, which
-- is how SQLite knows it may use the index (tests/unit/test_producer.c checks its plan).
-- The same index on PostgreSQL: schema/postgres/0007_hot_path_indexes.sql.
DROP INDEX calls_expires;
CREATE INDEX calls_expires ON calls(expires_at) WHERE state='succeeded' OR state='failed';
