-- SPDX-License-Identifier: Apache-2.0
-- Producer database, migration 7: an operator's hand on a task (producer/tasks.c).
--
-- review_fence numbers the episodes in which a task waits for a person: it moves each time
-- the task enters `awaiting_approval` (a step with "approval": true is next) or
-- `needs_review`. `onceq review resolve t_... --fence N` acts only while the task is still in
-- the episode N it was decided on; any other fence is refused (review_moved), nothing changed.
-- The decision itself is audited (audit.call_id = the task id, event 'task_review').
ALTER TABLE tasks ADD COLUMN review_fence INTEGER NOT NULL DEFAULT 0;
