-- asynccoord schema revision 7 (PostgreSQL): a key keeps its head until the head leaves the
-- active set.
--
-- An enqueue draws its ids (next_task_ids) before coord_enqueue takes the keys' row locks,
-- so two processes enqueueing on one key may commit in the other order than their ids: the
-- later commit's task then has the lower id. Promotion used to mark the lower of a key's head
-- and its earliest non-head active task, which in that case was a second head beside the
-- first: coord_tasks_one_head refused it, and the enqueue (or a later transition of the key)
-- failed until the first head finished. Promotion now marks a key's earliest active task
-- only when the key has no head, so the task that lost the race follows the one that won,
-- in the order the enqueues committed. Nothing else changes: every other transition already
-- either leaves the head in place or clears it first (a requeue recomputes the key's heads).
-- The three functions below are those of migration_0003.sql (coord_promote_held,
-- coord_complete_batch) and migration_0004.sql (coord_enqueue) with that one expression
-- changed; promote_heads in queries.sql changes with them. The fourth, coord_compute_heads
-- (migration_0003.sql: a queue's heads from scratch, when it starts keeping them or its
-- dead-letter policy changes), keeps a key's running head: after such a race the earliest
-- active task of a key may be the pending one behind it, and taking the head from the
-- running task would let an ordered claim take a second task of the key. Nor does a key
-- get a new head while another of its tasks runs (its head cleared by a 'hold' policy
-- whose dead task precedes it): promotion gives it one when that task leaves.

CREATE OR REPLACE FUNCTION coord_promote_held(p_queues text[], p_keys text[], p_kept text[], p_held text[])
    RETURNS TABLE (r_id bigint, r_queue text, r_partition integer)
    LANGUAGE sql VOLATILE AS $fn$
    UPDATE coord_tasks SET is_head = true
     WHERE NOT is_head AND id = ANY(ARRAY(
        SELECT c.id
          FROM (SELECT k.q, k.pk,
                       (SELECT t.id FROM coord_tasks AS t
                               WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active AND NOT t.is_head
                                 AND NOT EXISTS (SELECT 1 FROM coord_tasks AS h
                                                  WHERE h.queue = k.q AND h.partition_key = k.pk AND h.is_head)
                               ORDER BY t.id LIMIT 1) AS id
                  FROM (SELECT DISTINCT u.q, u.pk FROM unnest(p_queues, p_keys) AS u (q, pk)
                         WHERE u.q = ANY(p_kept)) AS k) AS c
         WHERE c.q <> ALL (p_held)
            OR NOT EXISTS (SELECT 1 FROM coord_tasks AS d
                            WHERE d.queue = c.q AND d.partition_key = c.pk AND d.status = 'dead' AND d.id < c.id)))
    RETURNING id, queue, partition
$fn$;


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
                SELECT (SELECT t.id FROM coord_tasks AS t
                               WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active AND NOT t.is_head
                                 AND NOT EXISTS (SELECT 1 FROM coord_tasks AS h
                                                  WHERE h.queue = k.q AND h.partition_key = k.pk AND h.is_head)
                               ORDER BY t.id LIMIT 1)
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
                    SELECT (SELECT t.id FROM coord_tasks AS t
                                   WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active AND NOT t.is_head
                                     AND NOT EXISTS (SELECT 1 FROM coord_tasks AS h
                                                      WHERE h.queue = k.q AND h.partition_key = k.pk AND h.is_head)
                                   ORDER BY t.id LIMIT 1)
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


CREATE OR REPLACE FUNCTION coord_enqueue(p_ids bigint[], p_queues text[], p_partition_keys text[],
                                         p_partitions integer[], p_idempotency_keys text[], p_payloads text[],
                                         p_priorities integer[], p_max_attempts integer[],
                                         p_delays double precision[], p_limit_keys text[],
                                         p_channel text, p_sender text, p_now double precision)
    RETURNS TABLE (r_id bigint, r_queue text, r_partition_key text, r_partition integer, r_idempotency_key text,
                   r_payload text, r_priority integer, r_status text, r_attempts integer, r_max_attempts integer,
                   r_run_at double precision, r_lease_owner text, r_lease_token text,
                   r_lease_expires_at double precision, r_version bigint, r_last_error text, r_result text,
                   r_created_at double precision, r_updated_at double precision, r_reclaimed boolean,
                   r_created boolean)
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off AS $fn$
DECLARE
    v_queues text[];
    v_kept   text[];
    v_held   text[];
    v_rows   coord_tasks[];
    v_todo   bigint[];  -- inputs still without a row (NULL before the first round)
    v_rounds integer := 0;
BEGIN
    -- 1. The queues that keep per-key heads. A queue never stops keeping them: one read as
    --    keeping them needs no lock. The others are share-locked (coord_share_queues, held to
    --    the commit) and read again in a later statement (a newer snapshot), so a queue
    --    starting to keep heads meanwhile (coord_keep_heads) waits for this transaction.
    v_queues := ARRAY(SELECT DISTINCT u.q FROM unnest(p_queues) AS u (q) ORDER BY 1);
    v_kept := ARRAY(SELECT o.queue FROM coord_ordered_queues AS o WHERE o.queue = ANY(v_queues));
    IF cardinality(v_kept) < cardinality(v_queues) THEN
        PERFORM coord_share_queues(ARRAY(SELECT u.q FROM unnest(v_queues) AS u (q) WHERE u.q <> ALL (v_kept)));
        v_kept := ARRAY(SELECT o.queue FROM coord_ordered_queues AS o WHERE o.queue = ANY(v_queues));
    END IF;

    -- 2. The row locks of those queues' keys, in sorted order (lock_keys).
    IF cardinality(v_kept) > 0 THEN
        INSERT INTO coord_task_keys AS k (queue, partition_key)
        SELECT DISTINCT u.q, u.pk FROM unnest(p_queues, p_partition_keys) AS u (q, pk)
         WHERE u.q = ANY(v_kept) ORDER BY 1, 2
        ON CONFLICT (queue, partition_key) DO UPDATE SET touches = k.touches + 1;
    END IF;

    -- 3. The insert (insert_task: is_head false in queues that keep heads, NULL in the others;
    --    heads are marked by 4), skipping a task whose id or idempotency key is taken (by an
    --    earlier run of this call, or by another task), then each task's row: its own, or the
    --    task holding its idempotency key. Should that task be gone by the read (a purge
    --    committed in between), the input is inserted again.
    LOOP
        INSERT INTO coord_tasks (id, queue, partition_key, partition, idempotency_key, payload, priority, status,
                                 is_head, attempts, max_attempts, run_at, version, created_at, updated_at, limit_keys)
        SELECT u.id, u.queue, u.partition_key, u.partition, u.idempotency_key, u.payload, u.priority,
               'pending', CASE WHEN u.queue = ANY(v_kept) THEN false END, 0, u.max_attempts,
               coord_now(p_now) + u.delay_s, 0, coord_now(p_now), coord_now(p_now), u.limit_keys
          FROM unnest(p_ids, p_queues, p_partition_keys, p_partitions, p_idempotency_keys, p_payloads, p_priorities,
                      p_max_attempts, p_delays, p_limit_keys)
               AS u (id, queue, partition_key, partition, idempotency_key, payload, priority, max_attempts, delay_s,
                     limit_keys)
         WHERE v_todo IS NULL OR u.id = ANY(v_todo)  -- NULL: the first round, every input
         ORDER BY u.id
        ON CONFLICT DO NOTHING;
        SELECT array_agg(h.t ORDER BY u.n), coalesce(array_agg(u.id) FILTER (WHERE h.t IS NULL), '{}')
          INTO v_rows, v_todo
          FROM unnest(p_ids, p_queues, p_idempotency_keys) WITH ORDINALITY AS u (id, q, ik, n)
          LEFT JOIN LATERAL (SELECT t FROM coord_tasks AS t WHERE t.id = u.id
                             UNION ALL
                             SELECT t FROM coord_tasks AS t
                              WHERE t.queue = u.q AND t.idempotency_key = u.ik AND t.id <> u.id) AS h ON true;
        EXIT WHEN cardinality(v_todo) = 0;
        v_rounds := v_rounds + 1;
        IF v_rounds >= 100 THEN
            RAISE EXCEPTION 'asynccoord: the tasks holding these idempotency keys keep going away'
                  USING ERRCODE = 'serialization_failure';
        END IF;
    END LOOP;

    -- 4. Each key's head in the queues that keep heads, under the key locks of 2
    --    (promote_heads). In a queue whose dead-letter policy is 'hold' (read after the
    --    key locks), a key whose earliest active task a dead task precedes gets none.
    IF cardinality(v_kept) > 0 THEN
        v_held := coord_held_queues(v_kept);
        IF cardinality(v_held) > 0 THEN
            PERFORM 1 FROM coord_promote_held(p_queues, p_partition_keys, v_kept, v_held);
        ELSE
            UPDATE coord_tasks SET is_head = true
             WHERE NOT is_head AND id = ANY(ARRAY(
                SELECT (SELECT t.id FROM coord_tasks AS t
                               WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active AND NOT t.is_head
                                 AND NOT EXISTS (SELECT 1 FROM coord_tasks AS h
                                                  WHERE h.queue = k.q AND h.partition_key = k.pk AND h.is_head)
                               ORDER BY t.id LIMIT 1)
                  FROM (SELECT DISTINCT u.q, u.pk FROM unnest(p_queues, p_partition_keys) AS u (q, pk)
                         WHERE u.q = ANY(v_kept)) AS k));
        END IF;
    END IF;

    -- 5. A work notification per queue with tasks this call created due now (delivered at commit).
    PERFORM pg_notify(p_channel, json_build_object(
                's', p_sender, 'q', g.q, 'n', g.n, 'p', CASE WHEN cardinality(g.parts) > 512 THEN NULL ELSE g.parts END)::text)
       FROM (SELECT u.q, count(*) AS n, array_agg(DISTINCT u.p ORDER BY u.p) AS parts
               FROM unnest(p_ids, p_queues, p_partitions, p_delays) WITH ORDINALITY AS u (id, q, p, d, i)
               JOIN unnest(v_rows) WITH ORDINALITY AS t ON t.ordinality = u.i
              WHERE u.d = 0 AND t.id = u.id
              GROUP BY u.q) AS g;

    RETURN QUERY
        SELECT t.id, t.queue, t.partition_key, t.partition, t.idempotency_key, t.payload, t.priority, t.status,
               t.attempts, t.max_attempts, t.run_at, t.lease_owner, t.lease_token, t.lease_expires_at, t.version,
               t.last_error, t.result, t.created_at, t.updated_at, t.reclaimed, t.id = u.id
          FROM unnest(v_rows) WITH ORDINALITY AS t
          JOIN unnest(p_ids) WITH ORDINALITY AS u (id, n) ON u.n = t.ordinality
         ORDER BY u.n;
END
$fn$;

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
       AND t.id NOT IN (SELECT h.id FROM (SELECT a.partition_key,
                                                 coalesce(min(a.id) FILTER (WHERE a.status = 'running' AND a.is_head),
                                                          min(a.id)) AS id
                                            FROM coord_tasks AS a
                                           WHERE a.queue = p_queue AND (a.status = 'pending' OR a.status = 'running')
                                           GROUP BY a.partition_key) AS h
                         WHERE NOT v_hold
                            OR NOT EXISTS (SELECT 1 FROM coord_tasks AS d
                                            WHERE d.queue = p_queue AND d.partition_key = h.partition_key
                                              AND d.status = 'dead' AND d.id < h.id));
    UPDATE coord_tasks AS t SET is_head = true
      FROM (SELECT a.partition_key,
                   coalesce(min(a.id) FILTER (WHERE a.status = 'running' AND a.is_head), min(a.id)) AS id
              FROM coord_tasks AS a
             WHERE a.queue = p_queue AND (a.status = 'pending' OR a.status = 'running')
             GROUP BY a.partition_key) AS h
     WHERE t.id = h.id AND NOT t.is_head
       AND NOT EXISTS (SELECT 1 FROM coord_tasks AS r  -- another task of the key runs: it gets its head later
                        WHERE r.queue = p_queue AND r.partition_key = h.partition_key AND r.status = 'running'
                          AND r.id <> h.id)
       AND (NOT v_hold
            OR NOT EXISTS (SELECT 1 FROM coord_tasks AS d
                            WHERE d.queue = p_queue AND d.partition_key = h.partition_key
                              AND d.status = 'dead' AND d.id < h.id));
    GET DIAGNOSTICS v_heads = ROW_COUNT;
    RETURN v_heads;
END
$fn$;
