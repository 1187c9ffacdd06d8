-- Named queries of the SQLite store's rate limits (backends/sqlite/ratelimits.py).

-- name: rate_limits
SELECT dimension, count, per_s, burst FROM coord_rate_limits WHERE queue = :queue ORDER BY dimension;

-- name: limited_queues
SELECT DISTINCT queue FROM coord_rate_limits;

-- name: delete_rate_limits
DELETE FROM coord_rate_limits WHERE queue = :queue;

-- name: insert_rate_limit
INSERT INTO coord_rate_limits (queue, dimension, count, per_s, burst)
VALUES (:queue, :dimension, :count, :per_s, :burst);

-- name: bucket_tat
SELECT tat FROM coord_rate_buckets WHERE queue = :queue AND dimension = :dimension AND key = :key;

-- name: set_bucket_tat
INSERT INTO coord_rate_buckets (queue, dimension, key, tat) VALUES (:queue, :dimension, :key, :tat)
ON CONFLICT (queue, dimension, key) DO UPDATE SET tat = excluded.tat;

-- name: task_limit_keys
SELECT queue, limit_keys FROM coord_tasks WHERE id = :id;

-- name: limited_candidates
-- The claim of a queue with limits: every task claim_ordered / claim would consider (due
-- pending tasks and expired leases), best first, with its partition and limit keys; the
-- claim takes them in this order while their buckets have tokens.
SELECT id, partition, limit_keys FROM (
    SELECT t.id, t.priority, t.partition, t.limit_keys FROM coord_tasks AS t
     WHERE t.queue = :queue AND t.status = 'pending' AND t.run_at <= :now - :min_due_age_s
       AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
    UNION ALL
    SELECT t.id, t.priority, t.partition, t.limit_keys FROM coord_tasks AS t
     WHERE t.queue = :queue AND t.status = 'running' AND t.lease_expires_at <= :now - :min_due_age_s
       AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions))))
 ORDER BY priority DESC, id;

-- name: limited_candidates_ordered
-- limited_candidates of an ordered claim: keys' heads only.
SELECT id, partition, limit_keys FROM (
    SELECT t.id, t.priority, t.partition, t.limit_keys FROM coord_tasks AS t
     WHERE t.queue = :queue AND t.status = 'pending' AND t.is_head = 1 AND t.run_at <= :now - :min_due_age_s
       AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
    UNION ALL
    SELECT t.id, t.priority, t.partition, t.limit_keys FROM coord_tasks AS t
     WHERE t.queue = :queue AND t.status = 'running' AND t.is_head = 1 AND t.lease_expires_at <= :now - :min_due_age_s
       AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions))))
 ORDER BY priority DESC, id;

-- name: limited_pending
-- limited_candidates when no lease of the queue has expired: due pending tasks only, read in
-- the order of coord_tasks_pending, which is the claim's own, so the walk streams (no sort of
-- every due task before the first row) and stops once the claim has chosen enough.
SELECT t.id, t.partition, t.limit_keys FROM coord_tasks AS t INDEXED BY coord_tasks_pending
 WHERE t.queue = :queue AND t.status = 'pending' AND t.run_at <= :now - :min_due_age_s
   AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
 ORDER BY t.priority DESC, t.id;

-- name: limited_pending_ordered
-- limited_pending of an ordered claim: keys' heads only (coord_tasks_pending_heads).
SELECT t.id, t.partition, t.limit_keys FROM coord_tasks AS t INDEXED BY coord_tasks_pending_heads
 WHERE t.queue = :queue AND t.status = 'pending' AND t.is_head = 1 AND t.run_at <= :now - :min_due_age_s
   AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
 ORDER BY t.priority DESC, t.id;

-- name: claim_ids
-- Lease the tasks :ids (a JSON array) chosen by a limited claim in the same transaction;
-- same columns as the claims of queries.sql.
UPDATE coord_tasks
   SET reclaimed = (status = 'running'),
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id, lease_token = :token || '.' || id, lease_expires_at = :now + :lease_s,
       version = version + 1, updated_at = :now
 WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING id, partition_key, partition, idempotency_key, payload, priority, attempts, max_attempts, run_at, lease_token, version, last_error, result, created_at, reclaimed;

-- name: release_rate_limited
-- A provider's rate limit: back to pending, the attempt not counted, due after :delay_s.
UPDATE coord_tasks
   SET status = 'pending', run_at = :now + :delay_s, attempts = max(attempts - 1, 0), last_error = :error,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE id = :id AND lease_token = :lease_token AND version = :version
   AND status = 'running' AND lease_expires_at > :now
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: held_buckets
-- Buckets with no token at :now, longest wait first: the wait is TAT - tau - now, with
-- tau = (burst - 1) * (per_s / count) of the limit the queue still declares. A read.
SELECT b.queue, b.dimension, b.key, b.tat - (l.burst - 1) * (l.per_s / l.count) - :now AS wait_s
  FROM coord_rate_buckets AS b
  JOIN coord_rate_limits AS l ON l.queue = b.queue AND l.dimension = b.dimension
 WHERE (:queue IS NULL OR b.queue = :queue)
   AND b.tat - (l.burst - 1) * (l.per_s / l.count) > :now
 ORDER BY wait_s DESC, b.queue, b.dimension, b.key
 LIMIT :limit;
