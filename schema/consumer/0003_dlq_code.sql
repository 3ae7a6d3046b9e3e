-- Dead letters get a stable reason code beside the human-readable reason, for the header
-- onceq-dlq-reason of their copy on onceq.dlq (oq_consumer.h lists the codes; `onceq dlq`
-- shows them). Rows written before this migration had only the text: they read as
-- 'invalid_envelope', the code of every decode failure.
ALTER TABLE dlq ADD COLUMN code TEXT NOT NULL DEFAULT 'invalid_envelope';
--
-- (No table change for the redrive: a message id whose inbox row is 'dlq' and that arrives
-- again valid takes over that row once, audited 'dlq_redriven'; a copy marked by the header
-- onceq-redrive that still fails is a new dlq row. consumer/execution.c has the rule.)
