-- SPDX-License-Identifier: Apache-2.0
-- Producer database, migration 3: stuck-call redrive (anti-entropy).
--
-- A call that is not terminal and has heard nothing for --redrive-after is "redriven": the
-- producer publishes its tool_call message once more, with the same message id (decide.c,
-- oq_outbox_republish). That repairs a call message or a result message lost on the way (a
-- broker that acknowledged a write it never stored; a consumer group reset past a message):
-- the consumer's inbox knows the id, so a call in flight is left alone, and a call already
-- terminal has its result re-emitted under that result's own message id, which the
-- result_inbox dedupes when the first copy did arrive.
--
--   message_id      the message id of the current attempt's tool_call, kept because the
--                   outbox row may be gone to retention by the time a redrive needs it. NULL
--                   for calls written before this migration whose outbox row is gone (a
--                   redrive then draws one).
--   redrive_count   redrives of the current attempt (0 again after a retry-reset).
--   next_redrive_at unix ms when a call that was looked at once is due again; NULL while it
--                   was never looked at, and again once it is terminal.
--
-- Two partial indexes hold exactly the calls a pass may need, so a pass reads those and
-- nothing else: calls_unheard the open calls never looked at, by the time of their last
-- change (a submit appends to its right-most leaf; a result removes the entry); calls_redrive
-- the calls looked at before, by when they are due. No due time is written at submit, so a
-- producer started later with another --redrive-after (or with redrive turned on) applies it
-- to every open call.
ALTER TABLE calls ADD COLUMN message_id TEXT;
ALTER TABLE calls ADD COLUMN redrive_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE calls ADD COLUMN next_redrive_at INTEGER;

-- Open calls keep the id of their newest outbox row (the current attempt's message).
UPDATE calls SET message_id = o.message_id
  FROM (SELECT key, message_id, max(seq) FROM outbox GROUP BY key) AS o
  WHERE o.key = calls.call_id AND (calls.state = 'pending' OR calls.state = 'running');

CREATE INDEX calls_unheard ON calls(updated_at)
  WHERE next_redrive_at IS NULL AND (state = 'pending' OR state = 'running');
CREATE INDEX calls_redrive ON calls(next_redrive_at) WHERE next_redrive_at IS NOT NULL;
