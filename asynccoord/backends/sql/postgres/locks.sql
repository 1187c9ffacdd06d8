-- Named queries of locks, semaphores and fencing for the PostgreSQL store (see
-- backends/postgres_locks.py). coord_now(:now) is the server clock (or a test clock);
-- a lease is live while expires_at > coord_now(:now).

-- name: lock_purge_expired
-- First statement of an acquisition: takes the name's row lock (creating the name with
-- fencing counter 0 if new), which serializes acquisitions of one name, then deletes
-- the name's lapsed leases.
WITH name_row AS (
    INSERT INTO coord_lock_names (name, last_fencing_token) VALUES (:name::text, 0)
    ON CONFLICT (name) DO UPDATE SET last_fencing_token = coord_lock_names.last_fencing_token
    RETURNING name)
DELETE FROM coord_lock_holders
 WHERE name = (SELECT name FROM name_row) AND expires_at <= coord_now(:now::float8);

-- name: lock_live
-- Second statement (a new snapshot, after the row lock): grant a permit in the lowest
-- free slot if fewer than :permits leases are live, bumping the fencing counter.
-- Returns the live count and earliest expiry seen, and the grant (NULLs when busy).
WITH live AS (
    SELECT count(*) AS n, min(expires_at) AS earliest, coalesce(array_agg(slot), '{}') AS slots
      FROM coord_lock_holders WHERE name = :name::text AND expires_at > coord_now(:now::float8)),
free AS (
    SELECT min(s) AS slot FROM live, generate_series(0, :permits::int - 1) AS s
     WHERE live.n < :permits::int AND NOT (s = ANY(live.slots))),
token AS (
    UPDATE coord_lock_names SET last_fencing_token = last_fencing_token + 1
     WHERE name = :name::text AND (SELECT slot FROM free) IS NOT NULL
    RETURNING last_fencing_token),
granted AS (
    INSERT INTO coord_lock_holders (owner_token, name, slot, holder, fencing_token, permits, acquired_at, expires_at)
    SELECT :owner_token::text, :name::text, free.slot, :holder::text, token.last_fencing_token, :permits::int,
           coord_now(:now::float8), coord_now(:now::float8) + :ttl_s::float8
      FROM free, token
    RETURNING fencing_token, acquired_at, expires_at)
SELECT live.n, live.earliest, coord_now(:now::float8), granted.fencing_token, granted.acquired_at, granted.expires_at
  FROM live LEFT JOIN granted ON true;

-- name: lock_next_fencing_token
-- Bump a name's fencing counter outside an acquisition (kept for dialect parity;
-- acquisitions bump it inside lock_live).
INSERT INTO coord_lock_names (name, last_fencing_token) VALUES (:name::text, 1)
ON CONFLICT (name) DO UPDATE SET last_fencing_token = coord_lock_names.last_fencing_token + 1
RETURNING last_fencing_token;

-- name: lock_release
-- Deletes the caller's row even when it lapsed (it is dead anyway); reports whether it was live.
DELETE FROM coord_lock_holders WHERE owner_token = :owner_token::text AND name = :name::text
RETURNING expires_at > coord_now(:now::float8);

-- name: lock_renew
UPDATE coord_lock_holders SET expires_at = coord_now(:now::float8) + :ttl_s::float8
 WHERE owner_token = :owner_token::text AND name = :name::text AND expires_at > coord_now(:now::float8)
RETURNING expires_at;

-- name: lock_renew_many
-- One statement for any number of leases, each with its own ttl_s.
UPDATE coord_lock_holders AS h SET expires_at = coord_now(:now::float8) + r.ttl_s
  FROM unnest(:owner_tokens::text[], :ttls::float8[]) AS r (owner_token, ttl_s)
 WHERE h.owner_token = r.owner_token AND h.expires_at > coord_now(:now::float8)
RETURNING h.owner_token, h.expires_at;

-- name: lock_list
SELECT name, owner_token, holder, fencing_token, permits, acquired_at, expires_at, coord_now(:now::float8)
  FROM coord_lock_holders
 WHERE expires_at > coord_now(:now::float8) AND (:name::text IS NULL OR name = :name::text)
 ORDER BY name, fencing_token;

-- name: fence
INSERT INTO coord_fences (resource, fencing_token, data, updated_at)
VALUES (:resource::text, :fencing_token::bigint, NULL, coord_now(:now::float8))
ON CONFLICT (resource) DO UPDATE SET fencing_token = excluded.fencing_token, updated_at = excluded.updated_at
 WHERE excluded.fencing_token >= coord_fences.fencing_token
RETURNING fencing_token;

-- name: fence_many
-- PostgreSQL only: record the tokens of fenced task commits (one statement per commit batch).
INSERT INTO coord_fences (resource, fencing_token, data, updated_at)
SELECT r, max(tok), NULL, coord_now(:now::float8)
  FROM unnest(:resources::text[], :tokens::bigint[]) AS u (r, tok) GROUP BY r ORDER BY r
ON CONFLICT (resource) DO UPDATE SET fencing_token = excluded.fencing_token, updated_at = excluded.updated_at
 WHERE excluded.fencing_token >= coord_fences.fencing_token
RETURNING resource;

-- name: fence_lock
-- PostgreSQL only: lock the fence rows of a commit batch (sorted) and read their tokens.
SELECT resource, fencing_token FROM coord_fences WHERE resource = ANY(:resources::text[])
 ORDER BY resource FOR UPDATE;

-- name: fenced_write
INSERT INTO coord_fences (resource, fencing_token, data, updated_at)
VALUES (:resource::text, :fencing_token::bigint, :data::text, coord_now(:now::float8))
ON CONFLICT (resource) DO UPDATE
   SET fencing_token = excluded.fencing_token, data = excluded.data, updated_at = excluded.updated_at
 WHERE excluded.fencing_token >= coord_fences.fencing_token
RETURNING resource, fencing_token, data, updated_at;

-- name: fence_get
SELECT resource, fencing_token, data, updated_at FROM coord_fences WHERE resource = :resource::text;
