"""asynccoord.locks."""
