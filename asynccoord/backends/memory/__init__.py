"""The memory engine: :class:`MemoryStore`, the in-memory store, the reference semantics."""

from .store import MemoryStore

__all__ = ("MemoryStore",)
