"""Lineage index: a queryable mirror of each application's snapshot store."""
