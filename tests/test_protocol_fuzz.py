"""Fuzzing the frame decoder, message validation and the handshake (hypothesis, a few seconds in all).

Whatever a peer sends, the decoder answers with a message or a ProtocolError, nothing else; a message it
accepts holds only values the store and strict JSON can take, and encodes back to itself.
"""

import dataclasses
import math
import struct

import msgpack
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crawler import protocol as p
from crawler.items import AudioItem

# Bounded so the whole file runs in a few seconds in the normal suite; raise max_examples to fuzz longer.
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

# Any msgpack value, with the edge cases a hostile peer would pick: integers at and past 64 bits, NaN and the
# infinities, long strings, bytes, deep and wide containers.
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(-(2**63), 2**64 - 1), st.sampled_from([0, -1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.binary(max_size=40),
    st.sampled_from(["done", "error", "retry", "http://a/", "url", "page", "extra", "identity"]),
)
values = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=6), st.dictionaries(st.text(max_size=8), kids, max_size=6)), max_leaves=30)
message_arrays = st.builds(lambda t, rest: [t, *rest], st.integers(0, 12), st.lists(values, max_size=6))

audio_maps = st.fixed_dictionaries(
    {"url": st.text(max_size=20), "page": st.text(max_size=20)},
    optional={"title": st.one_of(st.none(), st.text(max_size=20), st.integers(-(2**63), 2**64 - 1)),
              "duration": st.one_of(st.none(), st.floats(), st.integers(-(2**63), 2**64 - 1)),
              "bitrate": st.one_of(st.none(), st.floats(), st.integers(-(2**63), 2**64 - 1)),
              "size": st.one_of(st.none(), st.floats(), st.integers(-(2**63), 2**64 - 1)),
              "status": st.text(max_size=10), "extra": values,
              "identity": st.one_of(st.none(), values)})
results = st.lists(st.one_of(
    st.tuples(st.integers(-(2**63), 2**64 - 1), st.text(max_size=30), st.sampled_from(["done", "error", "retry"]),
              st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1)), st.one_of(st.none(), st.text(max_size=20)),
              st.one_of(st.none(), st.text(max_size=20)), st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1)),
              st.one_of(st.none(), st.text(max_size=20)), st.lists(st.text(max_size=20), max_size=4),
              st.lists(audio_maps, max_size=3), st.integers(-(2**63), 2**64 - 1)).map(list),
    values), max_size=4)
reports = results.map(lambda rs: [p.Report.TYPE, rs])


def _frame(obj) -> bytes:
    payload = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


def _check_values(v) -> None:
    """Every value in an accepted message is one SQLite and strict JSON can hold."""
    if dataclasses.is_dataclass(v):
        for f in dataclasses.fields(v):
            _check_values(getattr(v, f.name))
    elif isinstance(v, msgspec.Struct):
        for f in msgspec.structs.fields(v):
            _check_values(getattr(v, f.name))
    elif isinstance(v, bool) or v is None:
        pass
    elif isinstance(v, int):
        assert p.INT64_MIN <= v <= p.INT64_MAX
    elif isinstance(v, float):
        assert math.isfinite(v)
    elif isinstance(v, str):
        assert len(v) <= p.MAX_TEXT
    elif isinstance(v, dict):
        for k, x in v.items():
            assert isinstance(k, str)
            _check_values(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _check_values(x)
    else:
        assert isinstance(v, bytes) and len(v) == 32


def _decode_all(data: bytes, max_frame: int = 4096) -> list[p.Message]:
    d = p.FrameDecoder(max_frame)
    out: list[p.Message] = []
    try:
        d.feed(data)
        # One at a time: the messages before a broken frame count, as they do when fed in pieces.
        while (m := d.next_message()) is not None:
            out.append(m)
    except p.ProtocolError:
        pass
    return out


def _accepted(msg: p.Message) -> None:
    _check_values(msg)
    assert _decode_all(p.encode(msg), p.DEFAULT_MAX_FRAME) == [msg]


@settings(FUZZ, max_examples=200)
@given(st.one_of(message_arrays, reports))
def test_any_message_array_is_a_valid_message_or_a_protocol_error(obj):
    for msg in _decode_all(_frame(obj), p.DEFAULT_MAX_FRAME):
        _accepted(msg)


@FUZZ
@given(st.data())
def test_mutated_valid_frames_never_raise_anything_but_protocol_error(data):
    msg = data.draw(st.sampled_from([
        p.Hello("w1", p.PROTOCOL_VERSION, 8, bytes(32)), p.Challenge(bytes(32)), p.Auth(bytes(32)),
        p.Welcome(bytes(32), 1.0, ("x",), 4096, 2), p.Credit(3), p.Heartbeat(1.5),
        p.Assign((p.Task(1, "http://a/", 0, None),)),
        p.Report((p.Result(1, "http://a/", p.DONE, 200, links=("http://a/b",),
                           audio=(AudioItem(url="u", page="p", duration=1.0, extra={"k": [1]}),)),)),
    ]))
    frame = bytearray(p.encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(p.HEADER_SIZE, len(frame) - 1))
        frame[i] = data.draw(st.integers(0, 255))
    for m in _decode_all(bytes(frame)):
        _accepted(m)


@settings(FUZZ, max_examples=100)
@given(st.lists(st.one_of(st.binary(max_size=64), message_arrays.map(_frame)), max_size=4),
       st.integers(1, 64))
def test_streams_in_any_chunking_decode_alike_and_only_fail_with_protocol_error(parts, chunk):
    stream = b"".join(parts)
    whole = _decode_all(stream, p.PRE_AUTH_MAX_FRAME)
    d = p.FrameDecoder(p.PRE_AUTH_MAX_FRAME)
    pieces: list[p.Message] = []
    try:
        for i in range(0, len(stream), chunk):
            d.feed(stream[i:i + chunk])
            # One at a time, as _decode_all does: messages() loses those before a broken frame in its chunk.
            while (m := d.next_message()) is not None:
                pieces.append(m)
    except p.ProtocolError:
        pass
    assert pieces == whole
    for m in whole:
        _accepted(m)


SECRET = b"0y5v0U6TurQfutWXlbEjg8Uc6b8/atkB5d/V5bgjrR8="
peer_messages = st.one_of(
    st.builds(p.Hello, st.sampled_from(["w1", "w2"]), st.sampled_from([p.PROTOCOL_VERSION, 1]),
              st.integers(0, 10), st.sampled_from([bytes(32), b"\1" * 32])),
    st.builds(p.Auth, st.sampled_from([bytes(32), b"\1" * 32])),
    st.just(p.Credit(1)), st.just(p.Heartbeat(0.0)), st.just(p.Report(())),
    st.just(p.Challenge(bytes(32))), st.just(p.Welcome(bytes(32), 1.0)),
)


@FUZZ
@given(st.lists(peer_messages, max_size=6))
def test_no_sequence_of_messages_without_the_secret_opens_the_master(msgs):
    """An unauthenticated peer, whatever it sends in whatever order, gets a Challenge or a refusal: never
    authenticated, never a Welcome (and so never the master's proof)."""
    hs = p.MasterHandshake(SECRET)
    for m in msgs:
        try:
            if hs.state is p.State.AWAIT_HELLO:
                reply = hs.receive_hello(m)
                assert isinstance(reply, p.Challenge)
            elif hs.state is p.State.AWAIT_AUTH:
                hs.receive_auth(m)
            else:
                hs.receive(m)
        except p.ProtocolError:
            assert hs.state is p.State.CLOSED
            break
        assert hs.state in (p.State.AWAIT_AUTH, p.State.CLOSED)


def _session() -> tuple[p.FrameSealer, p.FrameDecoder]:
    """The master's sealer and the worker's decoder of one opened connection."""
    master, worker = p.MasterHandshake(SECRET), p.WorkerHandshake(SECRET, "w1", 8)
    master.receive_auth(worker.receive_challenge(master.receive_hello(worker.hello())))
    worker.receive_welcome(master.welcome(1.0))
    d = p.FrameDecoder()
    worker.session_keys().authenticate(d)
    return master.session_keys().sealer(), d


SESSION_MESSAGES = [p.Assign((p.Task(1, "http://a/", 0, None),)), p.Heartbeat(1.5), p.Assign(()),
                    p.Shutdown("done")]


@FUZZ
@given(st.data())
def test_after_the_handshake_a_changed_stream_yields_only_an_authentic_prefix(data):
    """Whatever a relay does to the session's bytes (change, insert, cut, in any chunking), the worker reads the
    frames as they were sent up to the first change and nothing after: then a ProtocolError, or a wait."""
    sealer, d = _session()
    stream = bytearray(b"".join(sealer.seal(p.encode(m)) for m in SESSION_MESSAGES))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(stream)))
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "flip" and i < len(stream):
            stream[i] ^= data.draw(st.integers(1, 255))
        elif op == "insert":
            stream[i:i] = data.draw(st.binary(min_size=1, max_size=40))
        elif i < len(stream):
            del stream[i:i + data.draw(st.integers(1, 40))]
    chunk = data.draw(st.integers(1, 64))
    got: list[p.Message] = []
    try:
        for i in range(0, len(stream), chunk):
            d.feed(bytes(stream[i:i + chunk]))
            while (m := d.next_message()) is not None:
                got.append(m)
    except p.ProtocolError:
        pass
    assert got == SESSION_MESSAGES[:len(got)]


@settings(FUZZ, max_examples=100)
@given(st.lists(st.one_of(st.binary(max_size=64), message_arrays.map(_frame)), max_size=4))
def test_garbage_after_the_handshake_is_never_a_message(parts):
    _, d = _session()
    try:
        d.feed(b"".join(parts))
        assert d.next_message() is None
    except p.ProtocolError:
        pass
