-- asynccoord schema version 2 (PostgreSQL): distributed locks, semaphores and fencing.
-- A lock is a semaphore of one permit. Each live acquisition is one row of
-- coord_lock_holders, in one of the name's permit slots 0..permits-1: the unique
-- (name, slot) index makes the database refuse more holders than permits even if two
-- grants raced (they cannot: a grant holds the name's row lock in coord_lock_names). An
-- expired row is dead: every query compares expires_at with the store clock, and the
-- next acquisition of the name deletes it. The fencing counter of a name lives in
-- coord_lock_names and is kept while the lock is free, so fencing tokens rise strictly
-- across releases, expiries and processes.
CREATE TABLE coord_lock_names (
    name               text   PRIMARY KEY,
    last_fencing_token bigint NOT NULL
);

CREATE TABLE coord_lock_holders (
    owner_token   text             PRIMARY KEY,
    name          text             NOT NULL,
    slot          integer          NOT NULL CHECK (slot >= 0 AND slot < permits),
    holder        text             NOT NULL,
    fencing_token bigint           NOT NULL,
    permits       integer          NOT NULL,
    acquired_at   double precision NOT NULL,
    expires_at    double precision NOT NULL
);
CREATE UNIQUE INDEX coord_lock_holders_slot ON coord_lock_holders (name, slot);
CREATE INDEX coord_lock_holders_expiry ON coord_lock_holders (expires_at);

-- Per guarded resource: the highest fencing token accepted, and the data of the last fenced write.
CREATE TABLE coord_fences (
    resource      text             PRIMARY KEY,
    fencing_token bigint           NOT NULL,
    data          text,
    updated_at    double precision NOT NULL
);
