-- Named queries for the SQLite store. Every task-returning query lists the columns
-- in the same order (see _row_to_task in backends/sqlite.py). Parameters are named.

-- name: now
SELECT (julianday('now') - 2440587.5) * 86400.0;

-- name: meta_get
SELECT value FROM coord_meta WHERE key = :key;

-- name: meta_set
INSERT INTO coord_meta (key, value) VALUES (:key, :value)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: insert_task
INSERT INTO coord_tasks (queue, partition_key, partition, idempotency_key, payload, priority,
                         status, attempts, max_attempts, run_at, version, created_at, updated_at)
VALUES (:queue, :partition_key, :partition, :idempotency_key, :payload, :priority,
        'pending', 0, :max_attempts, :run_at, 0, :now, :now)
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: select_by_idempotency_key
SELECT id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed FROM coord_tasks WHERE queue = :queue AND idempotency_key = :idempotency_key;

-- name: select_task
SELECT id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed FROM coord_tasks WHERE id = :id;

-- name: dead_letter_expired
-- Leases that expired on their last allowed attempt: dead, not claimable again.
UPDATE coord_tasks
   SET status = 'dead', last_error = 'lease expired on the last attempt (owner ' || coalesce(lease_owner, '?') || ')',
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE status = 'running' AND lease_expires_at <= :now AND attempts >= max_attempts AND queue = :queue
RETURNING id;

-- name: claim
UPDATE coord_tasks
   SET reclaimed = (status = 'running'),
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id, lease_token = :token || '.' || id, lease_expires_at = :now + :lease_s,
       version = version + 1, updated_at = :now
 WHERE id IN (
    SELECT t.id FROM coord_tasks AS t
     WHERE t.queue = :queue AND t.status IN ('pending', 'running')
       AND (CASE t.status WHEN 'pending' THEN t.run_at ELSE t.lease_expires_at END) <= :now
       AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
     ORDER BY t.priority DESC, t.id
     LIMIT :limit)
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: claim_ordered
-- Per-key ordering: only the earliest active task of each partition key is eligible.
UPDATE coord_tasks
   SET reclaimed = (status = 'running'),
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id, lease_token = :token || '.' || id, lease_expires_at = :now + :lease_s,
       version = version + 1, updated_at = :now
 WHERE id IN (
    SELECT t.id FROM coord_tasks AS t
     WHERE t.queue = :queue AND t.status IN ('pending', 'running')
       AND (CASE t.status WHEN 'pending' THEN t.run_at ELSE t.lease_expires_at END) <= :now
       AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
       AND NOT EXISTS (
           SELECT 1 FROM coord_tasks AS e
            WHERE e.queue = t.queue AND e.partition_key = t.partition_key
              AND e.status IN ('pending', 'running') AND e.id < t.id)
     ORDER BY t.priority DESC, t.id
     LIMIT :limit)
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: settle_duplicate
-- A claimed task whose message id was already processed: done without running it.
UPDATE coord_tasks
   SET status = 'done', result = '{"duplicate": true}', last_error = NULL,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE id = :id AND idempotency_key IS NOT NULL
   AND EXISTS (SELECT 1 FROM coord_processed AS p
                WHERE p.consumer = coord_tasks.queue AND p.message_id = coord_tasks.idempotency_key)
RETURNING id;

-- name: complete
UPDATE coord_tasks
   SET status = 'done', result = :result, last_error = NULL,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE id = :id AND lease_token = :lease_token AND version = :version
   AND status = 'running' AND lease_expires_at > :now
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: record_processed
INSERT INTO coord_processed (consumer, message_id, processed_at) VALUES (:consumer, :message_id, :now)
ON CONFLICT (consumer, message_id) DO NOTHING;

-- name: retry
UPDATE coord_tasks
   SET status = 'pending', run_at = :now + :delay_s, last_error = :error,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE id = :id AND lease_token = :lease_token AND version = :version
   AND status = 'running' AND lease_expires_at > :now
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: dead_letter
UPDATE coord_tasks
   SET status = 'dead', last_error = :error,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE id = :id AND lease_token = :lease_token AND version = :version
   AND status = 'running' AND lease_expires_at > :now
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: release
UPDATE coord_tasks
   SET status = 'pending', run_at = :now, attempts = max(attempts - 1, 0),
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE id = :id AND lease_token = :lease_token AND version = :version
   AND status = 'running' AND lease_expires_at > :now
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: extend
UPDATE coord_tasks SET lease_expires_at = :now + :lease_s
 WHERE id = :id AND lease_token = :lease_token AND version = :version
   AND status = 'running' AND lease_expires_at > :now
RETURNING lease_expires_at;

-- name: extend_many
UPDATE coord_tasks SET lease_expires_at = :now + :lease_s
 WHERE lease_token IN (SELECT value FROM json_each(:lease_tokens))
   AND status = 'running' AND lease_expires_at > :now
RETURNING lease_token;

-- name: stats_counts
SELECT status, count(*) FROM coord_tasks WHERE (:queue IS NULL OR queue = :queue) GROUP BY status;

-- name: stats_oldest_pending
SELECT min(run_at) FROM coord_tasks
 WHERE status = 'pending' AND run_at <= :now AND (:queue IS NULL OR queue = :queue);

-- name: requeue_dead
UPDATE coord_tasks
   SET status = 'pending', attempts = 0, run_at = :now, last_error = last_error,
       version = version + 1, updated_at = :now
 WHERE queue = :queue AND status = 'dead'
   AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
RETURNING id;

-- name: is_processed
SELECT 1 FROM coord_processed WHERE consumer = :consumer AND message_id = :message_id;

-- name: purge_processed_batch
DELETE FROM coord_processed
 WHERE rowid IN (SELECT rowid FROM coord_processed WHERE processed_at < :cutoff LIMIT :batch);

-- name: purge_finished_batch
DELETE FROM coord_tasks
 WHERE id IN (SELECT id FROM coord_tasks
               WHERE queue = :queue AND status = 'done' AND updated_at < :cutoff LIMIT :batch);
