-- Named queries of locks, semaphores and fencing for the PostgreSQL store (see
-- backends/postgres_locks.py). coord_now(:now) is the server clock (or a test clock);
-- a lease is live while expires_at > coord_now(:now).

-- name: lock_purge_expired
-- Garbage collection (every name, now and then): a lapsed lease is dead already (every
-- query compares expires_at with the clock) and its slot is taken over by the next grant.
DELETE FROM coord_lock_holders WHERE expires_at <= coord_now(:now::float8) - :grace_s::float8;

-- name: lock_live
-- Acquisitions, a batch in one round trip (coord_lock_acquire_many, migration_0002.sql):
-- under each name's row lock, count its live leases and, when fewer than the request's
-- permits, grant one with the name's next fencing token. Per request (r_ord is its
-- 1-based position): the live count, the earliest expiry, the clock, and the grant
-- (NULLs when busy).
SELECT r_ord, r_live, r_earliest, r_now, r_fencing_token, r_acquired_at, r_expires_at
  FROM coord_lock_acquire_many(:names::text[], :permits::int[], :owner_tokens::text[], :holders::text[],
                               :ttls::float8[], :now::float8);

-- name: lock_find_owned
-- PostgreSQL only: after a lost connection, the grants an earlier attempt of a batch committed.
SELECT owner_token, fencing_token, acquired_at, expires_at FROM coord_lock_holders
 WHERE owner_token = ANY(:owner_tokens::text[]);

-- name: lock_next_fencing_token
-- Bump a name's fencing counter outside an acquisition (kept for dialect parity: an
-- acquisition bumps it inside lock_live, which also does the SQLite dialect's lock_insert).
INSERT INTO coord_lock_names (name, last_fencing_token) VALUES (:name::text, 1)
ON CONFLICT (name) DO UPDATE SET last_fencing_token = coord_lock_names.last_fencing_token + 1
RETURNING last_fencing_token;

-- name: lock_release
-- Deletes the caller's row even when it lapsed (it is dead anyway); reports whether it was live.
-- A live one is announced on the store's channel (:payload names the lock), so pools waiting
-- in line in other processes try it at once (PgListener hands it to the store's ReleaseSignal).
WITH released AS (
    DELETE FROM coord_lock_holders WHERE owner_token = :owner_token::text AND name = :name::text
    RETURNING expires_at > coord_now(:now::float8) AS live)
SELECT live, CASE WHEN live THEN pg_notify(:channel::text, :payload::text) END FROM released;

-- name: lock_release_recheck
-- A release retried after a lost connection found no row: did the earlier attempt delete it?
-- Yes if the lease is live by the server clock still (nobody else deletes a live lease) and
-- the name's fencing counter is the lease's own (nobody acquired the name since).
SELECT coord_now(:now::float8) < :expires_at::float8
       AND COALESCE((SELECT last_fencing_token FROM coord_lock_names WHERE name = :name::text), 0)
           = :fencing_token::bigint;

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

-- name: fenced_write
INSERT INTO coord_fences (resource, fencing_token, data, updated_at)
VALUES (:resource::text, :fencing_token::bigint, :data::text, coord_now(:now::float8))
ON CONFLICT (resource) DO UPDATE
   SET fencing_token = excluded.fencing_token, data = excluded.data, updated_at = excluded.updated_at
 WHERE excluded.fencing_token >= coord_fences.fencing_token
RETURNING resource, fencing_token, data, updated_at;

-- name: fence_get
SELECT resource, fencing_token, data, updated_at FROM coord_fences WHERE resource = :resource::text;
