"""Jobs: running deployments of a branch (the control-plane issue grows this app)."""
