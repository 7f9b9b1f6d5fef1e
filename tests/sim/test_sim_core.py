"""The simulator's own promises: virtual time, determinism by seed, TCP-like delivery, crash-only-durable disk."""

from __future__ import annotations

import asyncio
import errno

import pytest

from quorumlog.sim import SimDeadlock, World, run_simulation


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.lost: list[BaseException | None] = []
        self.closed = asyncio.Event()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost.append(exc)
        self.closed.set()


class Echo(Recorder):
    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)


def test_virtual_time_jumps_to_the_next_timer() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(3600)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(2):
                await asyncio.sleep(10)
        return loop.time() - start

    assert run_simulation(main()) == pytest.approx(3602)


def test_waiting_on_nothing_is_a_deadlock_not_a_hang() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(SimDeadlock):
        run_simulation(main())


def _echo_trace(seed: int) -> list[tuple[float, bytes]]:
    async def main() -> list[tuple[float, bytes]]:
        world = World(seed)
        server_env, client_env = world.env("bookie"), world.env("client")
        await server_env.net.create_server(Echo, "bookie", 3181)
        clients = []
        for _ in range(3):
            _, proto = await client_env.net.create_connection(Recorder, "bookie", 3181)
            clients.append(proto)
        trace: list[tuple[float, bytes]] = []
        for i in range(50):
            c = clients[i % 3]
            assert c.transport is not None
            c.transport.write(b"%d," % i)
        await asyncio.sleep(1)
        loop = asyncio.get_running_loop()
        for c in clients:
            trace.append((loop.time(), bytes(c.data)))
        return trace

    return run_simulation(main())


def test_same_seed_same_run_and_bytes_arrive_in_order_per_connection() -> None:
    a, b = _echo_trace(7), _echo_trace(7)
    assert a == b
    for k, (_, data) in enumerate(a):
        assert data == b"".join(b"%d," % i for i in range(k, 50, 3))


def test_partition_resets_connections_and_refuses_new_ones_until_healed() -> None:
    async def main() -> None:
        world = World(1)
        await world.env("b").net.create_server(Echo, "b", 1)
        _, proto = await world.env("a").net.create_connection(Recorder, "b", 1)
        world.partition("a", "b")
        await proto.closed.wait()
        assert isinstance(proto.lost[0], ConnectionResetError)
        with pytest.raises(ConnectionRefusedError):
            await world.env("a").net.create_connection(Recorder, "b", 1)
        world.heal()
        _, again = await world.env("a").net.create_connection(Recorder, "b", 1)
        assert again.transport is not None
        again.transport.write(b"x")
        await asyncio.sleep(0.01)
        assert again.data == b"x"

    run_simulation(main())


def test_paused_node_delivers_after_resume() -> None:
    async def main() -> None:
        world = World(2)
        await world.env("b").net.create_server(Echo, "b", 1)
        _, proto = await world.env("a").net.create_connection(Recorder, "b", 1)
        world.pause("b")
        assert proto.transport is not None
        proto.transport.write(b"ping")
        await asyncio.sleep(5)
        assert proto.data == b""
        world.resume("b")
        await asyncio.sleep(0.01)
        assert proto.data == b"ping"

    run_simulation(main())


def test_crash_keeps_synced_data_and_loses_unsynced_names() -> None:
    world = World(3)
    disk = world.env("n").disk
    disk.makedirs("/d")
    f = disk.open("/d/journal", create=True)
    f.pwrite(b"durable", 0)
    f.fdatasync()
    disk.sync_dir("/d")
    f.pwrite(b"-maybe", 7)
    g = disk.open("/d/never-synced-name", create=True)
    g.pwrite(b"x", 0)
    g.fdatasync()  # data synced, but the directory entry never was
    disk.crash()
    with pytest.raises(OSError):
        f.pwrite(b"zombie", 0)
    disk.restart()
    data = disk.read_all("/d/journal")
    assert data.startswith(b"durable")
    assert b"-maybe".startswith(data[7:])  # a prefix of the unsynced write, possibly torn
    assert not disk.exists("/d/never-synced-name")


def test_crash_outcomes_vary_with_seed_but_never_lose_synced_bytes() -> None:
    outcomes = set()
    for seed in range(40):
        world = World(seed)
        disk = world.env("n").disk
        disk.makedirs("/d")
        f = disk.open("/d/f", create=True)
        f.pwrite(b"A" * 10, 0)
        f.fdatasync()
        disk.sync_dir("/d")
        f.pwrite(b"B" * 10, 10)
        f.pwrite(b"C" * 10, 20)
        disk.crash()
        disk.restart()
        data = disk.read_all("/d/f")
        assert data[:10] == b"A" * 10
        outcomes.add(len(data))
    assert len(outcomes) > 2


def test_full_disk_is_enospc() -> None:
    world = World(4, disk_capacity_bytes=100)
    disk = world.env("n").disk
    f = disk.open("/f", create=True)
    f.pwrite(b"x" * 100, 0)
    with pytest.raises(OSError) as info:
        f.pwrite(b"y", 100)
    assert info.value.errno == errno.ENOSPC
    assert disk.usage("/").free_bytes == 0
