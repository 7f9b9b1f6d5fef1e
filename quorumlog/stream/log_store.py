"""Typed operations on stream metadata over a `MetadataStore` (the layout is in `stream.metadata`).

This module only reads and writes keys; the rules about *who* may write (writer epochs, fencing) are kept
by the writer, which passes the version it last saw to every CAS here. Store errors are translated into the
stream vocabulary: a missing log is `LogNotFoundError`, a taken name `LogExistsError`; a lost CAS stays a
`MetadataVersionError` for the caller to interpret (for a writer it means "fenced").
"""

from __future__ import annotations

import json

from quorumlog.errors import (
    LogExistsError,
    LogNotFoundError,
    MetadataExistsError,
    MetadataNotFoundError,
)
from quorumlog.meta.store import ANY_VERSION, MetadataStore, Versioned
from quorumlog.stream.metadata import LogMetadata, LogSettings, SegmentInfo, StreamLayout, check_name
from quorumlog.stream.position import Position


class LogStore:
    def __init__(self, store: MetadataStore, layout: StreamLayout | None = None) -> None:
        self.store = store
        self.layout = layout or StreamLayout()

    # --- namespaces ---------------------------------------------------------------------------------------

    async def namespace_settings(self, ns: str) -> LogSettings:
        """The namespace's defaults for new logs (built-in defaults if it was never configured)."""
        try:
            got = await self.store.get(self.layout.namespace(ns))
        except MetadataNotFoundError:
            return LogSettings()
        return LogSettings.from_json(json.loads(got.value)) if got.value else LogSettings()

    async def set_namespace_settings(self, ns: str, settings: LogSettings) -> None:
        path = self.layout.namespace(ns)
        data = json.dumps(settings.to_json(), sort_keys=True).encode()
        try:
            await self.store.set(path, data, version=ANY_VERSION)
        except MetadataNotFoundError:
            await self.store.create(path, data, make_parents=True)

    async def _ensure_namespace(self, ns: str) -> None:
        try:
            await self.store.create(self.layout.namespace(ns), b"", make_parents=True)
        except MetadataExistsError:
            pass

    # --- logs ---------------------------------------------------------------------------------------------

    async def create_log(self, ns: str, md: LogMetadata) -> Versioned[LogMetadata]:
        check_name("log", md.name)
        await self._ensure_namespace(ns)
        path = self.layout.log(ns, md.name)
        try:
            created = await self.store.create_versioned(path, md.encode())
        except MetadataExistsError:
            raise LogExistsError(f"log {ns}/{md.name} already exists") from None
        for child in (self.layout.segments(ns, md.name), self.layout.subscriptions(ns, md.name)):
            try:
                await self.store.create(child, b"")
            except MetadataExistsError:
                pass
        return Versioned(md, created.version)

    async def read_log(self, ns: str, name: str) -> Versioned[LogMetadata]:
        try:
            got = await self.store.get(self.layout.log(ns, name))
        except MetadataNotFoundError:
            raise LogNotFoundError(f"no log {name!r} in namespace {ns!r}") from None
        return Versioned(LogMetadata.decode(got.value), got.version)

    async def write_log(self, ns: str, md: LogMetadata, *, version: int) -> Versioned[LogMetadata]:
        """CAS the log node. `MetadataVersionError` if it changed since `version`."""
        try:
            new_version = await self.store.set(self.layout.log(ns, md.name), md.encode(), version=version)
        except MetadataNotFoundError:
            raise LogNotFoundError(f"log {ns}/{md.name} was deleted") from None
        return Versioned(md, new_version)

    async def list_logs(self, ns: str) -> list[str]:
        try:
            return await self.store.children(self.layout.namespace(ns))
        except MetadataNotFoundError:
            return []

    async def delete_log_keys(self, ns: str, name: str) -> None:
        """Remove every key of a log (segments and subscriptions first). Ledgers are the caller's business."""
        for parent in (self.layout.segments(ns, name), self.layout.subscriptions(ns, name)):
            try:
                for child in await self.store.children(parent):
                    await _delete_quietly(self.store, f"{parent}/{child}")
            except MetadataNotFoundError:
                pass
            await _delete_quietly(self.store, parent)
        try:
            await self.store.delete(self.layout.log(ns, name))
        except MetadataNotFoundError:
            raise LogNotFoundError(f"no log {name!r} in namespace {ns!r}") from None

    # --- segments -----------------------------------------------------------------------------------------

    async def segments(self, ns: str, name: str) -> list[Versioned[SegmentInfo]]:
        """Every segment key of the log, in sequence order."""
        parent = self.layout.segments(ns, name)
        try:
            names = await self.store.children(parent)
        except MetadataNotFoundError:
            raise LogNotFoundError(f"no log {name!r} in namespace {ns!r}") from None
        out = []
        for child in sorted(names):
            try:
                got = await self.store.get(f"{parent}/{child}")
            except MetadataNotFoundError:
                continue  # deleted by retention between the listing and the read
            out.append(Versioned(SegmentInfo.decode(got.value), got.version))
        return out

    async def read_segment(self, ns: str, name: str, seq: int) -> Versioned[SegmentInfo] | None:
        try:
            got = await self.store.get(self.layout.segment(ns, name, seq))
        except MetadataNotFoundError:
            return None
        return Versioned(SegmentInfo.decode(got.value), got.version)

    async def create_segment(self, ns: str, name: str, info: SegmentInfo) -> Versioned[SegmentInfo]:
        created = await self.store.create_versioned(self.layout.segment(ns, name, info.seq), info.encode())
        return Versioned(info, created.version)

    async def write_segment(
        self, ns: str, name: str, info: SegmentInfo, *, version: int
    ) -> Versioned[SegmentInfo]:
        new_version = await self.store.set(
            self.layout.segment(ns, name, info.seq), info.encode(), version=version
        )
        return Versioned(info, new_version)

    async def delete_segment(self, ns: str, name: str, seq: int, *, version: int = ANY_VERSION) -> None:
        await self.store.delete(self.layout.segment(ns, name, seq), version=version)

    # --- subscriptions ------------------------------------------------------------------------------------

    async def commit_subscription(self, ns: str, name: str, sub: str, position: Position) -> None:
        path = self.layout.subscription(ns, name, sub)
        data = str(position).encode()
        try:
            await self.store.set(path, data, version=ANY_VERSION)
        except MetadataNotFoundError:
            # The log is gone (LogNotFoundError), or lacks its subscriptions key (a crash in create_log
            # between the log node and its children): make that key, never the log node itself.
            await self.read_log(ns, name)
            gone = LogNotFoundError(f"log {ns}/{name} was deleted")
            try:
                await self.store.create(self.layout.subscriptions(ns, name), b"")
            except MetadataExistsError:
                pass
            except MetadataNotFoundError:
                raise gone from None
            try:
                await self.store.create(path, data)
            except MetadataExistsError:
                await self.store.set(path, data, version=ANY_VERSION)
            except MetadataNotFoundError:
                raise gone from None

    async def subscription_position(self, ns: str, name: str, sub: str) -> Position | None:
        try:
            got = await self.store.get(self.layout.subscription(ns, name, sub))
        except MetadataNotFoundError:
            await self.read_log(ns, name)  # LogNotFoundError: "nothing committed" is for a log that exists
            return None
        return Position.parse(got.value.decode())


async def _delete_quietly(store: MetadataStore, path: str) -> None:
    try:
        await store.delete(path)
    except MetadataNotFoundError:
        pass
