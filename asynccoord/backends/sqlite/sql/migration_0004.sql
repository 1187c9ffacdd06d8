-- asynccoord schema version 4 (SQLite): the conflict monitor's cluster-wide counters.
-- Each process flushes the deltas of its counters and latency histograms every second
-- or so, in one batched write (see backends/sqlite_monitor.py):
--   * coord_metric_counts / coord_metric_latency hold them per 1-second time bucket of
--     the store clock (bucket_s = floor(now)), for sliding windows; buckets older than
--     the retention are purged by the flushes.
--   * coord_metric_totals holds each process' cumulative counts (lifetime totals);
--     processes silent for a day are folded into process_id '*retired*'.
--   * coord_metric_processes lists who flushed, and coord_alerts the firing alerts of
--     each live monitor (rows expire unless refreshed).
-- scope is '' for a process' own total and a node id for a per-node breakdown of it.
CREATE TABLE coord_metric_counts (
    bucket_s   INTEGER NOT NULL,
    process_id TEXT    NOT NULL,
    scope      TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    value      INTEGER NOT NULL,
    PRIMARY KEY (bucket_s, process_id, scope, name)
) WITHOUT ROWID;

-- slot is the histogram bucket index (asynccoord/histogram.py); slot -1 holds the total
-- count and sum_ms of the observations, the other slots their count only.
CREATE TABLE coord_metric_latency (
    bucket_s   INTEGER NOT NULL,
    process_id TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    slot       INTEGER NOT NULL,
    count      INTEGER NOT NULL,
    sum_ms     REAL    NOT NULL,
    PRIMARY KEY (bucket_s, process_id, name, slot)
) WITHOUT ROWID;

CREATE TABLE coord_metric_totals (
    process_id TEXT    NOT NULL,
    scope      TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    value      INTEGER NOT NULL,
    updated_at REAL    NOT NULL,
    PRIMARY KEY (process_id, scope, name)
) WITHOUT ROWID;
CREATE INDEX coord_metric_totals_age ON coord_metric_totals (updated_at);

CREATE TABLE coord_metric_processes (
    process_id     TEXT PRIMARY KEY,
    info           TEXT NOT NULL,
    first_flush_at REAL NOT NULL,
    last_flush_at  REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE coord_alerts (
    monitor_id TEXT NOT NULL,
    rule       TEXT NOT NULL,
    scope_key  TEXT NOT NULL,
    alert      TEXT NOT NULL,
    seen_at    REAL NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (monitor_id, rule, scope_key)
) WITHOUT ROWID;
