-- SPDX-License-Identifier: Apache-2.0
-- Producer database, migration 5: webhooks (completion without polling), a delivery outbox.
--
-- calls.callback_url  where to POST the call once it settles (NULL: no webhook). Set at
--                     submit from the request's callback_url, or the tenant's default in the
--                     token file; a replay keeps the first one. Not part of the fingerprint.
--
-- webhook_deliveries  one row per settled attempt of a call with a callback_url, written by
--                     decide.c in the SAME transaction that applies the settling result
--                     (succeeded or failed), so a crash never loses one; the producer's sender
--                     (producer/webhooks.c) POSTs `body` to `url` until a 2xx, a try at a
--                     time, and records each try here:
--   delivery_id  a UUID: the Idempotency-Key header of every try (receivers dedupe by it)
--   attempt      the call's attempt it reports (a retryable failure resubmitted settles again
--                under a new attempt: another delivery, another id)
--   body         the call JSON as it stood in that transaction (GET /v1/tool-calls/{id}'s);
--                every try sends these exact bytes
--   state        pending -> delivered | dead (tries or age ran out); dead -> pending again only
--                by an operator (onceq dlq redrive ID --webhooks-db)
--   next_at      pending: when the next try is due (unix ms)
--   created_at   when it was queued (a redrive sets it again: the age budget counts from it)
-- Purged with their call (retention of keys).
ALTER TABLE calls ADD COLUMN callback_url TEXT;

CREATE TABLE webhook_deliveries (
    delivery_id TEXT    PRIMARY KEY,
    call_id     TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    tenant      TEXT    NOT NULL,
    url         TEXT    NOT NULL,
    body        TEXT    NOT NULL,
    state       TEXT    NOT NULL DEFAULT 'pending'
                CHECK (state = 'pending' OR state = 'delivered' OR state = 'dead'),
    tries       INTEGER NOT NULL DEFAULT 0,
    next_at     INTEGER,
    last_status INTEGER,                         -- HTTP status of the last answer; NULL: none
    last_error  TEXT,                            -- why the last try failed
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    UNIQUE (call_id, attempt)
);
CREATE INDEX webhook_due ON webhook_deliveries(next_at) WHERE state = 'pending';
CREATE INDEX webhook_dead ON webhook_deliveries(updated_at) WHERE state = 'dead';
