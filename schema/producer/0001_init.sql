-- Producer database (calls.db). Owned by producer/store.c.
-- (placeholder; the producer issue defines calls, result_inbox and audit here)
CREATE TABLE producer_placeholder (id INTEGER PRIMARY KEY);
