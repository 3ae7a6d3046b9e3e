-- SPDX-License-Identifier: Apache-2.0
-- Dead letters of the outbox: rows the relay set aside because Kafka refused them for good.
--
-- A row that fails with a permanent per-message error (too large for message.max.bytes, a
-- record the broker rejects, ...: relay/README.md lists them and why) would otherwise stop the
-- watermark for ever, and every row behind it with it. The relay copies such a row here, in
-- the same fenced transaction that moves the watermark over it, and moves on. The outbox row
-- itself is then deleted by the usual retention; this copy stays until the database's owner
-- handled it and its retention passed (the producer fails the call and purges the row with the
-- call's key TTL).
CREATE TABLE outbox_dead (
    seq         INTEGER PRIMARY KEY,       -- the outbox row's seq (its place in publish order)
    message_id  TEXT    NOT NULL,
    topic       TEXT    NOT NULL,
    key         TEXT    NOT NULL,          -- Kafka key: the call_id
    payload     BLOB    NOT NULL,          -- the envelope, as it was in the outbox
    created_at  INTEGER NOT NULL,          -- unix ms, of the outbox row
    reason      TEXT    NOT NULL,          -- librdkafka error name, e.g. MSG_SIZE_TOO_LARGE
    detail      TEXT,                      -- human-readable: sizes, the broker's message
    dead_at     INTEGER NOT NULL,          -- unix ms, when the relay set it aside
    handled_at  INTEGER                    -- unix ms, when the owner acted on it; NULL = not yet
);
CREATE INDEX outbox_dead_unhandled ON outbox_dead(seq) WHERE handled_at IS NULL;
