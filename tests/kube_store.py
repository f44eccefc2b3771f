"""What etcd and the watch cache are to kube-apiserver, for the emulator (tests/kube_emulation.py).

The objects with their history (``kmock.ObjectsArray``, so tests may read them as kmock
documents), one resourceVersion counter for every kind (as etcd's), and the event queues of
the watches open on each resource. Nothing here awaits: on the event loop, each write (from
reading the stored object to announcing the new one) and each watch's snapshot with the
opening of its queue happen at once, so a watch starts exactly where its snapshot ends.
"""

from __future__ import annotations

import asyncio
import collections
import copy
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import kmock

Key = tuple[kmock.resource, str | None, str]
"""(resource, namespace or None for a cluster-scoped object, name)."""
Visible = Callable[[Mapping[str, Any]], bool]


class ObjectStore:
    def __init__(self) -> None:
        self.objects = kmock.ObjectsArray()
        self.revision = 0
        """The last resourceVersion handed out."""
        self.watches: dict[kmock.resource, set[asyncio.Queue[dict[str, Any]]]] = collections.defaultdict(set)

    def next_version(self) -> str:
        self.revision += 1
        return str(self.revision)

    def get(self, key: Key) -> dict[str, Any] | None:
        """A copy of the stored object, or None if absent or deleted."""
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def has(self, resource: kmock.resource) -> bool:
        """Whether any object of ``resource`` was ever stored."""
        return any(stored == resource for stored, _, _ in self.objects)

    def put(self, key: Key, obj: dict[str, Any]) -> None:
        """Store ``obj`` whole (a new version of the object) and announce it: ADDED or MODIFIED."""
        existed = self.get(key) is not None
        if key in self.objects:
            self.objects[key].history.append(copy.deepcopy(obj))
        else:
            self.objects[key] = copy.deepcopy(obj)
        self.announce(key[0], {"type": "MODIFIED" if existed else "ADDED", "object": copy.deepcopy(obj)})

    def remove(self, key: Key) -> dict[str, Any]:
        """Delete the object (its history stays) and announce it; its last state is returned."""
        last = self.get(key)
        assert last is not None, f"nothing stored at {key}"
        self.objects[key].delete()
        self.announce(key[0], {"type": "DELETED", "object": copy.deepcopy(last)})
        return last

    def announce(self, resource: kmock.resource, event: dict[str, Any]) -> None:
        for queue in self.watches[resource]:
            queue.put_nowait(event)

    def current(self, resource: kmock.resource, visible: Visible) -> list[dict[str, Any]]:
        """Copies of the live objects of ``resource`` that ``visible`` lets through, by namespace and name."""
        found = [
            copy.deepcopy(obj.raw) for (stored, _, _), obj in self.objects.items()
            if stored == resource and not obj.deleted and visible(obj.raw)
        ]  # fmt: skip
        return sorted(found, key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"].get("name") or ""))

    async def watch(self, resource: kmock.resource, visible: Visible) -> AsyncIterator[dict[str, Any]]:
        """Watch events as kube-apiserver's watch cache sends them to a filtered watch: every
        current object ADDED, then the changes; an object that stops being visible is DELETED
        from this watcher's view, one that starts being visible is ADDED."""
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.watches[resource].add(events)
        initial = self.current(resource, visible)
        try:
            seen: set[tuple[Any, Any]] = set()
            for obj in initial:
                seen.add((obj["metadata"].get("namespace"), obj["metadata"].get("name")))
                yield {"type": "ADDED", "object": obj}
            while True:
                event = await events.get()
                obj = event.get("object") or {}
                meta = obj.get("metadata") or {}
                key = (meta.get("namespace"), meta.get("name"))
                was, matches = key in seen, visible(obj)
                if event.get("type") == "DELETED" or not matches:
                    if was:
                        seen.discard(key)
                        yield {"type": "DELETED", "object": obj}
                    continue
                seen.add(key)
                yield event if was else {"type": "ADDED", "object": obj}
        finally:
            self.watches[resource].discard(events)
