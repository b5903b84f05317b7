"""A two-epoch engine job for the launcher test that runs `runners.engine.main` for real."""

from __future__ import annotations

from runners.engine import Job
from runners.engine import aggregations as agg
from runners.engine.sources import Generator

job = Job(
    name="launcher-probe",
    source=Generator(keys=20, records_per_epoch=200, epochs=2, rows_per_split=200),
    key="key",
    aggregate=[agg.count(), agg.sum("value")],
    time_mode="logical",
)

#: an endless stream for the standby test (paused and stopped through the control document)
endless = Job(
    name="launcher-endless",
    source=Generator(keys=20, records_per_epoch=200, epochs=None, rows_per_split=200),
    key="key",
    aggregate=[agg.count(), agg.sum("value")],
    time_mode="logical",
)
