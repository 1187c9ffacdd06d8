"""asynccoord.node."""
