-- SPDX-License-Identifier: Apache-2.0
-- Consumer database (effects.db), shared by every worker process of one consumer group on one
-- host (WAL). Owned by consumer/store.c: all SQL against these tables lives there.
--
-- Execution state machine (docs/DESIGN.md "States"):
--   PLANNED -> STARTED -> COMMITTED | FAILED_RETRYABLE | FAILED_FINAL
--   FAILED_RETRYABLE -> STARTED (after next_attempt_at; tries < max attempts) | FAILED_FINAL
--   STARTED with a lapsed lease -> UNKNOWN -> COMMITTED (effect present, result re-emitted)
--                                          | SAFE_RETRY (no effect) -> STARTED
--                                          | NEEDS_REVIEW (no effect, tries exhausted)
--   Terminal: COMMITTED, FAILED_FINAL, NEEDS_REVIEW. Recovery never touches them. The one way
--   out of a terminal state is a NEW producer attempt of a FAILED_FINAL call (envelope attempt
--   > executions.attempt): it re-plans the row (audit 'planned' with the new attempt). A
--   COMMITTED execution is never re-executed; effects.call_id UNIQUE is the last gate.

-- Every message seen on onceq.tool-calls, keyed by the envelope's message_id (or, for a message
-- without a usable id, "dlq:<topic>:<partition>:<offset>"). A redelivered message hits the
-- primary key, is counted in `seen` and skipped.
CREATE TABLE inbox (
    message_id  TEXT    PRIMARY KEY,
    call_id     TEXT,                      -- NULL when the message did not decode
    topic       TEXT    NOT NULL,
    partition   INTEGER NOT NULL,
    offset      INTEGER NOT NULL,
    received_at INTEGER NOT NULL,          -- unix ms
    outcome     TEXT    NOT NULL,          -- see below
    seen        INTEGER NOT NULL DEFAULT 1 -- deliveries of this message_id (> 1: duplicates)
) WITHOUT ROWID;
-- outcome: 'planned'     new execution (or a new attempt of a FAILED_FINAL one) planned
--          'done'        the call is already terminal: result re-emitted, nothing executed
--          'in_progress' the call is already being executed: nothing to do
--          'stale'       an older attempt than the execution's: ignored
--          'dlq'         undecodable / invalid: copied to the dlq table and onceq.dlq
-- (no index on call_id: nothing on the hot path looks the inbox up by call, and call ids are
-- random, so such an index would cost one scattered b-tree write per message)

-- Rowid tables with a narrow UNIQUE index on call_id, not WITHOUT ROWID keyed by it: call ids
-- are random, so a b-tree keyed by them takes one scattered page write per insert; keeping
-- the wide rows in rowid (insertion) order makes their pages append-only and leaves only the
-- narrow index scattered (measured: about half the WAL bytes per call, see bench consumer).
CREATE TABLE executions (
    call_id         TEXT    NOT NULL UNIQUE,
    tenant          TEXT    NOT NULL,
    idem_key        TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    tool            TEXT    NOT NULL,
    args            TEXT    NOT NULL,      -- JSON object
    -- (an OR chain, not IN (...): SQLite builds an ephemeral table per row for IN lists of
    -- more than two values, which costs a page-cache allocation on every write)
    state           TEXT    NOT NULL CHECK (state = 'PLANNED' OR state = 'STARTED' OR
                        state = 'COMMITTED' OR state = 'FAILED_RETRYABLE' OR
                        state = 'FAILED_FINAL' OR state = 'UNKNOWN' OR state = 'SAFE_RETRY' OR
                        state = 'NEEDS_REVIEW'),
    attempt         INTEGER NOT NULL,      -- the producer's attempt (envelope "attempt")
    tries           INTEGER NOT NULL DEFAULT 0, -- tool runs within this attempt (retries)
    lease_owner     TEXT,                  -- worker id holding the lease (STARTED only)
    lease_until     INTEGER,               -- unix ms
    fence           INTEGER NOT NULL DEFAULT 0, -- +1 on every claim and recovery; writes check it
    result          TEXT,                  -- JSON object (COMMITTED)
    error           TEXT,                  -- JSON {"code","message","retryable"} (failures)
    effect_id       TEXT,                  -- the effect's id (COMMITTED with an effect)
    next_attempt_at INTEGER,               -- unix ms when a waiting row (PLANNED,
                                           -- FAILED_RETRYABLE, SAFE_RETRY) becomes due;
                                           -- NULL in every other state
    message_id      TEXT    NOT NULL,      -- inbox message that planned this attempt
    created_at      INTEGER NOT NULL,      -- unix ms
    updated_at      INTEGER NOT NULL       -- unix ms
);
CREATE INDEX executions_due ON executions(next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX executions_lease ON executions(lease_until) WHERE state = 'STARTED';
-- (no index on state: every transition would pay for it; counts by state scan the table)

-- Side effects. UNIQUE(call_id) is the last gate: a conflict means "already done", never a
-- second effect. effect_id ("e_" + the call id's hex, oq_effect_id_for) is stable per call and
-- is handed to the tool as the downstream idempotency key; being a function of call_id it is
-- unique without an index of its own (rowid table + one narrow index, as executions).
CREATE TABLE effects (
    call_id    TEXT    NOT NULL UNIQUE,
    effect_id  TEXT    NOT NULL,
    tool       TEXT    NOT NULL,
    amount     INTEGER,                    -- charge
    recipient  TEXT,                       -- send_email "to"
    detail     TEXT,                       -- JSON: the tool's result object
    attempt    INTEGER NOT NULL,
    fence      INTEGER NOT NULL,           -- fence of the execution that wrote it
    worker     TEXT    NOT NULL,
    created_at INTEGER NOT NULL            -- unix ms
);

-- Every state transition, in order (id). event = lowercase state name ('planned', 'started',
-- 'committed', 'failed_retryable', 'failed_final', 'unknown', 'safe_retry', 'needs_review') or
-- 'duplicate_skipped' (a redelivered or already-terminal call), 'lease_lost' (a stale worker's
-- write refused), 'dlq' (a message sent to the dead-letter topic; call_id may be NULL).
-- The first run of a fast tool happens inline, inside the batch transaction that plans it:
-- nobody can observe its PLANNED or STARTED state, so that path is ONE row whose event is the
-- outcome ('committed', 'failed_retryable', 'failed_final') and whose detail starts with
-- "inline: planned, started, try 1". Any later run (retry, recovery, a blocking tool) is
-- claimed and writes its own 'started' row, so "nothing starts after 'committed'" still
-- catches every re-execution.
CREATE TABLE audit (
    id      INTEGER PRIMARY KEY,
    ts      INTEGER NOT NULL,              -- unix ms
    call_id TEXT,
    event   TEXT    NOT NULL,
    attempt INTEGER,
    fence   INTEGER,
    worker  TEXT,
    detail  TEXT
);
-- (no index on call_id: audit is append-only and never read on a hot path; an index keyed by
-- random call ids cost one scattered page write per row. Per-call reads scan, and joins such
-- as onceq verify's get SQLite's automatic index.)

-- Dead letters: the original bytes and the reason, written in the batch transaction, then
-- produced to onceq.dlq (header onceq-dlq-reason) and marked; unpublished rows are retried.
CREATE TABLE dlq (
    id           INTEGER PRIMARY KEY,
    message_id   TEXT    NOT NULL,         -- inbox key
    topic        TEXT    NOT NULL,
    partition    INTEGER NOT NULL,
    offset       INTEGER NOT NULL,
    msg_key      BLOB,
    payload      BLOB,
    reason       TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    published_at INTEGER
);
CREATE INDEX dlq_pending ON dlq(id) WHERE published_at IS NULL;
