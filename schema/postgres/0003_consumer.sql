-- SPDX-License-Identifier: Apache-2.0
-- PostgreSQL schema `onceq`, version 3: the consumer's rows (consumer/store_pg.c), the twin of
-- schema/consumer/0001..0005 on SQLite. Same rows and constraints: the inbox keyed by message
-- id, one execution per call (UNIQUE call_id) changed only by conditional updates on state and
-- fence, effects UNIQUE(call_id) as the last gate, the audit, the dead letters, the retention
-- horizon. Times are unix ms, JSON is kept as the exact text written.
--
-- Names: a producer and its consumers may share one database, and the producer already owns
-- onceq.audit (and onceq.calls, onceq.result_inbox): every consumer table is named consumer_*,
-- so a row's owner is plain from its name and neither stage's retention or counts ever reads
-- the other's rows. The one table both stages share on purpose is onceq.outbox (0001): its
-- rows name their topic, and the relay's publish scheme (pub_seq assigned after commit, one
-- fenced lease, LISTEN/NOTIFY) then serves the consumer's result events too, unchanged
-- (docs/DESIGN.md, "The consumer on PostgreSQL").
--
-- Leases: lease_until is unix ms on the database server's clock (the store reads
-- clock_timestamp() for the consumer's clock and decides lapses with it), so consumers on
-- hosts whose clocks disagree agree on who holds an execution. No lease clock anchor table:
-- SQLite's (0005) exists for processes of one host; here the server is the clock.

CREATE TABLE onceq.consumer_inbox (
    message_id  text   PRIMARY KEY,
    call_id     text,                      -- NULL when the message did not decode
    topic       text   NOT NULL,
    partition   integer NOT NULL,
    "offset"    bigint NOT NULL,
    received_at bigint NOT NULL,           -- unix ms
    outcome     text   NOT NULL,           -- 'planned' | 'done' | 'in_progress' | 'stale' | 'dlq'
    seen        bigint NOT NULL DEFAULT 1  -- deliveries of this message_id (> 1: duplicates)
);
CREATE INDEX consumer_inbox_call ON onceq.consumer_inbox (call_id);
CREATE INDEX consumer_inbox_received ON onceq.consumer_inbox (received_at);

CREATE TABLE onceq.consumer_executions (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, -- append order (retention)
    call_id         text   NOT NULL UNIQUE,
    tenant          text   NOT NULL,
    idem_key        text   NOT NULL,
    fingerprint     text   NOT NULL,
    tool            text   NOT NULL,
    args            text   NOT NULL,
    state           text   NOT NULL CHECK (state IN ('PLANNED','STARTED','COMMITTED',
                        'FAILED_RETRYABLE','FAILED_FINAL','UNKNOWN','RECONCILING','SAFE_RETRY',
                        'NEEDS_REVIEW')),
    attempt         bigint NOT NULL,
    tries           bigint NOT NULL DEFAULT 0,
    lease_owner     text,
    lease_until     bigint,                -- unix ms, server clock
    fence           bigint NOT NULL DEFAULT 0,
    result          text,
    error           text,
    effect_id       text,
    next_attempt_at bigint,
    message_id      text   NOT NULL,
    created_at      bigint NOT NULL,
    updated_at      bigint NOT NULL,
    started_at      bigint,
    unknown_at      bigint,
    lookups         bigint NOT NULL DEFAULT 0
);
CREATE INDEX consumer_executions_due ON onceq.consumer_executions (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
CREATE INDEX consumer_executions_lease ON onceq.consumer_executions (lease_until)
    WHERE state IN ('STARTED','RECONCILING');
CREATE INDEX consumer_executions_unsettled ON onceq.consumer_executions (state, updated_at)
    WHERE state IN ('UNKNOWN','RECONCILING','NEEDS_REVIEW');
CREATE INDEX consumer_executions_created ON onceq.consumer_executions (created_at);

CREATE TABLE onceq.consumer_effects (
    call_id       text   NOT NULL UNIQUE,  -- the last gate: one effect per call
    effect_id     text   NOT NULL,
    tool          text   NOT NULL,
    amount        bigint,
    recipient     text,
    detail        text,
    attempt       bigint NOT NULL,
    fence         bigint NOT NULL,
    worker        text   NOT NULL,
    created_at    bigint NOT NULL,
    downstream_id text
);

CREATE TABLE onceq.consumer_audit (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ts      bigint NOT NULL,
    call_id text,
    event   text   NOT NULL,
    attempt bigint,
    fence   bigint,
    worker  text,
    detail  text
);
CREATE INDEX consumer_audit_call ON onceq.consumer_audit (call_id, id);
CREATE INDEX consumer_audit_ts ON onceq.consumer_audit (ts);

CREATE TABLE onceq.consumer_dlq (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   text   NOT NULL,
    topic        text   NOT NULL,
    partition    integer NOT NULL,
    "offset"     bigint NOT NULL,
    msg_key      bytea,
    payload      bytea,
    reason       text   NOT NULL,
    created_at   bigint NOT NULL,
    published_at bigint,
    code         text   NOT NULL DEFAULT 'invalid_envelope',
    redrive      text
);
CREATE INDEX consumer_dlq_pending ON onceq.consumer_dlq (id) WHERE published_at IS NULL;

CREATE TABLE onceq.consumer_retention (
    name    text   PRIMARY KEY,            -- 'executions'
    horizon bigint NOT NULL                -- unix ms: only ever raised
);
-- the row exists from the start: intake reads it FOR SHARE (consumer/store_pg.c)
INSERT INTO onceq.consumer_retention (name, horizon) VALUES ('executions', 0);
