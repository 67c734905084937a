"""The metric names are a contract with dashboards: the registries expose them, and the Grafana dashboard in
configs/ asks for nothing else."""

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from crawler.metrics import MasterMetrics, WorkerMetrics

ROOT = Path(__file__).resolve().parent.parent


def exposed(text: bytes) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text.decode()):
        names.add(family.name)
        names.update(family.name + suffix for suffix in ("_total", "_bucket", "_count", "_sum"))
    return names


def test_the_names_of_the_issue_are_exposed():
    master, worker = MasterMetrics(), WorkerMetrics("w1")
    master.pages.labels("w1", "done").inc()
    worker.fetch_seconds.observe(0.1)
    names = exposed(master.render()) | exposed(worker.render())
    for name in ("crawler_pages_total", "crawler_audio_items_total", "crawler_discarded_urls_total",
                 "crawler_frontier_urls", "crawler_in_flight_urls", "crawler_nodes_connected",
                 "crawler_fetch_seconds_bucket", "crawler_download_bytes_total",
                 "crawler_event_loop_lag_seconds_bucket"):
        assert name in names, name
    assert 'crawler_fetch_seconds_count{node="w1"} 1.0' in worker.render().decode()


def test_the_grafana_dashboard_reads_only_metrics_that_exist():
    dash = json.loads((ROOT / "configs" / "grafana-dashboard.json").read_text())
    names = exposed(MasterMetrics().render()) | exposed(WorkerMetrics("w1").render())
    used = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"crawler_\w+", t["expr"])}
    assert used and used <= names, used - names


async def test_the_lag_probe_sees_a_blocked_loop_and_keeps_the_worst(until):
    """A callback that holds the loop 200 ms shows as a worst lag of at least 150 ms (the probe wakes every 50 ms),
    and the worst stays after the loop is free again."""
    import asyncio
    import time

    lag = MasterMetrics().lag

    def samples() -> float:
        return next(s.value for s in lag.hist.collect()[0].samples if s.name.endswith("_count"))

    probe = asyncio.create_task(lag.run())
    try:
        await until(lambda: samples() >= 2, 10, "the probe's first samples")
        quiet = lag.worst
        seen = samples()
        time.sleep(0.2)   # noqa: ASYNC251 -- the loop held on purpose, as a synchronous disk write would hold it
        await until(lambda: samples() >= seen + 2, 10, "the probe's samples after the block")
    finally:
        probe.cancel()
    assert lag.worst >= 0.15 > quiet
    assert lag.last < lag.worst


def test_the_dedup_totals_become_counters_that_only_grow():
    master = MasterMetrics()
    master.count_dedup({"offered": 10, "new": 7, "seen": 3, "rescued": 0})
    master.count_dedup({"offered": 25, "new": 9, "seen": 16, "rescued": 1})
    text = master.render().decode()
    assert 'crawler_dedup_urls_total{result="offered"} 25.0' in text
    assert 'crawler_dedup_urls_total{result="new"} 9.0' in text
    assert 'crawler_dedup_urls_total{result="rescued"} 1.0' in text


def test_the_seen_set_gauges_are_exposed():
    master = MasterMetrics()
    master.set_bloom({"urls": 1234, "capacity": 1500, "fp_estimate": 7.5e-7})
    text = master.render().decode()
    assert "crawler_bloom_urls 1234.0" in text and "crawler_bloom_capacity_urls 1500.0" in text
    assert "crawler_bloom_fp_estimate 7.5e-07" in text


def test_no_created_series_in_either_daemons_metrics():
    master, worker = MasterMetrics(), WorkerMetrics("w1")
    master.pages.labels("w1", "done").inc()
    master.discarded.labels("depth").inc()
    worker.pages_by_outcome["done"].inc()
    worker.fetch_seconds.observe(0.1)
    for text in (master.render().decode(), worker.render().decode()):
        assert "crawler_pages_total" in text and "_created" not in text


def test_paused_faulted_and_url_state_gauges():
    master = MasterMetrics()
    master.paused.set(1)
    master.nodes_faulted.set(2)
    master.set_urls({"queued": 5, "leased": 3, "done": 10, "failed": 1})    # a state it lacks shows as 0
    text = master.render().decode()
    assert "crawler_paused 1.0" in text and "crawler_nodes_faulted 2.0" in text
    for state, n in (("queued", 5), ("leased", 3), ("done", 10), ("failed", 1), ("discarded", 0)):
        assert f'crawler_urls{{state="{state}"}} {n}.0' in text, state


def test_the_matches_counter_follows_the_stores_count():
    from crawler.metrics import MasterMetrics

    m = MasterMetrics()
    m.count_matches(3)
    m.count_matches(2)     # a removed work took matches away: a counter never goes down
    m.count_matches(5)
    assert b"crawler_matches_total 5.0" in m.render()


def test_a_workers_pages_and_audio_are_counted_as_they_come_and_read_in_full():
    worker = WorkerMetrics("w1")
    for outcome, size in (("done", 1000), ("done", None), ("retry", 0), ("error", 24)):
        worker.count_page(outcome, size)
    for status in ("ok", "ok", "failed"):
        worker.count_audio(status)
    text = worker.render().decode()
    assert 'crawler_pages_total{node="w1",outcome="done"} 2.0' in text
    assert 'crawler_pages_total{node="w1",outcome="retry"} 1.0' in text
    assert 'crawler_pages_total{node="w1",outcome="error"} 1.0' in text
    assert 'crawler_download_bytes_total{kind="page",node="w1"} 1024.0' in text
    assert 'crawler_audio_items_total{node="w1",status="ok"} 2.0' in text
    assert 'crawler_audio_items_total{node="w1",status="failed"} 1.0' in text
    worker.count_page("done", 1)     # counted after a read: the next read has it, once
    text = worker.render().decode()
    assert 'crawler_pages_total{node="w1",outcome="done"} 3.0' in text
    assert 'crawler_download_bytes_total{kind="page",node="w1"} 1025.0' in text
