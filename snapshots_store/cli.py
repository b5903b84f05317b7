"""Command line: inspect and maintain a store.

    python -m snapshots_store [--store URL] --namespace NS [--json] COMMAND ...

The store defaults to `$STORE_URL`, else the control plane's embedded default (`var/store`).

Exit status: 0 success, 1 store error (message on stderr), 2 bad usage, 3 fsck problems.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

from snapshots_store.backends import local_store_url
from snapshots_store.codec import format_timestamp, parse_timestamp
from snapshots_store.diff import KeyGroupChange, SnapshotDiff
from snapshots_store.errors import StoreError
from snapshots_store.fsck import check_repository
from snapshots_store.gc import DEFAULT_GRACE, DEFAULT_RETENTION, collect_garbage
from snapshots_store.manifest import Manifest
from snapshots_store.repository import Repository

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_FSCK_PROBLEMS = 3
_DURATION = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str) -> timedelta:
    """``0``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w`` or combinations like ``1d12h``."""
    if text == "0":
        return timedelta(0)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30m, 12h, 7d or 1d12h")
    return sum((timedelta(**{_UNITS[u]: int(n)}) for n, u in parts), timedelta(0))


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0, 1, 2 …)")
    return int(text)


def _format_duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    if seconds % 86400 == 0:
        return f"{seconds // 86400}d"
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    return f"{seconds}s"


def _size(value: int | None) -> str:
    if value is None:
        return "missing"
    if value < 1024:
        return f"{value} B"
    amount = value / 1024
    unit = "KiB"
    for bigger in ("MiB", "GiB"):
        if amount < 1024:
            break
        amount, unit = amount / 1024, bigger
    return f"{amount:.1f} {unit}"


#: a checkout's embedded default store: `var/store` beside the packages (as the control plane's)
_CHECKOUT = Path(__file__).resolve().parent.parent


def default_store_url() -> str:
    """`$STORE_URL`, else the embedded default the control plane uses (`file://…/var/store`)."""
    var_dir = Path(os.environ.get("EPOCHAL_VAR_DIR", "").strip() or _CHECKOUT / "var")
    return local_store_url(
        os.environ.get("STORE_URL", "").strip(), root=_CHECKOUT, default=var_dir.resolve() / "store"
    )


def json_flag() -> argparse.ArgumentParser:
    """`--json` for every command's own parser (`log --json` as well as `--json log`)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    return parent


def add_commands(sub: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> None:
    """The store commands, on a subparsers object (`python -m snapshots_store`, `epochal store`)."""
    common = list(parents)
    log = sub.add_parser("log", help="history of a revision, newest first", parents=common)
    log.add_argument("rev", nargs="?", default="main", help="revision (default: main)")
    log.add_argument("--first-parent", action="store_true", help="follow first parents only")
    log.add_argument("-n", "--limit", type=_count, default=None, help="show at most N snapshots")

    show = sub.add_parser("show", help="one snapshot's manifest", parents=common)
    show.add_argument("rev")

    diff = sub.add_parser("diff", help="key groups and offsets changed from A to B", parents=common)
    diff.add_argument("a")
    diff.add_argument("b")

    refs = sub.add_parser("refs", help="branches and tags", parents=common)
    refs.add_argument("prefix", nargs="?", default="", help="e.g. heads/ or tags/")

    reflog = sub.add_parser("reflog", help="every move of a ref, oldest first", parents=common)
    reflog.add_argument("ref", help="heads/<branch>, tags/<tag> or a branch name")
    reflog.add_argument("-n", "--limit", type=_count, default=None, help="only the latest N moves")

    resolve = sub.add_parser(
        "resolve", help="print the snapshot id a revision names", parents=common
    )
    resolve.add_argument("rev")

    gc = sub.add_parser("gc", help="remove unreachable objects", parents=common)
    gc.add_argument(
        "--retention",
        type=parse_duration,
        default=DEFAULT_RETENTION,
        help=f"reflog entries younger than this keep snapshots alive "
        f"(default {_format_duration(DEFAULT_RETENTION)})",
    )
    gc.add_argument(
        "--grace",
        type=parse_duration,
        default=DEFAULT_GRACE,
        help=f"never remove objects younger than this, e.g. of in-flight commits "
        f"(default {_format_duration(DEFAULT_GRACE)})",
    )
    gc.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")

    sub.add_parser("fsck", help="verify every reachable object and every reflog", parents=common)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m snapshots_store",
        description="Inspect and maintain an Epochal snapshot store.",
        epilog="Exit status: 0 ok, 1 store error, 2 bad usage, 3 fsck found problems. "
        "`epochal store` runs the same commands on a registered application's store.",
    )
    parser.add_argument(
        "--store",
        default=default_store_url(),
        help="store URL: file://path or s3://bucket/prefix?endpoint_url=… "
        "(default: $STORE_URL, else the embedded default; now %(default)s)",
    )
    parser.add_argument("--namespace", required=True, help="application namespace")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_commands(
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND"), [json_flag()]
    )
    return parser


class _Output:
    def __init__(self, stream: TextIO, as_json: bool) -> None:
        self.stream = stream
        self.as_json = as_json

    def json(self, value: Any) -> None:
        self.stream.write(json.dumps(value, indent=2, sort_keys=True) + "\n")

    def line(self, text: str = "") -> None:
        self.stream.write(text + "\n")


def _decorations(repo: Repository) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for name, value in repo.list_refs().items():
        names.setdefault(value.target, []).append(name)
    return names


def _manifest_json(snapshot_id: str, manifest: Manifest) -> dict[str, Any]:
    return {"id": snapshot_id, **manifest.to_dict()}


def _when(value: str) -> str:
    """A stored timestamp the one way the commands print them (UTC, `…Z`): manifests written
    by different writers say `+00:00` or `Z`, which the hash keeps as written."""
    try:
        return format_timestamp(parse_timestamp(value))
    except ValueError:
        return value


def _cmd_log(repo: Repository, args: argparse.Namespace, out: _Output) -> int:
    entries = list(repo.log(args.rev, first_parent=args.first_parent, limit=args.limit))
    if out.as_json:
        out.json([_manifest_json(sid, m) for sid, m in entries])
        return 0
    refs = _decorations(repo)
    for sid, m in entries:
        where = f"  ({', '.join(refs[sid])})" if sid in refs else ""
        merge = f"  merge of {len(m.parents)}" if len(m.parents) > 1 else ""
        out.line(
            f"{sid[:12]}  epoch {m.epoch:<6} {m.kind:<9} {_when(m.created_at)}  "
            f"p={m.parallelism}/{m.max_parallelism}  {m.branch}{merge}{where}"
        )
    return 0


def _cmd_show(repo: Repository, args: argparse.Namespace, out: _Output) -> int:
    sid = repo.resolve(args.rev)
    m = repo.read_manifest(sid)
    if out.as_json:
        out.json(_manifest_json(sid, m))
        return 0
    out.line(f"snapshot     {sid}")
    for parent in m.parents:
        out.line(f"parent       {parent}")
    out.line(f"branch       {m.branch}")
    out.line(f"kind         {m.kind}   operation {m.operation_id or '-'}")
    out.line(f"epoch        {m.epoch}   created {_when(m.created_at)}")
    out.line(f"parallelism  {m.parallelism} of max {m.max_parallelism}")
    out.line(f"code         {m.code_version or '-'}   config {m.config_hash or '-'}")
    chunks = sum(len(c) for c in m.key_groups.values())
    out.line(f"key groups   {len(m.key_groups)} with state ({chunks} chunks)")
    out.line(f"outputs      {len(m.outputs)}")
    for source, parts in sorted(m.offsets.items()):
        shown = ", ".join(f"{p}:{o}" for p, o in sorted(parts.items()))
        out.line(f"offsets      {source}  {shown}")
    for name, number in sorted(m.stats.items()):
        out.line(f"stat         {name} = {number}")
    for name, text in sorted(m.provenance.items()):
        out.line(f"provenance   {name} = {text}")
    return 0


def _change_line(sign: str, change: KeyGroupChange) -> str:
    if sign == "~":
        sizes = f"{_size(change.old_size)} -> {_size(change.new_size)}"
    else:
        sizes = _size(change.new_size if sign == "+" else change.old_size)
    return f"  {sign} key group {change.key_group:<6} {sizes}"


def _cmd_diff(repo: Repository, args: argparse.Namespace, out: _Output) -> int:
    d: SnapshotDiff = repo.diff(args.a, args.b)
    if out.as_json:
        out.json(d.to_dict())
        return 0
    out.line(f"diff {d.old[:12]}..{d.new[:12]}")
    out.line(
        f"key groups: {len(d.added)} added, {len(d.changed)} changed, {len(d.removed)} removed"
    )
    for sign, group in (("+", d.added), ("~", d.changed), ("-", d.removed)):
        for change in group:
            out.line(_change_line(sign, change))
    if d.offsets:
        out.line("offsets:")
        for o in d.offsets:
            before = "-" if o.old is None else str(o.old)
            after = "-" if o.new is None else str(o.new)
            out.line(f"  {o.source}/{o.partition}  {before} -> {after}  ({o.advanced:+d})")
    if d.parallelism[0] != d.parallelism[1]:
        out.line(f"parallelism {d.parallelism[0]} -> {d.parallelism[1]}")
    if d.max_parallelism[0] != d.max_parallelism[1]:
        out.line(f"max parallelism {d.max_parallelism[0]} -> {d.max_parallelism[1]}")
    out.line(f"outputs: {len(d.outputs_added)} added, {len(d.outputs_removed)} removed")
    return 0


def _cmd_refs(repo: Repository, args: argparse.Namespace, out: _Output) -> int:
    refs = repo.list_refs(args.prefix)
    if out.as_json:
        out.json({name: {"target": v.target, "seq": v.seq} for name, v in refs.items()})
        return 0
    width = max((len(name) for name in refs), default=0)
    for name, value in refs.items():
        out.line(f"{name:<{width}}  {value.target}  (moved {value.seq}x)")
    return 0


def _cmd_reflog(repo: Repository, args: argparse.Namespace, out: _Output) -> int:
    name = args.ref
    if not name.startswith(("heads/", "tags/", "refs/")):  # a bare name: branch, else tag
        branch, tag = f"heads/{name}", f"tags/{name}"
        only_tag = repo.refs.read_document(branch) is None and repo.refs.read_document(tag)
        name = tag if only_tag else branch
    entries = repo.reflog(name, limit=args.limit)
    if out.as_json:
        out.json([e.to_dict() for e in entries])
        return 0
    for e in entries:
        old = "-" * 12 if e.old is None else e.old[:12]
        new = "(deleted)" if e.new is None else e.new[:12]
        op = f"  [{e.operation_id}]" if e.operation_id else ""
        out.line(f"{e.seq:>6}  {_when(e.at)}  {old} -> {new}  {e.reason}{op}")
    return 0


def _cmd_resolve(repo: Repository, args: argparse.Namespace, out: _Output) -> int:
    sid = repo.resolve(args.rev)
    if out.as_json:
        out.json({"rev": args.rev, "id": sid})
    else:
        out.line(sid)
    return 0


def _cmd_gc(repo: Repository, args: argparse.Namespace, out: _Output) -> int:
    report = collect_garbage(repo, retention=args.retention, grace=args.grace, dry_run=args.dry_run)
    if out.as_json:
        out.json(report.to_dict())
        return 0
    verb = "would remove" if report.dry_run else "removed"
    for item in report.removed:
        label = item.object_id or item.key
        out.line(f"{verb:>12}  {label}  {_size(item.size)}  ({item.reason})")
    if report.reflog_roots_gone:
        out.line(
            f"note: {report.reflog_roots_gone} snapshot(s) named by the reflog were removed earlier"
        )
    out.line(
        f"gc: {report.roots} roots, {report.reachable_objects} reachable objects kept, "
        f"{report.kept_young} unreachable but younger than the grace period kept, "
        f"{verb} {len(report.removed)} ({_size(report.removed_bytes)}); "
        f"{'would prune' if report.dry_run else 'pruned'} "
        f"{report.reflog_entries_pruned} expired reflog entries"
    )
    return 0


def _cmd_fsck(repo: Repository, args: argparse.Namespace, out: _Output) -> int:
    report = check_repository(repo)
    if out.as_json:
        out.json(report.to_dict())
    else:
        for problem in report.problems:
            out.line(f"{problem.kind}: {problem.message}")
        status = "ok" if report.ok else f"{len(report.problems)} problem(s)"
        out.line(
            f"fsck: {status}; checked {report.refs_checked} refs, "
            f"{report.snapshots_checked} snapshots, {report.objects_checked} objects"
        )
    return 0 if report.ok else EXIT_FSCK_PROBLEMS


_COMMANDS = {
    "log": _cmd_log,
    "show": _cmd_show,
    "diff": _cmd_diff,
    "refs": _cmd_refs,
    "reflog": _cmd_reflog,
    "resolve": _cmd_resolve,
    "gc": _cmd_gc,
    "fsck": _cmd_fsck,
}


def run_command(repo: Repository, args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    """Run the parsed store command `args.command` on `repo`; returns the exit status."""
    out = _Output(stdout or sys.stdout, bool(getattr(args, "json", False)))
    try:
        return _COMMANDS[args.command](repo, args, out)
    except StoreError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_ERROR
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        repo = Repository.open(args.store, args.namespace)
    except StoreError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_ERROR
    return run_command(repo, args, stdout)
