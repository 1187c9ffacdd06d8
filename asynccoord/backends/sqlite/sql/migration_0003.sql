-- asynccoord schema version 3 (SQLite): node membership.
-- One row per node id, holding its current incarnation (random per start of the
-- node). A member is live while expires_at > the store clock; a dead row is never
-- listed and is deleted by a later heartbeat once it has been dead for the retention
-- (see backends/_membercommon.py).
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
