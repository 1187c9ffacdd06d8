-- asynccoord schema version 2 (PostgreSQL): distributed locks, semaphores and fencing.
-- A lock is a semaphore of one permit. Each live acquisition is one row of
-- coord_lock_holders, in one of the name's permit slots 0..permits-1: the unique
-- (name, slot) index makes the database refuse more holders than permits, even when two
-- grants race. An expired row is dead: every query compares expires_at with the store
-- clock; the next grant takes its slot over, and garbage collection deletes it later. The fencing counter of a name lives in
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

-- Acquisitions, many in one round trip (a batch of the concurrent acquisitions of one
-- process). For each request, in name order (so two batches never deadlock): take the
-- name's row lock (which serializes acquisitions of the name), count its live leases and,
-- when fewer than the request's permits, grant one in the lowest slot no live lease holds
-- (empty, or a lapsed lease's, taken over) with the name's next fencing token. PL/pgSQL
-- takes a new snapshot for each statement (READ COMMITTED), so each count sees every
-- committed grant and release: no grant is refused by a stale view, and a fencing token
-- is spent only on a grant. r_fencing_token is NULL when every permit was taken.
CREATE FUNCTION coord_lock_acquire_many(p_names text[], p_permits integer[], p_owner_tokens text[], p_holders text[],
                                        p_ttls double precision[], p_now double precision)
    RETURNS TABLE (r_ord integer, r_live bigint, r_earliest double precision, r_now double precision,
                   r_fencing_token bigint, r_acquired_at double precision, r_expires_at double precision)
    LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_i     integer;
    v_slots integer[];
    v_slot  integer;
BEGIN
    FOR v_i IN SELECT u.i FROM generate_subscripts(p_names, 1) AS u (i) ORDER BY p_names[u.i], u.i LOOP
        r_ord := v_i;
        INSERT INTO coord_lock_names AS n (name, last_fencing_token) VALUES (p_names[v_i], 0)
        ON CONFLICT (name) DO UPDATE SET last_fencing_token = n.last_fencing_token;
        r_now := coord_now(p_now);
        SELECT count(*), min(h.expires_at), coalesce(array_agg(h.slot), '{}')
          INTO r_live, r_earliest, v_slots
          FROM coord_lock_holders AS h WHERE h.name = p_names[v_i] AND h.expires_at > r_now;
        r_fencing_token := NULL;
        r_acquired_at := NULL;
        r_expires_at := NULL;
        IF r_live < p_permits[v_i] THEN
            SELECT min(s) INTO v_slot
              FROM generate_series(0, least(p_permits[v_i] - 1, r_live::integer)) AS s WHERE NOT (s = ANY(v_slots));
            UPDATE coord_lock_names AS n SET last_fencing_token = n.last_fencing_token + 1
             WHERE n.name = p_names[v_i] RETURNING n.last_fencing_token INTO r_fencing_token;
            r_acquired_at := r_now;
            r_expires_at := r_now + p_ttls[v_i];
            INSERT INTO coord_lock_holders AS h
                   (owner_token, name, slot, holder, fencing_token, permits, acquired_at, expires_at)
            VALUES (p_owner_tokens[v_i], p_names[v_i], v_slot, p_holders[v_i], r_fencing_token, p_permits[v_i],
                    r_acquired_at, r_expires_at)
            ON CONFLICT (name, slot) DO UPDATE
               SET owner_token = excluded.owner_token, holder = excluded.holder,
                   fencing_token = excluded.fencing_token, permits = excluded.permits,
                   acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
             WHERE h.expires_at <= r_now;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'asynccoord: slot % of lock % is live although the name is locked', v_slot, p_names[v_i];
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$fn$;
