"""What the asyncio drivers (read_handle, write_handle, ensemble_change_driver, recovery_driver) share.

How a bookie's answer is classified before it is fed to a state machine, and the bound on metadata CAS
retries. No decisions: these only name what an error says about the bookie that sent it.
"""

from __future__ import annotations

from quorumlog.errors import (
    BadRequestError,
    BookieUnavailableError,
    ClientClosedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    OperationTimeoutError,
    QuorumLogError,
)

# CAS attempts for one metadata decision (ensemble change, close, recovery) before giving up.
METADATA_CAS_ATTEMPTS_MAX = 32
# Errors that say "this bookie did not have it", as opposed to "could not answer".
EMPTY_ERRORS = (NoSuchEntryError, NoSuchLedgerError)
# Answers that say nothing bad about the bookie (it did not have it, or it refused this request).
NOT_BOOKIE_FAULTS = (NoSuchEntryError, NoSuchLedgerError, BadRequestError)


def is_unreachable(error: QuorumLogError) -> bool:
    return isinstance(error, BookieUnavailableError | OperationTimeoutError | ClientClosedError)


def as_quorumlog_error(exc: BaseException) -> QuorumLogError:
    if isinstance(exc, QuorumLogError):
        return exc
    return BookieUnavailableError(f"request failed: {exc!r}")
