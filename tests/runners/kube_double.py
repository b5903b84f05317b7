"""A Kubernetes API server double for tests: kmock's emulator over real HTTP in a thread.

kmock keeps objects in memory and answers like the API server (201, 409, 404). Like a real
server it also assigns `metadata.uid` and `creationTimestamp` on create (kmock leaves that to
subclasses), which owner references need; filters lists and watches by `labelSelector` (Spark's
scheduler lists and watches its executors by label and would otherwise see the driver Pod as
an executor without an id); and deletes collections by label selector (`deletecollection`).
An optional `on_change(event_type, pod)` hook sees every Pod created, changed or deleted: the
kubelet double (kubelet.py) runs executor Pods with it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp.web
import attrs
import kmock
from kubernetes import client

PodHook = Callable[[str, dict[str, Any]], None]

_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?(?P<key>[\w./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[\w.-]*)|\s+(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Whether `labels` satisfy a Kubernetes label selector (`a=b,c!=d,e in (f,g),h,!i`)."""
    for requirement in re.split(r",(?![^(]*\))", selector):
        if not requirement.strip():
            continue
        m = _REQUIREMENT.match(requirement)
        if m is None:
            raise ValueError(f"unparseable label selector requirement {requirement!r}")
        key = m["key"]
        if m["set"]:
            values = {v.strip() for v in m["values"].split(",")}
            inside = labels.get(key) in values
            if inside != (m["set"] == "in"):
                return False
        elif m["op"]:
            equal = labels.get(key) == m["value"]
            if equal != (m["op"] != "!="):
                return False
        elif (key in labels) == bool(m["neg"]):
            return False
    return True


@attrs.define(kw_only=True)
class ApiServerDouble(kmock.KubernetesEmulator):
    on_change: PodHook | None = None

    async def _handle(self, request: Any) -> Any:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if request.namespace is not None:  # watches filter events by it
                meta.setdefault("namespace", request.namespace)
            meta.setdefault("uid", str(uuid.uuid4()))
            if _is_pods(request):  # a new Pod is Pending until a kubelet reports
                request.data.setdefault("status", {"phase": "Pending"})
            meta.setdefault(
                "creationTimestamp", dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            )
        if request.action == kmock.action.DELETE and request.name is None and request.resource:
            return await self._delete_collection(request)
        if request.action == kmock.action.WATCH and _wants_websocket(request):
            return await self._watch_over_websocket(request)
        response = await super()._handle(request)
        if self.on_change is None or not _is_pods(request):
            return response
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            name = request.data.get("metadata", {}).get("name")  # creates name it in the body
            raw = self._raw(request.resource, request.namespace, name)
            if raw is not None:
                self.on_change("ADDED", raw)
        elif request.action == kmock.action.DELETE and request.name is not None:
            self.on_change("DELETED", {"metadata": {"name": request.name}})
        elif request.action == kmock.action.UPDATE and request.name is not None:
            raw = self._raw(request.resource, request.namespace, request.name)
            if raw is not None:
                self.on_change("MODIFIED", raw)
        return response

    def _raw(self, resource: Any, namespace: str | None, name: str | None) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return dict(self.objects[key].raw)

    async def _delete_collection(self, request: Any) -> aiohttp.web.StreamResponse:
        selector = request.params.get("labelSelector", "")
        deleted = []
        async with self._lock:
            for (resource, namespace, _name), obj in list(self.objects.items()):
                if resource != request.resource or obj.deleted:
                    continue
                if request.namespace is not None and namespace != request.namespace:
                    continue
                if not selector_matches(selector, obj.get("metadata", {}).get("labels") or {}):
                    continue
                raw = obj.raw
                obj.delete()
                deleted.append(raw)
                await self._buses[request.resource].put({"type": "DELETED", "object": raw})
        if self.on_change is not None and _is_pods(request):
            for raw in deleted:
                self.on_change("DELETED", raw)
        return aiohttp.web.json_response(
            {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": deleted}
        )

    async def _watch_over_websocket(self, request: Any) -> aiohttp.web.StreamResponse:
        """A watch as the API server serves it to a WebSocket client (fabric8, so Spark):
        one text message per event. Answered as a plain streamed response instead, the
        client would wait for the upgrade forever."""
        ws = aiohttp.web.WebSocketResponse()
        await ws.prepare(request._raw_request)
        events = self._serve_watch(request)
        closed = asyncio.ensure_future(ws.receive())  # the client closing ends the watch
        try:
            while not ws.closed:
                step = asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait({step, closed}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:
                    step.cancel()
                    break
                event = step.result()
                if isinstance(event, dict):
                    await ws.send_str(json.dumps(event))
        except (StopAsyncIteration, ConnectionResetError):
            pass
        finally:
            closed.cancel()
            await events.aclose()
            await ws.close()
        return ws

    async def _serve_list(self, request: Any) -> Any:
        payload = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            payload["items"] = [
                item
                for item in payload["items"]
                if selector_matches(selector, item.get("metadata", {}).get("labels") or {})
            ]
        return payload

    async def _serve_watch(self, request: Any) -> AsyncIterator[Any]:
        selector = request.params.get("labelSelector")
        async for event in super()._serve_watch(request):
            if selector and isinstance(event, dict):
                labels = event.get("object", {}).get("metadata", {}).get("labels") or {}
                if not selector_matches(selector, labels):
                    continue
            yield event

    async def set_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """What a kubelet reports: merge `status` into the Pod and tell the watchers."""
        key = (kmock.resource("v1/pods"), namespace, name)
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                return
            self.objects[key].patch({"status": status})
            raw = self.objects[key].raw
            await self._buses[key[0]].put({"type": "MODIFIED", "object": raw})


def _wants_websocket(request: Any) -> bool:
    return (request.headers.get("Upgrade") or "").lower() == "websocket"


def _is_pods(request: Any) -> bool:
    return (
        request.resource is not None
        and request.resource.plural == "pods"
        and (request.subresource in (None, "status"))
    )


class RunningDouble:
    """The running server: `url`, the emulator (`.k`) and helpers to read what it holds."""

    def __init__(self, k: ApiServerDouble, url: str, loop: asyncio.AbstractEventLoop) -> None:
        self.k = k
        self.url = url
        self.loop = loop

    def api_client(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = self.url
        return client.ApiClient(cfg)

    def object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(f"v1/{plural}"), namespace, name)
        if key not in self.k.objects or self.k.objects[key].deleted:
            return None
        return dict(self.k.objects[key].raw)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        """The Pods the double holds now (not deleted) that match a label selector."""
        return [
            dict(obj.raw)
            for (resource, ns, _), obj in list(self.k.objects.items())
            if resource.plural == "pods"
            and ns == namespace
            and not obj.deleted
            and selector_matches(selector, obj.raw.get("metadata", {}).get("labels") or {})
        ]

    def requests(self, method: str, path: str) -> list[Any]:
        return [r for r in list(self.k[:]) if r.method.value == method and r.url.path == path]


@contextmanager
def api_server_double(on_change: PodHook | None = None) -> Iterator[RunningDouble]:
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        async with ApiServerDouble(on_change=on_change) as k, kmock.Server(k) as server:
            holder["loop"] = asyncio.get_running_loop()
            holder["double"] = RunningDouble(k, str(server.url).rstrip("/"), holder["loop"])
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
