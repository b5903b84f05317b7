"""Declarative jobs: a YAML job file, what it changes (diff) and applying it."""
