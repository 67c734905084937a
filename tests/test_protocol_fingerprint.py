"""An audio item's acoustic fingerprint and a worker's fingerprint backlog on the wire: they round-trip, a peer's
frame without them still reads (None, 0), and one past the limits is refused like any over-limit field."""

import json
import struct

import msgpack
import pytest

from crawler import protocol as p
from crawler.identify import MAX_FINGERPRINT_BYTES
from crawler.items import AUDIO_FIELD_KINDS, AudioItem
from crawler.master.store_audio import AUDIO_COLUMNS
from crawler.worker.ledger import outcome_within_limits
from crawler.worker.server import _outcome_frames, _report_frames, _wire_size

FP = bytes(range(256)) * 64      # 16 KiB: a plausible fingerprint, every byte value in it
ITEM = AudioItem(url="http://a/x.mp3", page="http://a/", sha256="ab" * 32, size=123, path="audio/ab/x.mp3",
                 fingerprint=FP)


def _wire(msg: p.Message) -> p.Message:
    d = p.FrameDecoder()
    d.feed(p.encode(msg))
    (out,) = d.messages()
    return out


def _frame(obj) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


def _item_map(**change):
    d = {"url": "http://a/x.mp3", "page": "http://a/", "status": "ok"}
    d.update(change)
    return d


@pytest.mark.parametrize("msg", [
    p.Report((p.Result(1, "http://a/", p.DONE, 200, audio=(ITEM,)),)),
    p.DownloadReport((("http://a/x.mp3", ITEM),)),
    p.DownloadWork((ITEM.replace(status="pending", fingerprint=None),)),
    p.Heartbeat(1.5, (1, 2), fingerprint_backlog=17),
], ids=lambda m: type(m).__name__)
def test_fingerprints_and_the_backlog_round_trip(msg):
    assert _wire(msg) == msg


def test_a_fingerprint_at_the_limit_is_accepted_and_one_byte_more_is_refused():
    at = ITEM.replace(fingerprint=b"\x01" * MAX_FINGERPRINT_BYTES)
    assert _wire(p.DownloadReport((("http://a/x.mp3", at),))) == p.DownloadReport((("http://a/x.mp3", at),))
    over = [24, [["http://a/x.mp3", _item_map(fingerprint=b"\x01" * (MAX_FINGERPRINT_BYTES + 1))]]]
    d = p.FrameDecoder()
    d.feed(_frame(over))
    with pytest.raises(p.ProtocolError, match="fingerprint"):
        d.messages()


@pytest.mark.parametrize("value", ["text", 5, [1, 2]])
def test_a_fingerprint_that_is_not_bytes_is_refused(value):
    d = p.FrameDecoder()
    d.feed(_frame([7, [[1, "http://a/", "done", 200, None, None, None, None, [], [_item_map(fingerprint=value)],
                        0]]]))
    with pytest.raises(p.ProtocolError, match="fingerprint"):
        d.messages()


def test_an_older_peers_items_and_heartbeats_read_without_them():
    d = p.FrameDecoder()
    d.feed(_frame([24, [["http://a/x.mp3", _item_map(sha256="ab" * 32)]]]))
    d.feed(_frame([8, 1.5, [3]]))
    report, beat = d.messages()
    assert report.outcomes[0][1].fingerprint is None
    assert beat == p.Heartbeat(1.5, (3,)) and beat.fingerprint_backlog == 0


def test_a_negative_backlog_is_refused():
    d = p.FrameDecoder()
    d.feed(_frame([8, 1.5, [], -1]))
    with pytest.raises(p.ProtocolError, match="fingerprint_backlog"):
        d.messages()


def test_the_fingerprint_is_no_catalogue_column_nor_in_a_catalogue_row():
    assert AUDIO_FIELD_KINDS["fingerprint"] == "bytes"
    assert "fingerprint" not in AUDIO_COLUMNS
    assert "fingerprint" not in ITEM.catalogue_row()
    # The plain form (what the master keeps of a pending item, as JSON) has it as hex: any peer's item dumps.
    assert json.loads(json.dumps(ITEM.to_wire()))["fingerprint"] == FP.hex()
    assert AudioItem.from_wire(json.loads(json.dumps(ITEM.to_wire()))) == ITEM


def test_report_batches_count_fingerprints_and_a_frame_too_small_for_one_drops_it():
    big = ITEM.replace(fingerprint=b"\x02" * MAX_FINGERPRINT_BYTES)
    r = p.Result(1, "http://a/", p.DONE, 200, audio=(big,))
    assert _wire_size(r) > MAX_FINGERPRINT_BYTES
    # The master's frame limit may be below a fingerprint's size: the item goes without it, not the result.
    small = 256 * 1024
    d = p.FrameDecoder(small)
    d.feed(_report_frames([r], small))
    (msg,) = d.messages()
    (got,) = msg.results[0].audio
    assert msg.results[0].status == p.DONE and got.fingerprint is None and got.sha256 == big.sha256
    d.feed(_outcome_frames([("http://a/x.mp3", big), ("http://a/y.mp3", ITEM)], small))
    assert [o.fingerprint for msg in d.messages() for _, o in msg.outcomes] == [None, FP]


def test_an_outcome_within_limits_keeps_its_fingerprint():
    assert outcome_within_limits("http://a/x.mp3", ITEM) is ITEM


def test_the_master_shows_each_workers_fingerprint_backlog_from_its_heartbeats(tmp_path):
    from crawler.master.live import build_status
    from crawler.master.observe import Observer

    obs = Observer(lambda: None, clock=lambda: 100.0, nodes=("w1", "w2"), data_dir=tmp_path, log_interval=30)
    obs.joined("w1", 100.0)
    obs.heartbeat("w1", _wire(p.Heartbeat(100.0, (), 42)))
    view = obs.live.view(101.0, held=0, at_workers=0, in_flight={}, web=None, lag=0.0, run_pages=0)
    assert view["nodes"]["w1"]["fingerprint_backlog"] == 42
    db = {"states": {}, "nodes": {}, "figures": {}}
    st = build_status(db, view, ["w1", "w2"], 101.0, running=True)
    assert [(n["node"], n["fingerprint_backlog"]) for n in st["nodes"]] == [("w1", 42), ("w2", 0)]
    assert b'crawler_fingerprint_backlog{node="w1"} 42.0' in obs.metrics.render()
