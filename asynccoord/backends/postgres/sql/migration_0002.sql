-- asynccoord schema revision 2 (PostgreSQL): rate limits per queue, enforced by the claim
-- (as the SQLite store's migration_0001.sql has them; semantics in contract/ratelimits.py).
--
-- A task's keys, one per limited dimension: compact JSON {"dimension": "key"}, NULL when
-- none (a nullable column without a default: only the catalog changes).
ALTER TABLE coord_tasks ADD COLUMN IF NOT EXISTS limit_keys text;

-- The limits each queue declares (set_rate_limits), read by every process's claims.
CREATE TABLE IF NOT EXISTS coord_rate_limits (
    queue     text             NOT NULL,
    dimension text             NOT NULL,
    count     integer          NOT NULL CHECK (count >= 1),
    per_s     double precision NOT NULL CHECK (per_s > 0),
    burst     integer          NOT NULL CHECK (burst >= 1),
    PRIMARY KEY (queue, dimension)
);

-- GCRA state per bucket: its theoretical arrival time, store clock (seconds since the epoch).
-- Logged (never UNLOGGED): a crash of the server must not hand spent tokens out again.
CREATE TABLE IF NOT EXISTS coord_rate_buckets (
    queue     text             NOT NULL,
    dimension text             NOT NULL,
    key       text             NOT NULL,
    tat       double precision NOT NULL,
    PRIMARY KEY (queue, dimension, key)
);

-- The exclusive advisory lock of a queue's buckets, to the end of the transaction, and then
-- the store clock (p_now under a test clock): the claims of a queue with limits, and the
-- pauses of its buckets, read and write TATs one transaction at a time across every process
-- and machine, each on an instant read after the previous holder committed. The lock's key is
-- (classid 0x61637274, hash of schema and queue), apart from coord_share_queues' locks.
CREATE OR REPLACE FUNCTION coord_lock_rate_limits(p_queue text, p_now double precision)
    RETURNS double precision
    LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(1633907316, hashtext(current_schema() || '.' || p_queue));
    RETURN coalesce(p_now, extract(epoch FROM clock_timestamp())::double precision);
END
$fn$;

-- coord_lease_key_heads of migration_0001.sql, and one more condition on the head: a continuation
-- never leases a task that names a limit key in a queue that declares limits (the claim
-- takes its tokens; a head left so is notified as any promoted head that was not leased).
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
                   AND (t.limit_keys IS NULL
                        OR NOT EXISTS (SELECT 1 FROM coord_rate_limits AS l WHERE l.queue = t.queue))
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
