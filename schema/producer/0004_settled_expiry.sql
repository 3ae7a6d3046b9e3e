-- SPDX-License-Identifier: Apache-2.0
-- Producer database, migration 4: a key's retention counts from the moment its call settled.
--
-- A call is settled when it is `succeeded` or `failed`. One that is not (`pending`, `running`,
-- `needs_review`: an operator's decision may still come) never expires: it is never purged
-- and never replaced by a same-key submit, whatever its age (producer/decide.c). When a call
-- settles, expires_at is set to that moment + key_ttl; until then it keeps the value written
-- at submit, which nothing reads as an expiry.
--
-- Calls settled before this migration had expires_at = created_at + key_ttl. Their last change
-- (updated_at) is when they settled (a result that is not applied changes nothing), so the
-- same retention is re-based on it: updated_at + (expires_at - created_at). That is at least
-- key_ttl after settling (more for a call that was retried), so no key expires sooner than
-- before.
UPDATE calls SET expires_at = updated_at + (expires_at - created_at)
 WHERE (state = 'succeeded' OR state = 'failed') AND updated_at > created_at;
