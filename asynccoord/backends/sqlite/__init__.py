"""The sqlite engine: :class:`SQLiteStore`, the embedded default store on one SQLite file."""

from .store import SQLiteStore

__all__ = ("SQLiteStore",)
