-- asynccoord schema version 3 (PostgreSQL): node membership.
-- One row per node id, holding its current incarnation (random per start of the
-- node). A member is live while expires_at > the store clock; a dead row is never
-- listed and is deleted by a later heartbeat once it has been dead for the retention
-- (see backends/_membercommon.py).
CREATE TABLE coord_members (
    node_id      text             PRIMARY KEY,
    incarnation  text             NOT NULL,
    info         text             NOT NULL,
    started_at   double precision NOT NULL,
    heartbeat_at double precision NOT NULL,
    expires_at   double precision NOT NULL
);
CREATE INDEX coord_members_expiry ON coord_members (expires_at);
