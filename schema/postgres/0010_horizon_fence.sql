-- SPDX-License-Identifier: Apache-2.0
-- PostgreSQL schema `onceq`: the retention horizon is fenced by an advisory lock, no longer by
-- a row lock on its row (consumer/store_pg.c, file comment; docs/SCALING.md, "The horizon's
-- fence without row locks").
--
-- Until version 9 every consumer batch read the horizon FOR SHARE: a WAL record and a write to
-- the one page of onceq.consumer_retention in every batch of every consumer, and a MultiXact
-- whenever two batches held it at once (86 % of the batches with four consumers). From this
-- version an intake takes the advisory lock shared and a purge takes it exclusive before it
-- raises the horizon, both until their transaction ends. Nothing in the tables changes; the
-- version changes so that a consumer from before it, which fences with the row lock, refuses
-- this database (newer schema) instead of purging beside consumers that fence with the advisory
-- lock. Stop every consumer before the upgrade, as the README's "Upgrades" says.
COMMENT ON TABLE onceq.consumer_retention IS
    'the executions retention horizon (unix ms, only raised); fenced by the advisory lock '
    'x''6f6e6365712d68'' (onceq-h): intakes take it shared before reading, a purge exclusive '
    'before raising (consumer/store_pg.c)';
