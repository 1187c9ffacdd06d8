"""asynccoord.cli."""
