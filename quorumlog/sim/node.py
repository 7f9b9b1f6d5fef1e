"""A simulated bookie node: the production `Bookie` and `BookieServer` on a node's `SimEnv`.

What is real: everything that decides what is durable and what is answered -- the journal (group commit,
checksummed batches, replay, rolling, recycling), the write cache, entry logs, the location index and
ledger state (over the simulator's key-value store, quorumlog/kv.py), checkpoints, the ledger book
(master keys, fencing, recovery adds, LAC), long polls, and the server's connection handling and codec.
What the simulator supplies through the Env: the clock (virtual), the disk (`SimDisk`: a crash keeps only
synced bytes, plus a possibly torn prefix of the rest, and only committed index transactions), the network,
and the journal's sync worker (a task instead of a thread: one event loop runs every node).
Not run here: the bookie service's cookie check, disk checker and garbage collector (the workload never
deletes ledgers), which are tested on real processes.

The sizes are small so that a short simulation rolls journal files, recycles them, fills write caches and
checkpoints many times.
"""

from __future__ import annotations

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.server import BookieServer
from quorumlog.meta.registration import BookieRegistration, BookieServiceInfo
from quorumlog.meta.store import MetadataStore
from quorumlog.sim.world import SimEnv

JOURNAL_MAX_BATCH_BYTES = 32 << 10
JOURNAL_FILE_BYTES = 1 << 20  # the smallest allowed: a few thousand small entries per file


# A bookie's journal wait is drawn per start: the default (0, sync at once) leaves a durability bug that
# acknowledges before the sync a window of one simulated sync, a wait leaves it milliseconds; both are run.
JOURNAL_MAX_WAIT_MS_CHOICES = (0.0, 1.0, 2.0)


def sim_bookie_config(node: str, port: int, journal_max_wait_ms: float = 0.0) -> BookieConfig:
    return BookieConfig(
        host=node,
        port=port,
        data_dir=f"/{node}",
        journal_max_batch_bytes=JOURNAL_MAX_BATCH_BYTES,
        journal_max_wait_ms=journal_max_wait_ms,
        journal_file_size_bytes=JOURNAL_FILE_BYTES,
        write_cache_bytes=1 << 20,
        read_cache_bytes=256 << 10,
        read_ahead_bytes=4 << 10,
        entry_log_size_bytes=1 << 20,
        checkpoint_interval_s=1.0,
    )


class SimBookieNode:
    """One bookie process on a simulated node: start it on the node's disk (replaying what survived), serve,
    register. A crash is the World's (`World.crash(node)`): tasks cancelled, unsynced data gone; a restart is
    a new `SimBookieNode` on the same disk."""

    def __init__(self, env: SimEnv, bookie_id: str, port: int, store: MetadataStore) -> None:
        self.env = env
        self.bookie_id = bookie_id
        self.host = env.node
        self.port = port
        self.store = store
        self.config = sim_bookie_config(env.node, port, env.rng.choice(JOURNAL_MAX_WAIT_MS_CHOICES))
        self.bookie: Bookie | None = None
        self.server: BookieServer | None = None
        self.registration: BookieRegistration | None = None

    async def start(self) -> None:
        self.bookie = Bookie(self.config, self.env)
        await self.bookie.start()
        self.server = BookieServer(self.bookie, self.env, self.host, self.port)
        await self.server.start()
        self.registration = BookieRegistration(
            self.store, self.bookie_id, BookieServiceInfo.for_rpc(self.host, self.port)
        )
        await self.registration.register()
