-- Named queries of node membership for the PostgreSQL store (see
-- backends/postgres_membership.py). coord_now(:now) is the server clock (or a test
-- clock); a member is live while expires_at > coord_now(:now).

-- name: member_purge_dead
DELETE FROM coord_members WHERE expires_at <= coord_now(:now::float8) - :retention_s::float8;

-- name: member_beat
-- One statement for every node of a process. started_at is kept while the incarnation
-- is unchanged (SET expressions see the old row) and reset by a new incarnation.
INSERT INTO coord_members (node_id, incarnation, info, started_at, heartbeat_at, expires_at)
SELECT b.node_id, b.incarnation, b.info, coord_now(:now::float8), coord_now(:now::float8),
       coord_now(:now::float8) + :ttl_s::float8
  FROM unnest(:node_ids::text[], :incarnations::text[], :infos::text[]) AS b (node_id, incarnation, info)
 ORDER BY b.node_id
ON CONFLICT (node_id) DO UPDATE
   SET started_at = CASE WHEN coord_members.incarnation = excluded.incarnation
                         THEN coord_members.started_at ELSE excluded.started_at END,
       incarnation = excluded.incarnation,
       info = excluded.info,
       heartbeat_at = excluded.heartbeat_at,
       expires_at = excluded.expires_at;

-- name: member_live
SELECT node_id, incarnation, info, started_at, heartbeat_at, expires_at, coord_now(:now::float8)
  FROM coord_members
 WHERE expires_at > coord_now(:now::float8)
 ORDER BY node_id;

-- name: member_leave
-- Deletes the incarnation's row even when it lapsed (it is dead anyway); reports whether it was live.
DELETE FROM coord_members WHERE node_id = :node_id::text AND incarnation = :incarnation::text
RETURNING expires_at > coord_now(:now::float8);
