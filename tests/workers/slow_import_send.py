"""A send module slow to import, for tests/multiprocess/test_run_start_signals.py.

``--send slow_import_send:send`` (``tests/workers`` on ``PYTHONPATH``): on import it creates
the file ``SLOW_IMPORT_MARK`` names, then sleeps ``SLOW_IMPORT_S`` seconds, as a bot's module
importing a large client library does. A signal sent once the file exists reaches ``run``
while it loads its ``--send``, before it has installed its own signal handlers. The send
itself is :func:`serve_send.send` (configured as that module says).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from serve_send import send

__all__ = ("send",)

Path(os.environ["SLOW_IMPORT_MARK"]).touch()
time.sleep(float(os.environ["SLOW_IMPORT_S"]))
