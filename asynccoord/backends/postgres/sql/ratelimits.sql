-- Named queries of the PostgreSQL store's rate limits (backends/postgres/ratelimits.py;
-- migration_0002.sql). Bucket TATs are read and written under the queue's exclusive
-- advisory lock (lock_rate_limits), on the instant that lock's statement returns (:now).
-- A limited claim is BEGIN, lock_rate_limits, limited_candidates (once per chunk it reads),
-- claim_ids, COMMIT.

-- name: rate_limits
-- Also the store's read, cached ~1 s, of whether :queue declares limits (the claim's choice of path).
SELECT dimension, count, per_s, burst FROM coord_rate_limits WHERE queue = :queue::text ORDER BY dimension;

-- name: limited_queues
SELECT DISTINCT queue FROM coord_rate_limits;

-- name: delete_rate_limits
DELETE FROM coord_rate_limits WHERE queue = :queue::text;

-- name: insert_rate_limit
INSERT INTO coord_rate_limits (queue, dimension, count, per_s, burst)
VALUES (:queue::text, :dimension::text, :count::int, :per_s::float8, :burst::int);

-- name: lock_rate_limits
-- PostgreSQL only: the queue's exclusive advisory lock (coord_lock_rate_limits), to the end of
-- the transaction; returns the store clock read once the lock is held, and the queue's
-- declared limits as four arrays (dimension, count, per_s, burst; read in this statement's
-- snapshot, which may predate the lock: a claim then uses the limits it began with). The
-- buckets are read by the later statements, in snapshots taken after the lock. It also lowers
-- idle_in_transaction_session_timeout to :idle_ms for the rest of the transaction (SET LOCAL):
-- every claim of the queue waits for this lock, so a client frozen while holding it is cut
-- off after that long, not after the session's own (longer) timeout.
SELECT coord_lock_rate_limits(:queue::text, :now::float8),
       ARRAY(SELECT l.dimension FROM coord_rate_limits AS l WHERE l.queue = :queue::text ORDER BY l.dimension),
       ARRAY(SELECT l.count FROM coord_rate_limits AS l WHERE l.queue = :queue::text ORDER BY l.dimension),
       ARRAY(SELECT l.per_s FROM coord_rate_limits AS l WHERE l.queue = :queue::text ORDER BY l.dimension),
       ARRAY(SELECT l.burst FROM coord_rate_limits AS l WHERE l.queue = :queue::text ORDER BY l.dimension),
       set_config('idle_in_transaction_session_timeout', :idle_ms::text, true);

-- name: bucket_tats
-- PostgreSQL only (SQLite reads one bucket at a time): the TATs of the buckets
-- (:dimensions[i], :keys[i]) of :queue that have one.
SELECT b.dimension, b.key, b.tat
  FROM coord_rate_buckets AS b
  JOIN unnest(:dimensions::text[], :keys::text[]) AS u (dimension, key)
    ON b.queue = :queue::text AND b.dimension = u.dimension AND b.key = u.key;

-- name: set_bucket_tat
-- Store the TATs a claim or a pause computed; a TAT only ever rises (greatest), so a write
-- can never give back a token, whatever wrote last.
INSERT INTO coord_rate_buckets (queue, dimension, key, tat)
SELECT :queue::text, u.dimension, u.key, u.tat
  FROM unnest(:dimensions::text[], :keys::text[], :tats::float8[]) AS u (dimension, key, tat)
 ORDER BY u.dimension, u.key
ON CONFLICT (queue, dimension, key) DO UPDATE SET tat = greatest(coord_rate_buckets.tat, excluded.tat);

-- name: task_limit_keys
SELECT queue, limit_keys FROM coord_tasks WHERE id = :id::bigint;

-- name: limited_candidates
-- The claim of a queue with limits: every task claim would consider (due pending tasks and
-- expired leases not on their last attempt, read through coord_tasks_pending and
-- coord_tasks_lease_expiry), best first, :chunk at a time (after the candidate
-- (:after_priority, :after_id), none for the first chunk), under the queue's advisory
-- lock, with its partition, priority, limit keys and the stored TATs of its buckets (three
-- arrays: dimension, key, TAT). Each branch stops at :chunk rows in index order, and only
-- the chunk's rows are joined to their buckets: a deep backlog costs a chunk, not its
-- size. No row is locked here: claim_ids locks and re-checks the chosen ones. With :plain
-- the TAT arrays are NULL (the claim reads them with bucket_tats): the read a claim falls
-- back to when a limit_keys text, written by another tool, is not a JSON object.
SELECT c.id, c.partition, c.priority, c.limit_keys,
       b.dimensions, b.keys, b.tats
  FROM (SELECT u.id, u.priority, u.partition, u.limit_keys FROM (
          (SELECT t.id, t.priority, t.partition, t.limit_keys FROM coord_tasks AS t
            WHERE t.queue = :queue::text AND t.status = 'pending'
              AND t.run_at <= :now::float8 - :min_due_age_s::float8
              AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
              AND (:after_id::bigint IS NULL OR t.priority < :after_priority::int
                   OR (t.priority = :after_priority::int AND t.id > :after_id::bigint))
            ORDER BY t.priority DESC, t.id
            LIMIT :chunk::int)
          UNION ALL
          (SELECT t.id, t.priority, t.partition, t.limit_keys FROM coord_tasks AS t
            WHERE t.queue = :queue::text AND t.status = 'running'
              AND t.lease_expires_at <= :now::float8 - :min_due_age_s::float8
              AND t.attempts < t.max_attempts
              AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
              AND (:after_id::bigint IS NULL OR t.priority < :after_priority::int
                   OR (t.priority = :after_priority::int AND t.id > :after_id::bigint))
            ORDER BY t.priority DESC, t.id
            LIMIT :chunk::int)) AS u
         ORDER BY u.priority DESC, u.id
         LIMIT :chunk::int) AS c
  LEFT JOIN LATERAL (
        SELECT array_agg(k.dimension) AS dimensions, array_agg(k.key) AS keys, array_agg(k.tat) AS tats
          FROM (SELECT r.dimension, r.key, r.tat
                  FROM jsonb_each_text(CASE WHEN NOT :plain::boolean THEN c.limit_keys::jsonb END) AS j (dimension, key)
                  JOIN coord_rate_buckets AS r ON r.queue = :queue::text AND r.dimension = j.dimension AND r.key = j.key) AS k
       ) AS b ON c.limit_keys IS NOT NULL
 ORDER BY c.priority DESC, c.id;

-- name: limited_candidates_ordered
-- limited_candidates of an ordered claim: keys' heads only.
SELECT c.id, c.partition, c.priority, c.limit_keys,
       b.dimensions, b.keys, b.tats
  FROM (SELECT u.id, u.priority, u.partition, u.limit_keys FROM (
          (SELECT t.id, t.priority, t.partition, t.limit_keys FROM coord_tasks AS t
            WHERE t.queue = :queue::text AND t.status = 'pending' AND t.is_head
              AND t.run_at <= :now::float8 - :min_due_age_s::float8
              AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
              AND (:after_id::bigint IS NULL OR t.priority < :after_priority::int
                   OR (t.priority = :after_priority::int AND t.id > :after_id::bigint))
            ORDER BY t.priority DESC, t.id
            LIMIT :chunk::int)
          UNION ALL
          (SELECT t.id, t.priority, t.partition, t.limit_keys FROM coord_tasks AS t
            WHERE t.queue = :queue::text AND t.status = 'running' AND t.is_head
              AND t.lease_expires_at <= :now::float8 - :min_due_age_s::float8
              AND t.attempts < t.max_attempts
              AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
              AND (:after_id::bigint IS NULL OR t.priority < :after_priority::int
                   OR (t.priority = :after_priority::int AND t.id > :after_id::bigint))
            ORDER BY t.priority DESC, t.id
            LIMIT :chunk::int)) AS u
         ORDER BY u.priority DESC, u.id
         LIMIT :chunk::int) AS c
  LEFT JOIN LATERAL (
        SELECT array_agg(k.dimension) AS dimensions, array_agg(k.key) AS keys, array_agg(k.tat) AS tats
          FROM (SELECT r.dimension, r.key, r.tat
                  FROM jsonb_each_text(CASE WHEN NOT :plain::boolean THEN c.limit_keys::jsonb END) AS j (dimension, key)
                  JOIN coord_rate_buckets AS r ON r.queue = :queue::text AND r.dimension = j.dimension AND r.key = j.key) AS k
       ) AS b ON c.limit_keys IS NOT NULL
 ORDER BY c.priority DESC, c.id;

-- name: claim_ids
-- Lease the tasks :ids chosen by a limited claim in the same transaction, :ids[i] to
-- :owners[i] for :lease_s[i] seconds, each only if it is still what the candidate read saw
-- (due pending, or an expired lease not on its last attempt; a head, when :ordered) and no
-- other transaction holds its row (SKIP LOCKED: a claim never waits); and, when every one
-- of them was leased, store the TATs of the tokens they took (:dimensions, :keys, :tats, as
-- set_bucket_tat does; otherwise the claim stores the leased ones' with set_bucket_tat).
-- Same columns as claim (each row names its claimer in lease_owner), and one more: how many
-- TATs were stored.
-- The status test is a CASE, not an OR of status equalities: those would let the planner
-- answer the id lookup with a bitmap over the pending and running partial indexes, which
-- reads every pending entry of the queue (34 ms on 20,000, against 0.2 ms by primary key).
WITH locked AS (
    SELECT t.id FROM coord_tasks AS t
     WHERE t.id = ANY(:ids::bigint[]) AND t.queue = :queue::text
       AND (NOT :ordered::boolean OR t.is_head)
       AND CASE t.status
               WHEN 'pending' THEN t.run_at <= :now::float8 - :min_due_age_s::float8
               WHEN 'running' THEN t.lease_expires_at <= :now::float8 - :min_due_age_s::float8
                                   AND t.attempts < t.max_attempts
               ELSE false
           END
     ORDER BY t.id
       FOR UPDATE SKIP LOCKED),
leased AS (
    UPDATE coord_tasks AS t
       SET reclaimed = (t.status = 'running'),
           status = 'running', attempts = t.attempts + 1,
           lease_owner = c.owner, lease_token = :token::text || '.' || t.id,
           lease_expires_at = :now::float8 + c.lease_s,
           version = t.version + 1, updated_at = :now::float8
      FROM unnest(:ids::bigint[], :owners::text[], :lease_s::float8[]) AS c (id, owner, lease_s)
     WHERE t.id = c.id AND t.id = ANY(ARRAY(SELECT l.id FROM locked AS l))
    RETURNING t.id, t.queue, t.partition_key, t.partition, t.idempotency_key, t.payload, t.priority, t.status, t.attempts, t.max_attempts, t.run_at, t.lease_owner, t.lease_token, t.lease_expires_at, t.version, t.last_error, t.result, t.created_at, t.updated_at, t.reclaimed,
              t.idempotency_key IS NOT NULL AND (SELECT true FROM coord_processed AS p
                                                  WHERE p.consumer = t.queue AND p.message_id = t.idempotency_key) IS NOT NULL AS dup),
stored AS (
    INSERT INTO coord_rate_buckets (queue, dimension, key, tat)
    SELECT :queue::text, u.dimension, u.key, u.tat
      FROM unnest(:dimensions::text[], :keys::text[], :tats::float8[]) AS u (dimension, key, tat)
     WHERE (SELECT count(*) FROM leased) = cardinality(:ids::bigint[])
     ORDER BY u.dimension, u.key
    ON CONFLICT (queue, dimension, key) DO UPDATE SET tat = greatest(coord_rate_buckets.tat, excluded.tat)
    RETURNING 1)
SELECT l.*,
       EXISTS (SELECT 1 FROM coord_tasks AS x
                WHERE x.queue = :queue::text AND x.status = 'running'
                  AND x.lease_expires_at <= :now::float8 AND x.attempts >= x.max_attempts),
       (SELECT count(*) FROM stored)
  FROM leased AS l;

-- name: claimable_partitions_limited
-- PostgreSQL only: claimable_partitions of a queue with limits: per partition of the due
-- tasks (as claimable_partitions reads them), NULL when a task there has a token in every
-- bucket it names (declared dimensions) now, else the earliest instant one will (store
-- clock); and the store clock. Nothing is locked or written.
WITH due AS (
    SELECT t.partition, t.limit_keys FROM coord_tasks AS t
     WHERE t.queue = :queue::text AND t.status = 'pending'
       AND t.run_at <= coord_now(:now::float8) - :min_due_age_s::float8
       AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
    UNION ALL
    SELECT t.partition, t.limit_keys FROM coord_tasks AS t
     WHERE t.queue = :queue::text AND t.status = 'running'
       AND t.lease_expires_at <= coord_now(:now::float8) - :min_due_age_s::float8
       AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))),
timed AS (
    SELECT d.partition,
           (SELECT max(b.tat - (l.burst - 1) * (l.per_s / l.count))
              FROM jsonb_each_text(d.limit_keys::jsonb) AS j (dimension, key)
              JOIN coord_rate_limits AS l ON l.queue = :queue::text AND l.dimension = j.dimension
              JOIN coord_rate_buckets AS b ON b.queue = :queue::text AND b.dimension = j.dimension AND b.key = j.key) AS at
      FROM due AS d)
SELECT m.partition, CASE WHEN bool_or(m.at IS NULL OR m.at <= coord_now(:now::float8)) THEN NULL ELSE min(m.at) END,
       coord_now(:now::float8)
  FROM timed AS m
 GROUP BY m.partition;

-- name: claimable_partitions_limited_ordered
-- claimable_partitions_limited for an ordered claim of a queue that keeps heads: keys' heads only.
WITH due AS (
    SELECT t.partition, t.limit_keys FROM coord_tasks AS t
     WHERE t.queue = :queue::text AND t.is_head AND t.status = 'pending'
       AND t.run_at <= coord_now(:now::float8) - :min_due_age_s::float8
       AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
    UNION ALL
    SELECT t.partition, t.limit_keys FROM coord_tasks AS t
     WHERE t.queue = :queue::text AND t.status = 'running' AND t.is_head
       AND t.lease_expires_at <= coord_now(:now::float8) - :min_due_age_s::float8
       AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))),
timed AS (
    SELECT d.partition,
           (SELECT max(b.tat - (l.burst - 1) * (l.per_s / l.count))
              FROM jsonb_each_text(d.limit_keys::jsonb) AS j (dimension, key)
              JOIN coord_rate_limits AS l ON l.queue = :queue::text AND l.dimension = j.dimension
              JOIN coord_rate_buckets AS b ON b.queue = :queue::text AND b.dimension = j.dimension AND b.key = j.key) AS at
      FROM due AS d)
SELECT m.partition, CASE WHEN bool_or(m.at IS NULL OR m.at <= coord_now(:now::float8)) THEN NULL ELSE min(m.at) END,
       coord_now(:now::float8)
  FROM timed AS m
 GROUP BY m.partition;

-- name: release_rate_limited
-- A provider's rate limit: back to pending, the attempt not counted, due after :delay_s.
UPDATE coord_tasks
   SET status = 'pending', run_at = :now::float8 + :delay_s::float8, attempts = greatest(attempts - 1, 0),
       last_error = :error::text,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = :now::float8
 WHERE id = :id::bigint AND lease_token = :lease_token::text AND version = :version::bigint
   AND status = 'running' AND lease_expires_at > :now::float8
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: held_buckets
-- Buckets with no token at the server clock (coord_now), longest wait first: the wait is
-- TAT - tau - now, with tau = (burst - 1) * (per_s / count) of the limit the queue still
-- declares. A read.
SELECT b.queue, b.dimension, b.key, b.tat - (l.burst - 1) * (l.per_s / l.count) - n.now AS wait_s
  FROM coord_rate_buckets AS b
  JOIN coord_rate_limits AS l ON l.queue = b.queue AND l.dimension = b.dimension
 CROSS JOIN (SELECT coord_now(:now::float8) AS now) AS n
 WHERE (:queue::text IS NULL OR b.queue = :queue::text)
   AND b.tat - (l.burst - 1) * (l.per_s / l.count) > n.now
 ORDER BY wait_s DESC, b.queue, b.dimension, b.key
 LIMIT :limit::int;
