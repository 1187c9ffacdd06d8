-- asynccoord schema version 7 (SQLite): rate limits per queue, enforced by the claim.
-- A task's keys, one per limited dimension: compact JSON {"dimension": "key"}, NULL when none.
ALTER TABLE coord_tasks ADD COLUMN limit_keys TEXT;
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
