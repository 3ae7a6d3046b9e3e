-- SPDX-License-Identifier: Apache-2.0
-- Calls to downstream services (DESIGN.md "Calling downstream services"): an execution whose
-- answer was lost is stored UNKNOWN and reconciled against the downstream, through RECONCILING
-- while a lookup runs; what cannot be decided waits in NEEDS_REVIEW for an operator.
--
-- State machine after this migration (consumer/execution.c holds the one transition table):
--   PLANNED -> STARTED -> COMMITTED | FAILED_RETRYABLE | FAILED_FINAL | UNKNOWN
--   FAILED_RETRYABLE, SAFE_RETRY -> STARTED (after next_attempt_at)
--   STARTED whose lease lapsed -> UNKNOWN; RECONCILING whose lease lapsed -> UNKNOWN
--   UNKNOWN -> COMMITTED | SAFE_RETRY | FAILED_FINAL | NEEDS_REVIEW   (decided in one
--              transaction: the local effects table, or a declaration of the tool)
--   UNKNOWN -> RECONCILING -> COMMITTED | SAFE_RETRY | FAILED_FINAL | NEEDS_REVIEW | UNKNOWN
--              (a lookup at the downstream, outside any transaction, under a lease)
--   NEEDS_REVIEW -> COMMITTED | FAILED_FINAL | SAFE_RETRY   only by an operator (onceq review
--              resolve), fenced and audited ('review_resolved')
--   FAILED_FINAL -> PLANNED   only for a new producer attempt
--
-- SQLite cannot change a CHECK constraint in place, so executions is rebuilt: same columns in
-- the same order, rows copied in rowid order, then the new columns.

CREATE TABLE executions_v2 (
    call_id         TEXT    NOT NULL UNIQUE,
    tenant          TEXT    NOT NULL,
    idem_key        TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    tool            TEXT    NOT NULL,
    args            TEXT    NOT NULL,      -- JSON object
    -- (an OR chain, not IN (...): see 0001_init.sql)
    state           TEXT    NOT NULL CHECK (state = 'PLANNED' OR state = 'STARTED' OR
                        state = 'COMMITTED' OR state = 'FAILED_RETRYABLE' OR
                        state = 'FAILED_FINAL' OR state = 'UNKNOWN' OR
                        state = 'RECONCILING' OR state = 'SAFE_RETRY' OR
                        state = 'NEEDS_REVIEW'),
    attempt         INTEGER NOT NULL,      -- the producer's attempt (envelope "attempt")
    tries           INTEGER NOT NULL DEFAULT 0, -- tool runs within this attempt (retries)
    lease_owner     TEXT,                  -- worker holding the lease (STARTED, RECONCILING)
    lease_until     INTEGER,               -- unix ms
    fence           INTEGER NOT NULL DEFAULT 0, -- moves on every change of holder; writes check it
    result          TEXT,                  -- JSON object (COMMITTED)
    error           TEXT,                  -- JSON {"code","message","retryable"}: failures, and
                                           -- why an execution is UNKNOWN or NEEDS_REVIEW
    effect_id       TEXT,                  -- the idempotency key sent (from STARTED on); the
                                           -- effect's id once COMMITTED with an effect
    next_attempt_at INTEGER,               -- unix ms when a waiting row becomes due: PLANNED,
                                           -- FAILED_RETRYABLE, SAFE_RETRY (the next run) and
                                           -- UNKNOWN (the next lookup); NULL otherwise
    message_id      TEXT    NOT NULL,      -- inbox message that planned this attempt
    created_at      INTEGER NOT NULL,      -- unix ms
    updated_at      INTEGER NOT NULL,      -- unix ms
    started_at      INTEGER,               -- unix ms of the last claim (the last request sent)
    unknown_at      INTEGER,               -- unix ms the current unknown episode began (UNKNOWN,
                                           -- RECONCILING, and kept in NEEDS_REVIEW)
    lookups         INTEGER NOT NULL DEFAULT 0 -- undecided lookups in this episode (budget)
);
INSERT INTO executions_v2 (call_id, tenant, idem_key, fingerprint, tool, args, state, attempt,
                           tries, lease_owner, lease_until, fence, result, error, effect_id,
                           next_attempt_at, message_id, created_at, updated_at)
    SELECT call_id, tenant, idem_key, fingerprint, tool, args, state, attempt, tries,
           lease_owner, lease_until, fence, result, error, effect_id, next_attempt_at,
           message_id, created_at, updated_at
    FROM executions ORDER BY rowid;
DROP TABLE executions;
ALTER TABLE executions_v2 RENAME TO executions;
CREATE INDEX executions_due ON executions(next_attempt_at) WHERE next_attempt_at IS NOT NULL;
-- leases: both states that hold one (a query on one state uses it: SQLite sees that
-- state = 'STARTED' implies the OR)
CREATE INDEX executions_lease ON executions(lease_until)
    WHERE state = 'STARTED' OR state = 'RECONCILING';
-- the unsettled executions (recovery, the review queue): rows enter and leave it only when
-- an answer was lost, so the hot path (PLANNED -> STARTED -> COMMITTED) never writes it
CREATE INDEX executions_unsettled ON executions(state, updated_at)
    WHERE state = 'UNKNOWN' OR state = 'RECONCILING' OR state = 'NEEDS_REVIEW';

-- The downstream's own id of the object the call created (a payment id, a ticket number),
-- from the answer or from the lookup that found it; NULL for local effects.
ALTER TABLE effects ADD COLUMN downstream_id TEXT;

-- audit events added: 'reconciling' (a lookup sent), 'review_resolved' (an operator's
-- decision: detail {"as","ref","note","by"}), 'lookup' (a lookup answer that decided nothing).
