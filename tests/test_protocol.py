import math
import re
import struct
import tracemalloc

import msgpack
import msgspec.inspect as mi
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawler import protocol as p
from crawler.items import AudioItem, LinkMeta, RequestIdentity

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
    p.Refused("node id 'w1' is already connected", p.DUPLICATE_ID),
    p.Assign((p.Task(1, "http://a/", 0, None), p.Task(2, "http://a/b", 3, "http://a/"),
              p.Task(3, "http://a/c", 3, "http://a/", after=2))),
    p.Assign(()),
    p.Report((p.Result(1, "http://a/", p.DONE, 200, "http://a/", "text/html", 123, None,
                       ("http://a/1", "http://a/2"), (ITEM,)),
              p.Result(2, "http://a/b", p.RETRY, None, None, None, None, "timeout"))),
    p.Report((p.Result(3, "http://a/sitemap.xml", p.DONE, 200, None, "application/xml", 9, None, ("http://a/1",),
                       (), lastmod=(("http://a/1", 1700000000.0),)),)),
    p.Heartbeat(1234.5),
    p.Heartbeat(1234.5, (3, 17, 2**40)),
    p.Report((p.Result(4, "http://a/song/1.html", p.DONE, 200, None, "text/html", 9, None, (), (),
                       refs=("http://a/playlists/1.m3u", "http://a/stream/1")),)),
    p.Credit(17),
    p.DownloadAsk(((1, "http://cdn.a/1.mp3"), (2, "http://cdn.a/2.mp3"))),
    p.DownloadGrant((p.Grant(1, p.GRANT_GO), p.Grant(2, p.GRANT_COPY, "w2", "ab" * 32, 123, "audio/ab/x.mp3"))),
    p.DownloadDone((p.DownloadEnd(1, "ab" * 32, 123, "audio/ab/x.mp3"), p.DownloadEnd(2))),
    p.DownloadReport((("http://a/1.mp3", ITEM.replace(sha256="ab" * 32, size=123, path="audio/ab/x.mp3")),
                      ("http://a/2.mp3", ITEM.replace(status="failed", reason="HTTP 404")))),
    p.DownloadWork((ITEM.replace(status="pending"),)),
    p.Shutdown("crawl finished"),
    p.Fetched((p.PageFetch(1, 200, None, 0.05), p.PageFetch(2, 429, 2.0, 0.001), p.PageFetch(3))),
    p.Fault("No space left on device", (3, 4, 5)),
    p.Fault("under min_free_bytes"),
    p.SiteWait("members.example", "login failed: HTTP 401", 4.0, (7, 8)),
    p.SiteWait("*.example.org", "no success text", 300.0),
    p.EvidenceAsk(7, ("http://a/song/1", "ab" * 32)),
    p.EvidenceAsk(8, ("http://a/1.mp3",), records=False),
    p.EvidenceRecords(7, p.EVIDENCE_WARC, b"\x1f\x8b" + bytes(100)),
    p.EvidenceRecords(7, p.EVIDENCE_CHAINS, b"[]", last=True),
    p.EvidenceRecords(9, p.EVIDENCE_CHAINS, last=True, error="another evidence request is being answered"),
]


def test_a_refusal_without_a_code_keeps_the_version_2_frame_so_any_worker_can_read_why():
    assert p.encode(p.Refused("protocol version 9 not supported")) == \
        p.encode(p.Refused("protocol version 9 not supported", ""))
    frame = p.encode(p.Refused("x"))
    assert msgpack.unpackb(frame[4:]) == [p.Refused.TYPE, "x"]


def test_a_download_outcome_is_ok_or_failed_and_download_work_names_an_address():
    item = ITEM.to_wire()
    for status in ("ok", "failed"):
        p.decode_payload(msgpack.packb([p.DownloadReport.TYPE, [["http://a/1.mp3", {**item, "status": status}]]]))
    for bad in ([["http://a/1.mp3", {**item, "status": "pending"}]],    # not an outcome
                [["http://a/1.mp3"]], [[7, item]], [["http://a/1.mp3", {**item, "duration": float("nan")}]]):
        with pytest.raises(p.ProtocolError):
            p.decode_payload(msgpack.packb([p.DownloadReport.TYPE, bad]))
    with pytest.raises(p.ProtocolError):
        p.decode_payload(msgpack.packb([p.DownloadWork.TYPE, [{**item, "url": ""}]]))
    # Each side receives only its own: a worker does not hand the master work, nor the master report outcomes.
    assert p.DownloadReport in p.MASTER_RECEIVES[p.State.OPEN] and p.DownloadReport not in p.WORKER_RECEIVES[p.State.OPEN]
    assert p.DownloadWork in p.WORKER_RECEIVES[p.State.OPEN] and p.DownloadWork not in p.MASTER_RECEIVES[p.State.OPEN]


def test_a_fault_with_bad_leases_is_a_protocol_error():
    with pytest.raises(p.ProtocolError, match=r"Fault.leases\[0\]: outside 0\.\."):
        p.decode_payload(msgpack.packb([p.Fault.TYPE, "full", [-1]]))
    with pytest.raises(p.ProtocolError, match="Fault.leases"):
        p.decode_payload(msgpack.packb([p.Fault.TYPE, "full", 3]))
    with pytest.raises(p.ProtocolError, match="Fault: expected 1 to 2 fields, got 3"):
        p.decode_payload(msgpack.packb([p.Fault.TYPE, "full", [], []]))
    with pytest.raises(p.ProtocolError, match="Fault: expected 1 to 2 fields, got 0"):
        p.decode_payload(msgpack.packb([p.Fault.TYPE]))
    # Version 9 leaves out trailing fields at their defaults: a Fault without leases hands none back.
    assert p.decode_payload(msgpack.packb([p.Fault.TYPE, "full"])) == p.Fault("full")


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
    [6, [[1, "u"]]], [6, [[-1, "u", 0, None, None]]], [6, [[1, "u", 0, None, None, None, None, None]]],
    [6, [[1, "u", 0, None, -2]]],
    [6, [[1, "u", 0, None, "2"]]], [7, [[1, "u", "bogus", None, None, None, None, None, [], [], 0]]],
    [7, [[1, "u", "done", None, None, None, None, None, [1], [], 0]]],
    [7, [[1, "u", "done", None, None, None, None, None, [], [{"url": 1}], 0]]],
    [7, [[1, "u", "done", None, None, None, None, None, [], [{"url": "a", "page": "b", "title": 3}], 0]]],
    [7, [[1, "u", "done", None, None, None, None, None, [], [{"url": "a", "page": "b", "identity": {"headers": [[1]]}}]]]],
    [9, -1], [9, 10**9], [8, "now"], [4, b"\x01" * 32, 1.0, [3], 1 << 20, None, [], []],
    [4, b"\x01" * 32, 1.0, [], 10, None, [], []], [4, b"\x01" * 32, 1.0, [], 1 << 20, None, [1], []],
    [2, NONCE, b"\x01" * 32],
    [20, [[1, 200, None, None, None]]], [20, [[]]], [20, [[-1, 200, None, None]]], [20, [[1, 42, None, None]]],
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


# --------------------------------------------------------------------------------------------- handshake
SECRET = b"0y5v0U6TurQfutWXlbEjg8Uc6b8/atkB5d/V5bgjrR8="


def _wire(msg: p.Message) -> p.Message:
    """Through bytes and back, as the peer would see it."""
    d = p.FrameDecoder()
    d.feed(p.encode(msg))
    (out,) = d.messages()
    return out


def test_handshake_worker_proves_first_and_both_sides_open():
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    assert master.recv_limit == p.PRE_AUTH_MAX_FRAME
    challenge = _wire(master.receive_hello(_wire(worker.hello())))
    assert challenge == p.Challenge(master.nonce)           # a nonce only: nothing computed from the secret
    hello = master.receive_auth(_wire(worker.receive_challenge(challenge)))
    assert hello.worker_id == "w1" and hello.capacity == 8 and master.state is p.State.AUTHENTICATED
    welcome = worker.receive_welcome(_wire(master.welcome(2.0, ("x",), 4096, 3, sort_query=True,
                                                          drop_params=("utm_source", "ref"))))
    assert (welcome.heartbeat_interval, welcome.keep_fragment, welcome.max_frame, welcome.max_depth) == \
        (2.0, ("x",), 4096, 3)
    assert (welcome.sort_query, welcome.drop_params) == (True, ("utm_source", "ref"))
    assert master.state is worker.state is p.State.OPEN
    assert master.recv_limit is None and worker.recv_limit is None
    assert master.receive(p.Heartbeat(1.0)) == p.Heartbeat(1.0)
    assert worker.receive(p.Assign(())) == p.Assign(())


def test_wrong_secret_is_refused_and_gets_no_proof():
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(b"another secret, quite as long as the first one", "w1", 8)
    challenge = master.receive_hello(worker.hello())
    with pytest.raises(p.HandshakeFailed) as e:
        master.receive_auth(worker.receive_challenge(challenge))
    assert e.value.reply == p.Refused("authentication failed", p.AUTH_FAILED)
    assert master.state is p.State.CLOSED
    with pytest.raises(p.LocalProtocolError):
        master.welcome(1.0)                # no Welcome (and so no proof) after a failed MAC
    with pytest.raises(p.PeerRefused, match="authentication failed"):
        worker.receive_welcome(e.value.reply)


def test_replayed_hello_and_auth_fail_against_a_fresh_nonce():
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    hello = worker.hello()
    first = p.MasterHandshake(SECRET)
    auth = worker.receive_challenge(first.receive_hello(hello))
    first.receive_auth(auth)
    replay = p.MasterHandshake(SECRET)
    replay.receive_hello(hello)
    with pytest.raises(p.HandshakeFailed):
        replay.receive_auth(auth)


def test_replayed_welcome_fails_against_a_fresh_worker_nonce():
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    master = p.MasterHandshake(SECRET)
    master.receive_auth(worker.receive_challenge(master.receive_hello(worker.hello())))
    welcome = master.welcome(1.0)
    again = p.WorkerHandshake(SECRET, "w1", 8)
    again.hello()
    again.receive_challenge(p.Challenge(master.nonce))       # an impostor replays the same nonce and Welcome
    with pytest.raises(p.ProtocolError, match="could not prove"):
        again.receive_welcome(welcome)


@pytest.mark.parametrize("change", [
    {"proxies": ("http://127.0.0.9:8080",)},                               # traffic sent through an attacker
    {"sites": (p.SiteWire("a.example", headers=(("X-Leak", "1"),)),)},
    {"sites": ()},                                                          # a site's policy dropped
    {"max_depth": 1},
], ids=["proxies", "site headers", "sites dropped", "max_depth"])
def test_the_masters_proof_covers_every_setting_of_its_welcome(change):
    site = p.SiteWire("a.example", proxies=("socks5://127.0.0.1:1080",),
                      login=p.LoginWire("http://a.example/login", (("user", "u"),), "Log out"))
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    master = p.MasterHandshake(SECRET)
    master.receive_auth(worker.receive_challenge(master.receive_hello(worker.hello())))
    welcome = master.welcome(1.0, proxies=("http://127.0.0.1:3128",), sites=(site,))
    tampered = p.decode_payload(p.encode(msgspec.structs.replace(welcome, **change))[p.HEADER_SIZE:])
    with pytest.raises(p.ProtocolError, match="could not prove"):
        worker.receive_welcome(tampered)
    worker = p.WorkerHandshake(SECRET, "w1", 8)                   # the Welcome as sent checks out, settings whole
    master = p.MasterHandshake(SECRET)
    master.receive_auth(worker.receive_challenge(master.receive_hello(worker.hello())))
    welcome = master.welcome(1.0, proxies=("http://127.0.0.1:3128",), sites=(site,))
    got = worker.receive_welcome(p.decode_payload(p.encode(welcome)[p.HEADER_SIZE:]))
    assert got.proxies == ("http://127.0.0.1:3128",) and got.sites == (site,)


def test_other_protocol_version_is_refused_with_a_reason():
    master = p.MasterHandshake(SECRET)
    with pytest.raises(p.HandshakeFailed) as e:
        master.receive_hello(p.Hello("w1", p.PROTOCOL_VERSION - 1, 8, NONCE))
    assert isinstance(e.value.reply, p.Refused) and "protocol version" in e.value.reply.reason


@pytest.mark.parametrize("msg", [p.Auth(b"\0" * 32), p.Report(()), p.Credit(1), p.Heartbeat(0.0),
                                 p.Welcome(b"\0" * 32, 1.0)], ids=lambda m: type(m).__name__)
def test_master_refuses_anything_but_hello_first(msg):
    master = p.MasterHandshake(SECRET)
    with pytest.raises(p.ProtocolError, match="unexpected"):
        master.receive_hello(msg)
    assert master.state is p.State.CLOSED


def test_session_messages_follow_the_table_of_legal_messages():
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    master.receive_auth(worker.receive_challenge(master.receive_hello(worker.hello())))
    with pytest.raises(p.ProtocolError):
        master.receive(p.Report(()))       # before the Welcome went out
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    master.receive_auth(worker.receive_challenge(master.receive_hello(worker.hello())))
    worker.receive_welcome(master.welcome(1.0))
    for state_table, side, bad in ((p.MASTER_RECEIVES, master, p.Hello("w1", 3, 1, NONCE)),
                                   (p.WORKER_RECEIVES, worker, p.Challenge(NONCE))):
        for legal in state_table[p.State.OPEN]:
            assert legal in (p.Report, p.Credit, p.Heartbeat, p.Fetched, p.Fault, p.Assign, p.Shutdown,
                             p.DownloadAsk, p.DownloadGrant, p.DownloadDone, p.DownloadReport, p.DownloadWork,
                             p.FragmentRules, p.EvidenceAsk, p.EvidenceRecords, p.SiteWait)
        with pytest.raises(p.ProtocolError):
            side.receive(bad)                # a second handshake inside the session
        assert side.state is p.State.CLOSED


def test_misuse_of_the_api_is_a_local_error_not_the_peers():
    master = p.MasterHandshake(SECRET)
    with pytest.raises(p.LocalProtocolError):
        master.welcome(1.0)                  # before any Hello
    with pytest.raises(p.LocalProtocolError):
        master.receive_auth(p.Auth(b"\0" * 32))
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    worker.hello()
    with pytest.raises(p.LocalProtocolError):
        worker.hello()
    assert not issubclass(p.LocalProtocolError, p.ProtocolError)


# --------------------------------------------------------------------------------------------- limits
def _result(**change):
    r = [1, "http://a/", "done", 200, None, None, None, None, [], [], 0]
    for k, v in change.items():
        r[["lease", "url", "status", "http_status", "final_url", "content_type", "size", "error", "links",
           "audio", "cut"].index(k)] = v
    return [7, [r]]


def _result_refs(refs):
    return [7, [[1, "http://a/", "done", 200, None, None, None, None, [], [], 0, [], None, refs]]]


def _uint64_frame(value: int) -> bytes:
    # msgpack cannot carry 2**70 at all; the largest integer it can is 2**64 - 1, as uint64 (0xcf).
    payload = msgpack.packb([7, [[1, "http://a/", "done", 200, None, None, None, None, [], [], 0]]])
    payload = payload.replace(b"\xcc\xc8", b"\xcf" + struct.pack(">Q", value))   # http_status 200 -> value
    return struct.pack(">I", len(payload)) + payload


@pytest.mark.parametrize("value", [2**64 - 1, 2**63])
def test_integers_past_signed_64_bits_are_refused(value):
    d = p.FrameDecoder()
    d.feed(_uint64_frame(value))
    with pytest.raises(p.ProtocolError, match="http_status"):
        d.messages()


@pytest.mark.parametrize("obj, field", [
    (_result(size=2**63), "size"), (_result(size=-1), "size"), (_result(lease=-5), "lease"),
    (_result(http_status=1000), "http_status"), (_result(cut=-1), "cut"), (_result(cut=2**40), "cut"),
    (_result(audio=[{"url": "a", "page": "b", "duration": float("nan")}]), "duration"),
    (_result(audio=[{"url": "a", "page": "b", "bitrate": float("inf")}]), "bitrate"),
    (_result(audio=[{"url": "a", "page": "b", "size": -1.0}]), "size"),
    (_result(audio=[{"url": "a", "page": "b", "extra": {"x": [1, {"y": float("-inf")}]}}]), "extra"),
    (_result(audio=[{"url": "a", "page": "b", "extra": {"x": 2**63}}]), "extra"),
    (_result(audio=[{"url": "a", "page": "b", "extra": {"x": b"raw"}}]), "extra"),
    (_result(audio=[{"url": "a", "page": "b", "extra": {"x": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]}}]), "extra"),
    (_result(url="http://a/" + "x" * p.MAX_URL), "url"),
    (_result(links=["http://a/" + "x" * p.MAX_URL]), "links"),
    (_result(content_type="t" * (p.MAX_NAME + 1)), "content_type"),
    ([8, float("nan"), []], "sent_at"), ([8, float("inf"), []], "sent_at"), ([8, 1.0, [-1]], "lease"),
    ([8, 1.0, ["x"]], "lease"), ([8, 1.0, 5], "leases"),
    ([21, [[-1, "http://a/1.mp3"]]], "ticket"), ([21, [[1, 2]]], r"asks\[0\]\.url"), ([21, [[1]]], "ask"),
    ([22, [[1, "steal", None, None, None, None]]], "verdict"), ([22, [[1, "copy", None, None, -5, None]]], "size"),
    ([23, [[1, None, None, "x" * (p.MAX_NAME + 1)]]], r"ends\[0\]\.path"),
    (_result_refs(["http://a/" + "x" * p.MAX_URL]), "refs"), (_result_refs([3]), "refs"),
    ([4, b"\1" * 32, float("nan"), [], 4096, None, [], []], "heartbeat_interval"),
    ([1, "w" * (p.MAX_WORKER_ID + 1), p.PROTOCOL_VERSION, 1, NONCE], "worker_id"),
    ([1, "w", p.PROTOCOL_VERSION, p.MAX_CAPACITY + 1, NONCE], "capacity"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_values_out_of_range_are_refused(obj, field):
    d = p.FrameDecoder()
    d.feed(_frame(obj))
    with pytest.raises(p.ProtocolError, match=field):
        d.messages()


@pytest.mark.parametrize("payload", [
    msgpack.packb([5, "x" * (p.MAX_TEXT + 1)]),                    # a string past the decoder's limit
    msgpack.packb([5, b"x" * 2000]),                               # bytes past the decoder's limit
    msgpack.packb([7, [{str(i): i for i in range(2000)}]]),        # a map past the decoder's limit
    msgpack.packb([8, msgpack.ExtType(1, b"12345678")]),           # ext types are refused
    b"\x91" * 5000 + b"\x90",                                      # nesting past msgpack's stack
], ids=["str", "bin", "map", "ext", "nesting"])
def test_decoding_limits(payload):
    d = p.FrameDecoder()
    d.feed(struct.pack(">I", len(payload)) + payload)
    with pytest.raises(p.ProtocolError, match="undecodable"):
        d.messages()


def test_values_at_their_limits_are_accepted():
    r = p.Result(2**63 - 1, "http://a/" + "x" * (p.MAX_URL - 9), p.DONE, 999, size=2**63 - 1,
                 audio=(AudioItem(url="u", page="p", duration=0.0, extra={"n": -(2**63), "f": 1e308}),))
    assert _wire(p.Report((r,))) == p.Report((r,))


def test_pre_auth_limit_fits_the_largest_hello_and_refuses_more_from_the_header():
    biggest = p.encode(p.Hello("語" * p.MAX_WORKER_ID, p.PROTOCOL_VERSION, p.MAX_CAPACITY, NONCE))
    d = p.FrameDecoder(p.PRE_AUTH_MAX_FRAME)
    d.feed(biggest)
    assert isinstance(d.next_message(), p.Hello)
    with pytest.raises(p.FrameTooLarge):
        d.feed(struct.pack(">I", p.PRE_AUTH_MAX_FRAME + 1))


def test_a_result_without_sitemap_dates_encodes_as_before_and_bad_dates_are_refused():
    plain = p.Result(1, "http://a/", p.DONE, 200, None, None, None, None, ("http://a/1",))
    assert plain.to_wire() == [1, "http://a/", "done", 200, None, None, None, None, ["http://a/1"], [], 0,
                               [], None, [], []]
    # A version-8 result (its trailing fields left out) reads as before.
    assert p.Result.from_wire(plain.to_wire()[:11]) == plain
    wire = plain.to_wire()[:11] + [[["http://a/1", "yesterday"]]]
    with pytest.raises(p.ProtocolError, match=r"lastmod\[0\]\.time"):
        p.Result.from_wire(wire)
    with pytest.raises(p.ProtocolError, match="3 to 15"):
        p.Result.from_wire(plain.to_wire() + [[]])
    # Audio references without sitemap dates: the dates go as an empty list, so the fields keep their places.
    with_refs = p.Result(1, "http://a/", p.DONE, refs=("http://a/1.m3u",))
    assert with_refs.to_wire()[11:] == [[], None, ["http://a/1.m3u"], []]
    assert p.Result.from_wire(with_refs.to_wire()) == with_refs


def test_validators_travel_both_ways_and_are_checked():
    task = p.Task(7, "http://a/", 1, None, None, ('"v1"', "Wed, 02 Dec 2026 10:00:00 GMT"))
    assert p.decode_payload(p.encode(p.Assign((task, p.Task(8, "http://a/2", 1))))[4:]) == p.Assign(
        (task, p.Task(8, "http://a/2", 1)))
    assert p.Assign((p.Task(8, "http://a/2", 1),)).fields() == [[[8, "http://a/2", 1, None, None, None, None]]]
    with pytest.raises(p.ProtocolError, match=r"tasks\[0\]\.validators\.etag"):
        p.Assign.from_fields([[[1, "http://a/", 0, None, None, [5, None]]]])
    r = p.Result(1, "http://a/", p.DONE, 200, validators=('"v1"', None, -(1 << 63)))
    assert p.Result.from_wire(r.to_wire()) == r
    assert p.Result.from_wire(p.Result(1, "http://a/", p.DONE, 304, validators=(None, None, None)).to_wire()
                              ).validators == (None, None, None)
    for bad in (["x", None], [None, None, 1 << 63], [None, None, "1"]):
        wire = p.Result(1, "http://a/", p.DONE).to_wire()
        wire[12] = bad
        with pytest.raises(p.ProtocolError, match="validators"):
            p.Result.from_wire(wire)


@pytest.mark.parametrize("key, value", [("meta_source", "class"), ("file_tags", [1]), ("codec", 3),
                                        ("published", 1.5)])
def test_new_audio_fields_are_type_checked(key, value):
    wire = ITEM.to_wire()
    wire[key] = value
    with pytest.raises(p.ProtocolError, match=rf"audio\[0\]\.{key}"):
        p.Result.from_wire([1, "http://a/", p.DONE, None, None, None, None, None, [], [wire], 0])


# --------------------------------------------------------------------------------------------- every declared limit
# Each limit a message type declares (msgspec.Meta on its fields and on the audio item's), found by walking the
# types themselves, so a limit added later is tested too: a value at the limit is accepted, one past it is
# refused with a ProtocolError naming the field. Payloads are built with msgpack, independently of our encoder.
_PATTERN_VALUES = {r"^(done|error|retry)\Z": ("done", "finished"), r"^(go|copy)\Z": ("go", "steal"),
                   r"^(warc|chains)\Z": ("warc", "audio")}
_LIST_PAST_CAP = "\0list past its cap\0"      # replaced by an array header announcing one entry too many


def _unwrap(info):
    return info.type if isinstance(info, mi.Metadata) else info


def _valid(info):
    """The smallest value of this type that is valid, as plain msgpack data."""
    info = _unwrap(info)
    if isinstance(info, mi.UnionType):
        return None if mi.NoneType() in info.types else _valid(info.types[0])
    if isinstance(info, (mi.IntType, mi.FloatType)):
        zero = 0 if isinstance(info, mi.IntType) else 0.0
        return zero if (info.ge is None or info.ge <= zero) and (info.le is None or zero <= info.le) else info.ge
    if isinstance(info, mi.StrType):
        return _PATTERN_VALUES[info.pattern][0] if info.pattern else "w" * (info.min_length or 0)
    if isinstance(info, mi.BytesType):
        return b"\0" * (info.min_length or 0)
    if isinstance(info, (mi.VarTupleType, mi.ListType)):
        return []
    if isinstance(info, mi.TupleType):
        return [_valid(t) for t in info.item_types]
    if isinstance(info, mi.DictType):
        return {}
    if isinstance(info, mi.BoolType):
        return False
    if isinstance(info, mi.StructType) and info.array_like:
        return ([info.tag] if info.tag is not None else []) + [_valid(f.type) for f in info.fields]
    if isinstance(info, (mi.DataclassType, mi.StructType)):     # a map (an audio item, its identity)
        # An audio item with an address: a download must have one (DownloadWork).
        return {f.name: "u" if f.name == "url" else _valid(f.type) for f in info.fields if f.required}
    assert isinstance(info, (mi.AnyType, mi.NoneType)), info
    return None


def _limits(info, label, wrap):
    """(field label, the message with the field at its limit or None, the message with it one past the limit)."""
    info = _unwrap(info)
    if isinstance(info, mi.UnionType):
        for t in info.types:
            yield from _limits(t, label, wrap)
    elif isinstance(info, (mi.IntType, mi.FloatType)):
        step = (lambda v, d: v + d) if isinstance(info, mi.IntType) else \
            (lambda v, d: math.nextafter(v, math.copysign(math.inf, d)))
        if info.le is not None:
            yield label, wrap(info.le), wrap(step(info.le, 1))
        if info.ge is not None and step(info.ge, -1) >= p.INT64_MIN:    # msgpack cannot carry less than -2**63
            yield label, wrap(info.ge), wrap(step(info.ge, -1))
        if isinstance(info, mi.FloatType):
            yield label, None, wrap(math.nan)
    elif isinstance(info, (mi.StrType, mi.BytesType)):
        unit = "語" if isinstance(info, mi.StrType) else b"\1"       # characters, not bytes, for strings
        if info.max_length is not None:
            yield label, wrap(unit * info.max_length), wrap(unit * (info.max_length + 1))
        if info.min_length:
            yield label, wrap(unit * info.min_length), wrap(unit * (info.min_length - 1))
        if getattr(info, "pattern", None):
            good, bad = _PATTERN_VALUES[info.pattern]
            yield label, wrap(good), wrap(bad)
    elif isinstance(info, (mi.VarTupleType, mi.ListType)):
        assert info.max_length is not None, f"{label}: a list without a cap"
        yield label, None, wrap(_LIST_PAST_CAP)
        yield from _limits(info.item_type, f"{label}[0]", lambda x: wrap([x]))
    elif isinstance(info, mi.TupleType):
        for i, t in enumerate(info.item_types):
            title = t.extra_json_schema.get("title") if isinstance(t, mi.Metadata) and t.extra_json_schema else None
            if title is None and isinstance(_unwrap(t), mi.UnionType):
                title = next((u.extra_json_schema.get("title") for u in _unwrap(t).types
                              if isinstance(u, mi.Metadata) and u.extra_json_schema), None)
            base = _valid(info)
            yield from _limits(t, f"{label}.{title}" if title else f"{label}[{i}]",
                               lambda x, i=i, base=base: wrap([*base[:i], x, *base[i + 1:]]))
    elif isinstance(info, mi.DictType):
        assert info.max_length is not None, f"{label}: a map without a cap"
        value = _valid(info.value_type) if not isinstance(info.value_type, mi.AnyType) else 1
        yield label, wrap({f"k{i}": value for i in range(info.max_length)}), \
            wrap({f"k{i}": value for i in range(info.max_length + 1)})
    elif isinstance(info, mi.StructType) and info.array_like:
        base = _valid(info)
        first = 1 if info.tag is not None else 0
        for i, f in enumerate(info.fields, first):
            yield from _limits(f.type, f"{label}.{f.name}",
                               lambda x, i=i, base=base: wrap([*base[:i], x, *base[i + 1:]]))
    elif isinstance(info, (mi.DataclassType, mi.StructType)):
        base = _valid(info)
        for f in info.fields:
            yield from _limits(f.type, f"{label}.{f.name}", lambda x, f=f, base=base: wrap({**base, f.name: x}))


def _every_limit():
    for cls in p.MESSAGE_TYPES.values():
        yield from _limits(mi.type_info(cls), cls.__name__, lambda x: x)


LIMITS = list(_every_limit())


def _payload(obj) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    marker = msgpack.packb(_LIST_PAST_CAP)
    if marker in payload:     # the decoder refuses from the array's header alone: nothing after it is needed
        payload = payload[:payload.index(marker)] + b"\xdd" + struct.pack(">I", p.MAX_ITEMS + 1)
    return payload


def test_the_walk_finds_the_limits_of_every_message():
    labels = {label for label, _, _ in LIMITS}
    # A sample of what must be there: each kind of limit, at each level of nesting.
    assert {"Hello.worker_id", "Hello.capacity", "Hello.nonce", "Welcome.heartbeat_interval", "Welcome.max_frame",
            "Report.results", "Report.results[0].http_status", "Report.results[0].lastmod[0].time",
            "Report.results[0].validators.digest", "Report.results[0].audio[0].duration",
            "Report.results[0].audio[0].identity.headers[0][1]", "Report.results[0].audio[0].extra",
            "Assign.tasks[0].validators.etag", "DownloadAsk.asks[0].url", "DownloadGrant.grants[0].verdict",
            "DownloadReport.outcomes[0].url", "DownloadWork.items[0].cover", "Fetched.fetches[0].retry_after",
            "Credit.n", "Fault.leases[0]", "Refused.code"} <= labels
    assert len(LIMITS) > 150


@pytest.mark.parametrize("label, at, past", LIMITS, ids=[f"{label}-{i}" for i, (label, _, _) in enumerate(LIMITS)])
def test_a_value_one_past_each_declared_limit_is_refused_naming_the_field(label, at, past):
    # A download outcome's status must be ok or failed besides being a short name: no other value is accepted.
    if at is not None and label != "DownloadReport.outcomes[0][1].status":
        p.decode_payload(_payload(at))                  # at the limit: accepted
    with pytest.raises(p.ProtocolError, match=re.escape(label)):
        p.decode_payload(_payload(past))


def test_the_workers_fragment_rules_reach_the_master_in_its_auth_bound_by_its_mac():
    rules = (r"^https?://(?:www\.kugou\.com)/song/",)
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(SECRET, "w1", 8, keep_fragment=rules)
    challenge = master.receive_hello(worker.hello())
    assert master.recv_limit == p.AUTH_MAX_FRAME        # the Auth may carry the rules, and no more
    auth = worker.receive_challenge(challenge)
    assert auth.keep_fragment == rules
    master.receive_auth(p.decode_payload(p.encode(auth)[p.HEADER_SIZE:]))
    assert master.keep_fragment == rules
    assert worker.receive_welcome(master.welcome(1.0, rules)).keep_fragment == rules


def test_fragment_rules_changed_on_the_way_fail_the_mac():
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(SECRET, "w1", 8, keep_fragment=("^https://a/",))
    auth = worker.receive_challenge(master.receive_hello(worker.hello()))
    forged = p.Auth(auth.mac, ("^https://a/", "^https://b/"))
    with pytest.raises(p.HandshakeFailed, match="failed authentication"):
        master.receive_auth(forged)
    assert master.keep_fragment == ()


def test_an_auth_past_its_limits_is_refused_before_the_secret_is_checked():
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    worker.receive_challenge(master.receive_hello(worker.hello()))
    too_many = p.encode(p.Auth(b"\0" * 32, tuple(f"^https://h{i}/" for i in range(p.MAX_RULES + 1))))
    with pytest.raises(p.ProtocolError, match="keep_fragment"):
        p.decode_payload(too_many[p.HEADER_SIZE:])
    too_long = p.encode(p.Auth(b"\0" * 32, ("x" * (p.MAX_RULE + 1),)))
    with pytest.raises(p.ProtocolError, match="keep_fragment"):
        p.decode_payload(too_long[p.HEADER_SIZE:])
    # The biggest legal Auth fits the frame limit the master reads it with.
    biggest = p.encode(p.Auth(b"\0" * 32, tuple("x" * p.MAX_RULE for _ in range(p.MAX_RULES))))
    assert len(biggest) - p.HEADER_SIZE <= p.AUTH_MAX_FRAME


# --------------------------------------------------------------------------------------------- session frames
def _opened(rules: tuple[str, ...] = ()) -> tuple[p.MasterHandshake, p.WorkerHandshake]:
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(SECRET, "w1", 8, keep_fragment=rules)
    master.receive_auth(worker.receive_challenge(master.receive_hello(worker.hello())))
    worker.receive_welcome(master.welcome(1.0))
    return master, worker


def _reader(hs: p.MasterHandshake | p.WorkerHandshake) -> p.FrameDecoder:
    d = p.FrameDecoder()
    hs.session_keys().authenticate(d)
    return d


ASSIGN = p.Assign((p.Task(1, "http://a/", 0, None),))
BEAT = p.Heartbeat(1.5)


def test_session_frames_carry_a_tag_and_decode_whole_and_one_byte_at_a_time():
    master, worker = _opened()
    seal = master.session_keys().sealer()
    wire = seal.seal(p.encode(ASSIGN)) + seal.seal(p.encode(BEAT) + p.encode(p.Shutdown("done")))
    assert len(wire) == len(p.encode(ASSIGN) + p.encode(BEAT) + p.encode(p.Shutdown("done"))) + 3 * p.TAG_SIZE
    whole = _reader(worker)
    whole.feed(wire)
    assert whole.messages() == [ASSIGN, BEAT, p.Shutdown("done")]
    bytewise, got = _reader(worker), []
    for b in wire:
        bytewise.feed(bytes([b]))
        got += bytewise.messages()
    assert got == [ASSIGN, BEAT, p.Shutdown("done")] and bytewise.buffered == 0
    # And the other way, with the worker's own key.
    up = worker.session_keys().sealer().seal(p.encode(p.Credit(3)))
    d = _reader(master)
    d.feed(up)
    assert d.messages() == [p.Credit(3)]


@pytest.mark.parametrize("where", ["payload", "tag", "last byte"])
def test_a_tampered_byte_fails_the_tag_and_breaks_the_decoder(where):
    master, worker = _opened()
    frame = bytearray(master.session_keys().sealer().seal(p.encode(ASSIGN)))
    i = {"payload": p.HEADER_SIZE + 2, "tag": len(frame) - p.TAG_SIZE, "last byte": len(frame) - 1}[where]
    frame[i] ^= 0x01
    d = _reader(worker)
    d.feed(bytes(frame))
    with pytest.raises(p.ProtocolError, match="wrong tag"):
        d.next_message()
    with pytest.raises(p.ProtocolError):
        d.feed(p.encode(BEAT))        # unusable after that: the connection closes


def test_a_shortened_length_in_the_header_fails_the_tag():
    master, worker = _opened()
    frame = bytearray(master.session_keys().sealer().seal(p.encode(ASSIGN)))
    struct.pack_into(">I", frame, 0, struct.unpack_from(">I", frame)[0] - 1)
    d = _reader(worker)
    d.feed(bytes(frame))
    with pytest.raises(p.ProtocolError, match="wrong tag"):
        d.next_message()


def test_a_replayed_frame_is_refused():
    master, worker = _opened()
    first = master.session_keys().sealer().seal(p.encode(ASSIGN))
    d = _reader(worker)
    d.feed(first + first)
    assert d.next_message() == ASSIGN
    with pytest.raises(p.ProtocolError, match="frame 1 of the session: wrong tag"):
        d.next_message()


def test_reordered_or_dropped_frames_are_refused():
    master, worker = _opened()
    seal = master.session_keys().sealer()
    f0, f1 = seal.seal(p.encode(BEAT)), seal.seal(p.encode(ASSIGN))
    swapped = _reader(worker)
    swapped.feed(f1 + f0)
    with pytest.raises(p.ProtocolError, match="wrong tag"):
        swapped.next_message()
    dropped = _reader(worker)
    dropped.feed(f1)
    with pytest.raises(p.ProtocolError, match="wrong tag"):
        dropped.next_message()


def test_an_injected_untagged_or_foreign_frame_is_refused():
    master, worker = _opened()
    # What a relay on the path can make: a well-formed frame with no tag, one tagged for another connection
    # (other nonces: other keys), and the worker's own frame reflected back at it.
    other_master, _ = _opened()
    untagged = p.encode(ASSIGN) + p.encode(BEAT) + p.encode(BEAT) + p.encode(BEAT) + p.encode(BEAT)
    foreign = other_master.session_keys().sealer().seal(p.encode(ASSIGN))
    reflected = worker.session_keys().sealer().seal(p.encode(ASSIGN))
    for wire in (untagged, foreign, reflected):
        d = _reader(worker)
        d.feed(wire)
        with pytest.raises(p.ProtocolError, match="wrong tag"):
            d.next_message()


def test_keys_differ_per_direction_and_per_connection_and_bind_the_fragment_rules():
    master, worker = _opened()
    mk, wk = master.session_keys(), worker.session_keys()
    assert mk.send_key == wk.recv_key and mk.recv_key == wk.send_key and mk.send_key != mk.recv_key
    again, _ = _opened()
    ruled, _ = _opened(("^https://a/",))
    keys = {mk.send_key, mk.recv_key, again.session_keys().send_key, ruled.session_keys().send_key}
    assert len(keys) == 4 and SECRET not in keys


def test_the_decoder_switches_between_two_buffered_frames():
    """The Welcome and the first tagged frames may arrive in one read: the tags start right after the Welcome."""
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    master.receive_auth(worker.receive_challenge(master.receive_hello(worker.hello())))
    wire = p.encode(master.welcome(1.0)) + master.session_keys().sealer().seal(p.encode(ASSIGN))
    d = p.FrameDecoder()
    d.feed(wire)
    worker.receive_welcome(d.next_message())
    worker.session_keys().authenticate(d)
    assert d.next_message() == ASSIGN


def test_session_keys_exist_only_once_open_and_seal_takes_whole_frames_only():
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    with pytest.raises(p.LocalProtocolError):
        master.session_keys()
    master.receive_auth(worker.receive_challenge(master.receive_hello(worker.hello())))
    with pytest.raises(p.LocalProtocolError):
        worker.session_keys()           # the master has not proved the secret yet
    with pytest.raises(p.LocalProtocolError):
        master.session_keys()           # no Welcome sent yet
    worker.receive_welcome(master.welcome(1.0))
    seal = master.session_keys().sealer()
    with pytest.raises(p.LocalProtocolError):
        seal.seal(p.encode(ASSIGN) + p.encode(BEAT)[:-1])
    # Nothing was tagged by the refused call: the next frame is still frame 0.
    d = _reader(worker)
    d.feed(seal.seal(p.encode(BEAT)))
    assert d.messages() == [BEAT]
    with pytest.raises(p.LocalProtocolError):
        d.authenticate(b"k" * 32, p.TO_WORKER)


def test_a_worker_without_frame_tags_is_refused_with_a_reason_naming_both_versions():
    master = p.MasterHandshake(SECRET)
    with pytest.raises(p.HandshakeFailed) as e:
        master.receive_hello(p.Hello("w1", 10, 8, NONCE))       # 10: the last version whose frames had no tag
    assert p.PROTOCOL_VERSION >= 11
    assert e.value.reply == p.Refused(f"protocol version 10 not supported (this master speaks {p.PROTOCOL_VERSION})")


def test_what_a_page_says_about_a_link_travels_with_it_within_the_limits():
    named = LinkMeta(title="Blue Moon", artist="Ann", meta_source={"title": "heading", "artist": "class"})
    r = p.Result(1, "http://a/song/1", p.DONE, 200, links=("http://a/stream/1",),
                 link_meta=(("http://a/stream/1", named),))
    assert p.Result.from_wire(r.to_wire()) == r
    task = p.Task(2, "http://a/stream/1", 2, "http://a/song/1", link_meta=named)
    assert p.decode_payload(p.encode(p.Assign((task,)))[4:]) == p.Assign((task,))
    # A version-11 task and result (without it) read as before.
    assert p.Result.from_wire(r.to_wire()[:14]).link_meta == ()
    for bad, where in (({"title": "x" * (p.MAX_NAME + 1)}, "title"), ({"artist": 5}, "artist"),
                       ({"meta_source": {str(i): "x" for i in range(4)}}, "meta_source")):
        wire = r.to_wire()
        wire[14] = [["http://a/stream/1", bad]]
        with pytest.raises(p.ProtocolError, match=rf"link_meta\[0\]\[1\]\.{where}"):
            p.Result.from_wire(wire)


def test_evidence_asks_and_pieces_keep_their_limits():
    ask = p.EvidenceAsk(1, tuple(f"http://a/{i}" for i in range(p.MAX_EVIDENCE_ITEMS)))
    assert p.decode_payload(p.encode(ask)[p.HEADER_SIZE:]) == ask
    biggest = p.EvidenceRecords(1, p.EVIDENCE_WARC, b"x" * p.MAX_EVIDENCE_CHUNK)
    assert p.decode_payload(p.encode(biggest)[p.HEADER_SIZE:]) == biggest
    for bad, field in (([p.EvidenceAsk.TYPE, 1, ["u"] * (p.MAX_EVIDENCE_ITEMS + 1)], "EvidenceAsk.wanted"),
                       ([p.EvidenceAsk.TYPE, -1, ["u"]], "EvidenceAsk.request"),
                       ([p.EvidenceRecords.TYPE, 1, "audio", b""], "EvidenceRecords.part"),
                       ([p.EvidenceRecords.TYPE, 1, "warc", b"x" * (p.MAX_EVIDENCE_CHUNK + 1)],
                        "EvidenceRecords.chunk")):
        with pytest.raises(p.ProtocolError, match=field):
            p.decode_payload(msgpack.packb(bad, use_bin_type=True))


def test_evidence_goes_master_to_worker_and_back_only_in_the_session():
    master = p.MasterHandshake(SECRET)
    worker = p.WorkerHandshake(SECRET, "w1", 8)
    ask, answer = p.EvidenceAsk(1, ("http://a/",)), p.EvidenceRecords(1, p.EVIDENCE_CHAINS, b"[]", last=True)
    with pytest.raises(p.ProtocolError):
        master.receive(answer)               # before the handshake
    master = p.MasterHandshake(SECRET)
    master.receive_auth(worker.receive_challenge(master.receive_hello(worker.hello())))
    worker.receive_welcome(master.welcome(1.0))
    assert master.receive(answer) == answer and worker.receive(ask) == ask
    with pytest.raises(p.ProtocolError):
        master.receive(ask)                  # the master is never asked
