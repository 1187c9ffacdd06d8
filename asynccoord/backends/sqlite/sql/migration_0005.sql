-- asynccoord schema revision 5 (SQLite): finished tasks removed from each queue, counted.
-- purge_finished deletes done tasks and discard_dead dead ones, so the queue's done and dead
-- counts fall although no work was undone. Each adds what it deleted here, in its own
-- transaction, so done + dead + removed_done + removed_dead only grows: what queue_depths
-- reports as the queue's finished tasks (the dashboard's finished-per-second).
CREATE TABLE coord_queue_removed (
    queue TEXT PRIMARY KEY,
    done  INTEGER NOT NULL DEFAULT 0,
    dead  INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
