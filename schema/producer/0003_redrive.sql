-- Producer database, migration 3: stuck-call redrive (anti-entropy).
--
-- A call that is not terminal and has heard nothing for --redrive-after is "redriven": the
-- producer publishes its tool_call message once more, with the same message id (decide.c,
-- oq_outbox_republish). That repairs a call message or a result message lost on the way (a
-- broker that acknowledged a write it never stored; a consumer group reset past a message):
-- the consumer's inbox knows the id, so a call in flight is left alone, and a call already
-- terminal has its result re-emitted under that result's own message id, which the
-- result_inbox below dedupes when the first copy did arrive.
--
--   message_id      the message id of the current attempt's tool_call (the outbox row may be
--                   gone to retention by the time a redrive needs it). NULL for calls written
--                   before this migration whose outbox row is gone: a redrive then draws one.
--   redrive_count   redrives of the current attempt (0 after a submit or a retry-reset).
--   next_redrive_at unix ms when the call is due to be looked at; NULL once the call is
--                   terminal, or when the producer runs with redrive off. The spacing grows
--                   exponentially with redrive_count (decide.c).
--
-- Only open calls are in calls_redrive (the partial index), so a pass reads the due calls and
-- nothing else; its keys are times, so a submit appends to the index's right-most leaf.
ALTER TABLE calls ADD COLUMN message_id TEXT;
ALTER TABLE calls ADD COLUMN redrive_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE calls ADD COLUMN next_redrive_at INTEGER;

-- Open calls keep the id of their newest outbox row (the current attempt's message) ...
UPDATE calls SET message_id = o.message_id
  FROM (SELECT key, message_id, max(seq) FROM outbox GROUP BY key) AS o
  WHERE o.key = calls.call_id AND (calls.state = 'pending' OR calls.state = 'running');
-- ... and become due two minutes (the default --redrive-after) after their last change.
UPDATE calls SET next_redrive_at = updated_at + 120000
  WHERE state = 'pending' OR state = 'running';

CREATE INDEX calls_redrive ON calls(next_redrive_at) WHERE next_redrive_at IS NOT NULL;
