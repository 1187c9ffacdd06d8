-- asynccoord schema version 2 (SQLite): distributed locks, semaphores and fencing.
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
