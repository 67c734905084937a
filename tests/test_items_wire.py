"""AudioItem and RequestIdentity are msgspec Structs (they were frozen dataclasses): the wire must not notice.

The byte strings below were made by the dataclass version (commit 810e332): an item with every field set, one
with the defaults, one with a default identity, alone and inside a Report frame, as msgpack and JSON."""

import json
import typing

import msgspec
import pytest

from crawler import protocol as p
from crawler.items import AUDIO_FIELD_KINDS, AudioItem, LinkMeta, RequestIdentity

FULL = AudioItem("http://a/x.mp3", "http://a/p", "T", "Ar", "Al", 12.5, 128, "D", "http://a/c.jpg", "failed",
              "gone", "kugou", "h1", RequestIdentity("UA", (("Referer", "http://a/"),), (("k", "v"),), "px1"),
              "ab" * 32, 5, "audio/mpeg", "x/y.mp3", "mp3", "2024-01-01", "la la",
              {"title": "jsonld"}, {"album": "B"}, {"k": [1, 2.5, None, "s", {"n": True}]}, b"\x00\x01fp")
MINIMAL = AudioItem("", "http://a/p")
BARE = AudioItem("http://a/y.ogg", "http://a/p", duration=3, identity=RequestIdentity())
FULL_MSGPACK = bytes.fromhex(
    "de0019a375726cae687474703a2f2f612f782e6d7033a470616765aa687474703a2f2f612f70a57469746c65a154a6617274"
    "697374a24172a5616c62756da2416ca86475726174696f6ecb4029000000000000a762697472617465cc80ab646573637269"
    "7074696f6ea144a5636f766572ae687474703a2f2f612f632e6a7067a6737461747573a66661696c6564a6726561736f6ea4"
    "676f6e65a87265736f6c766572a56b75676f75a9736f757263655f6964a26831a86964656e7469747984aa757365725f6167"
    "656e74a25541a7686561646572739192a752656665726572a9687474703a2f2f612fa7636f6f6b6965739192a16ba176a465"
    "786974a3707831a6736861323536d94061626162616261626162616261626162616261626162616261626162616261626162"
    "616261626162616261626162616261626162616261626162616261626162a473697a6505ac636f6e74656e745f74797065aa"
    "617564696f2f6d706567a470617468a7782f792e6d7033a5636f646563a36d7033a97075626c6973686564aa323032342d30"
    "312d3031a66c7972696373a56c61206c61ab6d6574615f736f7572636581a57469746c65a66a736f6e6c64a966696c655f74"
    "61677381a5616c62756da142a5657874726181a16b9501cb4004000000000000c0a17381a16ec3ab66696e6765727072696e"
    "74c40400016670")
FULL_JSON = (
    '{"url":"http://a/x.mp3","page":"http://a/p","title":"T","artist":"Ar","album":"Al","duration":12.5,"'
    'bitrate":128,"description":"D","cover":"http://a/c.jpg","status":"failed","reason":"gone","resolver"'
    ':"kugou","source_id":"h1","identity":{"user_agent":"UA","headers":[["Referer","http://a/"]],"cookies'
    '":[["k","v"]],"exit":"px1"},"sha256":"ababababababababababababababababababababababababababababababab'
    'ab","size":5,"content_type":"audio/mpeg","path":"x/y.mp3","codec":"mp3","published":"2024-01-01","ly'
    'rics":"la la","meta_source":{"title":"jsonld"},"file_tags":{"album":"B"},"extra":{"k":[1,2.5,null,"s'
    '",{"n":true}]},"fingerprint":"AAFmcA=="}').encode()
MINIMAL_MSGPACK = bytes.fromhex(
    "de0019a375726ca0a470616765aa687474703a2f2f612f70a57469746c65c0a6617274697374c0a5616c62756dc0a8647572"
    "6174696f6ec0a762697472617465c0ab6465736372697074696f6ec0a5636f766572c0a6737461747573a26f6ba672656173"
    "6f6ec0a87265736f6c766572a767656e65726963a9736f757263655f6964c0a86964656e74697479c0a6736861323536c0a4"
    "73697a65c0ac636f6e74656e745f74797065c0a470617468c0a5636f646563c0a97075626c6973686564c0a66c7972696373"
    "c0ab6d6574615f736f7572636580a966696c655f7461677380a5657874726180ab66696e6765727072696e74c0")
MINIMAL_JSON = (
    '{"url":"","page":"http://a/p","title":null,"artist":null,"album":null,"duration":null,"bitrate":null'
    ',"description":null,"cover":null,"status":"ok","reason":null,"resolver":"generic","source_id":null,"'
    'identity":null,"sha256":null,"size":null,"content_type":null,"path":null,"codec":null,"published":nu'
    'll,"lyrics":null,"meta_source":{},"file_tags":{},"extra":{},"fingerprint":null}').encode()
BARE_MSGPACK = bytes.fromhex(
    "de0019a375726cae687474703a2f2f612f792e6f6767a470616765aa687474703a2f2f612f70a57469746c65c0a661727469"
    "7374c0a5616c62756dc0a86475726174696f6e03a762697472617465c0ab6465736372697074696f6ec0a5636f766572c0a6"
    "737461747573a26f6ba6726561736f6ec0a87265736f6c766572a767656e65726963a9736f757263655f6964c0a86964656e"
    "7469747984aa757365725f6167656e74c0a76865616465727390a7636f6f6b69657390a465786974c0a6736861323536c0a4"
    "73697a65c0ac636f6e74656e745f74797065c0a470617468c0a5636f646563c0a97075626c6973686564c0a66c7972696373"
    "c0ab6d6574615f736f7572636580a966696c655f7461677380a5657874726180ab66696e6765727072696e74c0")
BARE_JSON = (
    '{"url":"http://a/y.ogg","page":"http://a/p","title":null,"artist":null,"album":null,"duration":3,"bi'
    'trate":null,"description":null,"cover":null,"status":"ok","reason":null,"resolver":"generic","source'
    '_id":null,"identity":{"user_agent":null,"headers":[],"cookies":[],"exit":null},"sha256":null,"size":'
    'null,"content_type":null,"path":null,"codec":null,"published":null,"lyrics":null,"meta_source":{},"f'
    'ile_tags":{},"extra":{},"fingerprint":null}').encode()
REPORT_FRAME = bytes.fromhex(
    "000004399207919f01aa687474703a2f2f612f70a4646f6e65ccc8c0c0c0c09093de0019a375726cae687474703a2f2f612f"
    "782e6d7033a470616765aa687474703a2f2f612f70a57469746c65a154a6617274697374a24172a5616c62756da2416ca864"
    "75726174696f6ecb4029000000000000a762697472617465cc80ab6465736372697074696f6ea144a5636f766572ae687474"
    "703a2f2f612f632e6a7067a6737461747573a66661696c6564a6726561736f6ea4676f6e65a87265736f6c766572a56b7567"
    "6f75a9736f757263655f6964a26831a86964656e7469747984aa757365725f6167656e74a25541a7686561646572739192a7"
    "52656665726572a9687474703a2f2f612fa7636f6f6b6965739192a16ba176a465786974a3707831a6736861323536d94061"
    "6261626162616261626162616261626162616261626162616261626162616261626162616261626162616261626162616261"
    "62616261626162616261626162a473697a6505ac636f6e74656e745f74797065aa617564696f2f6d706567a470617468a778"
    "2f792e6d7033a5636f646563a36d7033a97075626c6973686564aa323032342d30312d3031a66c7972696373a56c61206c61"
    "ab6d6574615f736f7572636581a57469746c65a66a736f6e6c64a966696c655f7461677381a5616c62756da142a565787472"
    "6181a16b9501cb4004000000000000c0a17381a16ec3ab66696e6765727072696e74c40400016670de0019a375726ca0a470"
    "616765aa687474703a2f2f612f70a57469746c65c0a6617274697374c0a5616c62756dc0a86475726174696f6ec0a7626974"
    "72617465c0ab6465736372697074696f6ec0a5636f766572c0a6737461747573a26f6ba6726561736f6ec0a87265736f6c76"
    "6572a767656e65726963a9736f757263655f6964c0a86964656e74697479c0a6736861323536c0a473697a65c0ac636f6e74"
    "656e745f74797065c0a470617468c0a5636f646563c0a97075626c6973686564c0a66c7972696373c0ab6d6574615f736f75"
    "72636580a966696c655f7461677380a5657874726180ab66696e6765727072696e74c0de0019a375726cae687474703a2f2f"
    "612f792e6f6767a470616765aa687474703a2f2f612f70a57469746c65c0a6617274697374c0a5616c62756dc0a864757261"
    "74696f6e03a762697472617465c0ab6465736372697074696f6ec0a5636f766572c0a6737461747573a26f6ba6726561736f"
    "6ec0a87265736f6c766572a767656e65726963a9736f757263655f6964c0a86964656e7469747984aa757365725f6167656e"
    "74c0a76865616465727390a7636f6f6b69657390a465786974c0a6736861323536c0a473697a65c0ac636f6e74656e745f74"
    "797065c0a470617468c0a5636f646563c0a97075626c6973686564c0a66c7972696373c0ab6d6574615f736f7572636580a9"
    "66696c655f7461677380a5657874726180ab66696e6765727072696e74c00090c09090")


@pytest.mark.parametrize(("item", "packed", "text"), [(FULL, FULL_MSGPACK, FULL_JSON),
                                                      (MINIMAL, MINIMAL_MSGPACK, MINIMAL_JSON),
                                                      (BARE, BARE_MSGPACK, BARE_JSON)])
def test_an_item_encodes_as_the_dataclass_did(item, packed, text):
    assert msgspec.msgpack.encode(item) == packed
    assert msgspec.json.encode(item) == text
    assert msgspec.msgpack.decode(packed, type=AudioItem) == item
    assert msgspec.json.decode(text, type=AudioItem) == item


def test_a_report_frame_is_the_same_bytes_and_decodes_back():
    report = p.Report((p.Result(1, "http://a/p", "done", 200, audio=(FULL, MINIMAL, BARE)),))
    assert p.encode(report) == REPORT_FRAME
    assert p.decode_payload(REPORT_FRAME[p.HEADER_SIZE:]) == report


def test_the_wire_dicts_survive_json():
    for item in (FULL, MINIMAL, BARE):
        row = json.loads(json.dumps(item.to_wire()))
        assert AudioItem.from_wire(row) == item
        assert list(row) == list(AUDIO_FIELD_KINDS)
        assert "identity" not in item.catalogue_row() and "fingerprint" not in item.catalogue_row()


def test_the_field_kinds_come_from_the_struct():
    assert tuple(AUDIO_FIELD_KINDS) == AudioItem.__struct_fields__
    assert set(typing.get_type_hints(AudioItem)) == set(AudioItem.__struct_fields__)
    assert AUDIO_FIELD_KINDS["identity"] == "identity" and AUDIO_FIELD_KINDS["fingerprint"] == "bytes"
    assert AUDIO_FIELD_KINDS["extra"] == "map" and AUDIO_FIELD_KINDS["size"] == "number"
    assert AUDIO_FIELD_KINDS["url"] == "text"


def test_replace_copies_and_refuses_unknown_names():
    item = MINIMAL.replace(size=5, title="t")
    assert (item.size, item.title, item.page) == (5, "t", "http://a/p")
    assert MINIMAL.size is None      # frozen: the original is unchanged
    with pytest.raises(TypeError):
        MINIMAL.replace(nonsense=1)
    with pytest.raises(AttributeError):
        MINIMAL.size = 5  # type: ignore[misc]


def test_the_default_maps_are_not_shared():
    a, b = AudioItem("u", "p"), AudioItem("u", "p")
    assert a.extra == {} and a.extra is not b.extra and a.meta_source is not b.meta_source


def test_equality_and_hashing_as_before():
    assert FULL == FULL.replace() and FULL != FULL.replace(size=6)
    with pytest.raises(TypeError):     # its dict fields: unhashable, as the frozen dataclass was
        hash(MINIMAL)
    ident = RequestIdentity("UA", (("a", "b"),))
    assert hash(ident) == hash(RequestIdentity("UA", (("a", "b"),)))
    assert ident != msgspec.structs.replace(ident, exit="x")


# LinkMeta became a Struct too (it was a frozen dataclass): these bytes were made by the dataclass version
# (commit f6435e0), alone, with its defaults, as JSON (the master's store), in a Report and in an Assign frame.
NAMED = LinkMeta("Blue Moon", "Ann", "Al", {"title": "heading", "artist": "class", "album": "jsonld"})
NAMED_MSGPACK = bytes.fromhex(
    "84a57469746c65a9426c7565204d6f6f6ea6617274697374a3416e6ea5616c62756da2416cab6d6574615f736f7572636583a5"
    "7469746c65a768656164696e67a6617274697374a5636c617373a5616c62756da66a736f6e6c64")
UNNAMED_MSGPACK = bytes.fromhex("84a57469746c65c0a6617274697374c0a5616c62756dc0ab6d6574615f736f7572636580")
NAMED_JSON = (b'{"title":"Blue Moon","artist":"Ann","album":"Al","meta_source":{"title":"heading","artist":"class",'
              b'"album":"jsonld"}}')
NAMED_REPORT = bytes.fromhex(
    "000000999207919f01a9687474703a2f2f612fa4646f6e65c0c0c0c0c091ae687474703a2f2f612f782e6d3375900090c09091"
    "92ae687474703a2f2f612f782e6d337584a57469746c65a9426c7565204d6f6f6ea6617274697374a3416e6ea5616c62756da2"
    "416cab6d6574615f736f7572636583a57469746c65a768656164696e67a6617274697374a5636c617373a5616c62756da66a73"
    "6f6e6c64")
NAMED_ASSIGN = bytes.fromhex(
    "000000779206919703aa687474703a2f2f612f7802a9687474703a2f2f612fc0c084a57469746c65a9426c7565204d6f6f6ea6"
    "617274697374a3416e6ea5616c62756da2416cab6d6574615f736f7572636583a57469746c65a768656164696e67a661727469"
    "7374a5636c617373a5616c62756da66a736f6e6c64")


def test_link_meta_encodes_as_the_dataclass_did():
    assert msgspec.msgpack.encode(NAMED) == NAMED_MSGPACK
    assert msgspec.msgpack.encode(LinkMeta()) == UNNAMED_MSGPACK
    assert msgspec.json.encode(NAMED) == NAMED_JSON
    report = p.Report((p.Result(1, "http://a/", p.DONE, links=("http://a/x.m3u",),
                                link_meta=(("http://a/x.m3u", NAMED),)),))
    assert p.encode(report) == NAMED_REPORT
    assert p.encode(p.Assign((p.Task(3, "http://a/x", 2, "http://a/", None, None, NAMED),))) == NAMED_ASSIGN


def test_link_meta_decodes_and_refuses_as_the_dataclass_did():
    assert msgspec.json.decode(NAMED_JSON, type=LinkMeta) == NAMED
    task = p.decode_payload(NAMED_ASSIGN[p.HEADER_SIZE:])
    assert isinstance(task, p.Assign) and task.tasks[0].link_meta == NAMED
    assert msgspec.json.decode(b'{"zzz": 1}', type=LinkMeta) == LinkMeta()     # unknown keys ignored
    for bad, why in ((b'{"title": "' + b"x" * 2000 + b'"}', "Expected `str` of length <= 1024 - at `$.title`"),
                     (b'{"meta_source": {"a": "b", "c": "d", "e": "f", "g": "h"}}',
                      "Expected `object` of length <= 3 - at `$.meta_source`"),
                     (b'{"title": 3}', "Expected `str | null`, got `int` - at `$.title`")):
        with pytest.raises(msgspec.ValidationError) as e:
            msgspec.json.decode(bad, type=LinkMeta)
        assert str(e.value) == why
    with pytest.raises(TypeError):     # its dict field: unhashable, as the frozen dataclass was
        hash(NAMED)
    with pytest.raises(AttributeError):
        NAMED.title = "x"  # type: ignore[misc]
