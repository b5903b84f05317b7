"""What one manifest says about its job's sinks, kept in the lineage index (`Snapshot.sinks`).

The engine records two things in every epoch's manifest (runners/engine/runner.py):

* ``extra.sinks.<name>``: the pending record of each sink of the run (`runners.engine.sinks`),
  whose ``staged`` part is the destination's own record: a *chain sink* (Delta Lake,
  PostgreSQL: `runners.engine.sink_catchup.ChainSinkBase.prepare`) records only where the
  epoch goes (``destination``, ``writer``); a *log sink* (Kafka: ``topic``/``transactions``;
  Redis and RabbitMQ Streams: ``stream``/``generation``) what it will publish; Iceberg the
  data files it staged;
* ``stats.sink_lag_epochs.<name>``: how many epochs of the branch's first-parent chain, up to
  the epoch's parent, sink `name`'s destination lacked when the epoch committed (the runner
  settles the sinks' writes of the previous epoch before it reads the lag), for every sink the
  catch-up driver follows: the chain sinks, and Iceberg and the Redis and RabbitMQ Streams
  sinks since they follow it too; ``stats.sink_lag_epochs`` is the largest, all that
  manifests written before the per-sink figures recorded (only chain sinks then).

So an epoch committed at epoch *e* with a sink's lag *L* proves that its destination held at
least the chain's epochs up to ``e - 1 - L`` (chain epochs are numbered 1, 2, … without gaps:
operation commits share their parent's epoch). That number is `held` here: for a chain sink
from its own lag or else the largest, for another sink only from its own. Nothing is asked of
any destination.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

SINKS = "sinks"  # the manifest's extra key (runners.engine.sinks.SINKS)
LAG = "sink_lag_epochs"  # the stats key (runners.engine.sink_catchup.LAG_KEY)
Role = Literal["chain", "log", "two_phase"]
#: the keys of a chain sink's staged record (ChainSinkBase.prepare)
CHAIN_RECORD = frozenset({"destination", "writer"})


def sink_role(staged: Mapping[str, Any]) -> Role:
    """How a sink with this staged record reaches its destination: ``chain`` (follows the
    branch, catches up in order, goes back on rollback), ``log`` (publishes; cannot take
    records back) or ``two_phase`` (Iceberg: commits each epoch after the store's CAS)."""
    if set(staged) == CHAIN_RECORD:
        return "chain"
    if "transactions" in staged or ("stream" in staged and "generation" in staged):
        return "log"
    return "two_phase"


def sink_facts(manifest: Any) -> dict[str, dict[str, Any]]:
    """`{sink name: {"role": …, "held": epoch or None}}` of a manifest (`held`: the newest
    chain epoch the sink's destination is known to have held when this epoch committed, from
    its own lag or, for a chain sink, else the largest; None when the stats do not say)."""
    records = (manifest.extra or {}).get(SINKS)
    if not isinstance(records, Mapping):
        return {}
    stats = manifest.stats or {}
    facts: dict[str, dict[str, Any]] = {}
    for name, entry in records.items():
        staged = entry.get("staged") if isinstance(entry, Mapping) else None
        role = sink_role(staged if isinstance(staged, Mapping) else {})
        own = stats.get(f"{LAG}.{name}")
        lag = own if own is not None or role != "chain" else stats.get(LAG)
        held = None
        if isinstance(lag, int | float) and manifest.epoch >= 1:
            held = max(0, int(manifest.epoch) - 1 - int(lag))
        facts[str(name)] = {"role": role, "held": held}
    return facts
