-- SPDX-License-Identifier: Apache-2.0
-- PostgreSQL schema `onceq`: tasks, an agent's run of steps (producer/tasks.c), the same rows
-- and constraints as the SQLite files schema/producer/0006_tasks.sql and 0007_task_review.sql
-- (see there for what each column means). A task is a request of its own ((tenant, idem_key)
-- unique); each step is an ordinary call in onceq.calls with a derived key; these tables hold
-- only the progress, and task_calls maps a call back to its task and step.
-- What PostgreSQL needs beyond SQLite:
--   tasks.pos  the list's position (newest first), drawn at insert; SQLite pages on its rowid
CREATE TABLE onceq.tasks (
    task_id      text   PRIMARY KEY,
    pos          bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    tenant       text   NOT NULL,
    idem_key     text   NOT NULL,
    fingerprint  text   NOT NULL,
    spec         text   NOT NULL,          -- the canonical request (RFC 8785)
    status       text   NOT NULL,          -- running, succeeded, compensating, compensated,
                                           -- failed, needs_review, awaiting_approval
    reason       text,
    created_at   bigint NOT NULL,          -- unix ms
    updated_at   bigint NOT NULL,
    review_fence bigint NOT NULL DEFAULT 0, -- the operator's episode (0007_task_review.sql)
    UNIQUE (tenant, idem_key)
);

CREATE TABLE onceq.task_steps (
    task_id       text    NOT NULL,
    idx           integer NOT NULL,        -- 0-based position in the request
    name          text    NOT NULL,
    status        text    NOT NULL,        -- pending, running, succeeded, failed, needs_review,
                                           -- compensating, compensated, skipped
    call_id       text,                    -- the step's call, once written
    comp_call_id  text,                    -- its compensation's call, once written
    comp_attempts bigint  NOT NULL DEFAULT 0,
    comp_next_at  bigint,                  -- a failed compensation's next attempt (ms), or NULL
    PRIMARY KEY (task_id, idx)
);

CREATE INDEX task_steps_retry ON onceq.task_steps (comp_next_at) WHERE comp_next_at IS NOT NULL;

CREATE TABLE onceq.task_calls (
    call_id text    PRIMARY KEY,
    task_id text    NOT NULL,
    idx     integer NOT NULL,
    role    text    NOT NULL               -- 'step' or 'compensate'
);

CREATE INDEX tasks_created ON onceq.tasks (created_at);
-- the list by status, newest first; the metrics: tasks by status
CREATE INDEX tasks_status ON onceq.tasks (status, pos);
CREATE INDEX task_steps_comp ON onceq.task_steps (status) WHERE comp_call_id IS NOT NULL;
