"""The clickstream example pipeline (`quorumlog pipeline`, examples/clickstream.py): events in, analysis out.

Three parts, each usable alone:
- `events(...)` makes realistic user events (seeded): users with skewed activity, sessions of a few to a
  few dozen page hits, pages with their own popularity and latency (log-normal, as web latencies are),
  actions that follow a funnel (view → click → add_to_cart → purchase).
- `produce(...)` writes them into a log from several producer threads through the blocking facade. A log
  has one writer, so the producers share it: each hands its chunks to the writer on the facade's loop, and
  the writer batches them into entries (order among producers is the order their chunks arrive).
- `analyze(df)` computes per-page views, sessions per user and latency percentiles from a DataFrame read
  with the `quorumlog` source and `EVENT_SCHEMA`; `render`, `write_parquet`, `chart` present the results.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from quorumlog.spark.connection import connect

EVENT_SCHEMA = "user STRING, session STRING, page STRING, action STRING, latency_ms INT, event_time TIMESTAMP"
PRODUCER_CHUNK = 500  # events handed to the writer at a time (one hand-off, not one per event)

# page → (popularity weight, median latency ms)
PAGES: dict[str, tuple[float, float]] = {
    "/": (30.0, 40.0),
    "/search": (20.0, 120.0),
    "/product": (25.0, 80.0),
    "/cart": (10.0, 60.0),
    "/checkout": (5.0, 250.0),
    "/account": (6.0, 70.0),
    "/help": (4.0, 35.0),
}
FUNNEL = (("view", 0.55), ("click", 0.30), ("add_to_cart", 0.11), ("purchase", 0.04))


def events(
    count: int, *, seed: int = 7, users: int = 300, start_ms: int | None = None
) -> Iterator[dict[str, Any]]:
    """`count` events as dicts (JSON-ready), in event-time order per session."""
    rng = random.Random(seed)
    now_ms = int(time.time() * 1000) if start_ms is None else start_ms
    pages = list(PAGES)
    weights = [PAGES[p][0] for p in pages]
    actions = [a for a, _ in FUNNEL]
    action_weights = [w for _, w in FUNNEL]
    # Zipf-like activity: the k-th most active user starts sessions in proportion to 1/k^0.9.
    user_ids = [f"u{k:04d}" for k in range(1, users + 1)]
    user_weights = [1 / k**0.9 for k in range(1, users + 1)]
    made = 0
    session_no = 0
    while made < count:
        user = rng.choices(user_ids, user_weights)[0]
        session_no += 1
        session = f"s{seed}-{session_no:07d}"
        t = now_ms + rng.randint(0, 60_000)
        for _ in range(min(count - made, 1 + int(rng.expovariate(1 / 8)))):
            page = rng.choices(pages, weights)[0]
            median = PAGES[page][1]
            latency = max(1, int(rng.lognormvariate(math.log(median), 0.6)))
            yield {
                "user": user,
                "session": session,
                "page": page,
                "action": rng.choices(actions, action_weights)[0],
                "latency_ms": latency,
                "event_time": t,
            }
            made += 1
            t += rng.randint(500, 20_000)


def produce(
    uri: str,
    namespace: str,
    log: str,
    count: int,
    *,
    producers: int = 4,
    seed: int = 7,
    events_per_s: float = 0.0,
) -> int:
    """Write `count` events from `producers` threads into the log (created if missing); returns the number
    written (every one acknowledged). `events_per_s` > 0 paces the producers (for the streaming demo)."""

    async def open_writer(client: Any) -> Any:
        ns = client.namespace(namespace)
        try:
            lg = await ns.open_log(log)
        except Exception:
            lg = await ns.create_log(log)
        return await lg.open_writer()

    with connect(uri) as conn:
        writer = conn.run(open_writer)
        errors: list[BaseException] = []
        shares = [count // producers + (1 if i < count % producers else 0) for i in range(producers)]

        def producer(i: int) -> None:
            try:
                chunk: list[bytes] = []
                started = time.monotonic()
                for n, event in enumerate(events(shares[i], seed=seed * 1000 + i), start=1):
                    chunk.append(json.dumps(event, separators=(",", ":")).encode())
                    if len(chunk) == PRODUCER_CHUNK or n == shares[i]:
                        payloads = chunk
                        chunk = []
                        conn.run(lambda _c, p=payloads: writer.write_many(p))  # type: ignore[misc]
                        if events_per_s > 0:
                            due = started + n * producers / events_per_s
                            delay = due - time.monotonic()
                            if delay > 0:
                                time.sleep(delay)  # pacing a producer, not synchronisation
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=producer, args=(i,), name=f"producer-{i}") for i in range(producers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        async def close(_client: Any) -> None:
            await writer.close()

        conn.run(close)
        if errors:
            raise errors[0]
    return count


def read_events(spark: Any, uri: str, namespace: str, log: str) -> Any:
    return (
        spark.read.format("quorumlog")
        .option("metadata", uri)
        .option("namespace", namespace)
        .option("log", log)
        .option("json_schema", EVENT_SCHEMA)
        .load()
    )


@dataclass
class Results:
    page_views: Any  # DataFrame: page, views, clicks, purchases
    sessions_per_user: Any  # DataFrame: sessions, users (how many users had that many sessions)
    latency: Any  # DataFrame: page, p50_ms, p90_ms, p99_ms, events
    total_events: int


def analyze(df: Any) -> Results:
    from pyspark.sql import functions as F

    events_df = df.select("user", "session", "page", "action", "latency_ms").cache()
    page_views = (
        events_df.groupBy("page")
        .agg(
            F.sum(F.when(F.col("action") == "view", 1).otherwise(0)).alias("views"),
            F.sum(F.when(F.col("action") == "click", 1).otherwise(0)).alias("clicks"),
            F.sum(F.when(F.col("action") == "purchase", 1).otherwise(0)).alias("purchases"),
        )
        .orderBy(F.desc("views"))
    )
    sessions_per_user = (
        events_df.groupBy("user")
        .agg(F.countDistinct("session").alias("sessions"))
        .groupBy("sessions")
        .agg(F.count("*").alias("users"))
        .orderBy("sessions")
    )
    latency = (
        events_df.groupBy("page")
        .agg(
            F.percentile_approx("latency_ms", 0.5).alias("p50_ms"),
            F.percentile_approx("latency_ms", 0.9).alias("p90_ms"),
            F.percentile_approx("latency_ms", 0.99).alias("p99_ms"),
            F.count("*").alias("events"),
        )
        .orderBy("page")
    )
    return Results(page_views, sessions_per_user, latency, events_df.count())


def render(results: Results, console: Any) -> None:
    from rich.table import Table

    def table(title: str, df: Any, limit: int = 20) -> Table:
        t = Table(title=title)
        for name in df.columns:
            t.add_column(name, justify="left" if name == "page" else "right")
        for row in df.limit(limit).collect():
            t.add_row(*(str(v) for v in row))
        return t

    console.print(f"[bold]{results.total_events}[/bold] events")
    console.print(table("Views per page", results.page_views))
    console.print(table("Sessions per user (distribution)", results.sessions_per_user))
    console.print(table("Latency percentiles per page (ms)", results.latency))


def write_parquet(results: Results, out_dir: str) -> list[str]:
    paths = []
    for name, df in (
        ("page_views", results.page_views),
        ("sessions_per_user", results.sessions_per_user),
        ("latency", results.latency),
    ):
        path = f"{out_dir}/{name}.parquet"
        df.coalesce(1).write.mode("overwrite").parquet(path)
        paths.append(path)
    return paths


def chart(results: Results, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    views = results.page_views.collect()
    latency = sorted(results.latency.collect(), key=lambda r: r.page)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.bar([r.page for r in views], [r.views for r in views], color="#4c72b0")
    left.set_title("Views per page")
    left.tick_params(axis="x", rotation=30)
    xs = range(len(latency))
    width = 0.27
    for k, (field, color) in enumerate((("p50_ms", "#55a868"), ("p90_ms", "#dd8452"), ("p99_ms", "#c44e52"))):
        right.bar(
            [x + (k - 1) * width for x in xs],
            [getattr(r, field) for r in latency],
            width,
            label=field,
            color=color,
        )
    right.set_xticks(list(xs), [r.page for r in latency], rotation=30)
    right.set_title("Latency percentiles per page (ms)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
