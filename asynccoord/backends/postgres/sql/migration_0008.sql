-- asynccoord schema version 8 (PostgreSQL): commit-and-continue in the commit's round trip.
-- complete_and_claim_next completes a task and leases its key's next task to the same
-- owner, so a node working through one conversation in order needs no wake-up and no claim
-- between two of its tasks. coord_complete_batch (version 6, promotion as of version 7)
-- takes two more per-item arrays for it and leases those next tasks in the batch's own
-- statement and transaction: the continuation costs no round trip of its own.
--
-- New arguments: p_next_owners and p_next_lease_s, one item per task of the batch: the
-- owner (the completed task's lease owner) and the lease length in seconds of its key's
-- next task, or NULL items for tasks that only complete (the arrays themselves NULL when
-- no task of the batch continues: the plain commit path then runs exactly the steps of
-- version 7); p_next_token, the lease-token prefix of the leased tasks (token '.' id).
--
-- Steps 1 to 5 are those of version 7. Step 6 promotes the committed keys' heads as
-- before but keeps them for step 9; step 7 (coord_lease_key_heads, below) leases, for each committed task that continues
-- (the first of the batch per key), its key's head if that head is pending and due (by
-- coord_now), as claim_ordered would lease it: reclaimed false, attempts + 1, a fresh token,
-- version + 1. A head whose row another transaction holds is skipped (SKIP LOCKED, as a
-- claim skips it): the commit goes through without a continuation, the head stays
-- claimable. A head whose message id is already processed is settled as a duplicate
-- instead (done, '{"duplicate": true}', attempts + 1, version + 2: a claim's lease and
-- settle_duplicate in one write), and step 8 promotes its key's following task. Step 9
-- notifies other processes of the promoted heads that were not leased: a head leased to
-- its continuing owner wakes nobody.
--
-- Returns the rows of version 7 (r_kind 'd': completed; 'f': refused by its fence) and two
-- more kinds: 'n', the next task leased for the completed task r_id (its full row in the
-- n_* columns, in the column order of the claims), and 'x', a next task of r_id settled as
-- a duplicate (n_id). The n_* columns are NULL in the other rows.
--
-- The arguments and the return type change, so version 7's function is dropped (CREATE OR
-- REPLACE cannot change a return type) before this one is made; the migration runs in
-- one transaction, so no caller sees the function missing. Both statements are idempotent
-- (a script run again over a schema that has this version's function changes nothing).
DROP FUNCTION IF EXISTS coord_complete_batch(bigint[], text[], bigint[], text[], text[], text[], text[], bigint[],
                                   text, text, double precision);

-- The continuations of a commit batch (step 7 of coord_complete_batch): for each committed
-- task (p_done, with its stored queue and key) that asked for one (p_owners / p_lease_s by
-- p_ids, NULL lease for those that did not; the first such task per key), lease its key's
-- head if pending and due, or settle it as a duplicate. Returns per head: the task it
-- continues, its id, whether it was settled as a duplicate, and then its queue and key.
-- A function of its own for one reason: its statement is planned once per session
-- (plan_cache_mode = force_generic_plan). Inside coord_complete_batch PL/pgSQL chose a custom
-- plan for it at every call, and planning it cost about 0.7 ms a commit (more than running
-- it). The head is found through coord_tasks_one_head (queue, partition_key), one index probe:
-- its state is checked as "not running, done or dead" rather than "= 'pending'", which would
-- let the planner read it through coord_tasks_pending_heads_partition instead (by queue only,
-- every pending head of the queue filtered by key; the statistics of a young table promise
-- a few rows there).
CREATE OR REPLACE FUNCTION coord_lease_key_heads(p_done bigint[], p_queues text[], p_keys text[],
                                                 p_ids bigint[], p_owners text[], p_lease_s double precision[],
                                                 p_token text, p_now double precision)
    RETURNS TABLE (r_done bigint, r_id bigint, r_dup boolean, r_queue text, r_key text)
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $fn$
BEGIN
    RETURN QUERY
        WITH wanted AS (
            SELECT DISTINCT ON (d.q, d.pk) d.id, d.q, d.pk, u.owner, u.lease_s
              FROM unnest(p_done, p_queues, p_keys) AS d (id, q, pk)  -- the stored key, not the caller's
              JOIN unnest(p_ids, p_owners, p_lease_s) WITH ORDINALITY AS u (id, owner, lease_s, n)
                ON u.id = d.id
             WHERE u.lease_s IS NOT NULL
             ORDER BY d.q, d.pk, u.n),
        target AS (
            SELECT h.id, h.dup, w.id AS done_id, w.owner, w.lease_s
              FROM wanted AS w
             CROSS JOIN LATERAL (
                SELECT t.id, t.idempotency_key IS NOT NULL
                             AND EXISTS (SELECT 1 FROM coord_processed AS p
                                          WHERE p.consumer = t.queue AND p.message_id = t.idempotency_key) AS dup
                  FROM coord_tasks AS t
                 WHERE t.queue = w.q AND t.partition_key = w.pk AND t.is_head
                   AND t.status <> ALL ('{running,done,dead}') AND t.run_at <= coord_now(p_now)
                   FOR UPDATE SKIP LOCKED) AS h),
        leased AS (
            UPDATE coord_tasks AS t
               SET reclaimed = false, status = 'running', attempts = t.attempts + 1,
                   lease_owner = g.owner, lease_token = p_token || '.' || t.id,
                   lease_expires_at = coord_now(p_now) + g.lease_s,
                   version = t.version + 1, updated_at = coord_now(p_now)
              FROM target AS g
             WHERE t.id = g.id AND NOT g.dup
            RETURNING g.done_id, t.id),
        settled AS (
            UPDATE coord_tasks AS t
               SET reclaimed = false, status = 'done', active = false, is_head = false, attempts = t.attempts + 1,
                   result = '{"duplicate": true}', last_error = NULL,
                   lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                   version = t.version + 2, updated_at = coord_now(p_now)
              FROM target AS g
             WHERE t.id = g.id AND g.dup
            RETURNING g.done_id, t.id, t.queue, t.partition_key)
        SELECT l.done_id, l.id, false, NULL::text, NULL::text FROM leased AS l
        UNION ALL
        SELECT s.done_id, s.id, true, s.queue, s.partition_key FROM settled AS s;
END
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
BEGIN
    -- 1. The row locks of the keys, in sorted order (the order of lock_keys: two
    --    transactions never deadlock on them). A key row is made at enqueue, so it exists;
    --    should one be missing, lock_keys' insert makes and locks it.
    SELECT count(*) INTO v_locked FROM (
        SELECT 1 FROM coord_task_keys AS k
         WHERE (k.queue, k.partition_key) IN (SELECT u.q, u.pk FROM unnest(p_queues, p_keys) AS u (q, pk))
         ORDER BY k.queue, k.partition_key
           FOR UPDATE) AS l;
    SELECT count(*) INTO v_keys FROM (SELECT DISTINCT u.q, u.pk FROM unnest(p_queues, p_keys) AS u (q, pk)) AS d;
    IF v_locked < v_keys THEN
        INSERT INTO coord_task_keys (queue, partition_key)
        SELECT DISTINCT u.q, u.pk FROM unnest(p_queues, p_keys) AS u (q, pk) ORDER BY 1, 2
        ON CONFLICT (queue, partition_key) DO UPDATE SET touches = coord_task_keys.touches + 1;
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
          FROM unnest(p_ids, p_tokens, p_versions, p_results) AS b (id, token, version, result)
         WHERE t.id = b.id AND NOT (b.id = ANY(v_refused))
           AND t.lease_token = b.token AND t.version = b.version
           AND t.status <> ALL ('{pending,done,dead}') AND t.lease_expires_at > coord_now(p_now)
        RETURNING t.id, t.version, t.updated_at, t.queue, t.partition_key, t.idempotency_key)
    SELECT coalesce(array_agg(d.id), '{}'), coalesce(array_agg(d.version), '{}'), coalesce(array_agg(d.updated_at), '{}'),
           coalesce(array_agg(d.queue), '{}'), coalesce(array_agg(d.partition_key), '{}'),
           coalesce(array_agg(d.idempotency_key), '{}')
      INTO v_ids, v_versions, v_at, v_queues, v_pkeys, v_messages
      FROM done AS d;

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

    -- 6. The new heads of the committed tasks' keys (promote_heads, schema version 7), kept
    --    for the continuations (7) and the notification (9).
    IF cardinality(v_ids) > 0 THEN
        WITH promoted AS (
            UPDATE coord_tasks SET is_head = true
             WHERE NOT is_head AND id = ANY(ARRAY(
                SELECT least((SELECT h.id FROM coord_tasks AS h
                               WHERE h.queue = k.q AND h.partition_key = k.pk AND h.is_head),
                             (SELECT t.id FROM coord_tasks AS t
                               WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active AND NOT t.is_head
                               ORDER BY t.id LIMIT 1))
                  FROM (SELECT DISTINCT u.q, u.pk FROM unnest(v_queues, v_pkeys) AS u (q, pk)) AS k))
            RETURNING id, queue, partition)
        SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.queue), '{}'), coalesce(array_agg(p.partition), '{}')
          INTO v_new_ids, v_new_q, v_new_parts
          FROM promoted AS p;
    END IF;

    -- 7. Continuations (coord_lease_key_heads): per key, the first committed task of the batch
    --    that continues leases the key's head (under the key's row lock taken in 1; every head
    --    is marked by 6) if it is pending and due, or settles it as a duplicate.
    IF p_next_owners IS NOT NULL AND cardinality(v_ids) > 0 THEN
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
        IF cardinality(v_dup_ids) > 0 THEN
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
