"""`epochal register-store`, `epochal stores`, `epochal entry-points`: what admins registered
(stores) and installed (jobs and state migrations), from a shell."""

from __future__ import annotations

import argparse

from controlplane.applications.stores import store_list, store_register
from controlplane.cli.console import Console
from controlplane.cli.verb import Verb
from runners import entry_points


def _register_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the name operations use, e.g. archive")
    parser.add_argument(
        "url", help="file:///dir (under EPOCHAL_STORE_ROOTS) or s3://bucket/prefix[?endpoint_url=…]"
    )
    parser.add_argument(
        "--credentials-env", default="", help="environment variable prefix of its credentials"
    )
    parser.add_argument(
        "--credentials-secret", default="", help="Kubernetes secret holding its credentials"
    )
    parser.add_argument("--description", default="")


def _run_register(args: argparse.Namespace, console: Console) -> int:
    store = store_register(
        name=args.name,
        url=args.url,
        credentials_env=args.credentials_env,
        credentials_secret=args.credentials_secret,
        description=args.description,
    )
    if console.as_json:
        console.json({"name": store.name, "url": store.shown_url})
    else:
        console.line(f"registered store {store.name}: {store.shown_url}")
    return 0


def _run_list(args: argparse.Namespace, console: Console) -> int:
    stores = store_list()
    rows = [
        {
            "name": s.name,
            "url": s.shown_url,
            "credentials": s.credentials_secret or s.credentials_env or "-",
            "applications": ", ".join(a.name for a in s.applications.all()) or "-",
        }
        for s in stores
    ]
    if console.as_json:
        console.json(rows)
        return 0
    console.table(
        ["store", "url", "credentials from", "applications"],
        [list(r.values()) for r in rows],
    )
    return 0


def _run_entry_points(args: argparse.Namespace, console: Console) -> int:
    rows = [
        {"group": group, **e.to_dict()}
        for group in entry_points.GROUPS
        for e in entry_points.registered(group)
    ]
    if console.as_json:
        console.json(rows)
        return 0
    console.table(
        ["group", "name", "points at", "package"],
        [[r["group"], r["name"], r["value"], f"{r['distribution']} {r['version']}"] for r in rows],
    )
    return 0


REGISTER_STORE = Verb(
    "register-store",
    "register a store operations may name (admins): file:// under EPOCHAL_STORE_ROOTS, s3://",
    _register_arguments,
    _run_register,
)
STORES = Verb("stores", "list the registered stores", lambda parser: None, _run_list)
ENTRY_POINTS = Verb(
    "entry-points",
    "list the jobs and state migrations installed packages register (versions name them)",
    lambda parser: None,
    _run_entry_points,
)
VERBS = (REGISTER_STORE, STORES, ENTRY_POINTS)
