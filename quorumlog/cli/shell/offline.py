"""Offline commands of `quorumlog shell` on a bookie's own directories (BookKeeper's readjournal, readlog,
localconsistencycheck, updatecookie): they read the files themselves, with no bookie running.

Rules kept here:
- The directories come from the bookie's own settings (`--bookie-config`, as `quorumlog bookie --config`,
  or `--data-dir`), so the shell looks where the bookie does.
- readjournal and readlog only read: files are opened read-only, nothing is truncated, sealed or replayed
  (copies of a bookie's files can be inspected anywhere). Damage is reported with the file and the offset,
  the records around it are still shown, and the command exits 1.
- localconsistencycheck and updatecookie take the bookie's directory locks (the `.lock` files a bookie
  holds while it runs), so they refuse to run beside a live bookie, and no bookie starts while they work.
- Output is bounded in memory: records are printed as they are read (`--json` streams one JSON array).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import click

from quorumlog.cli.common import (
    EXIT_FAILURE,
    CliError,
    config_errors,
    fail,
    print_json,
    run_async,
    usage,
)
from quorumlog.cli.shell.group import _ctx, json_option, shell

INCONSISTENT_LISTED_MAX = 1000
"""Inconsistent entries localconsistencycheck lists one by one (it counts them all)."""
SCAN_WINDOW_BYTES = 1 << 20
"""How much of an entry log is read at a time."""
_ENTRY_IDS = struct.Struct(">qqq")  # ledgerId, entryId, lastAddConfirmed: the start of every stored entry
_LOG_RECORD = struct.Struct(
    ">IIB"
)  # an entry log record's header (see bookie/entrylog.py): crc, length, type


def _dirs_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--data-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="The bookie's data_dir (its journal and ledger directories default under it).",
    )(fn)
    return click.option(
        "--bookie-config",
        type=click.Path(dir_okay=False, exists=True),
        default=None,
        help="The bookie's TOML settings file (as `quorumlog bookie --config`): where its directories are.",
    )(fn)


def _bookie_config(bookie_config: str | None, data_dir: str | None) -> Any:
    from quorumlog.bookie.config import load_config

    if bookie_config is None and data_dir is None:
        usage(
            "which bookie? no directories given",
            "pass the bookie's --bookie-config FILE (its TOML settings) or --data-dir DIR",
        )
    overrides = {"data_dir": data_dir} if data_dir is not None else {}
    return config_errors(lambda: load_config(bookie_config, overrides=overrides))


def _need_dir(path: str, what: str) -> None:
    if not os.path.isdir(path):
        fail(
            f"no {what} at {path}",
            "check --data-dir / --bookie-config: they must name the bookie's directories",
        )


@contextlib.contextmanager
def _bookie_stopped(directories: Iterable[str]) -> Iterator[None]:
    """Hold the locks a running bookie holds on its directories, or fail: the bookie must be stopped."""
    fds: list[int] = []
    try:
        for d in directories:
            path = os.path.join(d, ".lock")
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                fail(
                    f"{d} has no .lock file: no bookie has run on it",
                    "check --data-dir / --bookie-config: they must name the bookie's directories",
                )
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fail(
                    f"a bookie is running on {d} (it holds the directory's lock)",
                    "stop the bookie first: this command works on its files",
                )
        yield
    finally:
        for fd in fds:
            os.close(fd)  # releases the lock


def _open_read_only(path: str) -> Any:
    from quorumlog.env import OsFile

    try:
        return OsFile(path, os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
    except FileNotFoundError:
        fail(f"no such file: {path}")
    except IsADirectoryError:
        fail(f"{path} is a directory, not a file")
    except PermissionError:
        fail(f"cannot read {path}: permission denied")


def _pick_files(
    target: str | None, directory: str, name_of: Callable[[int], str], suffix: str, what: str
) -> list[str]:
    """`target` as a path, or as a file id (decimal, as BookKeeper's shell takes it) in `directory`; every
    such file of `directory`, oldest first, when no target is given."""
    if target is not None and (os.sep in target or os.path.exists(target)):
        return [target]
    _need_dir(directory, f"{what} directory")
    if target is not None and target.endswith(suffix):
        return [os.path.join(directory, target)]  # a file name, in the bookie's directory
    if target is not None:
        try:
            file_id = int(target, 10)
        except ValueError:
            usage(f"{target!r} is neither a {what} file nor a {what} id (a number)")
        if not 0 <= file_id < 2**64:
            usage(f"{what} id {file_id} is out of range")
        return [os.path.join(directory, name_of(file_id))]
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(suffix))


def _payload_fields(body: bytes, with_payload: bool) -> dict[str, Any]:
    """What a stored entry says about itself: ids, LAC, size, and with `with_payload` its payload.

    The digest type is not stored with the entry; CRC32C and CRC32 are recognised by checking them (they do
    not depend on the password). Anything else (MAC, DUMMY) is shown from the end of the 32-byte header."""
    from quorumlog.proto.entry import ENTRY_HEADER_BYTES, DigestManager, DigestType

    out: dict[str, Any] = {"size": len(body)}
    if len(body) >= _ENTRY_IDS.size:
        out["ledger_id"], out["entry_id"], out["lac"] = _ENTRY_IDS.unpack_from(body)
    if not with_payload:
        return out
    payload, digest = body[ENTRY_HEADER_BYTES:], "unknown (MAC or DUMMY: not checked)"
    for kind in (DigestType.CRC32C, DigestType.CRC32):
        with contextlib.suppress(Exception):
            payload = DigestManager(out.get("ledger_id", 0), kind, b"").decode_entry(body).payload
            digest = kind.name
            break
    out["digest"] = digest
    try:
        out["text"] = payload.decode("utf-8")
    except UnicodeDecodeError:
        out["hex"] = payload.hex()
    return out


class _Output:
    """Records printed as they come: a line each, or one streamed JSON array (memory stays flat)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.count = 0
        self.damage: list[dict[str, Any]] = []

    def __enter__(self) -> _Output:
        if self.as_json:
            click.echo("[")
        return self

    def row(self, item: dict[str, Any], line: str) -> None:
        if "damage" in item:
            self.damage.append(item)
        if self.as_json:
            click.echo(("," if self.count else "") + json.dumps(item))
        else:
            click.echo(line)
            if "text" in item or "hex" in item:
                click.echo(f"    payload ({item.get('digest')}): {item.get('text', item.get('hex'))}")
        self.count += 1

    def __exit__(self, *exc: object) -> None:
        if self.as_json:
            click.echo("]")

    def fail_on_damage(self, what: str, hint: str) -> None:
        if not self.damage:
            return
        first = self.damage[0]
        more = f" (and {len(self.damage) - 1} more places)" if len(self.damage) > 1 else ""
        raise CliError(
            f"{what} {first['file']} is damaged at offset {first['offset']}: {first['damage']}{more}",
            hint,
            EXIT_FAILURE,
        )


@shell.command("readjournal")
@click.argument("journal", required=False)
@click.option("-m", "--msg", "-msg", "with_payload", is_flag=True, help="Also print each entry's payload.")
@_dirs_options
@json_option
def readjournal(
    journal: str | None,
    with_payload: bool,
    bookie_config: str | None,
    data_dir: str | None,
    as_json: bool,
) -> None:
    """Print the records of journal files: type, ledger, entry, size (offline; changes nothing).

    JOURNAL is a journal file, or a journal id (the number in its name); without it, every journal file of
    the bookie, oldest first. Damaged bytes are reported with their offset, and the command exits 1.
    """
    from quorumlog.bookie.journal import JournalError, RecordType, ScannedDamage, scan_file
    from quorumlog.env import default_env

    if journal is not None and (os.sep in journal or os.path.exists(journal)):
        journal_dir = os.path.dirname(journal)
    else:
        journal_dir = _bookie_config(bookie_config, data_dir).journal_dir
    paths = _pick_files(journal, journal_dir, lambda i: f"{i:016x}.jnl", ".jnl", "journal")
    env = default_env()
    with _Output(as_json) as out:
        for path in paths:
            f = _open_read_only(path)
            try:
                for item in scan_file(env, f, path):
                    if isinstance(item, ScannedDamage):
                        resume = "the end of the file" if item.resume is None else f"offset {item.resume}"
                        out.row(
                            {
                                "file": path,
                                "offset": item.offset,
                                "damage": item.what,
                                "resume": item.resume,
                            },
                            f"{path} offset {item.offset}: DAMAGED ({item.what}) up to {resume}",
                        )
                        continue
                    row: dict[str, Any] = {"file": path, "offset": item.offset, "type": item.rtype.name}
                    if item.rtype == RecordType.ADD:
                        row.update(_payload_fields(item.payload, with_payload))
                        line = (
                            f"{path} offset {item.offset}: ADD ledger {row.get('ledger_id')} "
                            f"entry {row.get('entry_id')} size {row['size']}"
                        )
                    elif item.rtype == RecordType.ROLL:
                        line = f"{path} offset {item.offset}: ROLL (the journal continues in the next file)"
                    else:
                        if len(item.payload) >= 8:
                            row["ledger_id"] = struct.unpack_from(">q", item.payload)[0]
                        row["size"] = len(item.payload)
                        line = f"{path} offset {item.offset}: {item.rtype.name} ledger {row.get('ledger_id')}"
                    out.row(row, line)
            except JournalError as e:
                out.row({"file": path, "offset": 0, "damage": str(e), "resume": None}, f"{path}: {e}")
            finally:
                f.close()
    if not as_json and not paths:
        click.echo(f"no journal files in {journal_dir}", err=True)
    out.fail_on_damage(
        "journal file",
        "the records around the damage are listed; a bookie refuses to replay damage that valid records "
        "follow unless journal_skip_corrupt_records is set (then what the damage held is lost on it)",
    )


def _scan_entry_log(f: Any, size: int) -> Iterator[tuple[int, bytes | None, str | None]]:
    """(offset, entry, None) for each valid record of an entry log; (offset, None, why) where it is damaged.

    An entry log has no batches to resynchronise on (records follow each other), so the scan stops at the
    first damaged record; each entry the index points to past it is still checked by localconsistencycheck.
    """
    from quorumlog.bookie.entrylog import CorruptEntryError, parse_entries

    off = 0
    while off < size:
        head = f.pread(_LOG_RECORD.size, off)
        if len(head) < _LOG_RECORD.size:
            yield off, None, f"a record header cut short ({len(head)} of {_LOG_RECORD.size} bytes)"
            return
        _, length, _ = _LOG_RECORD.unpack(head)
        if off + _LOG_RECORD.size + length > size:
            yield off, None, f"a record of {length} bytes runs past the end of the file ({size} bytes)"
            return
        raw = f.pread(max(_LOG_RECORD.size + length, min(SCAN_WINDOW_BYTES, size - off)), off)
        try:
            entries = parse_entries(raw, 0, off)
        except CorruptEntryError:
            yield off, None, "the record fails its checksum"
            return
        for body in entries:
            yield off, body, None
            off += _LOG_RECORD.size + len(body)


@shell.command("readlog")
@click.argument("entrylog")
@click.option("-m", "--msg", "-msg", "with_payload", is_flag=True, help="Also print each entry's payload.")
@click.option("-l", "--ledger", "only_ledger", type=click.IntRange(0, 2**63 - 1), default=None)
@_dirs_options
@json_option
def readlog(
    entrylog: str,
    with_payload: bool,
    only_ledger: int | None,
    bookie_config: str | None,
    data_dir: str | None,
    as_json: bool,
) -> None:
    """Print the entries of an entry log file: offset, ledger, entry, size (offline; changes nothing).

    ENTRYLOG is an entry log file, or an entry log id (the number in its name, in decimal). Damage is
    reported with its offset, and the command exits 1.
    """
    if os.sep in entrylog or os.path.exists(entrylog):
        log_dir = os.path.dirname(entrylog)
    else:
        log_dir = os.path.join(_bookie_config(bookie_config, data_dir).ledger_dir, "entrylogs")
    (path,) = _pick_files(entrylog, log_dir, lambda i: f"{i:08x}.log", ".log", "entry log")
    f = _open_read_only(path)
    try:
        size = f.size()
        with _Output(as_json) as out:
            for offset, body, why in _scan_entry_log(f, size):
                if body is None:
                    out.row(
                        {"file": path, "offset": offset, "damage": why, "resume": None},
                        f"{path} offset {offset}: DAMAGED ({why}); the rest of the file is not read",
                    )
                    continue
                row: dict[str, Any] = {"file": path, "offset": offset}
                row.update(_payload_fields(body, with_payload))
                if only_ledger is not None and row.get("ledger_id") != only_ledger:
                    continue
                out.row(
                    row,
                    f"{path} offset {offset}: ledger {row.get('ledger_id')} entry {row.get('entry_id')} "
                    f"size {row['size']}",
                )
    finally:
        f.close()
    out.fail_on_damage(
        "entry log",
        "`localconsistencycheck` lists the entries the index needs from damaged places; re-replicate "
        "them from the other bookies (`quorumlog shell recover BOOKIE`)",
    )


# BookKeeper's newer shell calls it readentrylogfile; both names work.
shell.add_command(readlog, "readentrylogfile")


@shell.command("localconsistencycheck")
@_dirs_options
@json_option
def localconsistencycheck(bookie_config: str | None, data_dir: str | None, as_json: bool) -> None:
    """Check that every entry the bookie's index lists is readable from its entry logs (bookie stopped).

    Each entry is read where the index points and checked (checksum, ledger and entry ids); the ones that
    fail are listed with the reason. Exits 1 when any is inconsistent.
    """
    from quorumlog.bookie.entrylog import CorruptEntryError, EntryLogs
    from quorumlog.bookie.index import IndexError_, LedgerIndex
    from quorumlog.env import default_env

    config = _bookie_config(bookie_config, data_dir)
    ledger_dir = config.ledger_dir
    index_dir = os.path.join(ledger_dir, "index")
    logs_dir = os.path.join(ledger_dir, "entrylogs")
    _need_dir(ledger_dir, "ledger directory")
    if not os.path.exists(os.path.join(index_dir, "data.mdb")):
        fail(f"no ledger index at {index_dir}", "check --data-dir / --bookie-config")
    _need_dir(logs_dir, "entry log directory")
    result: dict[str, Any] = {"ledgers": 0, "entries": 0, "inconsistent_count": 0, "inconsistent": []}
    with _bookie_stopped([config.journal_dir, ledger_dir]):
        index = LedgerIndex(index_dir)
        logs = EntryLogs(default_env(), logs_dir)
        try:
            for ledger_id in index.ledger_ids():
                result["ledgers"] += 1
                for entry_id in index.entries(ledger_id):
                    result["entries"] += 1
                    location = index.location(ledger_id, entry_id)
                    try:
                        if location is None:
                            raise CorruptEntryError("the index entry vanished while checking")
                        logs.read(ledger_id, entry_id, location)
                        continue
                    except (CorruptEntryError, OSError) as e:
                        why = str(e) or type(e).__name__
                    result["inconsistent_count"] += 1
                    if len(result["inconsistent"]) < INCONSISTENT_LISTED_MAX:
                        result["inconsistent"].append(
                            {"ledger_id": ledger_id, "entry_id": entry_id, "error": why}
                        )
        except IndexError_ as e:
            fail(str(e), "the index itself is unreadable; the bookie will not start on it either")
        finally:
            logs.close()
            index.close()
    bad = result["inconsistent_count"]
    if as_json:
        print_json(result)
    else:
        for item in result["inconsistent"]:
            click.echo(f"ledger {item['ledger_id']} entry {item['entry_id']}: {item['error']}")
        click.echo(
            f"checked {result['entries']} entries of {result['ledgers']} ledgers: "
            + (f"{bad} inconsistent" if bad else "all readable")
        )
    if bad:
        raise CliError(
            f"{bad} entries the index lists cannot be read from the entry logs",
            "re-replicate this bookie's ledgers from the other bookies (`quorumlog shell recover BOOKIE`), "
            "or restore its ledger directory",
        )


@shell.command("updatecookie")
@click.option(
    "-b",
    "--bookie-id",
    "-bookieId",
    "new_id",
    default=None,
    metavar="HOST:PORT",
    help="The bookie's new id [default: the one its settings give: bookie_id, else host:port].",
)
@_dirs_options
@json_option
def updatecookie(new_id: str | None, bookie_config: str | None, data_dir: str | None, as_json: bool) -> None:
    """Give a stopped bookie's cookie a new bookie id (a new hostname, address or port), in its directories
    and in metadata.

    Run it after changing the bookie's host/port/bookie_id and before starting it again. Ledgers written
    before still name the old id in their ensembles: re-replicate them (`recover OLD_ID`) or they are read
    from the other replicas only.
    """
    from quorumlog.bookie.identity import COOKIE_FILE, bookie_id_of
    from quorumlog.errors import CookieError

    sc = _ctx()
    config = _bookie_config(bookie_config, data_dir)
    target = new_id if new_id is not None else bookie_id_of(config)
    if not target or target != target.strip() or "/" in target:
        usage(f"bad bookie id {target!r}", "a bookie id looks like HOST:PORT")
    directories = [config.journal_dir, config.ledger_dir]
    for d in directories:
        _need_dir(d, "bookie directory")

    def local_cookies() -> Any:
        from quorumlog.meta.cookie import Cookie

        cookies = []
        for d in directories:
            path = os.path.join(d, COOKIE_FILE)
            try:
                with open(path, "rb") as fh:
                    cookies.append(Cookie.decode(fh.read()))
            except FileNotFoundError:
                fail(f"no cookie at {path}", "this directory has never been a bookie's; nothing to update")
            except CookieError as e:
                fail(f"{path}: {e}")
        if any(c != cookies[0] for c in cookies):
            fail(
                "the bookie's directories hold different cookies: "
                + "; ".join(f"{d}: {c.bookie_id}" for d, c in zip(directories, cookies, strict=True)),
                "they belong to different bookies; fix the directory settings first",
            )
        return cookies[0]

    with _bookie_stopped(directories):
        local = local_cookies()
        new_cookie = _with_id(local, target)
        outcome = run_async(_update_cookie_in_metadata(sc, local, new_cookie))
        if local.bookie_id != target:
            from quorumlog.env import default_env

            disk = default_env().disk
            for d in directories:  # after metadata: a crash here leaves a state a rerun completes
                disk.write_atomic(os.path.join(d, COOKIE_FILE), new_cookie.encode())
    result = {"old_bookie_id": local.bookie_id, "bookie_id": target, "changed": local.bookie_id != target}
    result.update(outcome)
    if as_json:
        print_json(result)
    elif not result["changed"]:
        click.echo(f"the cookie already names {target}; nothing changed")
    else:
        click.echo(f"cookie updated: {local.bookie_id} -> {target} (directories and metadata)")
        click.echo(
            f"ledgers written before still name {local.bookie_id}: re-replicate them with "
            f"`quorumlog shell recover {local.bookie_id}`",
            err=True,
        )


def _with_id(cookie: Any, bookie_id: str) -> Any:
    import dataclasses

    return dataclasses.replace(cookie, bookie_id=bookie_id)


async def _update_cookie_in_metadata(sc: Any, local: Any, new: Any) -> dict[str, Any]:
    """Metadata first: create the new id's cookie, then delete the old one (only if it is this bookie's).

    A rerun after a crash between the steps finds the new cookie equal to what it would write and goes on;
    in between, a bookie started with either id refuses (its cookie is missing in metadata or on disk).
    """
    from quorumlog.errors import MetadataExistsError, MetadataNotFoundError
    from quorumlog.meta.cluster import check_cluster
    from quorumlog.meta.cookie import delete_cookie, read_cookie, write_cookie
    from quorumlog.meta.registration import BookieRegistry

    async with sc.store() as store:
        instance_id = (await check_cluster(store)).instance_id
        if local.instance_id not in (None, instance_id):
            fail(
                f"the bookie's cookie belongs to cluster {local.instance_id}, this metadata to {instance_id}",
                "is this the bookie's cluster? check --metadata",
            )
        registry = BookieRegistry(store)
        await registry.start()
        try:
            live = registry.writable_bookies() | registry.readonly_bookies()
        finally:
            await registry.close()
        if new.bookie_id in live and new.bookie_id != local.bookie_id:
            fail(
                f"bookie id {new.bookie_id} is registered by a running bookie",
                "choose an id no other bookie uses",
            )
        try:
            old = await read_cookie(store, local.bookie_id)
        except MetadataNotFoundError:
            old = None
        if old is not None and old.value != local:
            fail(
                f"the cookie in metadata for {local.bookie_id} differs from the one in the directories",
                "the directories may belong to another bookie; nothing was changed",
            )
        if new.bookie_id == local.bookie_id:
            if old is None:
                fail(
                    f"metadata has no cookie for {local.bookie_id}",
                    "the bookie writes it on its first start on empty directories only; restore it",
                )
            return {"metadata_cookie_created": False, "old_metadata_cookie_deleted": False}
        try:
            existing: Any = (await read_cookie(store, new.bookie_id)).value
        except MetadataNotFoundError:
            existing = None
        if existing is not None and existing != new:
            fail(
                f"bookie id {new.bookie_id} already has a cookie of another bookie in metadata",
                "choose an id no other bookie uses, or decommission that bookie first",
            )
        if old is None and existing is None:
            fail(
                f"metadata has no cookie for {local.bookie_id}, the id the directories name",
                "the bookie's cookie was deleted (decommissioned?); it cannot be renamed",
            )
        created = False
        if existing is None:
            with contextlib.suppress(MetadataExistsError):  # raced by another updatecookie: checked above
                await write_cookie(store, new)
                created = True
        if old is None:  # a rerun after the old cookie went: only the directories are left to update
            return {"metadata_cookie_created": created, "old_metadata_cookie_deleted": False}
        with contextlib.suppress(MetadataNotFoundError):
            await delete_cookie(store, local.bookie_id, version=old.version)
        return {"metadata_cookie_created": created, "old_metadata_cookie_deleted": True}
