-- SPDX-License-Identifier: Apache-2.0
-- Producer database (calls.db). Owned by producer/store.c (all producer SQL lives there).
-- Applied after common/0001_outbox.sql (outbox + relay_lease) by oq_db_migrate with the set
-- oq_migrations_producer. Timestamps are unix milliseconds (INTEGER).

-- One logical tool call per (tenant, idem_key). state moves
--   pending -> running -> succeeded | failed | needs_review
-- and failed-with-a-retryable-error -> pending again (attempt + 1, new outbox row) when the
-- same key and the same fingerprint are submitted again. Terminal states are never left
-- otherwise. A key reused after expires_at has been purged is a new call.
CREATE TABLE calls (
    call_id     TEXT    PRIMARY KEY,             -- "c_" + 16 hex
    tenant      TEXT    NOT NULL DEFAULT 'default',
    idem_key    TEXT    NOT NULL,                -- client-chosen, 1..255 printable bytes
    fingerprint TEXT    NOT NULL,                -- sha256 hex of JCS {"tenant","tool","args"}
    tool        TEXT    NOT NULL,
    args        TEXT    NOT NULL,                -- canonical (RFC 8785) JSON of args
    state       TEXT    NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending','running','succeeded','failed','needs_review')),
    result      TEXT,                            -- JSON, set by a tool_result
    error       TEXT,                            -- JSON {"code","message","retryable"}
    attempt     INTEGER NOT NULL DEFAULT 1,      -- +1 on every retry-reset
    effect_id   TEXT,                            -- reported back by the consumer (downstream key)
    client_id   TEXT,                            -- optional, from the submitter
    seq         INTEGER,                         -- optional client sequence number
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,                -- created_at + key_ttl
    UNIQUE (tenant, idem_key)
);
CREATE INDEX calls_state ON calls(state);
-- Purge scans expired terminal calls in expires_at order.
CREATE INDEX calls_expires ON calls(expires_at);
CREATE INDEX calls_effect ON calls(effect_id) WHERE effect_id IS NOT NULL;

-- Dedupe of tool_result messages (Kafka redelivery, relay republish): one row per message_id
-- applied or rejected. Rows are purged together with their call (by call_id) or by age.
CREATE TABLE result_inbox (
    message_id  TEXT    PRIMARY KEY,
    call_id     TEXT    NOT NULL,
    status      TEXT    NOT NULL,                -- status carried by the message
    outcome     TEXT    NOT NULL,                -- 'applied' | 'stale' | 'unknown_call' | 'ignored'
    received_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX result_inbox_call ON result_inbox(call_id);
CREATE INDEX result_inbox_received ON result_inbox(received_at);

-- Append-only timeline of every call transition: 'submitted', 'retry_reset', 'running',
-- 'succeeded', 'failed', 'needs_review', 'result_stale', ... detail is JSON or NULL.
CREATE TABLE audit (
    id          INTEGER PRIMARY KEY,
    ts          INTEGER NOT NULL,
    call_id     TEXT    NOT NULL,
    event       TEXT    NOT NULL,
    detail      TEXT
);
CREATE INDEX audit_call ON audit(call_id, id);
