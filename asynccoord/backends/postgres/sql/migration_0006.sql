-- asynccoord schema version 6 (PostgreSQL): a commit batch in one round trip.
-- complete_many and the group commit of complete() used to send about eight statements
-- per batch (BEGIN, key locks, fence check, compare-and-set, fence record, processed ids,
-- head promotion, notify, COMMIT), each a round trip and a parse/bind/execute on both
-- sides. coord_complete_batch does the same steps, in the same order and under the same
-- locks, as one statement (its own transaction when called outside one). PL/pgSQL takes a
-- new snapshot for each statement (READ COMMITTED), so the head promotion sees every
-- transition of the keys committed before their row locks were granted, as it did when
-- the steps were separate statements.
--
-- Arguments, one item per task of the batch: p_ids, p_tokens (lease tokens), p_versions,
-- p_results (JSON text or NULL), p_queues and p_keys (the tasks' queue and partition key),
-- p_fence_resources and p_fence_tokens (NULL items for unfenced tasks; the arrays
-- themselves NULL when no task is fenced). p_channel and p_sender make the work
-- notification (the payload PgListener reads: {"s": sender, "q": queue, "n": count,
-- "p": partitions, or null past 512}); p_now is the test clock (NULL: the server clock).
--
-- Returns one row per task that was completed (r_kind 'd', with its new version and
-- updated_at) or refused by its fence (r_kind 'f', with the highest token recorded);
-- a task without a row matched no compare-and-set (stale lease or version, or gone).
-- A higher fencing token recorded concurrently (the fence row did not exist when the
-- batch looked) raises serialization_failure: the caller runs the batch again.
CREATE FUNCTION coord_complete_batch(p_ids bigint[], p_tokens text[], p_versions bigint[], p_results text[],
                                     p_queues text[], p_keys text[],
                                     p_fence_resources text[], p_fence_tokens bigint[],
                                     p_channel text, p_sender text, p_now double precision)
    RETURNS TABLE (r_id bigint, r_kind text, r_version bigint, r_at double precision, r_top bigint)
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

    -- 6. The new heads of the committed tasks' keys (promote_heads), and a work
    --    notification per queue naming their partitions (delivered at commit).
    IF cardinality(v_ids) > 0 THEN
        WITH promoted AS (
            UPDATE coord_tasks SET is_head = true
             WHERE NOT is_head AND id IN (
                SELECT (SELECT t.id FROM coord_tasks AS t
                         WHERE t.queue = k.q AND t.partition_key = k.pk AND t.active
                         ORDER BY t.id LIMIT 1)
                  FROM (SELECT DISTINCT u.q, u.pk FROM unnest(v_queues, v_pkeys) AS u (q, pk)) AS k)
            RETURNING queue, partition),
        per_queue AS (
            SELECT p.queue, count(DISTINCT p.partition) AS n, array_agg(DISTINCT p.partition ORDER BY p.partition) AS parts
              FROM promoted AS p GROUP BY p.queue)
        SELECT count(*) INTO v_notified FROM (
            SELECT pg_notify(p_channel, json_build_object(
                       's', p_sender, 'q', g.queue, 'n', g.n, 'p', CASE WHEN g.n > 512 THEN NULL ELSE g.parts END)::text)
              FROM per_queue AS g) AS sent;
    END IF;

    RETURN QUERY
        SELECT d.id, 'd'::text, d.v, d.at, NULL::bigint FROM unnest(v_ids, v_versions, v_at) AS d (id, v, at)
        UNION ALL
        SELECT f.id, 'f'::text, NULL::bigint, NULL::double precision, f.top FROM unnest(v_refused, v_tops) AS f (id, top);
END
$fn$;
