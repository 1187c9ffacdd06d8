-- Named queries of the task queue for the PostgreSQL store (see backends/postgres.py).
-- Parameters are written :name and bound positionally by the loader (never formatted
-- into the text). :now is NULL except under a test clock: coord_now(:now) is the server
-- clock (statement_timestamp()). Every task-returning query lists the columns in the
-- same order as the SQLite dialect (see task_from_row in backends/_common.py).
-- Batches arrive as parallel arrays (unnest), one statement per table; a batch's rows are
-- found through the primary key. Where a batch checks that its tasks still run, it says
-- "status <> ALL ('{pending,done,dead}')" (the same under the CHECK constraint) and not
-- "status = 'running'": the latter lets the planner read the batch through
-- coord_tasks_lease_expiry, every running task, whose statistics (never covering leases
-- granted since the last ANALYZE) promise one row.

-- name: now
SELECT coord_now(:now::float8);

-- name: meta_get
SELECT value FROM coord_meta WHERE key = :key::text;

-- name: meta_set
INSERT INTO coord_meta (key, value) VALUES (:key::text, :value::text)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: next_task_ids
-- Ids for a batch of new tasks, ascending in input order (PostgreSQL only: drawn before the
-- enqueue statement, which runs again under the same ids after a lost answer and so finds
-- the tasks its earlier run created).
SELECT nextval(pg_get_serial_sequence('coord_tasks', 'id')) FROM generate_series(1, :count::int) ORDER BY 1;

-- name: lock_keys
-- PostgreSQL only. Takes the row lock of each (queue, partition_key), in sorted order
-- (so two transactions never deadlock on them), before a transition that changes the
-- keys' active sets: head upkeep then sees every committed transition of those keys.
INSERT INTO coord_task_keys (queue, partition_key)
SELECT q, k FROM unnest(:queues::text[], :keys::text[]) AS u (q, k) ORDER BY q, k
ON CONFLICT (queue, partition_key) DO UPDATE SET touches = coord_task_keys.touches + 1;

-- name: share_queues
-- PostgreSQL only (schema version 9): the shared advisory lock of each queue, to the end of
-- the transaction, before a transition decides whether its queues keep per-key heads
-- (kept_queues, read in the next statement).
SELECT coord_share_queues(:queues::text[]);

-- name: kept_queues
-- PostgreSQL only (schema version 9): which of these queues keep per-key heads.
SELECT queue FROM coord_ordered_queues WHERE queue = ANY(:queues::text[]);

-- name: keep_heads
-- PostgreSQL only (schema version 9): make a queue keep per-key heads (coord_keep_heads);
-- how many heads it marked, 0 if the queue kept them already.
SELECT coord_keep_heads(:queue::text);

-- name: enqueue
-- PostgreSQL only (schema revision 4): enqueue_many in one statement (coord_enqueue, which
-- takes the queues' locks and the keys' as the other transitions do, inserts, promotes and
-- notifies). :ids from next_task_ids, the same on every attempt. Every column array has one
-- item per task; :limit_keys: each task's keys as compact JSON, NULL for none. Each task's
-- row in input order, then whether this call created it.
SELECT * FROM coord_enqueue(:ids::bigint[], :queues::text[], :partition_keys::text[], :partitions::int[],
                            :idempotency_keys::text[], :payloads::text[], :priorities::int[], :max_attempts::int[],
                            :delays::float8[], :limit_keys::text[], :channel::text, :sender::text, :now::float8);

-- name: select_tasks
-- PostgreSQL only: many tasks by id (the SQLite dialect selects one at a time).
SELECT id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed
  FROM coord_tasks WHERE id = ANY(:ids::bigint[]);

-- name: select_task
SELECT id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed
  FROM coord_tasks WHERE id = :id::bigint;

-- name: promote_heads
-- Under lock_keys of the same keys: mark the earliest active task of each key that has no
-- head (coord_tasks_one_head) as its head (coord_tasks_key_order holds the non-head active
-- tasks); a key's head stays until it leaves the active set (migration_0007.sql says why).
-- Returns the newly promoted heads. In a queue whose
-- dead-letter policy is 'hold' (coord_held_queues, read once per statement, after the key
-- locks: a policy change locks every key of its queue), a key whose earliest active task a
-- dead task precedes gets none (coord_tasks_dead, probed in holding queues only).
UPDATE coord_tasks SET is_head = true
 WHERE NOT is_head AND id = ANY(ARRAY(
    SELECT c.id
      FROM (SELECT k.q, k.pk,
                   (SELECT t.id FROM coord_tasks AS t
                     WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active AND NOT t.is_head
                       AND NOT EXISTS (SELECT 1 FROM coord_tasks AS h
                                        WHERE h.queue = k.q AND h.partition_key = k.pk AND h.is_head)
                     ORDER BY t.id LIMIT 1) AS id
              FROM unnest(:queues::text[], :keys::text[]) AS k (q, pk)) AS c
     WHERE c.q <> ALL ((SELECT coord_held_queues(:queues::text[]))::text[])
        OR NOT EXISTS (SELECT 1 FROM coord_tasks AS d
                        WHERE d.queue = c.q AND d.partition_key = c.pk AND d.status = 'dead' AND d.id < c.id)))
RETURNING queue, partition, run_at;

-- name: recompute_heads
-- After tasks rejoin the active set out of order (requeue): heads of the keys from
-- scratch (under lock_keys). Clearing first keeps coord_tasks_one_head satisfied.
WITH cleared AS (
    UPDATE coord_tasks AS t SET is_head = false
      FROM unnest(:queues::text[], :keys::text[]) AS k (q, pk)
     WHERE t.queue = k.q AND t.partition_key = k.pk AND t.is_head
    RETURNING t.id)
SELECT count(*) FROM cleared;

-- name: exhausted_keys
-- PostgreSQL only: keys with a lease that expired on its last attempt (dead_letter_exhausted's
-- keys, locked before it runs).
SELECT DISTINCT queue, partition_key FROM coord_tasks
 WHERE queue = :queue::text AND status = 'running' AND lease_expires_at <= coord_now(:now::float8)
   AND attempts >= max_attempts;

-- name: dead_letter_exhausted
-- Leases that expired on the last allowed attempt: dead, so they never take a claim
-- slot or block their key. PostgreSQL: only those of :keys, the keys exhausted_keys found
-- and lock_keys locked (a lease of another key that expired meanwhile waits for the next
-- call: its key's head upkeep needs the key's lock).
UPDATE coord_tasks
   SET status = 'dead', active = false, is_head = false,
       last_error = 'lease expired on the last attempt (owner ' || coalesce(lease_owner, '?') || ')',
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = coord_now(:now::float8)
 WHERE queue = :queue::text AND status = 'running' AND lease_expires_at <= coord_now(:now::float8)
   AND attempts >= max_attempts AND partition_key = ANY(:keys::text[])
RETURNING id, queue, partition_key;

-- name: claim
-- One statement: rows locked by another claim are skipped, never waited for. Due pending
-- tasks (coord_tasks_pending) and expired leases (coord_tasks_lease_expiry) are scanned
-- apart and merged in priority-then-FIFO order: the best :limit of each side hold the best
-- :limit overall (rows a side locked but the merge dropped are unlocked at the statement's
-- end). The chosen ids are updated through the primary key (= ANY(ARRAY(...)): never a
-- hash join over the table). Tasks on their last attempt with an expired lease are left to
-- dead_letter_exhausted; the last two columns say whether the task's message id was
-- already processed and whether such exhausted leases exist in the queue. The first is a
-- scalar subquery (one primary-key probe per claimed row), not EXISTS: PostgreSQL may run an
-- EXISTS in a target list as a hashed subplan, reading the whole of coord_processed at every
-- claim, which it chose while the table's statistics were those of a young table (about 0.6
-- ms a claim per 1,000 processed ids, growing with the table until the next ANALYZE).
-- A task that names limit keys in a queue that declares limits is never taken here, nor by
-- the other claims below (migration_0002.sql): the limited claim (ratelimits.sql) takes it
-- with its tokens. The store runs that claim for such queues; this condition keeps a claim
-- whose answer to "does the queue have limits" is stale from leasing a limited task.
WITH exhausted AS (
    SELECT EXISTS (SELECT 1 FROM coord_tasks AS x
                    WHERE x.queue = :queue::text AND x.status = 'running'
                      AND x.lease_expires_at <= coord_now(:now::float8) AND x.attempts >= x.max_attempts) AS found),
pending AS (
    SELECT t.id, t.priority FROM coord_tasks AS t
     WHERE t.queue = :queue::text AND t.status = 'pending'
       AND t.run_at <= coord_now(:now::float8) - :min_due_age_s::float8
       AND (t.limit_keys IS NULL OR NOT EXISTS (SELECT 1 FROM coord_rate_limits AS l WHERE l.queue = :queue::text))
       AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
     ORDER BY t.priority DESC, t.id
     LIMIT :limit::int
     FOR UPDATE SKIP LOCKED),
expired AS (
    SELECT t.id, t.priority FROM coord_tasks AS t
     WHERE t.queue = :queue::text AND t.status = 'running'
       AND t.lease_expires_at <= coord_now(:now::float8) - :min_due_age_s::float8
       AND (t.limit_keys IS NULL OR NOT EXISTS (SELECT 1 FROM coord_rate_limits AS l WHERE l.queue = :queue::text))
       AND t.attempts < t.max_attempts
       AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
     ORDER BY t.priority DESC, t.id
     LIMIT :limit::int
     FOR UPDATE SKIP LOCKED)
UPDATE coord_tasks
   SET reclaimed = (status = 'running'),
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id::text, lease_token = :token::text || '.' || id,
       lease_expires_at = coord_now(:now::float8) + :lease_s::float8,
       version = version + 1, updated_at = coord_now(:now::float8)
 WHERE id = ANY(ARRAY(SELECT c.id FROM (SELECT * FROM pending UNION ALL SELECT * FROM expired) AS c
                       ORDER BY c.priority DESC, c.id LIMIT :limit::int))
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed,
          idempotency_key IS NOT NULL AND (SELECT true FROM coord_processed AS p
                                            WHERE p.consumer = queue AND p.message_id = idempotency_key) IS NOT NULL,
          (SELECT found FROM exhausted);

-- name: claim_ordered
-- Per-key ordering: only the head (earliest active task) of each partition key is
-- eligible; a running head whose lease expired is its key's head still. Pending heads come
-- from coord_tasks_pending_heads without a partition filter, from
-- coord_tasks_pending_heads_partition with one (the claimer's own heads only, each
-- partition's one index range; the one-time filters on :partitions pick the side at run
-- time, so a generic plan serves both); expired leases as in claim.
WITH exhausted AS (
    SELECT EXISTS (SELECT 1 FROM coord_tasks AS x
                    WHERE x.queue = :queue::text AND x.status = 'running'
                      AND x.lease_expires_at <= coord_now(:now::float8) AND x.attempts >= x.max_attempts) AS found),
everywhere AS (
    SELECT t.id, t.priority FROM coord_tasks AS t
     WHERE :partitions::int[] IS NULL AND t.queue = :queue::text AND t.is_head AND t.status = 'pending'
       AND t.run_at <= coord_now(:now::float8) - :min_due_age_s::float8
       AND (t.limit_keys IS NULL OR NOT EXISTS (SELECT 1 FROM coord_rate_limits AS l WHERE l.queue = :queue::text))
     ORDER BY t.priority DESC, t.id
     LIMIT :limit::int
     FOR UPDATE SKIP LOCKED),
owned AS (
    SELECT t.id, t.priority FROM coord_tasks AS t
     WHERE :partitions::int[] IS NOT NULL AND t.queue = :queue::text AND t.partition = ANY(:partitions::int[])
       AND t.is_head AND t.status = 'pending'
       AND t.run_at <= coord_now(:now::float8) - :min_due_age_s::float8
       AND (t.limit_keys IS NULL OR NOT EXISTS (SELECT 1 FROM coord_rate_limits AS l WHERE l.queue = :queue::text))
     ORDER BY t.priority DESC, t.id
     LIMIT :limit::int
     FOR UPDATE SKIP LOCKED),
expired AS (
    SELECT t.id, t.priority FROM coord_tasks AS t
     WHERE t.queue = :queue::text AND t.status = 'running'
       AND t.lease_expires_at <= coord_now(:now::float8) - :min_due_age_s::float8
       AND (t.limit_keys IS NULL OR NOT EXISTS (SELECT 1 FROM coord_rate_limits AS l WHERE l.queue = :queue::text))
       AND t.is_head
       AND t.attempts < t.max_attempts
       AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
     ORDER BY t.priority DESC, t.id
     LIMIT :limit::int
     FOR UPDATE SKIP LOCKED)
UPDATE coord_tasks
   SET reclaimed = (status = 'running'),
       status = 'running', attempts = attempts + 1,
       lease_owner = :node_id::text, lease_token = :token::text || '.' || id,
       lease_expires_at = coord_now(:now::float8) + :lease_s::float8,
       version = version + 1, updated_at = coord_now(:now::float8)
 WHERE id = ANY(ARRAY(SELECT c.id FROM (SELECT * FROM everywhere UNION ALL SELECT * FROM owned UNION ALL SELECT * FROM expired) AS c
                       ORDER BY c.priority DESC, c.id LIMIT :limit::int))
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed,
          idempotency_key IS NOT NULL AND (SELECT true FROM coord_processed AS p
                                            WHERE p.consumer = queue AND p.message_id = idempotency_key) IS NOT NULL,
          (SELECT found FROM exhausted);

-- name: claim_batch
-- The concurrent claims of a process's nodes in one statement: claim :node_ids[i] takes up
-- to :limits[i] tasks of its own partitions (the :partitions whose :partition_slots entry is
-- i, 1-based) with a lease of :lease_s[i] seconds, each claim scanned as in claim (pending
-- and expired apart, merged in priority-then-FIFO order). Rows locked by another statement
-- are skipped; a row two claims of the batch both chose (their partitions overlap) is leased
-- once, to one of them: each returned row names its claimer in lease_owner.
WITH exhausted AS (
    SELECT EXISTS (SELECT 1 FROM coord_tasks AS x
                    WHERE x.queue = :queue::text AND x.status = 'running'
                      AND x.lease_expires_at <= coord_now(:now::float8) AND x.attempts >= x.max_attempts) AS found),
claimer AS MATERIALIZED (
    SELECT r.node_id, r.lim, r.lease_s, g.parts
      FROM unnest(:node_ids::text[], :limits::int[], :lease_s::float8[]) WITH ORDINALITY AS r (node_id, lim, lease_s, slot)
      JOIN (SELECT p.slot, array_agg(p.partition) AS parts
              FROM unnest(:partitions::int[], :partition_slots::int[]) AS p (partition, slot)
             GROUP BY p.slot) AS g ON g.slot = r.slot),
picked AS (
    SELECT r.node_id, r.lease_s, c.id
      FROM claimer AS r
     CROSS JOIN LATERAL (
        SELECT u.id FROM (
            SELECT * FROM (SELECT t.id, t.priority FROM coord_tasks AS t
                            WHERE t.queue = :queue::text AND t.status = 'pending'
                              AND t.run_at <= coord_now(:now::float8) - :min_due_age_s::float8
                              AND (t.limit_keys IS NULL OR NOT EXISTS (SELECT 1 FROM coord_rate_limits AS l WHERE l.queue = :queue::text))
                              AND t.partition = ANY(r.parts)
                            ORDER BY t.priority DESC, t.id
                            LIMIT r.lim
                              FOR UPDATE SKIP LOCKED) AS pending
            UNION ALL
            SELECT * FROM (SELECT t.id, t.priority FROM coord_tasks AS t
                            WHERE t.queue = :queue::text AND t.status = 'running'
                              AND t.lease_expires_at <= coord_now(:now::float8) - :min_due_age_s::float8
                              AND (t.limit_keys IS NULL OR NOT EXISTS (SELECT 1 FROM coord_rate_limits AS l WHERE l.queue = :queue::text))
                              AND t.attempts < t.max_attempts
                              AND t.partition = ANY(r.parts)
                            ORDER BY t.priority DESC, t.id
                            LIMIT r.lim
                              FOR UPDATE SKIP LOCKED) AS expired) AS u
         ORDER BY u.priority DESC, u.id
         LIMIT r.lim) AS c)
UPDATE coord_tasks AS t
   SET reclaimed = (t.status = 'running'),
       status = 'running', attempts = t.attempts + 1,
       lease_owner = b.node_id, lease_token = :token::text || '.' || t.id,
       lease_expires_at = coord_now(:now::float8) + b.lease_s,
       version = t.version + 1, updated_at = coord_now(:now::float8)
  FROM picked AS b
 WHERE t.id = b.id
RETURNING t.id, t.queue, t.partition_key, t.partition, t.idempotency_key, t.payload, t.priority, t.status, t.attempts, t.max_attempts, t.run_at, t.lease_owner, t.lease_token, t.lease_expires_at, t.version, t.last_error, t.result, t.created_at, t.updated_at, t.reclaimed,
          t.idempotency_key IS NOT NULL AND (SELECT true FROM coord_processed AS p
                                              WHERE p.consumer = t.queue AND p.message_id = t.idempotency_key) IS NOT NULL,
          (SELECT found FROM exhausted);

-- name: claim_ordered_batch
-- claim_batch for queues claimed in order: each claim takes only heads of its own
-- partitions' keys, and expired leases of heads, as claim_ordered with a partition filter
-- does. Pending heads are read partition by partition, the best :limits[i] of each, then
-- merged per claim in priority-then-FIFO order. Each partition's read is one range of
-- coord_tasks_pending_heads_partition: the partition is bounded by a range and the rows are
-- ordered by (partition, priority DESC, id), which only that index yields unsorted. Written as
-- an equality, the partition is a constant of the subquery and coord_tasks_pending_heads (by
-- queue) yields the same order; with the statistics of a young table the two cost the same, and
-- the planner took the queue's index, each partition's read then filtering every pending head
-- of the queue (about 24 times the lone claims' time with 6,000 heads). A filter on a claim's
-- whole partition list was planned the same way.
WITH exhausted AS (
    SELECT EXISTS (SELECT 1 FROM coord_tasks AS x
                    WHERE x.queue = :queue::text AND x.status = 'running'
                      AND x.lease_expires_at <= coord_now(:now::float8) AND x.attempts >= x.max_attempts) AS found),
claimer AS MATERIALIZED (
    SELECT r.node_id, r.lim, r.lease_s, g.parts
      FROM unnest(:node_ids::text[], :limits::int[], :lease_s::float8[]) WITH ORDINALITY AS r (node_id, lim, lease_s, slot)
      JOIN (SELECT p.slot, array_agg(p.partition) AS parts
              FROM unnest(:partitions::int[], :partition_slots::int[]) AS p (partition, slot)
             GROUP BY p.slot) AS g ON g.slot = r.slot),
picked AS (
    SELECT r.node_id, r.lease_s, c.id
      FROM claimer AS r
     CROSS JOIN LATERAL (
        SELECT u.id FROM (
            SELECT h.id, h.priority
              FROM unnest(r.parts) AS q (partition)
             CROSS JOIN LATERAL (SELECT t.id, t.priority FROM coord_tasks AS t
                                  WHERE t.queue = :queue::text
                                    AND t.partition >= q.partition AND t.partition <= q.partition
                                    AND t.is_head AND t.status = 'pending'
                                    AND t.run_at <= coord_now(:now::float8) - :min_due_age_s::float8
                                    AND (t.limit_keys IS NULL OR NOT EXISTS (SELECT 1 FROM coord_rate_limits AS l WHERE l.queue = :queue::text))
                                  ORDER BY t.partition, t.priority DESC, t.id
                                  LIMIT r.lim
                                    FOR UPDATE SKIP LOCKED) AS h
            UNION ALL
            SELECT * FROM (SELECT t.id, t.priority FROM coord_tasks AS t
                            WHERE t.queue = :queue::text AND t.status = 'running'
                              AND t.lease_expires_at <= coord_now(:now::float8) - :min_due_age_s::float8
                              AND (t.limit_keys IS NULL OR NOT EXISTS (SELECT 1 FROM coord_rate_limits AS l WHERE l.queue = :queue::text))
                              AND t.is_head
                              AND t.attempts < t.max_attempts
                              AND t.partition = ANY(r.parts)
                            ORDER BY t.priority DESC, t.id
                            LIMIT r.lim
                              FOR UPDATE SKIP LOCKED) AS expired) AS u
         ORDER BY u.priority DESC, u.id
         LIMIT r.lim) AS c)
UPDATE coord_tasks AS t
   SET reclaimed = (t.status = 'running'),
       status = 'running', attempts = t.attempts + 1,
       lease_owner = b.node_id, lease_token = :token::text || '.' || t.id,
       lease_expires_at = coord_now(:now::float8) + b.lease_s,
       version = t.version + 1, updated_at = coord_now(:now::float8)
  FROM picked AS b
 WHERE t.id = b.id
RETURNING t.id, t.queue, t.partition_key, t.partition, t.idempotency_key, t.payload, t.priority, t.status, t.attempts, t.max_attempts, t.run_at, t.lease_owner, t.lease_token, t.lease_expires_at, t.version, t.last_error, t.result, t.created_at, t.updated_at, t.reclaimed,
          t.idempotency_key IS NOT NULL AND (SELECT true FROM coord_processed AS p
                                              WHERE p.consumer = t.queue AND p.message_id = t.idempotency_key) IS NOT NULL,
          (SELECT found FROM exhausted);

-- name: claimed_by_token
-- A claim retried after its connection was lost while the server ran it: the tasks its
-- first attempt leased, if that attempt went through (each leased task's token is the
-- claim's :token, a dot and its id; the claim's owner, or for claim_batch each of its claims'
-- owners, among :node_ids), in the claim's columns, so the retry returns them
-- instead of leaving them leased to nobody until their lease expires. Read through
-- coord_tasks_lease_expiry (the queue's running tasks).
SELECT id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed,
       idempotency_key IS NOT NULL AND (SELECT true FROM coord_processed AS p
                                         WHERE p.consumer = queue AND p.message_id = idempotency_key) IS NOT NULL,
       EXISTS (SELECT 1 FROM coord_tasks AS x
                WHERE x.queue = :queue::text AND x.status = 'running'
                  AND x.lease_expires_at <= coord_now(:now::float8) AND x.attempts >= x.max_attempts)
  FROM coord_tasks
 WHERE queue = :queue::text AND status = 'running' AND lease_owner = ANY(:node_ids::text[])
   AND left(lease_token, length(:token::text) + 1) = :token::text || '.'
 ORDER BY priority DESC, id;

-- name: claimable_partitions
-- A read for the runtime's idle poll: the partitions (of :partitions, or all) where an
-- unordered claim would find something now: a due pending task (coord_tasks_pending), or a
-- lease expired :min_due_age_s ago (coord_tasks_lease_expiry; also one on its last attempt:
-- the claim dead-letters it). Nothing is locked or written.
SELECT t.partition FROM coord_tasks AS t
 WHERE t.queue = :queue::text AND t.status = 'pending'
   AND t.run_at <= coord_now(:now::float8) - :min_due_age_s::float8
   AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
UNION
SELECT t.partition FROM coord_tasks AS t
 WHERE t.queue = :queue::text AND t.status = 'running'
   AND t.lease_expires_at <= coord_now(:now::float8) - :min_due_age_s::float8
   AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]));

-- name: claimable_partitions_ordered
-- claimable_partitions for an ordered claim: only keys' heads count
-- (coord_tasks_pending_heads / coord_tasks_pending_heads_partition).
SELECT t.partition FROM coord_tasks AS t
 WHERE t.queue = :queue::text AND t.is_head AND t.status = 'pending'
   AND t.run_at <= coord_now(:now::float8) - :min_due_age_s::float8
   AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
UNION
SELECT t.partition FROM coord_tasks AS t
 WHERE t.queue = :queue::text AND t.status = 'running' AND t.is_head
   AND t.lease_expires_at <= coord_now(:now::float8) - :min_due_age_s::float8
   AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]));

-- name: settle_duplicate
-- Claimed tasks whose message id was already processed: done without running them
-- (a compare-and-set on the claim's lease, under lock_keys).
UPDATE coord_tasks AS t
   SET status = 'done', active = false, is_head = false, result = '{"duplicate": true}', last_error = NULL,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = t.version + 1, updated_at = coord_now(:now::float8)
  FROM unnest(:ids::bigint[], :tokens::text[]) AS b (id, token)
 WHERE t.id = b.id AND t.lease_token = b.token AND t.status <> ALL ('{pending,done,dead}') AND t.idempotency_key IS NOT NULL
   AND EXISTS (SELECT 1 FROM coord_processed AS p WHERE p.consumer = t.queue AND p.message_id = t.idempotency_key)
RETURNING t.id;

-- name: complete_batch
-- A whole commit batch in one statement (coord_complete_batch, schema version 6): key
-- locks, fence check, a compare-and-set per task on (id, lease_token, version) plus a
-- live lease, fence records, processed-id records, head promotion and the notification;
-- since schema version 8 also the continuations of complete_and_claim_next (:next_owners,
-- :next_lease_s: the next task of a completed task's key leased to its owner; rows of kind
-- 'n' carry the leased task in the claims' column order from column 5, 'x' a next task
-- settled as a duplicate).
SELECT r_id, r_kind, r_version, r_at, r_top,
       n_id, n_queue, n_partition_key, n_partition, n_idempotency_key, n_payload, n_priority, n_status,
       n_attempts, n_max_attempts, n_run_at, n_lease_owner, n_lease_token, n_lease_expires_at, n_version,
       n_last_error, n_result, n_created_at, n_updated_at, n_reclaimed
  FROM coord_complete_batch(:ids::bigint[], :tokens::text[], :versions::bigint[], :results::text[],
                            :queues::text[], :keys::text[], :fence_resources::text[], :fence_tokens::bigint[],
                            :next_owners::text[], :next_lease_s::float8[], :next_token::text,
                            :channel::text, :sender::text, :now::float8);

-- name: select_key_head
-- PostgreSQL only: the head of one key, read after a lost connection to learn whether a
-- continuing commit's earlier attempt leased it (complete_and_claim_next).
SELECT id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed
  FROM coord_tasks WHERE queue = :queue::text AND partition_key = :partition_key::text AND is_head;

-- name: retry
UPDATE coord_tasks
   SET status = 'pending', run_at = coord_now(:now::float8) + :delay_s::float8, last_error = :error::text,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = coord_now(:now::float8)
 WHERE id = :id::bigint AND lease_token = :lease_token::text AND version = :version::bigint
   AND status = 'running' AND lease_expires_at > coord_now(:now::float8)
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: dead_letter
UPDATE coord_tasks
   SET status = 'dead', active = false, is_head = false, last_error = :error::text,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = coord_now(:now::float8)
 WHERE id = :id::bigint AND lease_token = :lease_token::text AND version = :version::bigint
   AND status = 'running' AND lease_expires_at > coord_now(:now::float8)
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: release
-- :refund 1 gives the attempt back, 0 keeps it counted (a send cut short may have gone out).
UPDATE coord_tasks
   SET status = 'pending', run_at = coord_now(:now::float8) + :delay_s::float8,
       attempts = greatest(attempts - :refund::int, 0),
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = version + 1, updated_at = coord_now(:now::float8)
 WHERE id = :id::bigint AND lease_token = :lease_token::text AND version = :version::bigint
   AND status = 'running' AND lease_expires_at > coord_now(:now::float8)
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: release_many
-- PostgreSQL only: hand back the tasks of a claim whose caller was cancelled (by lease token).
UPDATE coord_tasks AS t
   SET status = 'pending', run_at = coord_now(:now::float8), attempts = greatest(t.attempts - 1, 0),
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = t.version + 1, updated_at = coord_now(:now::float8)
  FROM unnest(:ids::bigint[], :tokens::text[]) AS b (id, token)
 WHERE t.id = b.id AND t.lease_token = b.token AND t.status <> ALL ('{pending,done,dead}')
RETURNING t.id;

-- name: extend
UPDATE coord_tasks SET lease_expires_at = coord_now(:now::float8) + :lease_s::float8
 WHERE id = :id::bigint AND lease_token = :lease_token::text AND version = :version::bigint
   AND status = 'running' AND lease_expires_at > coord_now(:now::float8)
RETURNING lease_expires_at;

-- name: extend_many
-- Each lease with its own TTL (:lease_s, seconds, one per id): one statement renews the
-- leases of several extend_many calls. The rows are locked first, in id order (the
-- ARRAY(...) runs to its end before the update), as a commit batch locks them: in another
-- order (the join's, say) a renewal and a commit could each hold a row the other waits for.
UPDATE coord_tasks AS t SET lease_expires_at = coord_now(:now::float8) + b.lease_s
  FROM unnest(:ids::bigint[], :tokens::text[], :lease_s::float8[]) AS b (id, token, lease_s)
 WHERE t.id = b.id AND t.lease_token = b.token
   AND t.id = ANY(ARRAY(SELECT l.id FROM coord_tasks AS l WHERE l.id = ANY(:ids::bigint[])
                         ORDER BY l.id FOR NO KEY UPDATE))
   AND t.status <> ALL ('{pending,done,dead}') AND t.lease_expires_at > coord_now(:now::float8)
RETURNING t.id, t.lease_token;

-- name: stats_queue
-- Pending tasks of :queue, the run_at of its oldest due one (a seek of coord_tasks_pending_due),
-- its running, done and dead tasks, and the store clock, in one statement (one snapshot). Each
-- count reads its status's partial index (coord_tasks_pending_due, coord_tasks_lease_expiry,
-- coord_tasks_done, coord_tasks_dead_order), index-only where the pages are all-visible, never
-- the table: the done tasks cost a walk of their index, not a scan of every row.
SELECT (SELECT count(*) FROM coord_tasks WHERE queue = :queue::text AND status = 'pending'),
       (SELECT min(run_at) FROM coord_tasks
         WHERE queue = :queue::text AND status = 'pending' AND run_at <= coord_now(:now::float8)),
       (SELECT count(*) FROM coord_tasks WHERE queue = :queue::text AND status = 'running'),
       (SELECT count(*) FROM coord_tasks WHERE queue = :queue::text AND status = 'done'),
       (SELECT count(*) FROM coord_tasks WHERE queue = :queue::text AND status = 'dead'),
       coord_now(:now::float8);

-- name: stats_all
-- stats_queue over every queue: the same partial indexes, each read whole.
SELECT (SELECT count(*) FROM coord_tasks WHERE status = 'pending'),
       (SELECT min(run_at) FROM coord_tasks WHERE status = 'pending' AND run_at <= coord_now(:now::float8)),
       (SELECT count(*) FROM coord_tasks WHERE status = 'running'),
       (SELECT count(*) FROM coord_tasks WHERE status = 'done'),
       (SELECT count(*) FROM coord_tasks WHERE status = 'dead'),
       coord_now(:now::float8);

-- name: queue_unfinished
-- One pending or running task of the queue, if any: the first entry of coord_tasks_pending,
-- then of coord_tasks_lease_expiry (partial indexes), never a count over the table.
SELECT EXISTS (SELECT 1 FROM coord_tasks WHERE queue = :queue::text AND status = 'pending')
    OR EXISTS (SELECT 1 FROM coord_tasks WHERE queue = :queue::text AND status = 'running');

-- name: requeue_dead
-- PostgreSQL: only tasks of :keys, the keys dead_keys found and lock_keys locked (a task
-- that died meanwhile under another key stays dead: its key's heads need the key's lock).
-- is_head: false where the queue keeps heads (recompute_heads follows), else NULL (as at insert).
UPDATE coord_tasks
   SET status = 'pending', active = true, attempts = 0, run_at = coord_now(:now::float8),
       is_head = CASE WHEN :keeps_heads::boolean THEN false END,
       version = version + 1, updated_at = coord_now(:now::float8)
 WHERE queue = :queue::text AND status = 'dead'
   AND (:ids::bigint[] IS NULL OR id = ANY(:ids::bigint[])) AND partition_key = ANY(:keys::text[])
RETURNING id, queue, partition_key, partition;

-- name: dead_keys
-- PostgreSQL only: the keys requeue_dead will touch (locked before it runs).
SELECT DISTINCT queue, partition_key FROM coord_tasks
 WHERE queue = :queue::text AND status = 'dead' AND (:ids::bigint[] IS NULL OR id = ANY(:ids::bigint[]));

-- name: is_processed
SELECT 1 FROM coord_processed WHERE consumer = :consumer::text AND message_id = :message_id::text;

-- name: purge_processed_batch
-- Returns the number of records deleted (as purge_finished_batch does).
WITH gone AS (
    DELETE FROM coord_processed
     WHERE ctid = ANY(ARRAY(SELECT ctid FROM coord_processed
                             WHERE processed_at < coord_now(:now::float8) - :age_s::float8 LIMIT :batch::int))
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: count_removed
-- What a discard deleted from a queue, in its transaction (purge_finished_batch counts its own).
INSERT INTO coord_queue_removed AS r (queue, done, dead) VALUES (:queue::text, :done::bigint, :dead::bigint)
ON CONFLICT (queue) DO UPDATE SET done = r.done + EXCLUDED.done, dead = r.dead + EXCLUDED.dead;

-- name: purge_finished_batch
-- Deletes a batch and counts it in coord_queue_removed (migration_0006.sql), in one statement.
WITH gone AS (
    DELETE FROM coord_tasks
     WHERE id IN (SELECT id FROM coord_tasks
                   WHERE queue = :queue::text AND status = 'done'
                     AND updated_at < coord_now(:now::float8) - :age_s::float8
                   LIMIT :batch::int)
    RETURNING 1
), counted AS (
    INSERT INTO coord_queue_removed AS r (queue, done)
    SELECT :queue::text, count(*) FROM gone HAVING count(*) > 0
    ON CONFLICT (queue) DO UPDATE SET done = r.done + EXCLUDED.done
)
SELECT count(*) FROM gone;

-- name: notify
-- PostgreSQL only: wake idle nodes of other processes (delivered at commit).
SELECT pg_notify(:channel::text, :payload::text);

-- Unchecked operations: what a naive queue does (read, then write without a
-- compare-and-set). Only for measuring what the version layer buys.

-- name: unchecked_peek
SELECT id FROM coord_tasks AS t
 WHERE t.queue = :queue::text AND t.status = 'pending' AND t.run_at <= coord_now(:now::float8)
   AND (:partitions::int[] IS NULL OR t.partition = ANY(:partitions::int[]))
 ORDER BY t.priority DESC, t.id
 LIMIT :limit::int;

-- name: unchecked_claim
UPDATE coord_tasks
   SET status = 'running', attempts = attempts + 1,
       lease_owner = :node_id::text, lease_token = :token::text || '.' || id,
       lease_expires_at = coord_now(:now::float8) + :lease_s::float8,
       version = version + 1, updated_at = coord_now(:now::float8)
 WHERE id = ANY(:ids::bigint[]) AND active
RETURNING id, queue, partition_key, partition, idempotency_key, payload, priority, status, attempts, max_attempts, run_at, lease_owner, lease_token, lease_expires_at, version, last_error, result, created_at, updated_at, reclaimed;

-- name: unchecked_complete
UPDATE coord_tasks AS t
   SET status = 'done', active = false, is_head = false, result = b.result, last_error = NULL,
       lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
       version = t.version + 1, updated_at = coord_now(:now::float8)
  FROM unnest(:ids::bigint[], :results::text[]) AS b (id, result)
 WHERE t.id = b.id
RETURNING t.queue, t.partition_key;
