"""The store's cheaper ways of writing the same things: list parameters as JSON by msgspec, columns no row of a
batch sets written as NULL, a catalogue row's small maps encoded once, a node's figures summed until the commit.
Each must give what the plain way gave."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from crawler.master import store_audio as sa
from crawler.master.backend import json_array
from crawler.master.store import MasterStore
from crawler.master.store_core import null_columns


def test_json_array_reads_as_json_dumps() -> None:
    cases = [[1, 2, 3], [], [("a", "é"), ("x\"", "\\")], ["\x00", "\u2028"], [1 << 70], ["\ud800"], [1.5, None, True]]
    for values in cases:
        assert json.loads(json_array(values)) == json.loads(json.dumps(values))


def test_json_text_is_json_dumps_sorted() -> None:
    rng = random.Random(5)
    keys = ["a", "b", "title", "1", "true", "é"]
    maps: list[dict] = [{True: "x"}, {1: "x"}, {"1": "x"}, {"true": "x"}, {"a": [1, 2]}, {"a": {"b": "c"}},
                        {"a": 1.5, "b": None}, {"\x00": "\x00"}, {str(i): "v" for i in range(20)}]
    for _ in range(500):
        values = ["x", "y", "data", "jsonld", 1, True]
        maps.append({rng.choice(keys): rng.choice(values) for _ in range(rng.randint(1, 4))})
    for m in maps + maps:        # twice: the second time from the texts kept
        assert sa._json_text(m) == json.dumps(m, sort_keys=True, ensure_ascii=False)
    with pytest.raises(TypeError):
        sa._json_text({"a": object()})
    assert sa._json_text({"a": "b"}) == '{"a": "b"}'     # usable after a failure


def test_null_columns() -> None:
    rows = [(1, None, "x", None), (2, None, None, None)]
    assert null_columns(rows) == {1, 3}
    assert null_columns(rows, 2) == {3}
    assert null_columns([(1, 2)]) == frozenset()


def test_node_figures_sum_until_the_commit(tmp_path: Path) -> None:
    store = MasterStore(tmp_path / "m.db")
    store.note_node("w1", bytes=10, links=2)
    store.note_node("w1", bytes=5)
    assert store.status()["nodes"]["w1"]["bytes"] == 15     # seen before the commit
    with pytest.raises(RuntimeError), store.core.atomic():
        store.note_node("w1", bytes=100)
        raise RuntimeError("the unit fails")
    store.note_node("w2", faults=1)
    store.commit()
    store.close()
    again = MasterStore.open_readonly(tmp_path / "m.db")
    try:
        nodes = again.status()["nodes"]
        assert (nodes["w1"]["bytes"], nodes["w1"]["links"], nodes["w2"]["faults"]) == (15, 2, 1)
    finally:
        again.close()
