"""Defects the fuzz targets (quorumlog/testing/fuzz/) found, each pinned by the smallest input that shows it."""

from __future__ import annotations

import asyncio
import os

import pytest

from quorumlog.bookie.journal import JournalCorruptError
from tests.bookie.test_journal import _batches_in_files, _jnl, journal, replayed


async def test_a_journal_file_emptied_before_files_with_records_is_corruption_not_a_prepared_file(
    tmp_path: str,
) -> None:
    """Found by the journal target (input: truncate file 1 to 0 bytes). A file whose header fails and that
    holds no batch was taken for a file being prepared when the bookie stopped, and skipped -- even with files
    holding synced (acknowledged) records after it, whose loss then went unreported. Only the last file can be
    one being prepared: followed by records, it is damage, refused like any other (issue 14, defect 5)."""
    env, d, data = await _batches_in_files(tmp_path, rounds=60, per_round=3)
    files = _jnl(d)
    assert len(files) >= 2
    kept = replayed(journal(env, d))
    assert kept == data
    os.truncate(files[0], 0)
    with pytest.raises(JournalCorruptError, match="no batch of the file verifies") as err:
        replayed(journal(env, d))
    assert files[0] in str(err.value)
    got = replayed(journal(env, d, skip_corrupt=True))  # the operator's choice: replay the rest
    assert got and got == data[len(data) - len(got) :]
    j = journal(env, d, skip_corrupt=True)
    assert replayed(j) == got
    j.start(asyncio.get_running_loop())
    await asyncio.to_thread(j.close)
    assert os.stat(files[0]).st_size > 0  # sealed with a header and ROLL: a later restart is clean
    assert replayed(journal(env, d)) == got
