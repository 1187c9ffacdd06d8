-- asynccoord schema version 6 (SQLite): operator queries that stay cheap on big tables.
-- Oldest due pending task of a queue (stats): one seek instead of a walk of the pending tasks.
CREATE INDEX coord_tasks_pending_due ON coord_tasks (queue, run_at) WHERE status = 'pending';
-- purge_finished: the oldest done tasks of a queue, without scanning the table.
CREATE INDEX coord_tasks_done_age ON coord_tasks (queue, updated_at) WHERE status = 'done';
