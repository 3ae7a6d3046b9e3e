-- SPDX-License-Identifier: Apache-2.0
-- The transactional outbox and the relay lease, shared by the producer database (calls.db)
-- and the consumer database (effects.db). Rows are appended inside the writer's own
-- transaction (oq_outbox_append) and published by the relay (relay/) in seq order.
-- AUTOINCREMENT: seq is never reused after the relay deletes published rows, so publish order
-- stays commit order across deletions.
CREATE TABLE outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id   TEXT    NOT NULL UNIQUE,
    topic        TEXT    NOT NULL,
    key          TEXT    NOT NULL,          -- Kafka key: the call_id
    payload      BLOB    NOT NULL,          -- envelope JSON (schema/envelope.schema.json)
    created_at   INTEGER NOT NULL,          -- unix ms
    published_at INTEGER                    -- unix ms of the delivery report; NULL = pending
);
CREATE INDEX outbox_pending ON outbox(seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published ON outbox(published_at) WHERE published_at IS NOT NULL;

-- One active relay per database: the holder of a row here publishes; every mark checks fence.
CREATE TABLE relay_lease (
    name       TEXT    PRIMARY KEY,        -- lease name, e.g. 'outbox'
    owner      TEXT    NOT NULL,           -- holder id (host:pid:random)
    fence      INTEGER NOT NULL,           -- fencing token, +1 on every change of holder
    expires_at INTEGER NOT NULL            -- unix ms
);
