-- asynccoord schema revision 2 (SQLite): settings per queue, the dead-letter policy first.
-- One row per queue that changed a setting from its default (set_dead_letter_policy).
-- dead_letters: 'skip' (a key goes on past its dead task) or 'hold' (it waits for the
-- dead task to be requeued or discarded; see DeadLetterStore in contract/deadletters.py).
CREATE TABLE coord_queue_settings (
    queue TEXT PRIMARY KEY,
    dead_letters TEXT NOT NULL DEFAULT 'skip' CHECK (dead_letters IN ('skip', 'hold'))
) WITHOUT ROWID;
-- Dead tasks of a key, oldest first: whether a key of a 'hold' queue is held (one seek).
CREATE INDEX coord_tasks_dead ON coord_tasks (queue, partition_key, id) WHERE status = 'dead';
