-- SPDX-License-Identifier: Apache-2.0
-- Producer database, migration 6: tasks, an agent's run of steps (producer/tasks.c).
--
-- A task is a request of its own ((tenant, idem_key) unique, a fingerprint over the canonical
-- request, kept in `spec`), and each of its steps is an ordinary call with a derived key (the
-- task's key + "/" + the step's name; its compensation: + "/compensate"), written into `calls`
-- and the outbox like any other. These tables hold only the progress: which call a step is,
-- its status, and the compensation's attempts and next retry. The step's result is the
-- call's (calls.result), read when a later step's arguments cite it.
--
-- task_calls maps a call back to its task and step: the results ingest looks a result's call
-- up there (one probe of a primary key) and, in the same transaction that applied the result,
-- records the checkpoint and writes the next call.
CREATE TABLE tasks (
    task_id     TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    idem_key    TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    spec        TEXT NOT NULL,            -- the canonical request (RFC 8785)
    status      TEXT NOT NULL,            -- running, succeeded, compensating, compensated,
                                          -- failed, needs_review
    reason      TEXT,                     -- why it failed / needs review
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    UNIQUE (tenant, idem_key)
);

CREATE TABLE task_steps (
    task_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,       -- 0-based position in the request
    name          TEXT NOT NULL,
    status        TEXT NOT NULL,          -- pending, running, succeeded, failed, needs_review,
                                          -- compensating, compensated, skipped
    call_id       TEXT,                   -- the step's call, once written
    comp_call_id  TEXT,                   -- its compensation's call, once written
    comp_attempts INTEGER NOT NULL DEFAULT 0,
    comp_next_at  INTEGER,                -- a failed compensation's next attempt (ms), or NULL
    PRIMARY KEY (task_id, idx)
) WITHOUT ROWID;

CREATE INDEX task_steps_retry ON task_steps(comp_next_at) WHERE comp_next_at IS NOT NULL;

CREATE TABLE task_calls (
    call_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    idx     INTEGER NOT NULL,
    role    TEXT NOT NULL                 -- 'step' or 'compensate'
) WITHOUT ROWID;

CREATE INDEX tasks_created ON tasks(created_at);
-- the metrics: tasks by status, and how the compensations ended (a count over an index each)
CREATE INDEX tasks_status ON tasks(status);
CREATE INDEX task_steps_comp ON task_steps(status) WHERE comp_call_id IS NOT NULL;
