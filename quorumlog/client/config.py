"""The client's settings, defined once: `ClientConfig`'s fields are the keyword arguments of `Client.connect`
(API.md), and `CLIENT_TABLE` -- the flags, `QUORUMLOG_*` variables, TOML keys and docs/CONFIG.md rows -- is
made from them (`quorumlog.config.table_of`).

A module of its own, importing only pure modules, so that the shell and the other commands can build their
flags from the table without loading the client's I/O (connections, codec, metadata drivers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quorumlog.client.add_tracker import OUTSTANDING_ADDS_MAX_DEFAULT, EnsembleChangeMode
from quorumlog.client.placement import PlacementPolicy, placement_by_name
from quorumlog.config import check_value, setting, table_of
from quorumlog.errors import InvalidArgumentError
from quorumlog.proto.frame import DEFAULT_MAX_FRAME_BYTES

if TYPE_CHECKING:
    from quorumlog.proto.messages import ProtocolVersion

__all__ = ["CLIENT_TABLE", "MAX_FRAME_BYTES_MAX", "MAX_FRAME_BYTES_MIN", "ClientConfig"]

# The bookie's own bounds for its max_frame_bytes setting.
MAX_FRAME_BYTES_MIN = 1024
MAX_FRAME_BYTES_MAX = 1 << 30


@dataclass(frozen=True)
class ClientConfig:
    """Client settings: the one definition of the keyword arguments of `Client.connect` (API.md), of the
    `[client]` table, its `QUORUMLOG_*` variables and shell flags, and of docs/CONFIG.md (all derived from
    these fields). Every value is checked against its range here, whichever way it came
    (`InvalidArgumentError`, as `ConfigError`, naming the key and the range). 0 turns an interval or timeout
    off."""

    explicit_lac_interval_s: float = setting(
        0.1, "send the LAC to bookies this often while idle, so readers see the last entry", 0, 3600
    )
    add_timeout_s: float = setting(
        5.0, "a bookie silent this long on an add counts as failed (ensemble change)", 0, 3600
    )
    add_quorum_timeout_s: float = setting(
        0.0, "an entry without an ack quorum this long fails the writer (AddQuorumTimeoutError)", 0, 3600
    )
    read_timeout_s: float = setting(5.0, "timeout of each read, LAC read and recovery read", 0, 3600)
    speculative_read_timeout_s: float = setting(
        0.5, "ask the next replica after this long without an answer (the first answer wins)", 0, 3600
    )
    # setting() is a dataclasses.field (its value is immutable), which ruff cannot see.
    ensemble_change: EnsembleChangeMode = setting(  # noqa: RUF009
        "immediate", "what a writer does when a bookie fails", choices=("immediate", "delayed", "disabled")
    )
    max_ensemble_changes: int = setting(
        50, "ensemble changes one write handle may make before it fails", 0, 1_000_000
    )
    placement: str | PlacementPolicy = setting(  # noqa: RUF009
        "random",
        "how bookies are chosen for ensembles (rack/zone read the bookies' labels); Client.connect also "
        "takes a PlacementPolicy object",
        choices=("random", "rack", "zone"),
    )
    outstanding_adds_max: int = setting(
        OUTSTANDING_ADDS_MAX_DEFAULT,
        "pending adds per write handle; append raises TooManyRequestsError beyond",
        1,
        10_000_000,
    )
    protocol: str = setting("v3", "bookie wire protocol", choices=("v3", "v2"))
    max_frame_bytes: int = setting(
        DEFAULT_MAX_FRAME_BYTES,
        "largest frame sent or accepted (BookKeeper's nettyMaxFrameSizeBytes); append refuses an entry whose "
        "ADD frame is larger (InvalidArgumentError); keep it at or below the bookies' max_frame_bytes",
        MAX_FRAME_BYTES_MIN,
        MAX_FRAME_BYTES_MAX,
    )
    auth_plugin: str = setting(
        "",
        "authentication plugin run on every bookie connection (docs/SECURITY.md)",
        choices=("", "quorumlog-token"),
    )
    auth_token_file: str = setting("", "quorumlog-token: file holding this client's one 'name token' line")
    tls_enabled: bool = setting(
        False, "send START_TLS on every new bookie connection and talk TLS (docs/SECURITY.md)"
    )
    tls_certificate_path: str = setting(
        "",
        "PEM certificate chain presented to bookies for mutual TLS (with tls_key_path; re-read on change)",
    )
    tls_key_path: str = setting("", "PEM private key of tls_certificate_path (unencrypted)")
    tls_trust_store_path: str = setting(
        "", "PEM CA certificates that bookie certificates must chain to (empty: the system's CAs)"
    )
    tls_hostname_verification: bool = setting(
        False, "also require the bookie certificate to name the address connected to (off, as in BookKeeper)"
    )

    def __post_init__(self) -> None:
        for s in CLIENT_TABLE.settings:
            value = getattr(self, s.name)
            if s.name == "placement" and not isinstance(value, str):
                if not callable(
                    getattr(value, "new_ensemble", None)
                ):  # the protocol is not runtime-checkable
                    raise InvalidArgumentError(
                        f"placement={value!r}: must be 'random', 'rack', 'zone' or a PlacementPolicy"
                    )
                continue
            check_value(s, value, "from Client.connect")
        if not self.tls_enabled and (
            self.tls_certificate_path or self.tls_key_path or self.tls_trust_store_path
        ):
            raise InvalidArgumentError(
                "tls_certificate_path, tls_key_path, tls_trust_store_path need tls_enabled=True"
            )

    @property
    def protocol_version(self) -> ProtocolVersion:
        from quorumlog.proto.messages import (
            ProtocolVersion,  # the codec: loaded by the client, not by settings
        )

        return ProtocolVersion.V2 if self.protocol == "v2" else ProtocolVersion.V3

    @property
    def placement_policy(self) -> PlacementPolicy:
        return placement_by_name(self.placement) if isinstance(self.placement, str) else self.placement


CLIENT_TABLE = table_of(
    ClientConfig,
    "client",
    "Client",
    "Keyword arguments of `Client.connect(uri, ...)` (API.md), defined once by `ClientConfig`. The shell "
    "reads them from flags, `QUORUMLOG_*` variables or the `[client]` table of its `--config` file; "
    "applications can do the same with "
    '`Client.connect(uri, **quorumlog.config.client_options("app.toml"))`. 0 turns an interval or timeout off.',
)
