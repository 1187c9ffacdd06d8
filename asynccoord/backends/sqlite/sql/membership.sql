-- Named queries of node membership for the SQLite store (see
-- backends/sqlite_membership.py). :now is the store clock read at the start of the
-- write transaction (or of the read); a member is live while expires_at > :now.

-- name: member_purge_dead
DELETE FROM coord_members WHERE expires_at <= :now - :retention_s;

-- name: member_beat
-- :beats is a JSON array of [node_id, incarnation, info_json] triples: one statement for
-- every node of a process. started_at is kept while the incarnation is unchanged (SET
-- expressions see the old row) and reset by a new incarnation.
INSERT INTO coord_members (node_id, incarnation, info, started_at, heartbeat_at, expires_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       :now, :now, :now + :ttl_s
  FROM json_each(:beats)
 WHERE true -- an INSERT ... SELECT needs a WHERE before ON CONFLICT (SQLite parsing ambiguity)
ON CONFLICT (node_id) DO UPDATE
   SET started_at = CASE WHEN coord_members.incarnation = excluded.incarnation
                         THEN coord_members.started_at ELSE excluded.started_at END,
       incarnation = excluded.incarnation,
       info = excluded.info,
       heartbeat_at = excluded.heartbeat_at,
       expires_at = excluded.expires_at;

-- name: member_live
SELECT node_id, incarnation, info, started_at, heartbeat_at, expires_at
  FROM coord_members
 WHERE expires_at > :now
 ORDER BY node_id;

-- name: member_leave
-- Deletes the incarnation's row even when it lapsed (it is dead anyway); reports whether it was live.
DELETE FROM coord_members WHERE node_id = :node_id AND incarnation = :incarnation
RETURNING expires_at > :now;
