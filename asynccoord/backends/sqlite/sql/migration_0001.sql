-- asynccoord schema revision 1 (SQLite): every table and index of the store.
-- Times are REAL seconds since the Unix epoch from the store clock (julianday('now')
-- arithmetic). Later changes go into migration_0002.sql, migration_0003.sql, ... (each
-- applied once, in order, and recorded as the schema revision in coord_meta).
CREATE TABLE IF NOT EXISTS coord_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- --- the task queue ------------------------------------------------------------------

CREATE TABLE coord_tasks (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT    NOT NULL,
    partition_key    TEXT    NOT NULL,
    partition        INTEGER NOT NULL,
    idempotency_key  TEXT,
    payload          TEXT    NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,
    status           TEXT    NOT NULL CHECK (status IN ('pending', 'running', 'done', 'dead')),
    -- 1 while pending or running. Kept apart from status so that claiming
    -- (pending -> running) does not rewrite the partial indexes below.
    active           INTEGER NOT NULL DEFAULT 1 CHECK ((active = 1) = (status IN ('pending', 'running'))),
    -- 1 for the earliest active task of its (queue, partition_key): the only one an
    -- ordered claim may take. Kept by every transition that changes the active set of a
    -- queue in coord_ordered_queues, so an ordered claim scans the heads instead of every
    -- blocked task behind them.
    is_head          INTEGER NOT NULL DEFAULT 0,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    run_at           REAL    NOT NULL,
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at REAL,
    version          INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    result           TEXT,
    reclaimed        INTEGER NOT NULL DEFAULT 0, -- 1 when the last claim took an expired lease
    created_at       REAL    NOT NULL,
    updated_at       REAL    NOT NULL,
    -- The task's rate-limit keys, one per limited dimension: compact JSON
    -- {"dimension": "key"}, NULL when none (see coord_rate_limits).
    limit_keys       TEXT
);

-- Dedup at enqueue: one task per (queue, idempotency key).
CREATE UNIQUE INDEX coord_tasks_idempotency
    ON coord_tasks (queue, idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Per-key ordering: the earliest active task of a key (head upkeep).
CREATE INDEX coord_tasks_key_order ON coord_tasks (queue, partition_key, id) WHERE active = 1;
-- Leases that may have expired (dead-lettering of exhausted leases at claim time). It
-- holds exactly the running tasks, so the claim scans below hold pending tasks only and
-- never walk past tasks in flight.
CREATE INDEX coord_tasks_lease_expiry ON coord_tasks (queue, lease_expires_at) WHERE status = 'running';
-- Claim scan: pending tasks of a queue in priority-then-FIFO order (a claim removes the
-- task, a retry or release adds it back). The columns after id make the index covering
-- for the claim's filter: a node claiming its own partitions steps over other nodes'
-- tasks and not-yet-due retries in the index alone (about 0.15 us per entry), without
-- reading their rows.
CREATE INDEX coord_tasks_pending ON coord_tasks (queue, priority DESC, id, partition, run_at, status)
    WHERE status = 'pending';
-- Ordered claim scan: the pending heads of the keys, in the same order.
CREATE INDEX coord_tasks_pending_heads ON coord_tasks (queue, priority DESC, id, partition, run_at, status, is_head)
    WHERE status = 'pending' AND is_head = 1;
-- Oldest due pending task of a queue (stats): one seek instead of a walk of the pending tasks.
CREATE INDEX coord_tasks_pending_due ON coord_tasks (queue, run_at) WHERE status = 'pending';
-- purge_finished: the oldest done tasks of a queue, without scanning the table.
CREATE INDEX coord_tasks_done_age ON coord_tasks (queue, updated_at) WHERE status = 'done';

-- Queues claimed in per-key order at least once. Only their tasks carry an is_head flag
-- that every transition keeps up to date; the first ordered claim of a queue adds it here
-- and computes its heads from scratch in the same transaction.
CREATE TABLE coord_ordered_queues (
    queue TEXT PRIMARY KEY
) WITHOUT ROWID;

CREATE TABLE coord_processed (
    consumer     TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    processed_at REAL NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX coord_processed_age ON coord_processed (processed_at);

-- --- rate limits per queue, enforced by the claim ------------------------------------

-- The limits each queue declares (set_rate_limits), read by every process's claims.
CREATE TABLE coord_rate_limits (
    queue TEXT NOT NULL,
    dimension TEXT NOT NULL,
    count INTEGER NOT NULL,
    per_s REAL NOT NULL,
    burst INTEGER NOT NULL,
    PRIMARY KEY (queue, dimension)
) WITHOUT ROWID;
-- GCRA state per bucket: its theoretical arrival time, store clock (contract/ratelimits.py).
CREATE TABLE coord_rate_buckets (
    queue TEXT NOT NULL,
    dimension TEXT NOT NULL,
    key TEXT NOT NULL,
    tat REAL NOT NULL,
    PRIMARY KEY (queue, dimension, key)
) WITHOUT ROWID;

-- --- distributed locks, semaphores and fencing ---------------------------------------
-- A lock is a semaphore of one permit. Each live acquisition is one row of
-- coord_lock_holders (an expired row is dead: every query compares expires_at with the
-- store clock, and the next acquisition of the name deletes it). The fencing counter of a
-- name lives in coord_lock_names and is kept while the lock is free, so fencing tokens
-- rise strictly across releases, expiries and processes.
CREATE TABLE coord_lock_names (
    name               TEXT    PRIMARY KEY,
    last_fencing_token INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE coord_lock_holders (
    owner_token   TEXT    PRIMARY KEY,
    name          TEXT    NOT NULL,
    holder        TEXT    NOT NULL,
    fencing_token INTEGER NOT NULL,
    permits       INTEGER NOT NULL,
    acquired_at   REAL    NOT NULL,
    expires_at    REAL    NOT NULL
) WITHOUT ROWID;
-- Live leases of a name (acquire, list_locks by name).
CREATE INDEX coord_lock_holders_name ON coord_lock_holders (name, expires_at);

-- Per guarded resource: the highest fencing token accepted, and the data of the last fenced write.
CREATE TABLE coord_fences (
    resource      TEXT    PRIMARY KEY,
    fencing_token INTEGER NOT NULL,
    data          TEXT,
    updated_at    REAL    NOT NULL
) WITHOUT ROWID;

-- --- node membership -----------------------------------------------------------------
-- One row per node id, holding its current incarnation (random per start of the
-- node). A member is live while expires_at > the store clock; a dead row is never
-- listed and is deleted by a later heartbeat once it has been dead for the retention
-- (see contract/membership.py).
CREATE TABLE coord_members (
    node_id      TEXT PRIMARY KEY,
    incarnation  TEXT NOT NULL,
    info         TEXT NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    expires_at   REAL NOT NULL
) WITHOUT ROWID;
-- Purge of long-dead rows.
CREATE INDEX coord_members_expiry ON coord_members (expires_at);

-- --- the conflict monitor's cluster-wide counters ------------------------------------
-- Each process flushes the deltas of its counters and latency histograms every second
-- or so, in one batched write (see backends/sqlite/monitor.py):
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

-- slot is the histogram bucket index (monitor/histogram.py); slot -1 holds the total
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
