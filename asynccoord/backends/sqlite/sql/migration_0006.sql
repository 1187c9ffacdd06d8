-- asynccoord schema revision 6 (SQLite): only the queues claimed in per-key order keep the order
-- index. coord_tasks_key_order (revision 1) held every pending or running task, so every enqueue
-- added an entry and every completion deleted one, on a leaf page far from the others', in every
-- queue. Only head upkeep reads it (queries.sql: insert_task, promote_heads, recompute_heads,
-- recompute_queue_heads, claim_key_head), and heads are kept only in the queues of
-- coord_ordered_queues: an unordered queue paid for it and never read it.
-- Set at insert (1 when the queue is in coord_ordered_queues) and by the trigger below when the
-- queue enters coord_ordered_queues; never cleared. In a queue of coord_ordered_queues every task
-- that is not done carries it: dead tasks too, as a requeue makes them active again.
ALTER TABLE coord_tasks ADD COLUMN by_key INTEGER NOT NULL DEFAULT 0;
-- The first ordered claim of a queue adds it to coord_ordered_queues and then computes its heads
-- from scratch (recompute_queue_heads), in one transaction: the queue's tasks enter the index
-- here, in between. Each status is read from its own partial index (coord_tasks_pending,
-- coord_tasks_lease_expiry, coord_tasks_dead_order), never by a walk of the table. A process that
-- opened the database before this revision marks a queue ordered with its old statements: this
-- flags that queue's tasks all the same.
CREATE TRIGGER coord_ordered_queues_by_key AFTER INSERT ON coord_ordered_queues
BEGIN
    UPDATE coord_tasks SET by_key = 1 WHERE queue = NEW.queue AND status = 'pending' AND by_key = 0;
    UPDATE coord_tasks SET by_key = 1 WHERE queue = NEW.queue AND status = 'running' AND by_key = 0;
    UPDATE coord_tasks SET by_key = 1 WHERE queue = NEW.queue AND status = 'dead' AND by_key = 0;
END;
-- A process that opened the database before this revision inserts tasks without by_key (it keeps
-- running its old statements until it restarts): in a queue of coord_ordered_queues such a task is
-- flagged here, or head upkeep would never see it.
CREATE TRIGGER coord_tasks_by_key AFTER INSERT ON coord_tasks
WHEN NEW.by_key = 0 AND EXISTS (SELECT 1 FROM coord_ordered_queues WHERE queue = NEW.queue)
BEGIN
    UPDATE coord_tasks SET by_key = 1 WHERE id = NEW.id;
END;
-- The queues already ordered: their tasks that are not done.
UPDATE coord_tasks SET by_key = 1
 WHERE status <> 'done' AND queue IN (SELECT queue FROM coord_ordered_queues);
-- Per-key ordering: the active tasks of the ordered queues, by key then id (head upkeep). Every
-- statement that reads it says both by_key = 1 and active = 1. The statements of revision 5 say
-- active = 1 only and cannot use it: a process still running them reads the whole table for each
-- of its enqueues and each head it keeps (8 ms at 200,000 tasks; a requeue of many keys, seconds)
-- until it restarts, correct but slow enough to push other processes' writes past their busy
-- timeout. So every process on the file stops before the upgrade (CHANGELOG).
DROP INDEX coord_tasks_key_order;
CREATE INDEX coord_tasks_key_order ON coord_tasks (queue, partition_key, id) WHERE active = 1 AND by_key = 1;
