"""Named PostgreSQL queries with ``:name`` parameters, bound positionally for asyncpg.

The ``.sql`` files of the ``postgres`` dialect use the same ``:name`` parameters as the
SQLite dialect. asyncpg speaks the server's positional ``$1, $2 ...`` syntax, so each
query is rewritten once at import: every distinct ``:name`` becomes ``$n`` in order of
first appearance (``::type`` casts are left alone, comments are dropped first so a
parameter named in a comment is not bound). Values are always bound, never formatted
into the text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..sqlfiles import load_queries

__all__ = ("PgQuery", "load_pg_queries")

_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
_COMMENT = re.compile(r"--[^\n]*")


@dataclass(frozen=True, slots=True)
class PgQuery:
    """One query: positional SQL text and the parameter name bound to each ``$n``."""

    name: str
    text: str
    params: tuple[str, ...]

    def args(self, values: Mapping[str, Any]) -> list[Any]:
        """The positional arguments for ``values`` (a mapping of every parameter name).

        Raises:
            KeyError: a parameter of the query is missing from ``values``.
        """
        try:
            return [values[p] for p in self.params]
        except KeyError as exc:
            raise KeyError(f"query {self.name!r} needs parameter {exc.args[0]!r}") from None


def _compile(name: str, sql: str) -> PgQuery:
    text = _COMMENT.sub("", sql)
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        param = match.group(1)
        if param not in names:
            names.append(param)
        return f"${names.index(param) + 1}"

    return PgQuery(name=name, text=_PARAM.sub(number, text).strip(), params=tuple(names))


@functools.cache
def load_pg_queries() -> dict[str, PgQuery]:
    """Query name -> :class:`PgQuery` for every named query of the ``postgres`` dialect."""
    return {name: _compile(name, sql) for name, sql in load_queries("postgres").items()}
