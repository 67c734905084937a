"""The master's live figures, status object and progress line: pure, time passed in."""

import json
from collections import Counter

from crawler import protocol as p
from crawler.items import AudioItem
from crawler.logs import iso_utc
from crawler.master.live import (
    CHART_BUCKET,
    MAX_REASONS,
    RECENT,
    Buckets,
    LiveStats,
    build_status,
    error_reason,
    human_bytes,
    progress_line,
    status_text,
)

T0 = 1_800_000_000.0


def test_buckets_slide_and_forget_what_fell_out_of_the_window():
    b = Buckets(5.0, 4)
    b.add(T0, 3)
    b.add(T0 + 4.9, 2)     # same bucket
    b.add(T0 + 5, 1)
    assert b.series(T0 + 5) == [0, 0, 5, 1]
    assert b.series(T0 + 15) == [5, 1, 0, 0]
    assert b.series(T0 + 20) == [1, 0, 0, 0]
    b.add(T0 + 25, 7)      # reuses the slot of T0 + 5: the old count must not leak in
    assert b.series(T0 + 25) == [0, 0, 0, 7]


def test_rates_per_minute_over_one_and_ten_minutes():
    live = LiveStats(started=T0)
    live.report("w1", (p.Result(1, "u", p.DONE, 200),) * 120, [], T0 + 30)   # early: in the 10-min window only
    for s in range(0, 60, 5):
        live.report("w1", (p.Result(1, "u", p.DONE, 200),) * 5, [], T0 + 540 + s)
    r = live.rates(T0 + 600)
    assert 55 <= r["pages_per_min_1m"] <= 66     # 60 pages in the last minute (whole buckets)
    assert abs(r["pages_per_min_10m"] - 18.0) <= 0.5   # 180 pages in 10 minutes
    assert r["errors_per_min_1m"] == 0


def test_a_run_younger_than_the_window_is_not_diluted():
    live = LiveStats(started=T0)
    live.report("w1", (p.Result(1, "u", p.DONE, 200),) * 10, [], T0 + 9)
    assert live.rates(T0 + 10)["pages_per_min_10m"] == 60.0


def test_report_counts_outcomes_statuses_and_reasons_and_keeps_recent_errors():
    live = LiveStats(started=T0)
    results = (p.Result(1, "a", p.DONE, 200), p.Result(2, "b", p.DONE, 404),
               p.Result(3, "c", p.RETRY, 503, error="HTTP 503"),
               p.Result(4, "d", p.RETRY, error="ConnectTimeout: timed out"),
               p.Result(5, "e", p.ERROR, error="unsupported URL: ftp"))
    out = live.report("w1", results, [AudioItem(url="x", page="a").catalogue_row()], T0 + 1)
    assert out == Counter({p.DONE: 2, p.RETRY: 2, p.ERROR: 1})
    assert live.http_status == Counter({"200": 1, "404": 1, "503": 1})
    assert live.error_reasons == Counter({"HTTP 503": 1, "ConnectTimeout": 1, "unsupported URL": 1})
    assert [e["url"] for e in live.recent_errors] == ["c", "d", "e"]
    assert live.take_interval() == (2, 1, live.error_reasons)
    assert live.take_interval() == (0, 0, Counter())
    assert live.chart.series(T0 + 1)[-1] == 2 and live.chart.width == CHART_BUCKET


def test_error_reasons_are_capped():
    live = LiveStats(started=T0)
    live.report("w1", tuple(p.Result(i, "u", p.ERROR, error=f"odd {i}: x") for i in range(MAX_REASONS + 10)),
                [], T0)
    assert len(live.error_reasons) == MAX_REASONS + 1 and live.error_reasons["other"] == 10
    assert error_reason(None, 500) == "HTTP 500" and error_reason("", None) == "unknown"


def test_figures_survive_a_restart():
    live = LiveStats(started=T0)
    live.report("w1", (p.Result(1, "u", p.RETRY, 503, error="HTTP 503"),), [], T0)
    again = LiveStats(started=T0 + 100)
    again.load_figures(live.figures())
    assert again.http_status == {"503": 1} and again.error_reasons == {"HTTP 503": 1}


def _db(**over):
    db = {"states": {"queued": 5, "leased": 7, "done": 10, "error": 1}, "frontier": 5,
          "frontier_by_node": {"None": 5}, "nodes": {}, "discards": {"depth": 3}, "audio": {"ok": 2},
          "figures": {"http_status": {"200": 10}, "errors": {"HTTP 503": 1}}}
    db.update(over)
    return db


def test_status_before_any_worker_joined_has_no_none_node_and_says_not_routed():
    st = build_status(_db(), None, ["w1", "w2"], T0, running=False)
    assert [n["node"] for n in st["nodes"]] == ["w1", "w2"] and not any(n["connected"] for n in st["nodes"])
    assert st["urls"]["not_routed"] == 5 and st["urls"]["leased_when_stopped"] == 7
    text = status_text(st)
    assert "None" not in text and "{" not in text and "not routed" in text
    assert "master not running" in text and "depth" in text and "HTTP 503" in text


def test_status_of_a_running_master_splits_waiting_at_the_master_from_at_workers():
    live = LiveStats(started=T0)
    live.seen("w1", T0 + 5)
    view = live.view(T0 + 6, held=3, at_workers=4, in_flight={"w1": 4}, web="127.0.0.1:1", lag=0.001,
                     run_pages=10)
    db = _db(frontier_by_node={"w1": 5},
             nodes={"w1": {"queued": 5, "leased": 7, "done": 10, "bytes": 3 << 20, "audio": 2}})
    st = build_status(db, view, ["w1", "w2"], T0 + 6, running=True)
    assert st["urls"] == {"queued": 5, "held_at_master": 3, "waiting_at_master": 8, "at_workers": 4, "done": 10,
                          "error": 1, "total": 23}
    w1 = st["nodes"][0]
    assert w1["connected"] and w1["in_flight"] == 4 and w1["pages"] == 10 and w1["last_heartbeat"]
    assert st["nodes_connected"] == 1 and st["master"]["web"] == "127.0.0.1:1"
    text = status_text(st)
    assert "3.0 MiB" in text and "waiting at the master" in text and "last 10 min" in text


def test_progress_line():
    line = progress_line(30.0, 300, 15, Counter({"HTTP 503": 4, "timeout": 1}), queued=100, held=20,
                         at_workers=64, connected=2, nodes=3, shrink=2.0)
    assert line.startswith("progress: 600 pages/min, 30 audio/min; queued 100, held at the master 20, at workers 64")
    assert "workers 2/3" in line and "HTTP 503 4, timeout 1" in line and "about 1 min 0 s left" in line
    assert "queue not shrinking" in progress_line(30, 0, 0, Counter(), queued=5, held=0, at_workers=0,
                                                  connected=0, nodes=1, shrink=None)
    assert human_bytes(0) == "0 B" and human_bytes(1536) == "1.5 KiB"


def test_status_shows_the_last_refresh_cycles_changes_only_when_refresh_runs():
    assert build_status(_db(), None, ["w1"], T0, running=False)["changes"] == {}
    off = _db(changes={"this_cycle": {"start": None, "new": 4, "changed": 0, "removed": 0}, "last_cycle": None})
    assert build_status(off, None, ["w1"], T0, running=False)["changes"] == {}
    assert "refresh cycles" not in status_text(build_status(off, None, ["w1"], T0, running=False))
    db = _db(changes={"this_cycle": {"start": T0 + 60, "new": 1, "changed": 0, "removed": 0},
                      "last_cycle": {"start": T0, "end": T0 + 60, "new": 3, "changed": 2, "removed": 5}})
    st = build_status(db, None, ["w1"], T0 + 70, running=False)
    assert st["changes"]["last_cycle"] == {"new": 3, "changed": 2, "removed": 5, "start": iso_utc(T0),
                                           "end": iso_utc(T0 + 60)}
    text = status_text(st)
    lines = [line.strip() for line in text.splitlines()]
    assert lines[lines.index("catalogue changes (refresh cycles):") + 1].split()[:3] == ["new", "changed", "removed"]
    (last,) = [line for line in lines if line.startswith("last cycle")]
    assert last.split()[2:5] == ["3", "2", "5"]
    assert any(line.startswith("this cycle") and line.endswith(" now") for line in lines)


def test_each_node_has_a_state_connected_fault_with_its_reason_or_disconnected():
    live = LiveStats(started=T0)
    live.seen("w1", T0 + 5)
    live.seen("w2", T0 + 5, fault="No space left on device: /data/pages")
    view = live.view(T0 + 6, held=0, at_workers=0, in_flight={}, web=None, lag=0.0, run_pages=0)
    st = build_status(_db(), view, ["w1", "w2", "w3"], T0 + 6, running=True)
    by = {n["node"]: n for n in st["nodes"]}
    assert [by[n]["state"] for n in ("w1", "w2", "w3")] == ["connected", "fault", "disconnected"]
    assert by["w2"]["fault"] == "No space left on device: /data/pages" and by["w1"]["fault"] is None
    assert by["w2"]["connected"] and st["nodes_connected"] == 2 and st["nodes_faulted"] == 1
    rows = {line.split()[0]: line for line in status_text(st).splitlines()[1:] if line.startswith("  w")}
    assert "fault: No space left on device: /data/pages" in rows["w2"]
    assert rows["w1"].split()[1] == "connected" and rows["w3"].split()[1] == "disconnected"
    assert "1 faulted" in status_text(st)
    live.seen("w2", T0 + 6, fault="\x1b[2Jdisk " + "x" * 500)     # a reason is bounded and printable
    odd = build_status(_db(), live.view(T0 + 6, held=0, at_workers=0, in_flight={}, web=None, lag=0.0,
                                        run_pages=0), ["w2"], T0 + 6, running=True)["nodes"][0]["fault"]
    assert odd.startswith("?[2Jdisk x") and len(odd) <= 120
    # The fault clears when the node can store again; a node that left is disconnected, with no fault.
    live.seen("w2", T0 + 7)
    again = build_status(_db(), live.view(T0 + 8, held=0, at_workers=0, in_flight={}, web=None, lag=0.0,
                                          run_pages=0), ["w1", "w2"], T0 + 8, running=True)
    assert [n["state"] for n in again["nodes"]] == ["connected", "connected"] and again["nodes_faulted"] == 0
    live.seen("w2", T0 + 9, connected=False, fault="disk full")
    gone = build_status(_db(), live.view(T0 + 9, held=0, at_workers=0, in_flight={}, web=None, lag=0.0,
                                         run_pages=0), ["w1", "w2"], T0 + 9, running=True)
    assert gone["nodes"][1]["state"] == "disconnected" and gone["nodes"][1]["fault"] is None
    # A stopped master's nodes are all disconnected, whatever its last view said.
    stopped = build_status(_db(), view, ["w1", "w2"], T0 + 60, running=False)
    assert {n["state"] for n in stopped["nodes"]} == {"disconnected"} and stopped["nodes_faulted"] == 0


def test_paused_is_in_the_status_the_table_and_the_progress_line():
    live = LiveStats(started=T0)
    view = live.view(T0 + 1, held=0, at_workers=0, in_flight={}, web=None, lag=0.0, run_pages=0, paused=True)
    st = build_status(_db(), view, ["w1"], T0 + 1, running=True)
    assert st["paused"] is True and "PAUSED" in status_text(st)
    # The store's flag, when it has one, is the fresher (the view on disk can be a few seconds old).
    assert build_status(_db(paused=False), view, ["w1"], T0 + 1, running=True)["paused"] is False
    running = live.view(T0 + 1, held=0, at_workers=0, in_flight={}, web=None, lag=0.0, run_pages=0)
    assert build_status(_db(), running, ["w1"], T0 + 1, running=True)["paused"] is False
    assert "PAUSED" not in status_text(build_status(_db(), running, ["w1"], T0 + 1, running=True))
    # A stopped crawl: what its store says (it starts paused).
    assert build_status(_db(paused=True), None, ["w1"], T0, running=False)["paused"] is True
    assert build_status(_db(), view, ["w1"], T0, running=False)["paused"] is False
    line = progress_line(30, 0, 0, Counter(), queued=50, held=0, at_workers=0, connected=1, nodes=1,
                         shrink=None, paused=True)
    assert line.startswith("progress (paused): ") and "paused: no work is handed out" in line
    assert "not shrinking" not in line


def test_the_table_names_the_limit_that_ended_the_crawl():
    st = build_status(_db(limit="crawl.max_bytes"), None, ["w1"], T0, running=False)
    assert st["limit"] == "crawl.max_bytes" and "crawl reached its limit: crawl.max_bytes" in status_text(st)
    assert "limit" not in status_text(build_status(_db(), None, ["w1"], T0, running=False))


def test_the_chart_ends_with_the_last_whole_minute():
    live = LiveStats(started=T0)
    start = (T0 // CHART_BUCKET) * CHART_BUCKET
    for minute in range(3):
        live.report("w1", (p.Result(1, "u", p.DONE, 200),) * 60, [], start + minute * 60 + 1)
    live.report("w1", (p.Result(1, "u", p.DONE, 200),) * 2, [], start + 180 + 1)   # 2 s into the 4th minute
    series, end = live.chart_view(start + 182)
    assert end == start + 180 and series[-3:] == [60, 60, 60] and len(series) == 60
    # Once that minute is over, it is drawn whole.
    series, end = live.chart_view(start + 240.5)
    assert end == start + 240 and series[-1] == 2


def test_recent_errors_survive_a_restart():
    live = LiveStats(started=T0)
    live.report("w1", (p.Result(1, "http://a/1", p.ERROR, 404, error="HTTP 404"),
                       p.Result(2, "http://a/2", p.RETRY, error="ConnectTimeout: timed out")), [], T0)
    saved = json.loads(json.dumps(live.figures()))      # as the meta table holds it
    again = LiveStats(started=T0 + 100)
    again.load_figures(saved)
    assert list(again.recent_errors) == list(live.recent_errors) and len(again.recent_errors) == 2
    # Bounded however much was saved.
    again.load_figures({"recent_errors": [{"url": f"u{i}"} for i in range(500)]})
    assert len(again.recent_errors) == RECENT
