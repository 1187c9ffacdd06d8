"""The postgres engine: :class:`PostgresStore`, the multi-machine store on PostgreSQL (extra ``postgres``)."""

from .store import PostgresStore

__all__ = ("PostgresStore",)
