"""The dashboard in a real browser (issue 15): headless Debian Chromium, driven through selenium, loads it
against a live cluster of bookie processes and shows the cluster's real numbers.

Skips, saying why, where Chromium or its driver is not installed (`./dev` installs both: CI has them).
With QUORUMLOG_DASHBOARD_SCREENSHOT=path it also saves a screenshot there (scripts/dashboard_screenshot.py
makes docs/images/dashboard.png this way).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from quorumlog.admin.dashboard import Dashboard
from quorumlog.client.client import Client
from quorumlog.replication import admin
from quorumlog.replication.service import AutoRecovery, AutoRecoverySettings
from quorumlog.testing.cluster import LocalCluster
from tests.bookie.helpers import BookieProcess, free_port

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver")
NO_CHROMIUM = "Chromium and chromedriver are not installed (Debian: apt-get install chromium chromium-driver)"
# Decided before any fixture runs: without a browser, no cluster is started for nothing.
pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None, reason=NO_CHROMIUM)
PAGE_WAIT_S = 20.0  # the page's script fetches /api/overview at once; this bounds waiting for it


def _driver() -> Any:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(NO_CHROMIUM)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (it is in the dev dependency group: uv sync --all-groups)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1500",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = _driver()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
async def cluster(tmp_path: Any) -> Any:
    c = LocalCluster(bookies=0, base_dir=str(tmp_path / "cluster"))
    await c.start()
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def bookies(cluster: LocalCluster, tmp_path: Any) -> Iterator[list[BookieProcess]]:
    procs = [
        BookieProcess(
            str(tmp_path / f"bookie-{i}"),
            free_port(),
            "--metadata",
            cluster.uri,
            "--http-port",
            str(free_port()),
        )
        for i in range(3)
    ]
    try:
        with ThreadPoolExecutor(len(procs)) as pool:  # the three start-ups overlap
            list(pool.map(BookieProcess.start, procs))
        yield procs
    finally:
        for p in procs:
            p.kill()


async def _traffic(dash: Dashboard, uri: str) -> int:
    """Writes in a few rounds with a sample after each, so the charts have points; returns a ledger id."""
    async with await Client.connect(uri) as client:
        handle = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw")
        await dash.refresh()
        for round_ in range(6):
            first = handle.last_add_confirmed + 1
            for i in range(40 + 60 * (round_ % 3)):
                await handle.append(b"order %d/%d" % (round_, i))
            if round_ % 2:
                await handle.read(first, handle.last_add_confirmed)  # some reads for the chart too
            await dash.refresh()
        await handle.close()
        log = await client.namespace("shop").create_log(
            "orders", ensemble_size=3, write_quorum=2, ack_quorum=2
        )
        async with await log.open_writer() as writer:
            await writer.write_many([b'{"order": %d, "total": %d.50}' % (i, i * 3) for i in range(50)])
        await dash.refresh()
        return int(handle.ledger_id)


async def test_dashboard_in_chromium_shows_the_live_cluster(
    browser: Any, cluster: LocalCluster, bookies: list[BookieProcess]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    dash = Dashboard(cluster.uri, "127.0.0.1", 0, sample_interval_s=0)
    await dash.start()
    recovery = AutoRecovery(cluster.uri, AutoRecoverySettings(status_interval_s=0.1, owner="autorecovery-1"))
    try:
        ledger_id = await _traffic(dash, cluster.uri)
        await admin.set_lost_bookie_recovery_delay(dash.store, 60)
        await recovery.start()
        # Its status node is written on its own schedule and announces nothing: sample until it shows
        # as the elected auditor, for at most 20 s.
        deadline = asyncio.get_running_loop().time() + 20.0
        while not any(p["auditor_elected"] for p in (await dash.refresh()).workers):
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)

        # Selenium blocks; the dashboard serves on this event loop, so the browser runs in a thread.
        def load() -> dict[str, Any]:
            browser.get(dash.url)
            wait = WebDriverWait(browser, PAGE_WAIT_S)
            # The script's first refresh has drawn the charts once a polyline is there.
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-adds polyline"))
            wait.until(lambda d: d.find_element(By.ID, "updated").text.startswith("updated"))
            out = {
                "bookies": browser.find_element(By.ID, "bookies").text,
                "adds_total": browser.find_element(By.ID, "sum-adds_total").text,
                "writable": browser.find_element(By.ID, "sum-writable").text,
                "ledgers": browser.find_element(By.ID, "ledgers").text,
                "logs": browser.find_element(By.ID, "logs").text,
                "recovery": browser.find_element(By.ID, "recovery").text,
                "title": browser.title,
            }
            shot = os.environ.get("QUORUMLOG_DASHBOARD_SCREENSHOT")
            if shot:
                browser.save_screenshot(shot)
            # Browse: the ledger's link opens its ensembles and the entries at its tail.
            browser.find_element(By.CSS_SELECTOR, f'a[href="/ledger/{ledger_id}"]').click()
            wait.until(lambda d: d.find_elements(By.ID, "entries"))
            out["ledger_page"] = browser.find_element(By.TAG_NAME, "main").text
            return out

        seen = await asyncio.to_thread(load)
    finally:
        await recovery.stop()
        await dash.stop()
    for p in bookies:
        assert f"127.0.0.1:{p.port}" in seen["bookies"]  # the real addresses, as text of the page
    assert seen["bookies"].count("writable") == 3
    assert int(seen["adds_total"].replace(",", "")) > 0
    assert seen["writable"] == "3"
    assert str(ledger_id) in seen["ledgers"]
    assert "orders" in seen["logs"]
    assert "autorecovery-1" in seen["recovery"] and "auditor + worker" in seen["recovery"]
    assert seen["title"] == "quorumlog cluster"
    assert "order 5/159" in seen["ledger_page"]  # the last entry written (round 5 wrote 160)
    assert all(f"127.0.0.1:{p.port} (writable)" in seen["ledger_page"] for p in bookies)
