-- asynccoord schema version 1 (SQLite). Times are REAL seconds since the Unix epoch
-- from the store clock (julianday('now') arithmetic).
CREATE TABLE IF NOT EXISTS coord_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

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
    -- ordered claim may take. Kept by every transition that changes the active set, so
    -- an ordered claim scans the heads instead of every blocked task behind them.
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
    updated_at       REAL    NOT NULL
);

-- Dedup at enqueue: one task per (queue, idempotency key).
CREATE UNIQUE INDEX coord_tasks_idempotency
    ON coord_tasks (queue, idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Claim scan: active tasks of a queue in priority-then-FIFO order.
CREATE INDEX coord_tasks_claim ON coord_tasks (queue, priority DESC, id) WHERE active = 1;
-- Ordered claim scan: the heads of the keys, in priority-then-FIFO order.
CREATE INDEX coord_tasks_heads ON coord_tasks (queue, priority DESC, id) WHERE active = 1 AND is_head = 1;
-- Per-key ordering: the earliest active task of a key (head upkeep).
CREATE INDEX coord_tasks_key_order ON coord_tasks (queue, partition_key, id) WHERE active = 1;
-- Leases that may have expired (dead-lettering of exhausted leases at claim time).
CREATE INDEX coord_tasks_lease_expiry ON coord_tasks (queue, lease_expires_at) WHERE status = 'running';

CREATE TABLE coord_processed (
    consumer     TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    processed_at REAL NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX coord_processed_age ON coord_processed (processed_at);
