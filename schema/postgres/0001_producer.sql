-- SPDX-License-Identifier: Apache-2.0
-- PostgreSQL schema `onceq`, version 1: the producer's calls, result inbox, audit, and the
-- outbox with the relay's lease and dead letters. The same rows and constraints as the SQLite
-- files schema/common/0001..0003 and schema/producer/0001..0003 (times are unix ms, JSON is
-- kept as the exact text written, never re-serialized), plus what PostgreSQL needs:
--   outbox.pub_seq the relay's publish order, assigned by the relay after the row's transaction
--                  committed (NULL until then): seq is handed out at insert, not at commit, so a
--                  watermark over seq could skip a row whose transaction commits late; pub_seq
--                  values are drawn only by the serialized assigner (relay/store_pg.c) from
--                  committed rows, so every value at or below the watermark is final
--                  (docs/DESIGN.md, "The relay on PostgreSQL")
--   calls.settled_at      when the call became succeeded/failed (retention counts from it)
-- A statement-level trigger NOTIFYs channel onceq_outbox on every insert into the outbox.
-- Applied by oq_pg_migrate() (common/pg.c) inside one transaction; append new files, never
-- edit a released one.

CREATE TABLE onceq.outbox (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   text   NOT NULL UNIQUE,
    topic        text   NOT NULL,
    key          text   NOT NULL,          -- Kafka key: the call_id
    payload      text   NOT NULL,          -- envelope JSON, exact bytes
    created_at   bigint NOT NULL,          -- unix ms
    pub_seq      bigint UNIQUE             -- publish order (see above); NULL = not assigned yet
);
CREATE INDEX outbox_unassigned ON onceq.outbox (seq) WHERE pub_seq IS NULL;
CREATE SEQUENCE onceq.outbox_pub_seq AS bigint;

CREATE FUNCTION onceq.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('onceq_outbox', TG_TABLE_NAME);
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON onceq.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION onceq.outbox_notify();

-- The JSON of a text, or NULL when it is not JSON (a dead letter's payload may be anything).
CREATE FUNCTION onceq.try_jsonb(t text) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN t::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

CREATE TABLE onceq.relay_lease (
    name          text   PRIMARY KEY,      -- lease name, e.g. 'outbox'
    owner         text   NOT NULL,         -- holder id (host:pid:random)
    fence         bigint NOT NULL,         -- fencing token, +1 on every change of holder
    expires_at    timestamptz NOT NULL,    -- on the database server's clock
    published_seq bigint NOT NULL DEFAULT 0,
    published_at  bigint
);

CREATE TABLE onceq.outbox_dead (
    seq         bigint PRIMARY KEY,        -- the outbox row's seq
    message_id  text   NOT NULL,
    topic       text   NOT NULL,
    key         text   NOT NULL,
    payload     text   NOT NULL,
    created_at  bigint NOT NULL,
    reason      text   NOT NULL,
    detail      text,
    dead_at     bigint NOT NULL,
    handled_at  bigint
);
CREATE INDEX outbox_dead_unhandled ON onceq.outbox_dead (seq) WHERE handled_at IS NULL;

CREATE TABLE onceq.calls (
    call_id         text   PRIMARY KEY,
    tenant          text   NOT NULL DEFAULT 'default',
    idem_key        text   NOT NULL,
    fingerprint     text   NOT NULL,       -- sha256 hex of JCS {"tenant","tool","args"}
    tool            text   NOT NULL,
    args            text   NOT NULL,       -- canonical (RFC 8785) JSON text of args
    state           text   NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending','running','succeeded','failed','needs_review')),
    result          text,
    error           text,
    attempt         bigint NOT NULL DEFAULT 1,
    effect_id       text,
    client_id       text,
    seq             bigint,
    created_at      bigint NOT NULL,
    updated_at      bigint NOT NULL,
    expires_at      bigint NOT NULL,
    message_id      text,
    redrive_count   bigint NOT NULL DEFAULT 0,
    next_redrive_at bigint,
    settled_at      bigint,
    UNIQUE (tenant, idem_key)
);
CREATE INDEX calls_expires ON onceq.calls (expires_at);
CREATE INDEX calls_effect ON onceq.calls (effect_id) WHERE effect_id IS NOT NULL;
CREATE INDEX calls_settled ON onceq.calls (state) WHERE state <> 'pending';
CREATE INDEX calls_unheard ON onceq.calls (updated_at)
    WHERE next_redrive_at IS NULL AND (state = 'pending' OR state = 'running');
CREATE INDEX calls_redrive ON onceq.calls (next_redrive_at) WHERE next_redrive_at IS NOT NULL;

CREATE TABLE onceq.result_inbox (
    message_id  text   PRIMARY KEY,
    call_id     text   NOT NULL,
    status      text   NOT NULL,
    outcome     text   NOT NULL,           -- 'applied' | 'stale' | 'unknown_call' | 'ignored'
    received_at bigint NOT NULL
);
CREATE INDEX result_inbox_call ON onceq.result_inbox (call_id);
CREATE INDEX result_inbox_received ON onceq.result_inbox (received_at);

CREATE TABLE onceq.audit (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ts      bigint NOT NULL,
    call_id text   NOT NULL,
    event   text   NOT NULL,
    detail  text
);
CREATE INDEX audit_call ON onceq.audit (call_id, id);
