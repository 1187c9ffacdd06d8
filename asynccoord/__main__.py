"""``python -m asynccoord COMMAND``: see :mod:`asynccoord.cli.main`."""

from __future__ import annotations

from .cli.main import main

if __name__ == "__main__":
    raise SystemExit(main(exiting=True))
