-- Named queries of the conflict monitor for the PostgreSQL store (see
-- backends/postgres_monitor.py). :bucket is floor of the store clock of the flush (read
-- by the first statement of the flush transaction). Batches arrive as parallel arrays.

-- name: metric_process_upsert
INSERT INTO coord_metric_processes (process_id, info, first_flush_at, last_flush_at)
VALUES (:process_id::text, :info::text, coord_now(:now::float8), coord_now(:now::float8))
ON CONFLICT (process_id) DO UPDATE SET info = excluded.info, last_flush_at = excluded.last_flush_at
RETURNING last_flush_at;

-- name: metric_counts_add
INSERT INTO coord_metric_counts (bucket_s, process_id, scope, name, value)
SELECT :bucket::bigint, :process_id::text, u.scope, u.name, u.delta
  FROM unnest(:scopes::text[], :names::text[], :deltas::bigint[]) AS u (scope, name, delta)
 ORDER BY u.scope, u.name
ON CONFLICT (bucket_s, process_id, scope, name) DO UPDATE SET value = coord_metric_counts.value + excluded.value;

-- name: metric_totals_add
INSERT INTO coord_metric_totals (process_id, scope, name, value, updated_at)
SELECT :process_id::text, u.scope, u.name, u.delta, :flushed_at::float8
  FROM unnest(:scopes::text[], :names::text[], :deltas::bigint[]) AS u (scope, name, delta)
 ORDER BY u.scope, u.name
ON CONFLICT (process_id, scope, name) DO UPDATE
   SET value = coord_metric_totals.value + excluded.value, updated_at = excluded.updated_at;

-- name: metric_latency_add
INSERT INTO coord_metric_latency (bucket_s, process_id, name, slot, count, sum_ms)
SELECT :bucket::bigint, :process_id::text, u.name, u.slot, u.count, u.sum_ms
  FROM unnest(:names::text[], :slots::int[], :counts::bigint[], :sums::float8[]) AS u (name, slot, count, sum_ms)
 ORDER BY u.name, u.slot
ON CONFLICT (bucket_s, process_id, name, slot) DO UPDATE
   SET count = coord_metric_latency.count + excluded.count, sum_ms = coord_metric_latency.sum_ms + excluded.sum_ms;

-- name: metric_alerts_clear
DELETE FROM coord_alerts WHERE monitor_id = :process_id::text;

-- name: metric_alerts_insert
INSERT INTO coord_alerts (monitor_id, rule, scope_key, alert, seen_at, expires_at)
SELECT :process_id::text, u.rule, u.scope_key, u.alert, :flushed_at::float8, :flushed_at::float8 + :alert_ttl_s::float8
  FROM unnest(:rules::text[], :scope_keys::text[], :alerts::text[]) AS u (rule, scope_key, alert)
ON CONFLICT (monitor_id, rule, scope_key) DO UPDATE
   SET alert = excluded.alert, seen_at = excluded.seen_at, expires_at = excluded.expires_at;

-- name: metric_purge_counts
DELETE FROM coord_metric_counts WHERE bucket_s < :cutoff::bigint;

-- name: metric_purge_latency
DELETE FROM coord_metric_latency WHERE bucket_s < :cutoff::bigint;

-- name: metric_purge_alerts
DELETE FROM coord_alerts WHERE expires_at <= :flushed_at::float8;

-- name: metric_retire_totals
-- Folds the process totals of processes silent since :cutoff into '*retired*' (per-node
-- breakdowns of those processes are dropped: they are only a breakdown of the totals).
INSERT INTO coord_metric_totals (process_id, scope, name, value, updated_at)
SELECT '*retired*', '', name, sum(value), :flushed_at::float8
  FROM coord_metric_totals
 WHERE updated_at < :cutoff::float8 AND process_id <> '*retired*' AND scope = ''
 GROUP BY name
ON CONFLICT (process_id, scope, name) DO UPDATE
   SET value = coord_metric_totals.value + excluded.value, updated_at = excluded.updated_at;

-- name: metric_retire_delete
DELETE FROM coord_metric_totals WHERE updated_at < :cutoff::float8 AND process_id <> '*retired*';

-- name: metric_retire_processes
DELETE FROM coord_metric_processes WHERE last_flush_at < :cutoff::float8;

-- name: metric_read_totals
SELECT process_id, scope, name, value FROM coord_metric_totals;

-- name: metric_read_window_counts
SELECT process_id, scope, name, sum(value)::bigint FROM coord_metric_counts
 WHERE bucket_s > :since::float8
 GROUP BY process_id, scope, name;

-- name: metric_read_window_latency
SELECT name, slot, sum(count)::bigint, sum(sum_ms) FROM coord_metric_latency
 WHERE bucket_s > :since::float8
 GROUP BY name, slot;

-- name: metric_read_processes
SELECT process_id, info, first_flush_at, last_flush_at FROM coord_metric_processes ORDER BY process_id;

-- name: metric_read_alerts
SELECT alert FROM coord_alerts WHERE expires_at > :now_s::float8 ORDER BY seen_at, monitor_id, rule, scope_key;

-- name: queue_depths
-- Tasks by queue and status, each status counted in its partial index (as stats_all in
-- queries.sql), never a scan of the table's rows.
SELECT queue, 'pending', count(*) FROM coord_tasks WHERE status = 'pending' GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*) FROM coord_tasks WHERE status = 'running' GROUP BY queue
UNION ALL
SELECT queue, 'done', count(*) FROM coord_tasks WHERE status = 'done' GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*) FROM coord_tasks WHERE status = 'dead' GROUP BY queue;

-- name: queue_oldest_pending
SELECT queue, min(run_at) FROM coord_tasks WHERE status = 'pending' AND run_at <= :now_s::float8 GROUP BY queue;

-- name: queue_removed
-- Finished tasks deleted from each queue by purges and discards (migration_0006.sql).
SELECT queue, done, dead FROM coord_queue_removed;

-- name: queue_expired_leases
-- Running tasks whose lease expired (coord_tasks_lease_expiry), by queue.
SELECT queue, count(*) FROM coord_tasks WHERE status = 'running' AND lease_expires_at <= :now_s::float8 GROUP BY queue;

-- name: queue_backlog
-- Pending, running and dead tasks of :queue, each counted in its partial index (a pending one,
-- coord_tasks_lease_expiry, coord_tasks_dead_order), and the run_at of the oldest due pending
-- task, the first entry of coord_tasks_pending_due at or after the queue (one seek, never a read
-- of the pending rows): the cost follows the unfinished and dead tasks' index entries, never
-- the done tasks kept.
SELECT (SELECT count(*) FROM coord_tasks WHERE queue = :queue::text AND status = 'pending'),
       (SELECT min(run_at) FROM coord_tasks
         WHERE queue = :queue::text AND status = 'pending' AND run_at <= :now_s::float8),
       (SELECT count(*) FROM coord_tasks WHERE queue = :queue::text AND status = 'running'),
       (SELECT count(*) FROM coord_tasks WHERE queue = :queue::text AND status = 'dead');
