-- SPDX-License-Identifier: Apache-2.0
-- Dead letters get a stable reason code beside the human-readable reason, for the header
-- onceq-dlq-reason of their copy on onceq.dlq (oq_consumer.h lists the codes; `onceq dlq`
-- shows them). Rows written before this migration had only the text: they read as
-- 'invalid_envelope', the code of every decode failure.
ALTER TABLE dlq ADD COLUMN code TEXT NOT NULL DEFAULT 'invalid_envelope';
-- A dead letter that is itself a redrive that failed again: the header onceq-redrive it
-- came with (the dead letter it was redriven from, "onceq.dlq:PARTITION:OFFSET"); its copy on
-- onceq.dlq carries the same header.
ALTER TABLE dlq ADD COLUMN redrive TEXT;
--
-- (The inbox needs no change for the redrive: a message id whose row is 'dlq' and that
-- arrives again valid takes over that row once, audited 'dlq_redriven'; a copy marked by the
-- header onceq-redrive that still fails is a new dlq row. consumer/execution.c has the rule.)
