-- SPDX-License-Identifier: Apache-2.0
-- PostgreSQL schema `onceq`: the console's calls page filtered by a status reads the calls of
-- that status only, newest id first (producer/store_pg.c, page_query): (state, call_id) walked
-- backwards from the page's upper bound. Without it a rare status (needs_review, pending) meant
-- reading the newest rows of every status until a page was full, and a page that was not full
-- counted a window of 200,000 rows to tell whether older ones remained. SQLite needs no such
-- index: calls_settled on (state) (every status but pending) is (state, rowid) underneath, the
-- rowid its pages are keyed on.
CREATE INDEX calls_state_id ON onceq.calls (state, call_id);
