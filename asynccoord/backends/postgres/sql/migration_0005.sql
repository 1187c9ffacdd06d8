-- asynccoord schema version 5 (PostgreSQL): claims that scan only what they can take.
-- The claim indexes of version 1 held every active task (coord_tasks_claim) and every
-- head (coord_tasks_heads), running ones included, so a claim stepped over each task in
-- flight and, with a partition filter, over every other node's heads: with 900 heads in
-- flight one ordered claim visited 1,000 heads (1,719 index entries) to return 10 to 100.
-- Pending tasks now have partial indexes of their own (a claim removes the task from
-- them, a retry, release or requeue adds it back); expired leases are found through
-- coord_tasks_lease_expiry, which holds exactly the running tasks.
DROP INDEX coord_tasks_claim;
DROP INDEX coord_tasks_heads;
-- Unordered claim scan: pending tasks of a queue in priority-then-FIFO order.
CREATE INDEX coord_tasks_pending ON coord_tasks (queue, priority DESC, id) WHERE status = 'pending';
-- Ordered claim scan of a claimer without a partition filter (a sole node, work stealing):
-- the pending heads of a queue in the same order.
CREATE INDEX coord_tasks_pending_heads ON coord_tasks (queue, priority DESC, id)
    WHERE is_head AND status = 'pending';
-- Ordered claim scan of a node owning some partitions: its own pending heads only (about
-- one per key of its partitions), sorted afterwards.
CREATE INDEX coord_tasks_pending_heads_partition ON coord_tasks (queue, partition, priority DESC, id)
    WHERE is_head AND status = 'pending';
