"""The JSON schema of an autoscaling policy's fields: what the REST API's PATCH publishes and
checks, and what a job file's `autoscaler` holds (controlplane/jobfiles)."""

from __future__ import annotations

from typing import Final

from controlplane.applications.models import MAX_PARALLELISM_LIMIT
from controlplane.autoscaler.decision import MODES

_WINDOW: Final = {"type": "integer", "minimum": 1, "maximum": 1000}
POLICY_PATCH: Final = {
    "type": "object",
    "description": "The policy fields to change (docs/autoscaling.md); the others stay. "
    "Each field is checked against this schema (400); how they fit together and with the "
    "policy's other fields, and max_parallelism at most the application's M, is a 422.",
    "properties": {
        "mode": {"type": "string", "enum": list(MODES)},
        "target_utilisation": {"type": "number", "minimum": 0.05, "maximum": 1.0},
        "min_parallelism": {"type": "integer", "minimum": 1, "maximum": MAX_PARALLELISM_LIMIT},
        "max_parallelism": {"type": "integer", "minimum": 1, "maximum": MAX_PARALLELISM_LIMIT},
        "scale_up_window": _WINDOW,
        "scale_down_window": _WINDOW,
        "cooldown_epochs": {"type": "integer", "minimum": 0, "maximum": 1000},
        "metric_window": _WINDOW,
        "catch_up_epochs": _WINDOW,
        "utilisation_min": {"type": "number", "minimum": 0.0, "maximum": 1.0},
        "utilisation_max": {"type": "number", "minimum": 0.05, "maximum": 2.0},
        "min_dwell_s": {"type": "number", "minimum": 0.0, "maximum": 86400},
    },
    "additionalProperties": False,
}
"""The PATCH body: every field `AutoscalePolicy.FIELDS` names, with the bounds
`Policy.problems` checks (tests/security/test_schema_contract.py holds them equal)."""
