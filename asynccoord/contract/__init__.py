"""asynccoord.contract."""
