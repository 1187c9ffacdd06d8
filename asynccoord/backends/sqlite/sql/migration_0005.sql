-- asynccoord schema version 5 (SQLite): claim scans that do not walk past leased tasks,
-- and per-key head upkeep only for the queues that are claimed in order.
-- The claim indexes of version 1 covered every active task, so a claim stepped over each
-- running task ahead of the first pending one: with 64 nodes x 32 tasks in flight, some
-- 2,000 rows per claim. Pending tasks get their own partial indexes (a claim removes the
-- task from them, a retry or release adds it back); expired leases are found through
-- coord_tasks_lease_expiry, which already holds exactly the running tasks.
DROP INDEX coord_tasks_claim;
DROP INDEX coord_tasks_heads;
-- Claim scan: pending tasks of a queue in priority-then-FIFO order. The columns after id
-- make the index covering for the claim's filter: a node claiming its own partitions
-- steps over other nodes' tasks and not-yet-due retries in the index alone (about 0.15 us
-- per entry), without reading their rows.
CREATE INDEX coord_tasks_pending ON coord_tasks (queue, priority DESC, id, partition, run_at, status)
    WHERE status = 'pending';
-- Ordered claim scan: the pending heads of the keys, in the same order.
CREATE INDEX coord_tasks_pending_heads ON coord_tasks (queue, priority DESC, id, partition, run_at, status, is_head)
    WHERE status = 'pending' AND is_head = 1;

-- Queues claimed in per-key order at least once. Only their tasks carry an is_head flag
-- that every transition keeps up to date; the first ordered claim of a queue adds it here
-- and computes its heads from scratch in the same transaction. Queues with active tasks
-- had their heads kept by version 4 already.
CREATE TABLE coord_ordered_queues (
    queue TEXT PRIMARY KEY
) WITHOUT ROWID;
INSERT INTO coord_ordered_queues (queue) SELECT DISTINCT queue FROM coord_tasks WHERE active = 1;
