"""asynccoord.backends.postgres."""
