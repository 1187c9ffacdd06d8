-- Named queries of the PostgreSQL store's dead-letter policy and discard
-- (backends/postgres/deadletters.py; schema and functions in migration_0003.sql). Head
-- upkeep (promote_heads in queries.sql, coord_compute_heads, coord_complete_batch) leaves a
-- key of a 'hold' queue without a head while a dead task precedes its earliest pending or
-- running task.

-- name: dead_letter_policy
SELECT dead_letters FROM coord_queue_settings WHERE queue = :queue::text;

-- name: dead_letter_policies
-- Every queue whose policy is not the default 'skip', by name (status lists them per queue).
SELECT queue, dead_letters FROM coord_queue_settings WHERE dead_letters <> 'skip' ORDER BY queue;

-- name: set_dead_letter_policy
-- Record the policy and, where it moves heads, recompute them under every key lock of the
-- queue (coord_set_dead_letters); how many heads it marked.
SELECT coord_set_dead_letters(:queue::text, :policy::text);

-- name: queue_holds
-- PostgreSQL only: whether the queue keeps heads and holds keys behind dead tasks, read
-- after share_queues (a policy change takes that lock exclusively).
SELECT EXISTS (SELECT 1 FROM coord_ordered_queues WHERE queue = :queue::text AND hold);

-- name: discard_dead
-- Dead tasks hold no head (is_head is kept for active tasks); in a queue that holds, the
-- caller locked the keys of the tasks (dead_keys, lock_keys; :keys) and promotes them after.
-- :keys NULL: any key (a queue that does not hold: no head moves).
DELETE FROM coord_tasks
 WHERE queue = :queue::text AND status = 'dead' AND (:ids::bigint[] IS NULL OR id = ANY(:ids::bigint[]))
   AND (:keys::text[] IS NULL OR partition_key = ANY(:keys::text[]))
RETURNING id, queue, partition_key, partition;

-- name: dead_letters
-- A page of :queue's dead tasks: ids above :after_id, ascending, at most :limit. One range
-- scan of coord_tasks_dead_order (migration_0005.sql); a read, also of a read-only store.
SELECT id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at
  FROM coord_tasks
 WHERE queue = :queue::text AND status = 'dead' AND id > :after_id::bigint
 ORDER BY id
 LIMIT :limit::integer;
