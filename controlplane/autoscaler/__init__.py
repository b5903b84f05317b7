"""Autoscaling: per-job policies, decisions computed from committed epochs, rescale requests."""
