-- Consumer database (effects.db). Owned by consumer/store.c.
-- (placeholder; the consumer issue defines inbox, executions, effects and audit here)
CREATE TABLE consumer_placeholder (id INTEGER PRIMARY KEY);
