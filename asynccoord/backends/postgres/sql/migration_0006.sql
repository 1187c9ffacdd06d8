-- asynccoord schema revision 6 (PostgreSQL): finished tasks removed from each queue, counted.
-- purge_finished deletes done tasks and discard_dead dead ones, so the queue's done and dead
-- counts fall although no work was undone. Each adds what it deleted here, in the statement
-- that deletes, so done + dead + removed_done + removed_dead only grows: what queue_depths
-- reports as the queue's finished tasks (the dashboard's finished-per-second).
CREATE TABLE IF NOT EXISTS coord_queue_removed (
    queue text PRIMARY KEY,
    done  bigint NOT NULL DEFAULT 0,
    dead  bigint NOT NULL DEFAULT 0
);
