"""`python -m bench.sinks [--records-per-epoch N] [--epochs N] [--kinds a,b]`: every
destination module's `measure` in one process; the last stdout line is one JSON object, the
exit status 1 when a destination misses its target or its exactly-once check.

(A temporary runner of the Iceberg and log destinations: the core's runner of all of them
replaces it.)"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

KINDS = ("iceberg", "redis_streams", "rabbitmq_streams")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sinks")
    parser.add_argument("--records-per-epoch", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args(argv)
    out: dict[str, object] = {"loadavg_start": list(os.getloadavg())}
    ok = True
    for kind in [k for k in args.kinds.split(",") if k]:
        module = importlib.import_module(f"bench.sinks.{kind}")
        with tempfile.TemporaryDirectory(prefix=f"bench-sinks-{kind}-") as workdir:
            result = module.measure(records_per_epoch=args.records_per_epoch,
                                    epochs=args.epochs, workdir=Path(workdir))  # fmt: skip
        print(f"{kind}: {json.dumps(result)}", file=sys.stderr)
        ok = ok and bool(result["exactly_once_checked"]) and bool(result["target_met"])
        out[kind] = result
    out["loadavg_end"] = list(os.getloadavg())
    out["ok"] = ok
    print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
