-- Named queries of the conflict monitor for the SQLite store (see
-- backends/sqlite_monitor.py). :now is the store clock read at the start of the write
-- transaction (or of the read); :bucket is floor(:now), the current 1-second bucket.
-- Batches arrive as JSON arrays, one statement per table.

-- name: metric_process_upsert
INSERT INTO coord_metric_processes (process_id, info, first_flush_at, last_flush_at)
VALUES (:process_id, :info, :now, :now)
ON CONFLICT (process_id) DO UPDATE SET info = excluded.info, last_flush_at = excluded.last_flush_at;

-- name: metric_counts_add
-- :counts is a JSON array of [scope, name, delta].
INSERT INTO coord_metric_counts (bucket_s, process_id, scope, name, value)
SELECT :bucket, :process_id, json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]')
  FROM json_each(:counts)
 WHERE true
ON CONFLICT (bucket_s, process_id, scope, name) DO UPDATE SET value = coord_metric_counts.value + excluded.value;

-- name: metric_totals_add
INSERT INTO coord_metric_totals (process_id, scope, name, value, updated_at)
SELECT :process_id, json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), :now
  FROM json_each(:counts)
 WHERE true
ON CONFLICT (process_id, scope, name) DO UPDATE
   SET value = coord_metric_totals.value + excluded.value, updated_at = excluded.updated_at;

-- name: metric_latency_add
-- :latency is a JSON array of [name, slot, count, sum_ms].
INSERT INTO coord_metric_latency (bucket_s, process_id, name, slot, count, sum_ms)
SELECT :bucket, :process_id, json_extract(value, '$[0]'), json_extract(value, '$[1]'),
       json_extract(value, '$[2]'), json_extract(value, '$[3]')
  FROM json_each(:latency)
 WHERE true
ON CONFLICT (bucket_s, process_id, name, slot) DO UPDATE
   SET count = coord_metric_latency.count + excluded.count, sum_ms = coord_metric_latency.sum_ms + excluded.sum_ms;

-- name: metric_alerts_clear
DELETE FROM coord_alerts WHERE monitor_id = :process_id;

-- name: metric_alerts_insert
-- :alerts is a JSON array of [rule, scope_key, alert_json].
INSERT INTO coord_alerts (monitor_id, rule, scope_key, alert, seen_at, expires_at)
SELECT :process_id, json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       :now, :now + :alert_ttl_s
  FROM json_each(:alerts)
 WHERE true
ON CONFLICT (monitor_id, rule, scope_key) DO UPDATE
   SET alert = excluded.alert, seen_at = excluded.seen_at, expires_at = excluded.expires_at;

-- name: metric_purge_counts
DELETE FROM coord_metric_counts WHERE bucket_s < :cutoff;

-- name: metric_purge_latency
DELETE FROM coord_metric_latency WHERE bucket_s < :cutoff;

-- name: metric_purge_alerts
DELETE FROM coord_alerts WHERE expires_at <= :now;

-- name: metric_retire_totals
-- Folds the process totals of processes silent since :cutoff into '*retired*' (per-node
-- breakdowns of those processes are dropped: they are only a breakdown of the totals).
INSERT INTO coord_metric_totals (process_id, scope, name, value, updated_at)
SELECT '*retired*', '', name, sum(value), :now
  FROM coord_metric_totals
 WHERE updated_at < :cutoff AND process_id <> '*retired*' AND scope = ''
 GROUP BY name
ON CONFLICT (process_id, scope, name) DO UPDATE
   SET value = coord_metric_totals.value + excluded.value, updated_at = excluded.updated_at;

-- name: metric_retire_delete
DELETE FROM coord_metric_totals WHERE updated_at < :cutoff AND process_id <> '*retired*';

-- name: metric_retire_processes
DELETE FROM coord_metric_processes WHERE last_flush_at < :cutoff;

-- name: metric_read_totals
SELECT process_id, scope, name, value FROM coord_metric_totals;

-- name: metric_read_window_counts
SELECT process_id, scope, name, sum(value) FROM coord_metric_counts
 WHERE bucket_s > :since
 GROUP BY process_id, scope, name;

-- name: metric_read_window_latency
SELECT name, slot, sum(count), sum(sum_ms) FROM coord_metric_latency
 WHERE bucket_s > :since
 GROUP BY name, slot;

-- name: metric_read_processes
SELECT process_id, info, first_flush_at, last_flush_at FROM coord_metric_processes ORDER BY process_id;

-- name: metric_read_alerts
SELECT alert FROM coord_alerts WHERE expires_at > :now ORDER BY seen_at, monitor_id, rule, scope_key;

-- name: queue_depths
-- Tasks by queue and status, each status counted in its partial index (as stats_all in
-- queries.sql): index entries only, in queue order, never a scan of the table's rows.
SELECT queue, 'pending', count(*) FROM coord_tasks WHERE status = 'pending' GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*) FROM coord_tasks WHERE status = 'running' GROUP BY queue
UNION ALL
SELECT queue, 'done', count(*) FROM coord_tasks WHERE status = 'done' GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*) FROM coord_tasks WHERE status = 'dead' GROUP BY queue;

-- name: queue_oldest_pending
SELECT queue, min(run_at) FROM coord_tasks WHERE status = 'pending' AND run_at <= :now GROUP BY queue;

-- name: queue_removed
-- Finished tasks deleted from each queue by purges and discards (migration_0005.sql).
SELECT queue, done, dead FROM coord_queue_removed;

-- name: queue_expired_leases
-- Running tasks whose lease expired (coord_tasks_lease_expiry), by queue.
SELECT queue, count(*) FROM coord_tasks WHERE status = 'running' AND lease_expires_at <= :now GROUP BY queue;

-- name: queue_backlog
-- Pending (with the oldest due run_at), running and dead tasks of :queue, each counted in its
-- partial index (coord_tasks_pending, coord_tasks_lease_expiry, coord_tasks_dead_order): the
-- cost follows the unfinished and dead tasks, never the done tasks kept.
SELECT p.n, p.oldest,
       (SELECT count(*) FROM coord_tasks WHERE queue = :queue AND status = 'running'),
       (SELECT count(*) FROM coord_tasks WHERE queue = :queue AND status = 'dead')
  FROM (SELECT count(*) AS n, min(run_at) FILTER (WHERE run_at <= :now) AS oldest
          FROM coord_tasks WHERE queue = :queue AND status = 'pending') AS p;
