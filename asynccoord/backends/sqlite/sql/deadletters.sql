-- Named queries of the SQLite store's dead-letter policy and discard (backends/sqlite/deadletters.py).
-- Head upkeep (queries.sql: insert_task, promote_heads, recompute_heads, recompute_queue_heads,
-- claim_key_head) leaves a key of a 'hold' queue without a head while a dead task of it
-- precedes its earliest pending or running task.

-- name: dead_letter_policy
SELECT dead_letters FROM coord_queue_settings WHERE queue = :queue;

-- name: dead_letter_policies
-- Every queue whose policy is not the default 'skip', by name (status lists them per queue).
SELECT queue, dead_letters FROM coord_queue_settings WHERE dead_letters <> 'skip' ORDER BY queue;

-- name: set_dead_letter_policy
INSERT INTO coord_queue_settings (queue, dead_letters) VALUES (:queue, :policy)
ON CONFLICT (queue) DO UPDATE SET dead_letters = excluded.dead_letters;

-- name: dead_letter_keys
-- The keys of :queue with a dead task: the only ones whose heads a change of policy moves.
SELECT DISTINCT queue, partition_key FROM coord_tasks WHERE queue = :queue AND status = 'dead';

-- name: discard_dead
DELETE FROM coord_tasks
 WHERE queue = :queue AND status = 'dead'
   AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
RETURNING queue, partition_key, partition;

-- name: dead_letters
-- A page of :queue's dead tasks: ids above :after_id, ascending, at most :limit. One seek of
-- coord_tasks_dead_order (migration_0004.sql), then one row read per task returned.
SELECT id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at
  FROM coord_tasks
 WHERE queue = :queue AND status = 'dead' AND id > :after_id
 ORDER BY id
 LIMIT :limit;
