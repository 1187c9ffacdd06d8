"""The command line, ``python -m asynccoord COMMAND``: four commands around one database.

``run`` hosts a Runtime of N nodes around a send function named as ``module:attribute``
until SIGTERM, SIGINT or SIGHUP (:mod:`~asynccoord.cli.run`, with ``--lifespan`` in
:mod:`~asynccoord.cli.lifespan`, the alert webhooks and metrics in
:mod:`~asynccoord.cli.runmonitor` and the lines it prints in
:mod:`~asynccoord.cli.runlines`). ``status`` prints one read-only report of the queues,
nodes, locks, rates and alerts, as tables or JSON (:mod:`~asynccoord.cli.status`);
``dashboard`` serves that report as a live web page (:mod:`~asynccoord.cli.dashboard`,
extra ``dashboard``); ``dead`` lists a queue's dead tasks, then requeues or discards them
(:mod:`~asynccoord.cli.dead`). :mod:`~asynccoord.cli.main` parses the arguments and
gives every command the same exit status: 0 done, 1 failed, 2 bad usage.
"""
