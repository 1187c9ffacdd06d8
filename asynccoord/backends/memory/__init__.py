"""asynccoord.backends.memory."""
