-- Named queries for the SQLite store. Every task-returning query lists the columns
-- in the same order (see task_from_row in backends/_common.py). Parameters are named.

-- name: now
SELECT (julianday('now') - 2440587.5) * 86400.0;

-- name: meta_get
SELECT value FROM coord_meta WHERE key = :key;

-- name: meta_set
INSERT INTO coord_meta (key, value) VALUES (:key, :value)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: insert_task
-- In a queue of coord_ordered_queues the task enters the order index (by_key, migration_0006.sql)
-- and is its key's head when the key has no other active task (and no dead one holds it).
INSERT INTO coord_tasks (queue, partition_key, partition, idempotency_key, payload, priority,
                         status, is_head, attempts, max_attempts, run_at, version, created_at, updated_at, limit_keys,
                         by_partition, by_key)
VALUES (:queue, :partition_key, :partition, :idempotency_key, :payload, :priority, 'pending',
        EXISTS (SELECT 1 FROM coord_ordered_queues WHERE queue = :queue)
        AND NOT EXISTS (SELECT 1 FROM coord_tasks AS e
                         WHERE e.queue = :queue AND e.partition_key = :partition_key AND e.active = 1 AND e.by_key = 1)
        AND NOT (EXISTS (SELECT 1 FROM coord_queue_settings WHERE queue = :queue AND dead_letters = 'hold')
                 AND EXISTS (SELECT 1 FROM coord_tasks AS d
                              WHERE d.queue = :queue AND d.partition_key = :partition_key AND d.status = 'dead')),
        0, :max_attempts, :run_at, 0, :now, :now, :limit_keys,
        EXISTS (SELECT 1 FROM coord_partitioned_queues WHERE queue = :queue),
        EXISTS (SELECT 1 FROM coord_ordered_queues WHERE queue = :queue))
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: select_by_idempotency_key
SELECT id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed FROM coord_tasks WHERE queue = :queue AND idempotency_key = :idempotency_key;

-- name: select_task
SELECT id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed FROM coord_tasks WHERE id = :id;

-- name: promote_heads
-- :keys is a JSON array of [queue, partition_key] whose head may have left the active
-- set: mark each key's earliest active task as its head (ordered queues only), unless a dead
-- task precedes it in a queue whose dead-letter policy is 'hold' (deadletters.sql). Returns
-- the queue and partition of every new head (claimable now, if due). The active tasks of an
-- ordered queue all carry by_key (migration_0006.sql): each key is one seek of coord_tasks_key_order.
UPDATE coord_tasks SET is_head = 1
 WHERE is_head = 0 AND id IN (
    SELECT (SELECT t.id FROM coord_tasks AS t
             WHERE t.queue = json_extract(k.value, '$[0]') AND t.partition_key = json_extract(k.value, '$[1]')
               AND t.active = 1 AND t.by_key = 1
             ORDER BY t.id LIMIT 1)
      FROM json_each(:keys) AS k
     WHERE json_extract(k.value, '$[0]') IN (SELECT queue FROM coord_ordered_queues))
   AND NOT (EXISTS (SELECT 1 FROM coord_queue_settings AS s WHERE s.queue = coord_tasks.queue AND s.dead_letters = 'hold')
       AND EXISTS (SELECT 1 FROM coord_tasks AS d
                    WHERE d.queue = coord_tasks.queue AND d.partition_key = coord_tasks.partition_key
                      AND d.status = 'dead' AND d.id < coord_tasks.id))
RETURNING queue, partition;

-- name: recompute_heads
-- After tasks rejoin or leave the order out of turn (requeue, discard, a new dead-letter
-- policy): heads of :keys from scratch (ordered queues only; held keys have none).
UPDATE coord_tasks
   SET is_head = (id = (SELECT min(e.id) FROM coord_tasks AS e
                         WHERE e.queue = coord_tasks.queue AND e.partition_key = coord_tasks.partition_key
                           AND e.active = 1 AND e.by_key = 1))
                 AND NOT (EXISTS (SELECT 1 FROM coord_queue_settings AS s WHERE s.queue = coord_tasks.queue AND s.dead_letters = 'hold')
                      AND EXISTS (SELECT 1 FROM coord_tasks AS d
                                   WHERE d.queue = coord_tasks.queue AND d.partition_key = coord_tasks.partition_key
                                     AND d.status = 'dead' AND d.id < coord_tasks.id))
 WHERE active = 1 AND id IN (
    SELECT t.id FROM json_each(:keys) AS k CROSS JOIN coord_tasks AS t  -- CROSS JOIN: each key a seek
     WHERE t.queue = json_extract(k.value, '$[0]') AND t.partition_key = json_extract(k.value, '$[1]')
       AND t.active = 1 AND t.by_key = 1 AND t.queue IN (SELECT queue FROM coord_ordered_queues));

-- name: recompute_heads_of_tasks
-- recompute_heads for the keys of the tasks :ids (a JSON array): for keys another tool stored
-- as no text (a BLOB, bytes that are no UTF-8), which a JSON text cannot name.
UPDATE coord_tasks
   SET is_head = (id = (SELECT min(e.id) FROM coord_tasks AS e
                         WHERE e.queue = coord_tasks.queue AND e.partition_key = coord_tasks.partition_key
                           AND e.active = 1 AND e.by_key = 1))
                 AND NOT (EXISTS (SELECT 1 FROM coord_queue_settings AS s WHERE s.queue = coord_tasks.queue AND s.dead_letters = 'hold')
                      AND EXISTS (SELECT 1 FROM coord_tasks AS d
                                   WHERE d.queue = coord_tasks.queue AND d.partition_key = coord_tasks.partition_key
                                     AND d.status = 'dead' AND d.id < coord_tasks.id))
 WHERE active = 1 AND id IN (
    SELECT t.id FROM json_each(:ids) AS j JOIN coord_tasks AS k ON k.id = j.value
     CROSS JOIN coord_tasks AS t
     WHERE t.queue = k.queue AND t.partition_key = k.partition_key
       AND t.active = 1 AND t.by_key = 1 AND t.queue IN (SELECT queue FROM coord_ordered_queues));

-- name: ordered_queues
-- Which of :queues (a JSON array) are claimed in order, i.e. keep per-key heads.
SELECT queue FROM coord_ordered_queues WHERE queue IN (SELECT value FROM json_each(:queues));

-- name: mark_ordered
-- First ordered claim of :queue: from now on its heads are kept (see recompute_queue_heads). Its
-- insert fires coord_ordered_queues_by_key (migration_0006.sql), which puts the queue's tasks
-- that are not done into coord_tasks_key_order, before recompute_queue_heads reads it.
INSERT INTO coord_ordered_queues (queue) VALUES (:queue) ON CONFLICT (queue) DO NOTHING;

-- name: recompute_queue_heads
-- Heads of every key of :queue, when the queue becomes ordered. A queue that was never
-- ordered has no is_head = 1 rows (inserts set it only for ordered queues, every exit
-- from the active set clears it), so marking each key's earliest active task suffices.
UPDATE coord_tasks SET is_head = 1
 WHERE id IN (SELECT min(id) FROM coord_tasks WHERE queue = :queue AND active = 1 AND by_key = 1 GROUP BY partition_key)
   AND NOT (EXISTS (SELECT 1 FROM coord_queue_settings AS s WHERE s.queue = coord_tasks.queue AND s.dead_letters = 'hold')
       AND EXISTS (SELECT 1 FROM coord_tasks AS d
                    WHERE d.queue = coord_tasks.queue AND d.partition_key = coord_tasks.partition_key
                      AND d.status = 'dead' AND d.id < coord_tasks.id));

-- name: dead_letter_exhausted
-- Leases that expired on the last allowed attempt: dead, before the claim runs (same
-- transaction), so they never take a claim slot or block their key.
UPDATE coord_tasks
   SET status = 'dead', active = 0, is_head = 0,
       last_error = 'lease expired on the last attempt (owner ' || coalesce(lease_owner, '?') || ')',
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE queue = :queue AND status = 'running' AND lease_expires_at <= :now AND attempts >= max_attempts
RETURNING id, queue, partition_key;

-- name: claim_probe
-- Is any lease of :queue expired (coord_tasks_lease_expiry, one seek)? Almost never: a claim
-- then takes the pending-only form below, which skips merging with expired leases. And does
-- :queue declare rate limits (one seek)? A queue without claims with the statements below, one
-- with limits as ratelimits.sql says.
SELECT EXISTS (SELECT 1 FROM coord_tasks WHERE queue = :queue AND status = 'running' AND lease_expires_at <= :now),
       EXISTS (SELECT 1 FROM coord_rate_limits WHERE queue = :queue);

-- Claims. Every form returns the same columns (the claiming node knows the rest: queue,
-- status 'running', lease owner, lease expiry :now + :lease_s, updated_at :now): id,
-- partition_key, partition, idempotency_key, payload, priority, attempts, max_attempts, run_at,
-- lease_token, version, last_error, result, created_at, reclaimed.

-- name: claim
-- Due pending tasks (coord_tasks_pending) and expired leases (coord_tasks_lease_expiry), merged
-- in priority-then-FIFO order: the best :limit of each side hold the best :limit overall.
UPDATE coord_tasks
   SET reclaimed = (status = 'running'),
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id, lease_token = :token || '.' || id, lease_expires_at = :now + :lease_s,
       version = version + 1, updated_at = :now
 WHERE id IN (
    SELECT id FROM (
        SELECT * FROM (
            SELECT t.id, t.priority FROM coord_tasks AS t
             WHERE t.queue = :queue AND t.status = 'pending' AND t.run_at <= :now - :min_due_age_s
               AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
             ORDER BY t.priority DESC, t.id
             LIMIT :limit)
        UNION ALL
        SELECT * FROM (
            SELECT t.id, t.priority FROM coord_tasks AS t
             WHERE t.queue = :queue AND t.status = 'running' AND t.lease_expires_at <= :now - :min_due_age_s
               AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
             ORDER BY t.priority DESC, t.id
             LIMIT :limit))
     ORDER BY priority DESC, id
     LIMIT :limit)
RETURNING id, partition_key, partition, idempotency_key, payload, priority, attempts, max_attempts, run_at, lease_token, version, last_error, result, created_at, reclaimed;

-- name: claim_pending
-- claim when no lease of the queue has expired: due pending tasks only, a walk of
-- coord_tasks_pending (for a node owning a small share of the partitions, see
-- claim_pending_partitions).
UPDATE coord_tasks
   SET reclaimed = 0,
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id, lease_token = :token || '.' || id, lease_expires_at = :now + :lease_s,
       version = version + 1, updated_at = :now
 WHERE id IN (
    SELECT t.id FROM coord_tasks AS t INDEXED BY coord_tasks_pending
     WHERE t.queue = :queue AND t.status = 'pending' AND t.run_at <= :now - :min_due_age_s
       AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
     ORDER BY t.priority DESC, t.id
     LIMIT :limit)
RETURNING id, partition_key, partition, idempotency_key, payload, priority, attempts, max_attempts, run_at, lease_token, version, last_error, result, created_at, reclaimed;

-- name: is_partitioned
SELECT 1 FROM coord_partitioned_queues WHERE queue = :queue;

-- name: mark_partitioned
-- From now on the tasks of :queue enter coord_tasks_pending_partition (insert_task sets
-- by_partition); seek.py flags the tasks it already has first, in stretches.
INSERT INTO coord_partitioned_queues (queue) VALUES (:queue) ON CONFLICT (queue) DO NOTHING;

-- name: flag_stretch_end
-- The last id of the next :rows rows of the table after :after, and how many there are.
SELECT max(id), count(*) FROM (SELECT id FROM coord_tasks WHERE id > :after ORDER BY id LIMIT :rows);

-- name: flag_partitioned_stretch
-- The tasks of :queue among those rows that are or may again be pending.
UPDATE coord_tasks SET by_partition = 1
 WHERE id > :after AND id <= :last AND queue = :queue AND status <> 'done' AND by_partition = 0;

-- name: claim_pending_partitions
-- claim_pending for a node that owns a small share of the partitions, in a queue of
-- coord_partitioned_queues (queue.py decides and marks it): one arm per owned partition reads its
-- due tasks from coord_tasks_pending_partition in claim order (a seek, then the index's own
-- order), and SQLite merges the arms (MERGE (UNION ALL): no sort), stopping after :limit rows.
-- So a claim reads about one entry per owned partition plus the tasks it takes, where a walk of
-- coord_tasks_pending steps over every pending task of the other nodes' partitions that sorts
-- ahead of this node's. The store repeats the arm between the "arm" and "end arm" comments once
-- per arm, each with its own parameter (:partition_0, :partition_1, ...; -1 pads the count to a
-- multiple of 8), joined by UNION ALL; values are bound, never formatted.
UPDATE coord_tasks
   SET reclaimed = 0,
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id, lease_token = :token || '.' || id, lease_expires_at = :now + :lease_s,
       version = version + 1, updated_at = :now
 WHERE id IN (
    SELECT id FROM (
        /* arm */
        SELECT t.priority, t.id FROM coord_tasks AS t INDEXED BY coord_tasks_pending_partition
         WHERE t.queue = :queue AND t.partition = :partition_N AND t.status = 'pending' AND t.by_partition = 1
           AND t.run_at <= :now - :min_due_age_s
        /* end arm */
         ORDER BY priority DESC, id
         LIMIT :limit))
RETURNING id, partition_key, partition, idempotency_key, payload, priority, attempts, max_attempts, run_at, lease_token, version, last_error, result, created_at, reclaimed;

-- name: claim_ordered
-- Per-key ordering: only the head (earliest active task) of each partition key is eligible;
-- a running head whose lease expired is the key's head still, and is reclaimed first.
UPDATE coord_tasks
   SET reclaimed = (status = 'running'),
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id, lease_token = :token || '.' || id, lease_expires_at = :now + :lease_s,
       version = version + 1, updated_at = :now
 WHERE id IN (
    SELECT id FROM (
        SELECT * FROM (
            SELECT t.id, t.priority FROM coord_tasks AS t
             WHERE t.queue = :queue AND t.status = 'pending' AND t.is_head = 1 AND t.run_at <= :now - :min_due_age_s
               AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
             ORDER BY t.priority DESC, t.id
             LIMIT :limit)
        UNION ALL
        SELECT * FROM (
            SELECT t.id, t.priority FROM coord_tasks AS t
             WHERE t.queue = :queue AND t.status = 'running' AND t.is_head = 1 AND t.lease_expires_at <= :now - :min_due_age_s
               AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
             ORDER BY t.priority DESC, t.id
             LIMIT :limit))
     ORDER BY priority DESC, id
     LIMIT :limit)
RETURNING id, partition_key, partition, idempotency_key, payload, priority, attempts, max_attempts, run_at, lease_token, version, last_error, result, created_at, reclaimed;

-- name: claim_pending_ordered
-- claim_ordered when no lease of the queue has expired: due pending heads only.
UPDATE coord_tasks
   SET reclaimed = 0,
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id, lease_token = :token || '.' || id, lease_expires_at = :now + :lease_s,
       version = version + 1, updated_at = :now
 WHERE id IN (
    SELECT t.id FROM coord_tasks AS t
     WHERE t.queue = :queue AND t.status = 'pending' AND t.is_head = 1 AND t.run_at <= :now - :min_due_age_s
       AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
     ORDER BY t.priority DESC, t.id
     LIMIT :limit)
RETURNING id, partition_key, partition, idempotency_key, payload, priority, attempts, max_attempts, run_at, lease_token, version, last_error, result, created_at, reclaimed;

-- name: claim_key_head
-- Commit-and-continue (complete_and_claim_next): the head of one key (its earliest active
-- task, coord_tasks_key_order: _keep_heads in queue.py has made the queue ordered), leased like
-- claim_pending_ordered leases it, if it is pending and due, and not held by a dead task
-- (deadletters.sql), and marked the key's head (as promote_heads would mark it). Same columns
-- as the claims.
UPDATE coord_tasks
   SET reclaimed = 0, is_head = 1,
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id, lease_token = :token || '.' || id, lease_expires_at = :now + :lease_s,
       version = version + 1, updated_at = :now
 WHERE id = (SELECT t.id FROM coord_tasks AS t
              WHERE t.queue = :queue AND t.partition_key = :partition_key AND t.active = 1 AND t.by_key = 1
              ORDER BY t.id LIMIT 1)
   AND status = 'pending' AND run_at <= :now
   AND (limit_keys IS NULL OR NOT EXISTS (SELECT 1 FROM coord_rate_limits WHERE queue = :queue))
   AND NOT (EXISTS (SELECT 1 FROM coord_queue_settings AS s WHERE s.queue = coord_tasks.queue AND s.dead_letters = 'hold')
       AND EXISTS (SELECT 1 FROM coord_tasks AS d
                    WHERE d.queue = coord_tasks.queue AND d.partition_key = coord_tasks.partition_key
                      AND d.status = 'dead' AND d.id < coord_tasks.id))
RETURNING id, partition_key, partition, idempotency_key, payload, priority, attempts, max_attempts, run_at, lease_token, version, last_error, result, created_at, reclaimed;

-- name: claimable_partitions
-- A read for the runtime's idle poll: the partitions (of :partitions, a JSON array, or all)
-- where a claim would find something now: a due pending task, or a lease expired :min_due_age_s
-- ago (also one on its last attempt: the claim dead-letters it and frees its key), whose
-- rate limits' buckets (declared dimensions) all have a token. A task whose limit_keys are not
-- a JSON object (a row written by another tool) counts: the claim dead-letters it.
-- coord_tasks_pending and coord_tasks_lease_expiry cover it; nothing is written.
SELECT t.partition FROM coord_tasks AS t
 WHERE t.queue = :queue AND t.status = 'pending' AND t.run_at <= :now - :min_due_age_s
   AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
   AND (t.limit_keys IS NULL OR NOT EXISTS (
        SELECT 1 FROM json_each(CASE WHEN NOT json_valid(t.limit_keys) THEN NULL
                                       WHEN json_type(t.limit_keys) = 'object' THEN t.limit_keys END) AS j
          JOIN coord_rate_limits AS l ON l.queue = t.queue AND l.dimension = j.key
          JOIN coord_rate_buckets AS b ON b.queue = t.queue AND b.dimension = j.key AND b.key = j.value
         WHERE b.tat - (l.burst - 1) * l.per_s / l.count > :now))
UNION
SELECT t.partition FROM coord_tasks AS t
 WHERE t.queue = :queue AND t.status = 'running' AND t.lease_expires_at <= :now - :min_due_age_s
   AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
   AND (t.limit_keys IS NULL OR NOT EXISTS (
        SELECT 1 FROM json_each(CASE WHEN NOT json_valid(t.limit_keys) THEN NULL
                                       WHEN json_type(t.limit_keys) = 'object' THEN t.limit_keys END) AS j
          JOIN coord_rate_limits AS l ON l.queue = t.queue AND l.dimension = j.key
          JOIN coord_rate_buckets AS b ON b.queue = t.queue AND b.dimension = j.key AND b.key = j.value
         WHERE b.tat - (l.burst - 1) * l.per_s / l.count > :now));

-- name: claimable_partitions_ordered
-- claimable_partitions for an ordered claim of a queue that keeps heads (coord_ordered_queues):
-- only keys' heads count (coord_tasks_pending_heads covers it).
SELECT t.partition FROM coord_tasks AS t
 WHERE t.queue = :queue AND t.status = 'pending' AND t.is_head = 1 AND t.run_at <= :now - :min_due_age_s
   AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
   AND (t.limit_keys IS NULL OR NOT EXISTS (
        SELECT 1 FROM json_each(CASE WHEN NOT json_valid(t.limit_keys) THEN NULL
                                       WHEN json_type(t.limit_keys) = 'object' THEN t.limit_keys END) AS j
          JOIN coord_rate_limits AS l ON l.queue = t.queue AND l.dimension = j.key
          JOIN coord_rate_buckets AS b ON b.queue = t.queue AND b.dimension = j.key AND b.key = j.value
         WHERE b.tat - (l.burst - 1) * l.per_s / l.count > :now))
UNION
SELECT t.partition FROM coord_tasks AS t
 WHERE t.queue = :queue AND t.status = 'running' AND t.is_head = 1 AND t.lease_expires_at <= :now - :min_due_age_s
   AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
   AND (t.limit_keys IS NULL OR NOT EXISTS (
        SELECT 1 FROM json_each(CASE WHEN NOT json_valid(t.limit_keys) THEN NULL
                                       WHEN json_type(t.limit_keys) = 'object' THEN t.limit_keys END) AS j
          JOIN coord_rate_limits AS l ON l.queue = t.queue AND l.dimension = j.key
          JOIN coord_rate_buckets AS b ON b.queue = t.queue AND b.dimension = j.key AND b.key = j.value
         WHERE b.tat - (l.burst - 1) * l.per_s / l.count > :now));

-- name: settle_duplicate
-- Claimed tasks (:ids, a JSON array) whose message id was already processed: done
-- without running them. Same transaction as the claim, so no lease check is needed.
UPDATE coord_tasks
   SET status = 'done', active = 0, is_head = 0, result = '{"duplicate": true}', last_error = NULL,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE id IN (SELECT value FROM json_each(:ids)) AND idempotency_key IS NOT NULL
   AND EXISTS (SELECT 1 FROM coord_processed AS p
                WHERE p.consumer = coord_tasks.queue AND p.message_id = coord_tasks.idempotency_key)
RETURNING id, queue, partition_key;

-- name: complete_batch
-- :batch is a JSON array of [id, lease_token, version, result]; each row is its own
-- compare-and-set. Returns the ids that were completed, their new versions and their stored
-- queue, partition key and idempotency key (the processed-id record is the stored one).
UPDATE coord_tasks
   SET status = 'done', active = 0, is_head = 0, result = b.result, last_error = NULL,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = coord_tasks.version + 1, updated_at = :now
  FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token,
               json_extract(value, '$[2]') AS version, json_extract(value, '$[3]') AS result
          FROM json_each(:batch)) AS b
 WHERE coord_tasks.id = b.id AND coord_tasks.lease_token = b.token AND coord_tasks.version = b.version
   AND coord_tasks.status = 'running' AND coord_tasks.lease_expires_at > :now
RETURNING coord_tasks.id, coord_tasks.version, coord_tasks.queue, coord_tasks.partition_key, coord_tasks.idempotency_key;

-- name: record_processed_batch
-- :records is a JSON array of [consumer, message_id].
INSERT INTO coord_processed (consumer, message_id, processed_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), :now FROM json_each(:records) WHERE true
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
   SET status = 'dead', active = 0, is_head = 0, last_error = :error,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE id = :id AND lease_token = :lease_token AND version = :version
   AND status = 'running' AND lease_expires_at > :now
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: release
-- :refund 1 gives the attempt back, 0 keeps it counted (a send cut short may have gone out).
UPDATE coord_tasks
   SET status = 'pending', run_at = :now + :delay_s, attempts = max(attempts - :refund, 0),
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
-- :leases is a JSON array of [id, lease_token]; returns the (id, lease_token) pairs renewed.
UPDATE coord_tasks SET lease_expires_at = :now + :lease_s
  FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token
          FROM json_each(:leases)) AS b
 WHERE coord_tasks.id = b.id AND coord_tasks.lease_token = b.token
   AND coord_tasks.status = 'running' AND coord_tasks.lease_expires_at > :now
RETURNING coord_tasks.id, coord_tasks.lease_token;

-- name: stats_queue
-- Pending tasks of :queue with the run_at of the oldest due one, then its running, done and dead
-- tasks: each counted in its status's partial index (coord_tasks_pending, which holds run_at,
-- coord_tasks_lease_expiry, coord_tasks_done_age, coord_tasks_dead_order), in one statement
-- (one snapshot). The counts read index entries only, never the rows: the done tasks cost a walk
-- of their index (about 60 ms a million), not a scan of the table (350 ms and more).
SELECT p.n, p.oldest,
       (SELECT count(*) FROM coord_tasks WHERE queue = :queue AND status = 'running'),
       (SELECT count(*) FROM coord_tasks WHERE queue = :queue AND status = 'done'),
       (SELECT count(*) FROM coord_tasks WHERE queue = :queue AND status = 'dead')
  FROM (SELECT count(*) AS n, min(run_at) FILTER (WHERE run_at <= :now) AS oldest
          FROM coord_tasks WHERE queue = :queue AND status = 'pending') AS p;

-- name: stats_all
-- stats_queue over every queue: the same partial indexes, each walked whole.
SELECT p.n, p.oldest,
       (SELECT count(*) FROM coord_tasks WHERE status = 'running'),
       (SELECT count(*) FROM coord_tasks WHERE status = 'done'),
       (SELECT count(*) FROM coord_tasks WHERE status = 'dead')
  FROM (SELECT count(*) AS n, min(run_at) FILTER (WHERE run_at <= :now) AS oldest
          FROM coord_tasks WHERE status = 'pending') AS p;

-- name: queue_unfinished
-- One pending or running task of the queue, if any: a probe of coord_tasks_pending, then one of
-- coord_tasks_lease_expiry (coord_tasks_key_order holds the tasks of ordered queues only).
SELECT 1 FROM coord_tasks WHERE queue = :queue AND status = 'pending'
UNION ALL
SELECT 1 FROM coord_tasks WHERE queue = :queue AND status = 'running'
LIMIT 1;

-- name: requeue_dead
UPDATE coord_tasks
   SET status = 'pending', active = 1, attempts = 0, run_at = :now,
       version = version + 1, updated_at = :now
 WHERE queue = :queue AND status = 'dead'
   AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
RETURNING id, queue, partition_key;

-- name: is_processed
SELECT 1 FROM coord_processed WHERE consumer = :consumer AND message_id = :message_id;

-- name: purge_processed_batch
DELETE FROM coord_processed
 WHERE rowid IN (SELECT rowid FROM coord_processed WHERE processed_at < :cutoff LIMIT :batch);

-- name: purge_finished_batch
DELETE FROM coord_tasks
 WHERE id IN (SELECT id FROM coord_tasks
               WHERE queue = :queue AND status = 'done' AND updated_at < :cutoff LIMIT :batch);

-- name: count_removed
-- What a purge or a discard deleted from a queue, in its transaction (migration_0005.sql).
INSERT INTO coord_queue_removed (queue, done, dead) VALUES (:queue, :done, :dead)
ON CONFLICT (queue) DO UPDATE SET done = done + excluded.done, dead = dead + excluded.dead;

-- Unchecked operations: what a naive queue does (read, then write without a
-- compare-and-set). Only for measuring what the version layer buys.

-- name: unchecked_peek
SELECT id FROM coord_tasks AS t
 WHERE t.queue = :queue AND t.status = 'pending' AND t.run_at <= :now
   AND (:partitions IS NULL OR t.partition IN (SELECT value FROM json_each(:partitions)))
 ORDER BY t.priority DESC, t.id
 LIMIT :limit;

-- name: unchecked_claim
UPDATE coord_tasks
   SET status = 'running', active = 1, attempts = attempts + 1,
       lease_owner = :node_id, lease_token = :token || '.' || id, lease_expires_at = :now + :lease_s,
       version = version + 1, updated_at = :now
 WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: unchecked_complete
UPDATE coord_tasks
   SET status = 'done', active = 0, is_head = 0, result = :result, last_error = NULL,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now
 WHERE id = :id
RETURNING queue, partition_key;
