"""Settings for every quorumlog component: one table per component of names, types, defaults, help texts and
allowed ranges, read from a TOML file, `QUORUMLOG_<NAME>` environment variables and `--kebab-case` flags.

What it owns:
- `Setting` (one row) and `SettingsTable` (one component: `bookie`, `client`, `shell`, `standalone`, ...).
- Loading with one precedence everywhere: a flag beats an environment variable, which beats the TOML file,
  which beats the default.
- The error messages: every bad value raises `ConfigError` naming the key, the value, where it came from
  and what is allowed (`port=70000 is out of range: allowed 0 .. 65535 (from --port)`).
- `all_tables()`: what `scripts/gen_config_docs.py` turns into docs/CONFIG.md, so the documentation is
  generated from these tables and cannot drift from them.

One definition per component: a component with a config dataclass declares each field with `setting(...)`
(default, help, range, choices) and its table is `table_of(ThatClass)`, so the dataclass, the table, the docs,
the flags and the environment variables cannot disagree. The bookie's lives with the bookie
(`quorumlog.bookie.config.BookieConfig`), auto-recovery's with auto-recovery
(`quorumlog.replication.config.AutoRecoveryConfig`), the client's with the client
(`quorumlog.client.config.ClientConfig`, whose fields are the keyword arguments of `Client.connect`;
`client_options` loads them for an application). The shell, standalone and logging tables, which have no
dataclass of their own, live here.

A TOML file may hold one component's keys at top level, or several components as tables (`[bookie]`,
`[client]`, `[shell]`, `[standalone]`, `[autorecovery]`); each component reads its own table.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quorumlog.errors import ConfigError

__all__ = [
    "CLIENT",
    "LOGGING",
    "SHELL",
    "STANDALONE",
    "Setting",
    "SettingsTable",
    "all_tables",
    "check_fields",
    "check_value",
    "client_connect_options",
    "client_options",
    "parse_text",
    "read_toml",
    "setting",
    "table_of",
]

ENV_PREFIX = "QUORUMLOG_"


@dataclass(frozen=True)
class Setting:
    """One setting. `kind` is int, float, bool, str or list (of str); `low`/`high` bound numbers (inclusive);
    `choices` lists the allowed values of a str setting."""

    name: str
    kind: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def allowed(self) -> str:
        """What values are allowed, in words (for error messages and docs)."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.low is not None and self.high is not None:
            return f"{_num(self.low)} .. {_num(self.high)}"
        if self.kind is bool:
            return "true or false"
        if self.kind is list:
            return "a list of paths (comma-separated in flags and env vars)"
        return f"any {self.kind.__name__}"


def _num(x: float) -> str:
    # 65536 rather than 6.5536e+04; large round powers of two stay readable too.
    if float(x).is_integer():
        return str(int(x))
    return f"{x:g}"


def check_value(s: Setting, value: Any, source: str) -> Any:
    """`value` if it is valid for `s` (ints widen to float for float settings), else `ConfigError`."""
    if s.kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{s.name}: expected a list of paths, got {value!r} ({source})")
        return value
    if s.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, s.kind) and not (s.kind is int and isinstance(value, bool))
    if not ok:
        raise ConfigError(f"{s.name}: expected {s.kind.__name__}, got {value!r} ({source})")
    if s.kind is float and math.isnan(value):
        raise ConfigError(f"{s.name}: NaN is not a value; allowed {s.allowed()} ({source})")
    if s.low is not None and s.high is not None and not (s.low <= value <= s.high):
        raise ConfigError(f"{s.name}={value!r} is out of range: allowed {s.allowed()} ({source})")
    if s.choices and value not in s.choices:
        raise ConfigError(f"{s.name}={value!r} is not allowed: {s.allowed()} ({source})")
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_text(s: Setting, text: str, source: str) -> Any:
    """A setting's value from text (an env var or a flag); not yet range-checked."""
    t = text.strip()
    try:
        if s.kind is bool:
            if t.lower() in _TRUE:
                return True
            if t.lower() in _FALSE:
                return False
            raise ValueError
        if s.kind is int:
            return int(t.replace("_", ""), 0)
        if s.kind is float:
            return float(t)
        if s.kind is list:
            return [p for p in t.split(",") if p]
    except ValueError:
        raise ConfigError(
            f"{s.name}: cannot parse {text!r} as {s.kind.__name__}; allowed {s.allowed()} ({source})"
        ) from None
    return t


# --- settings declared on a dataclass ----------------------------------------------------------------------------

_SPEC = "quorumlog.setting"


@dataclass(frozen=True)
class _Spec:
    help: str
    low: float | None
    high: float | None
    choices: tuple[str, ...]
    kind: type | None


def setting(
    default: Any,
    help: str,
    low: float | None = None,
    high: float | None = None,
    *,
    choices: tuple[str, ...] = (),
    kind: type | None = None,
) -> Any:
    """A dataclass field that is also a setting: `port: int = setting(3181, "port to listen on", 0, 65535)`.

    The kind is the default's type unless given (write float defaults as floats: `0.0`, not `0`). A list
    default becomes a default factory, so instances never share it. Returns `Any` so the annotation stays
    the field's type for type checkers."""
    meta = {_SPEC: _Spec(help, low, high, tuple(choices), kind)}
    if isinstance(default, list):
        frozen = tuple(default)
        return dataclasses.field(default_factory=lambda: list(frozen), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def settings_of(cls: type) -> tuple[Setting, ...]:
    """The `Setting` rows of a dataclass's `setting(...)` fields, in field order."""
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_SPEC)
        if spec is None:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: a setting needs a default")
        kind = spec.kind or type(default)
        out.append(Setting(f.name, kind, default, spec.help, spec.low, spec.high, spec.choices))
    return tuple(out)


def check_fields(obj: Any, table: SettingsTable, source: str) -> None:
    """`ConfigError` (an `InvalidArgumentError`) naming the first field of `obj` outside its table's range."""
    for s in table.settings:
        check_value(s, getattr(obj, s.name), source)


def check_listen_address(name: str, value: str) -> None:
    """`ConfigError` unless `value` names an address to listen on. An empty string binds every interface (and
    made a bookie's id `:port`): a server that listens beyond loopback must say so, as `0.0.0.0` or `::`."""
    if not value or value != value.strip() or any(c.isspace() for c in value):
        raise ConfigError(
            f"{name}={value!r}: not an address to listen on (use 0.0.0.0 or :: to listen on every interface)"
        )


def read_toml(path: str) -> dict[str, Any]:
    """A TOML file's contents; unreadable or malformed files raise `ConfigError` naming the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # (TOML is UTF-8: other bytes are an error)
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


SECTION_NAMES = ("bookie", "client", "shell", "standalone", "autorecovery", "logging")


@dataclass(frozen=True)
class SettingsTable:
    """One component's settings; `section` is its TOML table name."""

    section: str
    title: str
    doc: str
    settings: tuple[Setting, ...]

    def __post_init__(self) -> None:
        names = [s.name for s in self.settings]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.section}: duplicate setting names")
        for s in self.settings:
            check_value(s, s.default, "default")

    def get(self, name: str) -> Setting:
        for s in self.settings:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.settings)

    def defaults(self) -> dict[str, Any]:
        # Lists are copied: a loaded config must never share (and mutate) the table's default list.
        return {s.name: list(s.default) if isinstance(s.default, list) else s.default for s in self.settings}

    def section_of(self, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """This component's keys in a parsed TOML file (its own table, else the top level)."""
        own = data.get(self.section)
        if isinstance(own, dict):
            return own
        return {k: v for k, v in data.items() if not (k in SECTION_NAMES and isinstance(v, dict))}

    def load(
        self,
        path: str | None = None,
        *,
        overrides: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        data: Mapping[str, Any] | None = None,
        base: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Every setting's value: defaults < `base` (e.g. values remembered from an earlier run) < TOML file
        (`path`, or already parsed `data`) < environment < `overrides` (typed values from flags; None means
        "not given")."""
        by_name = {s.name: s for s in self.settings}
        values = self.defaults()
        for key, value in (base or {}).items():
            if key in by_name:
                values[key] = check_value(by_name[key], value, "remembered value")
        if path is not None and data is None:
            data = read_toml(path)
        if data is not None:
            where = f"from {path}" if path else "from the config file"
            for key, value in self.section_of(data).items():
                s = by_name.get(key)
                if s is None:
                    raise ConfigError(
                        f"{key}: unknown {self.section} setting ({where}); known: {', '.join(sorted(by_name))}"
                    )
                if s.kind is list and isinstance(value, str):
                    value = [value]
                values[key] = check_value(s, value, where)
        env = os.environ if environ is None else environ
        for s in self.settings:
            if s.env_var in env:
                where = f"from ${s.env_var}"
                values[s.name] = check_value(s, parse_text(s, env[s.env_var], where), where)
        for key, value in (overrides or {}).items():
            if value is None:
                continue
            s = by_name.get(key)
            if s is None:
                raise ConfigError(f"{key}: unknown {self.section} setting")
            values[key] = check_value(s, value, f"from {s.flag}")
        return values

    def parsers(self) -> dict[str, Callable[[str], Any]]:
        """Text parsers by setting name, for command-line flags."""

        def parser(s: Setting) -> Callable[[str], Any]:
            return lambda text: parse_text(s, text, f"from {s.flag}")

        return {s.name: parser(s) for s in self.settings}

    def parse_flags(self, flags: Mapping[str, str | None]) -> dict[str, Any]:
        """Typed overrides from raw flag texts (None: flag not given); `ConfigError` names a bad one."""
        out: dict[str, Any] = {}
        for name, text in flags.items():
            if text is not None:
                s = self.get(name)
                out[name] = parse_text(s, text, f"from {s.flag}")
        return out

    def click_options(self, *, skip: Iterable[str] = ()) -> Callable[[Any], Any]:
        """A decorator adding one `--kebab-case` option per setting (value None when not given)."""
        import click  # the CLI's dependency; the rest of this module does without it

        skipped = set(skip)

        def decorate(fn: Any) -> Any:
            for s in reversed(self.settings):
                if s.name in skipped:
                    continue
                fn = click.option(
                    s.flag,
                    s.name,
                    default=None,
                    metavar=s.kind.__name__.upper() if not s.choices else "|".join(s.choices),
                    help=f"{s.help} [env {s.env_var}; default {_show(s.default)}]",
                )(fn)
            return fn

        return decorate


def table_of(cls: type, section: str, title: str, doc: str) -> SettingsTable:
    """The settings table of a config dataclass declared with `setting(...)` fields."""
    return SettingsTable(section, title, doc, settings_of(cls))


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value) if value == "" else value
    return repr(value)


# --- the client ----------------------------------------------------------------------------------------------

if TYPE_CHECKING:
    CLIENT: SettingsTable  # `quorumlog.client.config.CLIENT_TABLE`, through __getattr__ below


def __getattr__(name: str) -> Any:
    # The client's table is made from `ClientConfig` in the client package, which imports this module:
    # resolved on first use so neither import needs the other to have finished.
    if name == "CLIENT":
        from quorumlog.client.config import CLIENT_TABLE

        return CLIENT_TABLE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def client_connect_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """`Client.connect` keyword arguments from loaded client settings (only the client table's keys)."""
    from quorumlog.client.config import CLIENT_TABLE

    return {name: values[name] for name in CLIENT_TABLE.names if name in values}


def client_options(
    path: str | None = None, *, environ: Mapping[str, str] | None = None, **overrides: Any
) -> dict[str, Any]:
    """`Client.connect` keyword arguments for an application, checked and with the shared precedence:
    `overrides` > `QUORUMLOG_*` variables > the file's `[client]` table > defaults.

        client = await Client.connect(uri, **client_options("app.toml"))
    """
    from quorumlog.client.config import CLIENT_TABLE

    return client_connect_options(CLIENT_TABLE.load(path, environ=environ, overrides=overrides))


# --- the shell ------------------------------------------------------------------------------------------------

SHELL = SettingsTable(
    "shell",
    "Shell",
    "`quorumlog shell` (flags go before the command: `quorumlog shell --metadata URI listbookies`). "
    "Client settings apply to the commands that read or write ledgers.",
    (
        Setting("metadata", str, "", "metadata store URI (zk://, etcd://, file://); required"),
        Setting(
            "connect_timeout_s",
            float,
            10.0,
            "give up on an unreachable metadata store after this long",
            0.1,
            600,
        ),
        Setting("op_timeout_s", float, 10.0, "longest one metadata operation may take", 0.1, 600),
        Setting("bookie_timeout_s", float, 5.0, "timeout of direct bookie requests (listbookies)", 0.1, 600),
    ),
)


# --- the standalone cluster -------------------------------------------------------------------------------------

STANDALONE = SettingsTable(
    "standalone",
    "Standalone cluster",
    "`quorumlog standalone`: a metadata store, N bookies and auto-recovery on one machine, restarted when "
    'they die (docs/OPERATIONS.md, "Standalone"). The bookies are `quorumlog bookie` processes with their '
    "default settings. `QUORUMLOG_METADATA` is not read: a standalone uses its own data dir's store unless "
    "`--metadata` (or the file's `metadata`) names another.",
    (
        Setting(
            "bookies",
            int,
            3,
            "number of bookies (more than last time adds bookies; fewer decommissions the extra ones first)",
            1,
            64,
        ),
        Setting("data_dir", str, "./data", "directory for metadata and every bookie's data"),
        Setting(
            "metadata",
            str,
            "",
            "metadata store URI; empty: the embedded store, file://<data_dir>/metadata",
        ),
        Setting("port_base", int, 3181, "first bookie port; bookie i listens on port_base + i", 1, 65535),
        Setting(
            "http_port",
            int,
            0,
            "first admin HTTP API port: bookie i serves BookKeeper's admin API and /metrics on "
            "http_port + i (0 = off)",
            0,
            65535,
        ),
        Setting(
            "dashboard_port",
            int,
            0,
            "serve the web dashboard (quorumlog.admin.dashboard) on 127.0.0.1 at this port (0 = off)",
            0,
            65535,
        ),
        Setting("autorecovery", bool, True, "run an auto-recovery process (auditor + replication worker)"),
        Setting(
            "lost_bookie_recovery_delay_s",
            int,
            60,
            "auto-recovery marks a lost bookie's ledgers this long after it vanished (a bookie restarted "
            "sooner is never re-replicated); kept in metadata once the cluster has it",
            0,
            2**31 - 1,
        ),
        Setting(
            "restart_backoff_s_max",
            float,
            30.0,
            "longest wait between restarts of a bookie that keeps failing (the wait doubles from 0.5 s)",
            0.5,
            3600,
        ),
    ),
)


# --- logging of the long-running commands ------------------------------------------------------------------------

LOGGING = SettingsTable(
    "logging",
    "Logging",
    "Log output of `quorumlog bookie`, `autorecovery` and `standalone` (with `--log-level`); the `[logging]` "
    "table of their `--config` file. A standalone writes each child's log into its directory "
    "(`<data_dir>/bookie-<i>/bookie.log`, `<data_dir>/autorecovery/autorecovery.log`) with these settings.",
    (
        Setting("log_file", str, "", "write log records to this file, rotated by size; empty: stderr"),
        Setting(
            "log_format",
            str,
            "text",
            "text lines, or JSON lines (one object per record: ts, level, logger, msg, exc)",
            choices=("text", "json"),
        ),
        Setting(
            "log_max_bytes",
            int,
            10 << 20,
            "rotate the log file when it would grow past this size (0 = never rotate)",
            0,
            1 << 40,
        ),
        Setting("log_backup_count", int, 5, "rotated files kept (<file>.1 is the newest)", 0, 1000),
    ),
)


def all_tables() -> list[SettingsTable]:
    """Every component's table, in the order docs/CONFIG.md lists them."""
    from quorumlog.bookie.config import TABLE as BOOKIE  # each area owns its table
    from quorumlog.client.config import CLIENT_TABLE as CLIENT
    from quorumlog.replication.config import AUTORECOVERY

    return [BOOKIE, CLIENT, SHELL, STANDALONE, AUTORECOVERY, LOGGING]
