-- Named queries of locks, semaphores and fencing for the SQLite store (see
-- backends/sqlite_locks.py). :now is the store clock read at the start of the write
-- transaction; a lease is live while expires_at > :now.

-- name: lock_purge_expired
DELETE FROM coord_lock_holders WHERE name = :name AND expires_at <= :now;

-- name: lock_live
SELECT count(*), min(expires_at) FROM coord_lock_holders WHERE name = :name AND expires_at > :now;

-- name: lock_next_fencing_token
INSERT INTO coord_lock_names (name, last_fencing_token) VALUES (:name, 1)
ON CONFLICT (name) DO UPDATE SET last_fencing_token = last_fencing_token + 1
RETURNING last_fencing_token;

-- name: lock_insert
INSERT INTO coord_lock_holders (owner_token, name, holder, fencing_token, permits, acquired_at, expires_at)
VALUES (:owner_token, :name, :holder, :fencing_token, :permits, :now, :now + :ttl_s);

-- name: lock_release
-- Deletes the caller's row even when it lapsed (it is dead anyway); reports whether it was live.
DELETE FROM coord_lock_holders WHERE owner_token = :owner_token AND name = :name
RETURNING expires_at > :now;

-- name: lock_renew
UPDATE coord_lock_holders SET expires_at = :now + :ttl_s
 WHERE owner_token = :owner_token AND name = :name AND expires_at > :now
RETURNING expires_at;

-- name: lock_renew_many
-- :renewals is a JSON array of [owner_token, ttl_s] pairs: one statement for any number of leases.
UPDATE coord_lock_holders
   SET expires_at = :now + r.ttl_s
  FROM (SELECT json_extract(value, '$[0]') AS owner_token, json_extract(value, '$[1]') AS ttl_s
          FROM json_each(:renewals)) AS r
 WHERE coord_lock_holders.owner_token = r.owner_token AND coord_lock_holders.expires_at > :now
RETURNING owner_token, expires_at;

-- name: lock_list
SELECT name, owner_token, holder, fencing_token, permits, acquired_at, expires_at
  FROM coord_lock_holders
 WHERE expires_at > :now AND (:name IS NULL OR name = :name)
 ORDER BY name, fencing_token;

-- name: fence
INSERT INTO coord_fences (resource, fencing_token, data, updated_at) VALUES (:resource, :fencing_token, NULL, :now)
ON CONFLICT (resource) DO UPDATE SET fencing_token = excluded.fencing_token, updated_at = excluded.updated_at
 WHERE excluded.fencing_token >= coord_fences.fencing_token
RETURNING fencing_token;

-- name: fenced_write
INSERT INTO coord_fences (resource, fencing_token, data, updated_at) VALUES (:resource, :fencing_token, :data, :now)
ON CONFLICT (resource) DO UPDATE
   SET fencing_token = excluded.fencing_token, data = excluded.data, updated_at = excluded.updated_at
 WHERE excluded.fencing_token >= coord_fences.fencing_token
RETURNING resource, fencing_token, data, updated_at;

-- name: fence_get
SELECT resource, fencing_token, data, updated_at FROM coord_fences WHERE resource = :resource;
