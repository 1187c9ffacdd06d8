-- asynccoord schema revision 3 (SQLite): a node that owns a few partitions claims by seeking
-- them instead of walking every pending task of the queue.
-- Queues claimed by such nodes at least once (queue.py). Only their tasks carry by_partition = 1
-- and enter coord_tasks_pending_partition: its order is not the claims' global order, so every
-- claim and enqueue writes its own pages of it, and a queue claimed without partitions (or by
-- a node owning most of them) does not pay for it. The first such claim of a queue adds it here
-- and flags the queue's tasks that may be pending again, in the same transaction.
CREATE TABLE coord_partitioned_queues (
    queue TEXT PRIMARY KEY
) WITHOUT ROWID;
-- Set at insert (1 when the queue is in coord_partitioned_queues) and by that first claim; never
-- cleared.
ALTER TABLE coord_tasks ADD COLUMN by_partition INTEGER NOT NULL DEFAULT 0;
-- A process that opened the database before this revision inserts tasks without by_partition
-- (it keeps running its old statements until it restarts): in a queue of
-- coord_partitioned_queues such a task is flagged here, or no claim that seeks would ever see it.
CREATE TRIGGER coord_tasks_by_partition AFTER INSERT ON coord_tasks
WHEN NEW.by_partition = 0 AND EXISTS (SELECT 1 FROM coord_partitioned_queues WHERE queue = NEW.queue)
BEGIN
    UPDATE coord_tasks SET by_partition = 1 WHERE id = NEW.id;
END;
-- Pending tasks of a queue per partition, in the claim's order (priority, then FIFO): a claim
-- restricted to a small share of the partitions reads each owned partition's best tasks from a
-- seek here, so its cost does not grow with the other nodes' backlogs (coord_tasks_pending holds
-- all partitions in one order: a walk there steps over every task of the partitions the node
-- does not own that sorts ahead of its own). The columns after id make it covering for the claim.
CREATE INDEX coord_tasks_pending_partition ON coord_tasks (queue, partition, priority DESC, id, run_at, status, by_partition)
    WHERE status = 'pending' AND by_partition = 1;
-- The oldest due pending task (stats) is found in the scan that counts the queue's tasks by
-- status (queries.sql, stats_counts), which reads every row of the queue anyway, so this index
-- no longer pays for itself.
DROP INDEX coord_tasks_pending_due;
