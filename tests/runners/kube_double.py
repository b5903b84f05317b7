"""A Kubernetes API server double for tests: kmock's emulator over real HTTP in a thread.

kmock keeps objects in memory and answers like the API server (201, 409, 404). Like a real
server it now also assigns `metadata.uid` and `creationTimestamp` on create (kmock leaves
that to subclasses), which owner references need.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kmock
from kubernetes import client


class ApiServerDouble(kmock.KubernetesEmulator):
    async def _handle(self, request: Any) -> Any:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault(
                "creationTimestamp", dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            )
        return await super()._handle(request)


class RunningDouble:
    """The running server: `url`, the emulator (`.k`) and helpers to read what it holds."""

    def __init__(self, k: ApiServerDouble, url: str) -> None:
        self.k = k
        self.url = url

    def api_client(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = self.url
        return client.ApiClient(cfg)

    def object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(f"v1/{plural}"), namespace, name)
        if key not in self.k.objects or self.k.objects[key].deleted:
            return None
        return dict(self.k.objects[key].raw)

    def requests(self, method: str, path: str) -> list[Any]:
        return [r for r in list(self.k[:]) if r.method.value == method and r.url.path == path]


@contextmanager
def api_server_double() -> Iterator[RunningDouble]:
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        async with ApiServerDouble() as k, kmock.Server(k) as server:
            holder["double"] = RunningDouble(k, str(server.url).rstrip("/"))
            holder["loop"] = asyncio.get_running_loop()
            holder["stop"] = asyncio.Event()
            ready.set()
            await holder["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    if not ready.wait(timeout=30):
        raise RuntimeError("the Kubernetes API double did not start")
    try:
        yield holder["double"]
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(timeout=10)
