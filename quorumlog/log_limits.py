"""Repeated log lines, bounded: a log that a peer (or a failing disk) can fill at its own rate is a denial of
service on the process's CPU and buries the lines that say what happened.

What it owns: `RepeatLimiter`, the filter `cli.common.setup_logging` puts on the handler of every
long-running command (bookie, standalone, auto-recovery). Records are grouped by logger, level and message
*template* (the format string before its arguments: "bad request answered EBADREQ: %s" is one group
whatever the reason), and each group passes at most `burst` records per `window_s`. The last record let
through says that more are being counted; the first one after the window says how many were not logged.
DEBUG records are never held back: debug logging is asked for, and then wanted whole.

The decision reads only the record (its `created` time), so it is tested with records made by hand.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["BURST", "KEYS_MAX", "WINDOW_S", "RepeatLimiter"]

BURST = 20  # records of one group per window
WINDOW_S = 10.0
KEYS_MAX = 1024  # groups remembered (templates are code, but a message built by hand is its own group)


class RepeatLimiter(logging.Filter):
    def __init__(self, burst: int = BURST, window_s: float = WINDOW_S) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        # group -> [window start, records in the window, records not logged in it]
        self._groups: dict[tuple[str, int, str], list[float]] = {}
        self._lock = threading.Lock()  # records come from the loop and from storage threads alike

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO:
            return True
        msg = record.msg
        key = (record.name, record.levelno, msg if isinstance(msg, str) else type(msg).__qualname__)
        now = record.created
        with self._lock:
            group = self._groups.get(key)
            if group is None or now - group[0] >= self.window_s:
                dropped = int(group[2]) if group is not None else 0
                if group is None and len(self._groups) >= KEYS_MAX:
                    self._forget_expired(now)
                self._groups[key] = [now, 1, 0]
                count = 1
            else:
                group[1] += 1
                count = int(group[1])
                if count > self.burst:
                    group[2] += 1
                    return False
                dropped = 0
        if dropped:
            self._annotate(
                record, f"[{dropped} more like this were not logged in the {self.window_s:g} s before]"
            )
        elif count == self.burst:
            self._annotate(
                record, f"[{self.burst} like this within {self.window_s:g} s: more are counted, not logged]"
            )
        return True

    def _forget_expired(self, now: float) -> None:
        """Make room: groups whose window is over go (their unreported counts with them), or all if none is."""
        expired = [k for k, g in self._groups.items() if now - g[0] >= self.window_s]
        for k in expired:
            del self._groups[k]
        if not expired:
            self._groups.clear()

    @staticmethod
    def _annotate(record: logging.LogRecord, note: str) -> None:
        # The process has one handler (setup_logging), so changing the record changes only its line.
        try:
            text = record.getMessage()
        except Exception:  # arguments that do not fit the template: logging reports that itself
            return
        record.msg = f"{text} {note}"
        record.args = None
