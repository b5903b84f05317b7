"""Epochal's embedded epoch-commit engine: keyed state in PySpark jobs, committed as snapshots.

See docs/engine.md. Spark and `snapshots_store` only; nothing of Django.
"""

from runners.engine import aggregations, sources
from runners.engine.job import Job, JobError
from runners.engine.keygroups import KeyGroupRange, key_group_of, key_group_range, operator_index
from runners.engine.output import publish_output, read_dead_letters, read_output
from runners.engine.runner import EngineError, EpochResult, EpochRunner
from runners.engine.state import EpochContext, KeyedState, ListState, MapState, ValueState

__all__ = [
    "EngineError",
    "EpochContext",
    "EpochResult",
    "EpochRunner",
    "Job",
    "JobError",
    "KeyGroupRange",
    "KeyedState",
    "ListState",
    "MapState",
    "ValueState",
    "aggregations",
    "key_group_of",
    "key_group_range",
    "operator_index",
    "publish_output",
    "read_dead_letters",
    "read_output",
    "sources",
]
