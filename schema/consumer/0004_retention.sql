-- SPDX-License-Identifier: Apache-2.0
-- Consumer database, migration 4: retention of settled executions (issue 17, item 7).
--
-- Settled executions (COMMITTED, FAILED_FINAL) are deleted with their effect and audit rows
-- once they settled longer ago than the consumer's retention (consumer/execution.c, "what
-- retention deletes"); NEEDS_REVIEW and every other unsettled execution is kept. A deleted
-- execution must never run again, yet a message of its call can still come (the producer's
-- redrive, a topic replayed from an old offset). So each purge first raises the horizon below:
-- an execution is deleted only when it settled before it, and a message that finds no
-- execution and was created (envelope created_at) before it is never executed, it is
-- dead-lettered with reason `expired`. A message created after the horizon cannot belong to a
-- deleted execution: its call was submitted after every deleted one had settled.
CREATE TABLE retention (
    name    TEXT    PRIMARY KEY,     -- 'executions'
    horizon INTEGER NOT NULL         -- unix ms: only ever raised
) WITHOUT ROWID;
