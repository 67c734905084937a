import struct
import tracemalloc

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawler import protocol as p
from crawler.items import AudioItem, RequestIdentity

NONCE = bytes(range(32))
ITEM = AudioItem(url="http://a/x.mp3", page="http://a/", title="Tí", artist="歌手", duration=3.5, bitrate=128,
                 identity=RequestIdentity(user_agent="UA", headers=(("Referer", "http://a/"),),
                                          cookies=(("kg_mid", "1"),)), extra={"k": [1, 2]})

MESSAGES = [
    p.Hello("w1", p.PROTOCOL_VERSION, 64, NONCE),
    p.Challenge(NONCE),
    p.Auth(b"\x02" * 32),
    p.Welcome(b"\x01" * 32, 5.0, (r"^https?://www\.kugou\.com/song/",), 4 * 1024 * 1024),
    p.Welcome(b"\x01" * 32, 0.5, (), 1024, max_depth=3),
    p.Refused("bad secret"),
    p.Assign((p.Task(1, "http://a/", 0, None), p.Task(2, "http://a/b", 3, "http://a/"),
              p.Task(3, "http://a/c", 3, "http://a/", after=2))),
    p.Assign(()),
    p.Report((p.Result(1, "http://a/", p.DONE, 200, "http://a/", "text/html", 123, None,
                       ("http://a/1", "http://a/2"), (ITEM,)),
              p.Result(2, "http://a/b", p.RETRY, None, None, None, None, "timeout"))),
    p.Heartbeat(1234.5),
    p.Credit(17),
    p.Shutdown("crawl finished"),
    p.Fetched((p.PageFetch(1, 200, None, 0.05), p.PageFetch(2, 429, 2.0, 0.001), p.PageFetch(3))),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip_whole(msg):
    d = p.FrameDecoder()
    d.feed(p.encode(msg))
    assert d.messages() == [msg]
    assert d.buffered == 0


def test_round_trip_one_byte_at_a_time():
    stream = b"".join(p.encode(m) for m in MESSAGES)
    d = p.FrameDecoder()
    got = []
    for i in range(len(stream)):
        d.feed(stream[i:i + 1])
        got.extend(d.messages())
    assert got == MESSAGES


def test_many_frames_in_one_feed():
    d = p.FrameDecoder()
    d.feed(b"".join(p.encode(m) for m in MESSAGES) + p.encode(MESSAGES[0])[:3])
    assert d.messages() == MESSAGES
    assert d.buffered == 3


def test_oversized_length_refused_from_header_alone_without_allocating():
    d = p.FrameDecoder(max_frame=1024)
    tracemalloc.start()
    try:
        with pytest.raises(p.FrameTooLarge):
            d.feed(struct.pack(">I", 0xFFFFFFF0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    with pytest.raises(p.ProtocolError):
        d.feed(b"more")


def test_frame_exactly_at_limit_is_accepted():
    msg = p.Refused("x" * 100)
    frame = p.encode(msg)
    d = p.FrameDecoder(max_frame=len(frame) - 4)
    d.feed(frame)
    assert d.messages() == [msg]
    with pytest.raises(ValueError):  # our own misuse is not a ProtocolError
        p.encode(msg, max_frame=len(frame) - 5)


def _frame(obj) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


@pytest.mark.parametrize("obj", [
    [], {}, "hello", [99], [True], [1, "w"], [1, "w", 1, 1, b"short"], [1, 5, 1, 1, NONCE],
    [6, [[1, "u"]]], [6, [[-1, "u", 0, None, None]]], [6, [[1, "u", 0, None]]], [6, [[1, "u", 0, None, -2]]],
    [6, [[1, "u", 0, None, "2"]]], [7, [[1, "u", "bogus", None, None, None, None, None, [], []]]],
    [7, [[1, "u", "done", None, None, None, None, None, [1], []]]],
    [7, [[1, "u", "done", None, None, None, None, None, [], [{"url": 1}]]]],
    [7, [[1, "u", "done", None, None, None, None, None, [], [{"url": "a", "page": "b", "title": 3}]]]],
    [7, [[1, "u", "done", None, None, None, None, None, [], [{"url": "a", "page": "b", "identity": {"headers": [[1]]}}]]]],
    [9, -1], [9, 10**9], [8, "now"], [4, b"\x01" * 32, 1.0, [3], 1 << 20, None, [], []],
    [4, b"\x01" * 32, 1.0, [], 10, None, [], []], [4, b"\x01" * 32, 1.0, [], 1 << 20, None, [1], []],
    [2, NONCE, b"\x01" * 32],
    [20, [[1, 200, None]]], [20, [[-1, 200, None, None]]], [20, [[1, 42, None, None]]],
    [20, [[1, 200, -1.0, None]]], [20, [[1, 200, None, float("nan")]]], [20, [[1, 200, float("inf"), None]]],
    [20, [[1, "200", None, None]]], [20, [[1, 200, None, "fast"]]], [20, {}],
], ids=repr)
def test_malformed_messages_raise_protocol_error(obj):
    d = p.FrameDecoder()
    d.feed(_frame(obj))
    with pytest.raises(p.ProtocolError):
        d.messages()


def test_undecodable_payload():
    d = p.FrameDecoder()
    d.feed(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
    with pytest.raises(p.ProtocolError):
        d.next_message()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_never_raises_anything_but_protocol_error(data):
    d = p.FrameDecoder(max_frame=4096)
    try:
        d.feed(data)
        d.messages()
    except p.ProtocolError:
        pass


def test_handshake_proofs_bind_both_nonces_and_the_id():
    secret = b"s3cret"
    wn, mn = p.new_nonce(), p.new_nonce()
    assert wn != mn and len(wn) == p.NONCE_SIZE
    hello = p.Hello("w1", p.PROTOCOL_VERSION, 8, wn)
    mp = p.master_proof(secret, hello, mn)
    assert p.check_proof(mp, p.master_proof(secret, hello, mn))
    assert not p.check_proof(mp, p.master_proof(b"other", hello, mn))
    assert not p.check_proof(mp, p.master_proof(secret, hello, wn))
    wp = p.worker_proof(secret, hello, mn)
    assert not p.check_proof(wp, p.worker_proof(secret, p.Hello("w2", p.PROTOCOL_VERSION, 8, wn), mn))
    assert not p.check_proof(wp, p.worker_proof(secret, p.Hello("w1", p.PROTOCOL_VERSION, 9, wn), mn))
    assert not p.check_proof(wp, mp)


def test_unknown_audio_keys_are_ignored_for_forward_compatibility():
    d = p.FrameDecoder()
    d.feed(_frame([7, [[1, "u", "done", None, None, None, None, None, [], [{"url": "a", "page": "b", "new": 1}], 0]]]))
    (msg,) = d.messages()
    assert msg.results[0].audio[0] == AudioItem(url="a", page="b")
