"""Every operation kind, by name."""

from __future__ import annotations

from controlplane.errors import InvalidRequest
from controlplane.operations.framework import OperationSpec
from controlplane.operations.kinds.align import AlignSpec
from controlplane.operations.kinds.fork import ForkSpec
from controlplane.operations.kinds.hotswap import HotswapSpec
from controlplane.operations.kinds.lifecycle import SavepointSpec, StartSpec, StopSpec
from controlplane.operations.kinds.migrate import MigrateSpec
from controlplane.operations.kinds.rescale import RescaleSpec
from controlplane.operations.kinds.rollback import RollbackSpec

SPECS: dict[str, OperationSpec] = {
    spec.kind: spec
    for spec in (
        StartSpec(),
        StopSpec(),
        SavepointSpec(),
        RescaleSpec(),
        RollbackSpec(),
        ForkSpec(),
        MigrateSpec(),
        AlignSpec(),
        HotswapSpec(),
    )
}


def operation_spec(kind: str) -> OperationSpec:
    try:
        return SPECS[kind]
    except KeyError:
        raise InvalidRequest(
            f"unknown operation kind {kind!r}; one of {sorted(SPECS)}",
            fields={"kind": [f"must be one of {sorted(SPECS)}"]},
        ) from None
