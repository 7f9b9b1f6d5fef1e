"""The typed errors of quorumlog's public API (API.md, "Errors").

One class per outcome. Each has a `code` (the BookKeeper `StatusCode` when the error comes from a bookie,
otherwise a negative client-side code like BookKeeper's client `BKException` codes) and `retriable`: whether
doing the same thing again later can succeed. `error_for_status` turns a bookie's status into the class a
caller can catch.
"""

from __future__ import annotations

from quorumlog.proto.status import StatusCode


class QuorumLogError(Exception):
    """Base of every quorumlog error."""

    code: int = -1
    retriable: bool = False

    def __init__(self, message: str = "", *, code: int | None = None) -> None:
        super().__init__(message or self.__class__.__doc__ or self.__class__.__name__)
        if code is not None:
            self.code = code


# --- errors a bookie reports (code = v3 StatusCode) -------------------------------------------------------


class BookieError(QuorumLogError):
    """A bookie answered with an error status."""


class NoSuchLedgerError(BookieError):
    """The ledger does not exist (on the bookie, or in metadata)."""

    code = StatusCode.ENOLEDGER


class NoSuchEntryError(BookieError):
    """The entry does not exist."""

    code = StatusCode.ENOENTRY


class BadRequestError(BookieError):
    """The peer could not parse or does not support the request."""

    code = StatusCode.EBADREQ


class BookieIOError(BookieError):
    """The bookie failed to read or write its storage (or stored data failed its checksum)."""

    code = StatusCode.EIO
    retriable = True


class UnauthorizedError(BookieError):
    """Wrong password (master key) for the ledger, or authentication failed."""

    code = StatusCode.EUA


class ProtocolVersionError(BookieError):
    """The peer does not speak this protocol version."""

    code = StatusCode.EBADVERSION


class LedgerFencedError(BookieError):
    """The ledger has been fenced by a recovering client: this writer can never be acknowledged again."""

    code = StatusCode.EFENCED


class BookieReadOnlyError(BookieError):
    """The bookie is in read-only mode and refuses writes."""

    code = StatusCode.EREADONLY
    retriable = True


class TooManyRequestsError(BookieError):
    """The bookie's queues are full; back off and retry."""

    code = StatusCode.ETOOMANYREQUESTS
    retriable = True


class UnknownLedgerStateError(BookieError):
    """The bookie cannot tell whether it has the ledger (4.15+ code)."""

    code = StatusCode.EUNKNOWNLEDGERSTATE
    retriable = True


# --- client-side errors (negative codes) -------------------------------------------------------------------


class ProtocolError(QuorumLogError):
    """Bytes on the wire (or on disk) that do not form a valid message: malformed, truncated or oversized."""

    code = -100


class FrameTooLargeError(ProtocolError):
    """A frame is larger than the configured maximum frame size."""

    code = -101


class DigestMismatchError(QuorumLogError):
    """An entry failed digest verification, or the digest type does not match the ledger's."""

    code = -102


class ReadBeyondLastAddConfirmedError(QuorumLogError):
    """A read asked for entries past the last add confirmed."""

    code = -103


class NotEnoughBookiesError(QuorumLogError):
    """Not enough writable bookies to form the ensemble (or to replace a failed one)."""

    code = -104
    retriable = True


class AddQuorumTimeoutError(QuorumLogError):
    """An add was not acknowledged by the ack quorum within add_quorum_timeout_s."""

    code = -105
    retriable = True


class OperationTimeoutError(QuorumLogError):
    """An operation did not complete within its timeout."""

    code = -106
    retriable = True


class BookieUnavailableError(QuorumLogError):
    """A bookie could not be reached (connection refused, reset or closed)."""

    code = -107
    retriable = True


class LedgerClosedError(QuorumLogError):
    """The ledger is closed: no more appends."""

    code = -108


class LedgerExistsError(QuorumLogError):
    """A ledger with that id already exists."""

    code = -109


class LedgerRecoveryError(QuorumLogError):
    """Recovery of the ledger could not complete."""

    code = -110
    retriable = True


class IllegalOperationError(QuorumLogError):
    """The operation is not allowed on this handle (e.g. append with an entry id on a non-adv ledger)."""

    code = -111


class InvalidArgumentError(QuorumLogError, ValueError):
    """An argument or setting is out of range; the message names it and what is allowed."""

    code = -112


class MetadataStoreError(QuorumLogError):
    """The metadata store could not be reached or failed the operation."""

    code = -113
    retriable = True


class MetadataVersionError(QuorumLogError):
    """A compare-and-set on metadata lost: the stored version differs from the expected one."""

    code = -114


class MetadataNotFoundError(MetadataStoreError):
    """The metadata key does not exist."""

    code = -115
    retriable = False


class MetadataExistsError(MetadataStoreError):
    """The metadata key already exists."""

    code = -116
    retriable = False


class SessionExpiredError(MetadataStoreError):
    """The metadata session expired; ephemeral registrations are gone."""

    code = -117


class ClientClosedError(QuorumLogError):
    """The client (or handle) has been closed."""

    code = -118


class CookieError(QuorumLogError):
    """The bookie's cookie (identity + directories) is missing or does not match; the bookie refuses to start."""

    code = -119


class ConfigError(InvalidArgumentError):
    """A configuration value is invalid; the message names the key and the allowed range."""

    code = -120


# --- streams ------------------------------------------------------------------------------------------------


class LogNotFoundError(QuorumLogError):
    """No log of that name in the namespace."""

    code = -200


class LogExistsError(QuorumLogError):
    """A log of that name already exists."""

    code = -201


class WriterFencedError(QuorumLogError):
    """A newer writer has taken over the log; this writer stopped and can write no more."""

    code = -202


class EndOfStreamError(QuorumLogError):
    """The log was sealed with mark_end_of_stream: no more writes."""

    code = -203


class LogTruncatedError(QuorumLogError):
    """The requested position lies before the log's truncation point."""

    code = -204


_BY_STATUS: dict[int, type[BookieError]] = {
    cls.code: cls
    for cls in (
        NoSuchLedgerError,
        NoSuchEntryError,
        BadRequestError,
        BookieIOError,
        UnauthorizedError,
        ProtocolVersionError,
        LedgerFencedError,
        BookieReadOnlyError,
        TooManyRequestsError,
        UnknownLedgerStateError,
    )
}


def error_for_status(status: int, message: str = "") -> BookieError:
    """The exception for a non-EOK bookie status (v3 numbering)."""
    if status == StatusCode.EOK:
        raise ValueError("EOK is not an error")
    cls = _BY_STATUS.get(status)
    if cls is None:
        return BookieError(message or f"bookie returned unknown status {status}", code=status)
    return cls(message) if message else cls()


# --- bookie storage -----------------------------------------------------------------------------------------


class JournalCorruptError(BookieIOError):
    """The bookie's journal is damaged where valid data follows (not a torn tail): acknowledged entries may be
    in the damaged part or after it. The bookie refuses to start; the message names the file, the offset, what
    follows, and the option to skip the damage."""

    retriable = False


class IndexCorruptError(BookieIOError):
    """The bookie's ledger index cannot be used: its file is truncated or damaged, or it holds no checkpoint
    while the entry logs hold data the journal no longer covers (the index was emptied or replaced). The
    bookie refuses to start: serving would answer "no such ledger" for entries it acknowledged, and a
    recovery trusting that answer could truncate a ledger."""

    retriable = False


# --- metadata store security --------------------------------------------------------------------------------


class MetadataSecurityError(MetadataStoreError):
    """The metadata store (ZooKeeper, etcd) refused us or we refused it: a TLS handshake failed (server
    certificate not trusted, client certificate missing or rejected) or etcd authentication failed (wrong
    user or password). The message names the server and the cause. Not retried: retrying does not fix a
    wrong setting, and failing fast at connect time is what tells the operator."""

    code = -121
    retriable = False


# --- TLS ----------------------------------------------------------------------------------------------------


class TLSError(QuorumLogError):
    """TLS could not be set up: a certificate, key or CA file is missing, unreadable, malformed, expired or
    does not match, or a peer's certificate was refused. The message names the file or the peer and why."""

    code = -130


class BookieTLSError(BookieUnavailableError, TLSError):
    """TLS with a bookie failed (START_TLS refused, handshake failed, certificate refused either way): to this
    client the bookie is unavailable, as for any failed connection; the message says it was TLS and why."""

    code = BookieUnavailableError.code
