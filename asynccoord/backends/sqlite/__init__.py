"""asynccoord.backends.sqlite."""
