"""Named SQL queries, one set per dialect, loaded once from ``.sql`` files.

A file holds blocks that start with a ``-- name: <query_name>`` line; the block's
text runs to the next such line. The schema is in separate files named
``migration_NNNN.sql``: ``migration_0001.sql`` creates it whole, and each later number
changes it (applied in order, each once; see :mod:`.schema`). Values are always bound as
parameters, never formatted into the text.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

__all__ = ("load_migrations", "load_queries")

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^migration_(\d{4})\.sql$")


@functools.cache
def load_queries(dialect: str) -> dict[str, str]:
    """Query name -> SQL text from every ``backends/<dialect>/sql/*.sql`` file except migrations.

    Raises:
        RuntimeError: a query name is defined twice (in one file or across files).
    """
    folder = resources.files(__package__).joinpath(dialect, "sql")
    queries: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql") or _MIGRATION.match(entry.name):
            continue
        text = entry.read_text("utf-8")
        matches = list(_NAME.finditer(text))
        for i, match in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
            name = match.group(1)
            if name in queries:
                raise RuntimeError(f"duplicate query name {name!r} in {dialect}/{entry.name}")
            queries[name] = text[match.end() : end].strip()
    return queries


@functools.cache
def load_migrations(dialect: str) -> tuple[tuple[int, str], ...]:
    """``(version, script)`` pairs from ``backends/<dialect>/sql/migration_NNNN.sql``, ascending."""
    folder = resources.files(__package__).joinpath(dialect, "sql")
    found: list[tuple[int, str]] = []
    for entry in folder.iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text("utf-8")))
    found.sort()
    versions = [v for v, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise RuntimeError(f"{dialect} migrations must be numbered 1..n without gaps, got {versions}")
    return tuple(found)
