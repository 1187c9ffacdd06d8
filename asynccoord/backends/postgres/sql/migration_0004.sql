-- asynccoord schema revision 4 (PostgreSQL): an enqueue in one statement.
--
-- enqueue_many used to run seven statements in a transaction of the client (ids, the queues'
-- shared locks and flags, key locks, insert, promotion, notification, and a read of the task
-- holding each repeated idempotency key), nine round trips with BEGIN and COMMIT; a task's
-- cross-process pickup waited for all of them. Now the client draws the ids (next_task_ids)
-- and coord_enqueue runs the other steps, in the same order and under the same locks, as one
-- statement: two round trips, the transaction the statement's own (it commits, and its
-- notifications go out, when the statement ends).

-- Enqueue the tasks of p_queues .. p_limit_keys (parallel arrays, one item per task, as
-- insert_task took them) under the ids p_ids (from next_task_ids, ascending in input order)
-- and return each one's row in input order, with whether this call created it (r_created).
-- The caller passes the same ids each time it runs the statement again after losing its
-- answer: a task its earlier run created is then found under its own id (the insert skips
-- it), and reported as created, once; a task holding the idempotency key of another is
-- the other's, not created. Notifies p_channel, per queue with new due
-- tasks, naming p_sender, their count and partitions (all, NULL, above 512: conn.py's
-- MAX_NOTIFY_PARTITIONS). Generic plans throughout (plan_cache_mode): PL/pgSQL otherwise
-- plans its statements anew at most calls, which made a call of one task cost about twice
-- as much (0.8 ms against 0.4 ms). And no sequential scan (enable_seqscan): a session plans
-- once, and a plan made while coord_tasks was small read the whole table at every later
-- promotion (1.7 ms at 10,000 tasks, against 0.08 ms through the primary key).
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
                SELECT least((SELECT h.id FROM coord_tasks AS h
                               WHERE h.queue = k.q AND h.partition_key = k.pk AND h.is_head),
                             (SELECT t.id FROM coord_tasks AS t
                               WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active AND NOT t.is_head
                               ORDER BY t.id LIMIT 1))
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
