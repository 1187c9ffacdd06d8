-- asynccoord schema revision 3 (PostgreSQL): the dead-letter policy 'hold' (as the SQLite
-- store's migration_0002.sql has it; semantics in contract/deadletters.py). A key of a queue
-- whose policy is 'hold' has no head while a dead task precedes its earliest pending or
-- running task: no ordered claim and no continuation leases a later task of it until the
-- dead task is requeued or discarded.
--
-- Where the policy is read. coord_queue_settings holds it for every queue that set one;
-- coord_ordered_queues.hold mirrors it for the queues that keep heads, the only ones whose
-- heads it moves. Both are written under the queue's exclusive advisory lock (the lock of
-- coord_share_queues and coord_keep_heads). Head upkeep reads the mirror: a commit batch in
-- the statement that already reads which of its queues keep heads (no extra read), and
-- promote_heads in one probe per statement; the dead tasks of a key are looked for only in
-- a queue that holds, so a queue with 'skip' (the default) pays nothing more than before.

-- One row per queue that set a policy (set_dead_letter_policy): 'skip' or 'hold'.
CREATE TABLE IF NOT EXISTS coord_queue_settings (
    queue        text PRIMARY KEY,
    dead_letters text NOT NULL DEFAULT 'skip' CHECK (dead_letters IN ('skip', 'hold'))
);

-- The policy of a queue that keeps heads, for head upkeep (true: 'hold'). A column with a
-- constant default: only the catalog changes.
ALTER TABLE coord_ordered_queues ADD COLUMN IF NOT EXISTS hold boolean NOT NULL DEFAULT false;

-- Dead tasks of a key, oldest first: whether a key of a 'hold' queue is held (one probe).
-- Written once per dead-lettered task; a queue that dead-letters nothing writes nothing here.
CREATE INDEX IF NOT EXISTS coord_tasks_dead ON coord_tasks (queue, partition_key, id) WHERE status = 'dead';

-- coord_compute_heads of migration_0001.sql, and the policy: in a 'hold' queue a key whose
-- earliest active task a dead task precedes gets no head (its head, if any, is cleared).
-- Called by coord_keep_heads and by coord_set_dead_letters, under the queue's exclusive lock.
CREATE OR REPLACE FUNCTION coord_compute_heads(p_queue text) RETURNS integer
    LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_heads integer;
    v_hold  boolean;
BEGIN
    v_hold := EXISTS (SELECT 1 FROM coord_queue_settings AS s WHERE s.queue = p_queue AND s.dead_letters = 'hold');
    INSERT INTO coord_task_keys (queue, partition_key)
    SELECT DISTINCT a.queue, a.partition_key FROM coord_tasks AS a
     WHERE a.queue = p_queue AND (a.status = 'pending' OR a.status = 'running')
    ORDER BY 1, 2
    ON CONFLICT (queue, partition_key) DO NOTHING;
    UPDATE coord_tasks SET is_head = false
     WHERE queue = p_queue AND (status = 'pending' OR status = 'running') AND is_head IS NULL;
    UPDATE coord_tasks AS t SET is_head = false  -- a head is active (CHECK): wrong if not its key's head now
     WHERE t.queue = p_queue AND t.is_head
       AND t.id NOT IN (SELECT h.id FROM (SELECT a.partition_key, min(a.id) AS id FROM coord_tasks AS a
                                           WHERE a.queue = p_queue AND (a.status = 'pending' OR a.status = 'running')
                                           GROUP BY a.partition_key) AS h
                         WHERE NOT v_hold
                            OR NOT EXISTS (SELECT 1 FROM coord_tasks AS d
                                            WHERE d.queue = p_queue AND d.partition_key = h.partition_key
                                              AND d.status = 'dead' AND d.id < h.id));
    UPDATE coord_tasks AS t SET is_head = true
      FROM (SELECT a.partition_key, min(a.id) AS id FROM coord_tasks AS a
             WHERE a.queue = p_queue AND (a.status = 'pending' OR a.status = 'running')
             GROUP BY a.partition_key) AS h
     WHERE t.id = h.id AND NOT t.is_head
       AND (NOT v_hold
            OR NOT EXISTS (SELECT 1 FROM coord_tasks AS d
                            WHERE d.queue = p_queue AND d.partition_key = h.partition_key
                              AND d.status = 'dead' AND d.id < h.id));
    GET DIAGNOSTICS v_heads = ROW_COUNT;
    RETURN v_heads;
END
$fn$;

-- coord_keep_heads of migration_0001.sql, and the queue's policy copied into
-- coord_ordered_queues.hold when it is recorded (under the same exclusive lock).
CREATE OR REPLACE FUNCTION coord_keep_heads(p_queue text) RETURNS integer
    LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_new integer;
BEGIN
    IF EXISTS (SELECT 1 FROM coord_ordered_queues WHERE queue = p_queue) THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock(1633907061, hashtext(current_schema() || '.' || p_queue));
    INSERT INTO coord_ordered_queues (queue, hold)
    VALUES (p_queue, EXISTS (SELECT 1 FROM coord_queue_settings AS s
                              WHERE s.queue = p_queue AND s.dead_letters = 'hold'))
    ON CONFLICT (queue) DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    IF v_new = 0 THEN
        RETURN 0;
    END IF;
    RETURN coord_compute_heads(p_queue);
END
$fn$;

-- Which of p_queues keep heads and hold keys behind dead tasks (coord_ordered_queues.hold).
-- promote_heads calls it once per statement (an InitPlan). A PL/pgSQL function rather than a
-- subquery: the planner reads this table of a few rows by a sequential scan, which would sit
-- in promote_heads' plan beside the index probes per key that make the statement's cost.
CREATE OR REPLACE FUNCTION coord_held_queues(p_queues text[]) RETURNS text[]
    LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    RETURN coalesce((SELECT array_agg(o.queue) FROM coord_ordered_queues AS o
                      WHERE o.queue = ANY(p_queues) AND o.hold), '{}');
END
$fn$;

-- Set p_queue's dead-letter policy ('skip' or 'hold') for every process. Under the queue's
-- exclusive advisory lock (it waits for every commit batch and every transition of a queue
-- not yet keeping heads that share-locked it, and for coord_keep_heads), it records the
-- policy and, if the queue keeps heads and the policy changed, mirrors it into
-- coord_ordered_queues.hold, takes the row lock of every key of the queue (sorted, as
-- lock_keys: it waits for every transition in flight on them, and every later one waits
-- for this commit and then reads the new policy) and recomputes the queue's heads
-- (coord_compute_heads). Returns how many heads it marked (0 when no head can move).
CREATE OR REPLACE FUNCTION coord_set_dead_letters(p_queue text, p_policy text) RETURNS integer
    LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(1633907061, hashtext(current_schema() || '.' || p_queue));
    INSERT INTO coord_queue_settings (queue, dead_letters) VALUES (p_queue, p_policy)
    ON CONFLICT (queue) DO UPDATE SET dead_letters = excluded.dead_letters;
    UPDATE coord_ordered_queues SET hold = (p_policy = 'hold') WHERE queue = p_queue AND hold <> (p_policy = 'hold');
    IF NOT FOUND THEN
        RETURN 0;  -- a queue without heads, or the same policy: no head moves
    END IF;
    INSERT INTO coord_task_keys AS k (queue, partition_key)
    SELECT p_queue, u.pk FROM (SELECT c.partition_key AS pk FROM coord_task_keys AS c WHERE c.queue = p_queue
                               UNION
                               SELECT d.partition_key FROM coord_tasks AS d
                                WHERE d.queue = p_queue AND d.status = 'dead') AS u
     ORDER BY 1, 2
    ON CONFLICT (queue, partition_key) DO UPDATE SET touches = k.touches + 1;
    RETURN coord_compute_heads(p_queue);
END
$fn$;

-- Promotion of these keys' next heads in queues that keep heads (p_kept), some of which
-- hold (p_held): as promote_heads of migration_0001.sql, but a key of a holding queue whose
-- earliest active task a dead task precedes gets no head. Under the keys' row locks. Used by
-- coord_complete_batch (steps 6 and 8) only when a queue of its batch holds.
CREATE OR REPLACE FUNCTION coord_promote_held(p_queues text[], p_keys text[], p_kept text[], p_held text[])
    RETURNS TABLE (r_id bigint, r_queue text, r_partition integer)
    LANGUAGE sql VOLATILE AS $fn$
    UPDATE coord_tasks SET is_head = true
     WHERE NOT is_head AND id = ANY(ARRAY(
        SELECT c.id
          FROM (SELECT k.q, k.pk,
                       least((SELECT h.id FROM coord_tasks AS h
                               WHERE h.queue = k.q AND h.partition_key = k.pk AND h.is_head),
                             (SELECT t.id FROM coord_tasks AS t
                               WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active AND NOT t.is_head
                               ORDER BY t.id LIMIT 1)) AS id
                  FROM (SELECT DISTINCT u.q, u.pk FROM unnest(p_queues, p_keys) AS u (q, pk)
                         WHERE u.q = ANY(p_kept)) AS k) AS c
         WHERE c.q <> ALL (p_held)
            OR NOT EXISTS (SELECT 1 FROM coord_tasks AS d
                            WHERE d.queue = c.q AND d.partition_key = c.pk AND d.status = 'dead' AND d.id < c.id)))
    RETURNING id, queue, partition
$fn$;

-- coord_complete_batch of migration_0001.sql, with the policy: step 0 also reads which of the
-- batch's queues hold (v_held), and steps 6 and 8 promote through coord_promote_held when any
-- does (as before otherwise).
CREATE OR REPLACE FUNCTION coord_complete_batch(p_ids bigint[], p_tokens text[], p_versions bigint[], p_results text[],
                                     p_queues text[], p_keys text[],
                                     p_fence_resources text[], p_fence_tokens bigint[],
                                     p_next_owners text[], p_next_lease_s double precision[], p_next_token text,
                                     p_channel text, p_sender text, p_now double precision)
    RETURNS TABLE (r_id bigint, r_kind text, r_version bigint, r_at double precision, r_top bigint,
                   n_id bigint, n_queue text, n_partition_key text, n_partition integer, n_idempotency_key text,
                   n_payload text, n_priority integer, n_status text, n_attempts integer, n_max_attempts integer,
                   n_run_at double precision, n_lease_owner text, n_lease_token text,
                   n_lease_expires_at double precision, n_version bigint, n_last_error text, n_result text,
                   n_created_at double precision, n_updated_at double precision, n_reclaimed boolean)
    LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_keys      integer;
    v_locked    integer;
    v_refused   bigint[] := '{}';
    v_tops      bigint[] := '{}';
    v_ids       bigint[];
    v_versions  bigint[];
    v_at        double precision[];
    v_queues    text[];
    v_pkeys     text[];
    v_messages  text[];
    v_expected  integer;
    v_recorded  integer;
    v_notified  integer;
    v_new_ids   bigint[] := '{}';
    v_new_q     text[] := '{}';
    v_new_parts integer[] := '{}';
    v_next_for  bigint[] := '{}';
    v_next_ids  bigint[] := '{}';
    v_dup_for   bigint[] := '{}';
    v_dup_ids   bigint[] := '{}';
    v_dup_q     text[] := '{}';
    v_dup_pk    text[] := '{}';
    v_kept      text[];
    v_alt_q     text[];
    v_alt_pk    text[];
    v_held      text[];
BEGIN
    -- 0. The queues of the batch that keep per-key heads (coord_ordered_queues): a shared
    --    lock on each queue of the batch (coord_share_queues; cheap, and only a queue's
    --    first ordered claim takes it exclusively) is taken first and the flags read after
    --    it, in a statement of its own (a new snapshot), so a queue that starts keeping heads
    --    concurrently (coord_keep_heads, under the exclusive lock) either waits for this
    --    transaction or is seen keeping them.
    --    The same statement reads which of them hold a key behind its dead task (the
    --    dead-letter policy 'hold', mirrored in coord_ordered_queues.hold): a policy
    --    change (coord_set_dead_letters) takes the queue's lock exclusively, so it stays
    --    as read to this transaction's commit.
    PERFORM coord_share_queues(p_queues);
    SELECT coalesce(array_agg(o.queue), '{}'), coalesce(array_agg(o.queue) FILTER (WHERE o.hold), '{}')
      INTO v_kept, v_held
      FROM coord_ordered_queues AS o WHERE o.queue = ANY(p_queues);

    -- 1. The row locks of the keys of the queues that keep heads, in sorted order (the
    --    order of lock_keys: two transactions never deadlock on them). A key row is made at
    --    enqueue, so it exists; should one be missing, lock_keys' insert makes and locks it.
    IF cardinality(v_kept) > 0 THEN
        SELECT count(*) INTO v_locked FROM (
            SELECT 1 FROM coord_task_keys AS k
             WHERE (k.queue, k.partition_key) IN (SELECT u.q, u.pk FROM unnest(p_queues, p_keys) AS u (q, pk)
                                                   WHERE u.q = ANY(v_kept))
             ORDER BY k.queue, k.partition_key
               FOR UPDATE) AS l;
        SELECT count(*) INTO v_keys FROM (SELECT DISTINCT u.q, u.pk FROM unnest(p_queues, p_keys) AS u (q, pk)
                                           WHERE u.q = ANY(v_kept)) AS d;
        IF v_locked < v_keys THEN
            INSERT INTO coord_task_keys (queue, partition_key)
            SELECT DISTINCT u.q, u.pk FROM unnest(p_queues, p_keys) AS u (q, pk) WHERE u.q = ANY(v_kept) ORDER BY 1, 2
            ON CONFLICT (queue, partition_key) DO UPDATE SET touches = coord_task_keys.touches + 1;
        END IF;
    END IF;

    -- 2. Fences: lock their rows (sorted) and refuse the tasks whose token is below the
    --    highest recorded.
    IF p_fence_resources IS NOT NULL THEN
        WITH top AS (
            SELECT f.resource, f.fencing_token FROM coord_fences AS f
             WHERE f.resource = ANY(p_fence_resources)
             ORDER BY f.resource
               FOR UPDATE)
        SELECT coalesce(array_agg(u.id), '{}'), coalesce(array_agg(top.fencing_token), '{}')
          INTO v_refused, v_tops
          FROM unnest(p_ids, p_fence_resources, p_fence_tokens) AS u (id, r, tok)
          JOIN top ON top.resource = u.r
         WHERE u.tok < top.fencing_token;
    END IF;

    -- 3. The compare-and-set of each remaining task on (id, lease_token, version), with a
    --    live lease. The state is checked as "not pending, done or dead" rather than
    --    "= 'running'" (the same under the CHECK constraint; a lease token is only ever set
    --    while running): "= 'running'" lets the planner read the batch through
    --    coord_tasks_lease_expiry, every running task, whose statistics (taken when none
    --    ran, and never covering leases granted since) promise one row; this way the only
    --    path to the rows is the primary key.
    WITH done AS (
        UPDATE coord_tasks AS t
           SET status = 'done', active = false, is_head = false, result = b.result, last_error = NULL,
               lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
               version = t.version + 1, updated_at = coord_now(p_now)
          FROM unnest(p_ids, p_tokens, p_versions, p_results, p_queues, p_keys) AS b (id, token, version, result, q, pk)
         WHERE t.id = b.id AND NOT (b.id = ANY(v_refused))
           AND t.lease_token = b.token AND t.version = b.version
           AND t.status <> ALL ('{pending,done,dead}') AND t.lease_expires_at > coord_now(p_now)
        RETURNING t.id, t.version, t.updated_at, t.queue, t.partition_key, t.idempotency_key,
                  (t.queue, t.partition_key) IS DISTINCT FROM (b.q, b.pk) AS altered)
    SELECT coalesce(array_agg(d.id), '{}'), coalesce(array_agg(d.version), '{}'), coalesce(array_agg(d.updated_at), '{}'),
           coalesce(array_agg(d.queue), '{}'), coalesce(array_agg(d.partition_key), '{}'),
           coalesce(array_agg(d.idempotency_key), '{}'), coalesce(array_agg(d.queue) FILTER (WHERE d.altered), '{}'),
           coalesce(array_agg(d.partition_key) FILTER (WHERE d.altered), '{}')
      INTO v_ids, v_versions, v_at, v_queues, v_pkeys, v_messages, v_alt_q, v_alt_pk
      FROM done AS d;

    -- 3b. A task named by the caller with another queue than its own (an altered copy: the
    --     stored queue and key are the ones committed and promoted): its own queue is
    --     share-locked now and the flags read again (the batch's other queues cannot have
    --     changed, their locks are held). The task's row is locked by 3 already, so the lock
    --     is not waited for (coord_keep_heads, holding it, may be waiting for that row): the
    --     batch fails as a serialization failure instead, and the client runs it again.
    IF EXISTS (SELECT 1 FROM unnest(v_queues) AS u (q) WHERE u.q <> ALL (p_queues)) THEN
        IF NOT (SELECT bool_and(pg_try_advisory_xact_lock_shared(1633907061, hashtext(current_schema() || '.' || o.q)))
                  FROM (SELECT DISTINCT u.q FROM unnest(v_queues) AS u (q) WHERE u.q <> ALL (p_queues)) AS o) THEN
            RAISE EXCEPTION 'asynccoord: a queue of the batch is starting to keep heads'
                  USING ERRCODE = 'serialization_failure';
        END IF;
        SELECT coalesce(array_agg(o.queue), '{}'), coalesce(array_agg(o.queue) FILTER (WHERE o.hold), '{}')
          INTO v_kept, v_held
          FROM coord_ordered_queues AS o WHERE o.queue = ANY(p_queues || v_queues);
    END IF;

    -- 3c. A committed task named with another key (or queue) than its own, in a queue that
    --     keeps heads: 1 locked the caller's key row, not the task's own, which 6 and 7
    --     promote and continue. Its row is locked now (made if missing, as in 1), or an
    --     enqueue of that key running meanwhile could see the committed task as the head
    --     still, and promote nothing while 6 misses the enqueued task: a key left without a
    --     head, never claimed in order again. Waiting here with the batch's other locks held
    --     can deadlock; the server detects it and the client runs the batch again.
    IF cardinality(v_alt_q) > 0 AND cardinality(v_kept) > 0 THEN
        INSERT INTO coord_task_keys AS k (queue, partition_key)
        SELECT DISTINCT a.q, a.pk FROM unnest(v_alt_q, v_alt_pk) AS a (q, pk) WHERE a.q = ANY(v_kept) ORDER BY 1, 2
        ON CONFLICT (queue, partition_key) DO UPDATE SET touches = k.touches + 1;
    END IF;

    -- 4. The fencing tokens of the committed fenced tasks (under the rows locked in 2).
    IF p_fence_resources IS NOT NULL THEN
        SELECT count(DISTINCT u.r) INTO v_expected
          FROM unnest(p_ids, p_fence_resources) AS u (id, r)
         WHERE u.r IS NOT NULL AND u.id = ANY(v_ids);
        IF v_expected > 0 THEN
            WITH recorded AS (
                INSERT INTO coord_fences AS f (resource, fencing_token, data, updated_at)
                SELECT u.r, max(u.tok), NULL, coord_now(p_now)
                  FROM unnest(p_ids, p_fence_resources, p_fence_tokens) AS u (id, r, tok)
                 WHERE u.r IS NOT NULL AND u.id = ANY(v_ids)
                 GROUP BY u.r ORDER BY u.r
                ON CONFLICT (resource) DO UPDATE SET fencing_token = excluded.fencing_token, updated_at = excluded.updated_at
                 WHERE excluded.fencing_token >= f.fencing_token
                RETURNING 1)
            SELECT count(*) INTO v_recorded FROM recorded;
            IF v_recorded < v_expected THEN
                RAISE EXCEPTION 'asynccoord: a higher fencing token was recorded concurrently'
                      USING ERRCODE = 'serialization_failure';
            END IF;
        END IF;
    END IF;

    -- 5. The processed-id records of the committed tasks that carry a message id.
    INSERT INTO coord_processed (consumer, message_id, processed_at)
    SELECT u.q, u.m, coord_now(p_now) FROM unnest(v_queues, v_messages) AS u (q, m) WHERE u.m IS NOT NULL
    ON CONFLICT (consumer, message_id) DO NOTHING;

    -- 6. The new heads of the committed tasks' keys in queues that keep heads (promote_heads,
    --    schema version 7), kept for the continuations (7) and the notification (9). In a
    --    queue whose policy is 'hold' (v_held, rarely any), a key whose earliest active task
    --    a dead task precedes gets no head (coord_promote_held); the others, as ever.
    IF cardinality(v_ids) > 0 AND cardinality(v_held) > 0 THEN
        SELECT coalesce(array_agg(p.r_id), '{}'), coalesce(array_agg(p.r_queue), '{}'),
               coalesce(array_agg(p.r_partition), '{}')
          INTO v_new_ids, v_new_q, v_new_parts
          FROM coord_promote_held(v_queues, v_pkeys, v_kept, v_held) AS p;
    ELSIF cardinality(v_ids) > 0 AND cardinality(v_kept) > 0 THEN
        WITH promoted AS (
            UPDATE coord_tasks SET is_head = true
             WHERE NOT is_head AND id = ANY(ARRAY(
                SELECT least((SELECT h.id FROM coord_tasks AS h
                               WHERE h.queue = k.q AND h.partition_key = k.pk AND h.is_head),
                             (SELECT t.id FROM coord_tasks AS t
                               WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active AND NOT t.is_head
                               ORDER BY t.id LIMIT 1))
                  FROM (SELECT DISTINCT u.q, u.pk FROM unnest(v_queues, v_pkeys) AS u (q, pk)
                         WHERE u.q = ANY(v_kept)) AS k))
            RETURNING id, queue, partition)
        SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.queue), '{}'), coalesce(array_agg(p.partition), '{}')
          INTO v_new_ids, v_new_q, v_new_parts
          FROM promoted AS p;
    END IF;

    -- 7. Continuations (coord_lease_key_heads): per key, the first committed task of the batch
    --    that continues leases the key's head (under the key's row lock taken in 1; every head
    --    is marked by 6) if it is pending and due, or settles it as a duplicate. Only queues
    --    that keep heads have any (the client makes a queue keep them before it continues).
    IF p_next_owners IS NOT NULL AND cardinality(v_ids) > 0 AND cardinality(v_kept) > 0 THEN
        SELECT coalesce(array_agg(c.r_done) FILTER (WHERE NOT c.r_dup), '{}'),
               coalesce(array_agg(c.r_id) FILTER (WHERE NOT c.r_dup), '{}'),
               coalesce(array_agg(c.r_done) FILTER (WHERE c.r_dup), '{}'),
               coalesce(array_agg(c.r_id) FILTER (WHERE c.r_dup), '{}'),
               coalesce(array_agg(c.r_queue) FILTER (WHERE c.r_dup), '{}'),
               coalesce(array_agg(c.r_key) FILTER (WHERE c.r_dup), '{}')
          INTO v_next_for, v_next_ids, v_dup_for, v_dup_ids, v_dup_q, v_dup_pk
          FROM coord_lease_key_heads(v_ids, v_queues, v_pkeys, p_ids, p_next_owners, p_next_lease_s,
                                     p_next_token, p_now) AS c;

        -- 8. A duplicate settled in 7 left its key: promote the key's following task (as 6).
        IF cardinality(v_dup_ids) > 0 AND cardinality(v_held) > 0 THEN
            SELECT v_new_ids || coalesce(array_agg(p.r_id), '{}'), v_new_q || coalesce(array_agg(p.r_queue), '{}'),
                   v_new_parts || coalesce(array_agg(p.r_partition), '{}')
              INTO v_new_ids, v_new_q, v_new_parts
              FROM coord_promote_held(v_dup_q, v_dup_pk, v_kept, v_held) AS p;
        ELSIF cardinality(v_dup_ids) > 0 THEN
            WITH promoted AS (
                UPDATE coord_tasks SET is_head = true
                 WHERE NOT is_head AND id = ANY(ARRAY(
                    SELECT least((SELECT h.id FROM coord_tasks AS h
                                   WHERE h.queue = k.q AND h.partition_key = k.pk AND h.is_head),
                                 (SELECT t.id FROM coord_tasks AS t
                                   WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active AND NOT t.is_head
                                   ORDER BY t.id LIMIT 1))
                      FROM (SELECT DISTINCT u.q, u.pk FROM unnest(v_dup_q, v_dup_pk) AS u (q, pk)) AS k))
                RETURNING id, queue, partition)
            SELECT v_new_ids || coalesce(array_agg(p.id), '{}'), v_new_q || coalesce(array_agg(p.queue), '{}'),
                   v_new_parts || coalesce(array_agg(p.partition), '{}')
              INTO v_new_ids, v_new_q, v_new_parts
              FROM promoted AS p;
        END IF;
    END IF;

    -- 9. A work notification per queue naming the partitions of the promoted heads that
    --    were neither leased nor settled in 7 (delivered at commit).
    IF cardinality(v_new_ids) > 0 THEN
        SELECT count(*) INTO v_notified FROM (
            SELECT pg_notify(p_channel, json_build_object(
                       's', p_sender, 'q', g.queue, 'n', g.n, 'p', CASE WHEN g.n > 512 THEN NULL ELSE g.parts END)::text)
              FROM (SELECT u.q AS queue, count(DISTINCT u.p) AS n, array_agg(DISTINCT u.p ORDER BY u.p) AS parts
                      FROM unnest(v_new_ids, v_new_q, v_new_parts) AS u (id, q, p)
                     WHERE NOT (u.id = ANY(v_next_ids)) AND NOT (u.id = ANY(v_dup_ids))
                     GROUP BY u.q) AS g) AS sent;
    END IF;

    RETURN QUERY
        SELECT d.id, 'd'::text, d.v, d.at, NULL::bigint,
               NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::text, NULL::text, NULL::integer, NULL::text,
               NULL::integer, NULL::integer, NULL::double precision, NULL::text, NULL::text, NULL::double precision,
               NULL::bigint, NULL::text, NULL::text, NULL::double precision, NULL::double precision, NULL::boolean
          FROM unnest(v_ids, v_versions, v_at) AS d (id, v, at)
        UNION ALL
        SELECT f.id, 'f'::text, NULL::bigint, NULL::double precision, f.top,
               NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::text, NULL::text, NULL::integer, NULL::text,
               NULL::integer, NULL::integer, NULL::double precision, NULL::text, NULL::text, NULL::double precision,
               NULL::bigint, NULL::text, NULL::text, NULL::double precision, NULL::double precision, NULL::boolean
          FROM unnest(v_refused, v_tops) AS f (id, top)
        UNION ALL
        SELECT n.done_id, 'n'::text, NULL::bigint, NULL::double precision, NULL::bigint,
               t.id, t.queue, t.partition_key, t.partition, t.idempotency_key, t.payload, t.priority, t.status,
               t.attempts, t.max_attempts, t.run_at, t.lease_owner, t.lease_token, t.lease_expires_at,
               t.version, t.last_error, t.result, t.created_at, t.updated_at, t.reclaimed
          FROM unnest(v_next_for, v_next_ids) AS n (done_id, id)
          JOIN coord_tasks AS t ON t.id = n.id
        UNION ALL
        SELECT x.done_id, 'x'::text, NULL::bigint, NULL::double precision, NULL::bigint,
               x.id, NULL::text, NULL::text, NULL::integer, NULL::text, NULL::text, NULL::integer, NULL::text,
               NULL::integer, NULL::integer, NULL::double precision, NULL::text, NULL::text, NULL::double precision,
               NULL::bigint, NULL::text, NULL::text, NULL::double precision, NULL::double precision, NULL::boolean
          FROM unnest(v_dup_for, v_dup_ids) AS x (done_id, id);
END
$fn$;
