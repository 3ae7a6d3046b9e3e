-- SPDX-License-Identifier: Apache-2.0
-- PostgreSQL schema `onceq`: webhooks, the delivery outbox. The same columns and rules as
-- schema/producer/0005_webhooks.sql (read that file's comment): calls.callback_url, and one
-- webhook_deliveries row per settled attempt of a call with a callback, written in the
-- transaction that applies the settling result.
ALTER TABLE onceq.calls ADD COLUMN callback_url text;

CREATE TABLE onceq.webhook_deliveries (
    delivery_id text   PRIMARY KEY,
    call_id     text   NOT NULL,
    attempt     bigint NOT NULL,
    tenant      text   NOT NULL,
    url         text   NOT NULL,
    body        text   NOT NULL,
    state       text   NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending','delivered','dead')),
    tries       bigint NOT NULL DEFAULT 0,
    next_at     bigint,
    last_status bigint,
    last_error  text,
    created_at  bigint NOT NULL,
    updated_at  bigint NOT NULL,
    UNIQUE (call_id, attempt)
);
CREATE INDEX webhook_due ON onceq.webhook_deliveries (next_at) WHERE state = 'pending';
CREATE INDEX webhook_dead ON onceq.webhook_deliveries (updated_at) WHERE state = 'dead';
