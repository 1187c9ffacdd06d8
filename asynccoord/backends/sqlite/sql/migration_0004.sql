-- asynccoord schema revision 4 (SQLite): a queue's dead tasks in id order, for dead_letters
-- (the listing of `python -m asynccoord dead`).
-- coord_tasks_dead (revision 2) orders a queue's dead tasks by key first, so a page of them in
-- id order read every dead task of the queue and sorted them (10 ms a page at 50,000 dead
-- tasks); here a page is one seek. A task enters it when it dies and leaves it when it is
-- requeued or discarded: a queue that dead-letters nothing writes nothing here.
CREATE INDEX coord_tasks_dead_order ON coord_tasks (queue, id) WHERE status = 'dead';
