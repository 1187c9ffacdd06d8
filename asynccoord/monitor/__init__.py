"""asynccoord.monitor."""
