"""The store's partial-download API (AudioStore.open_partial -> Partial), on a real disk.

The downloader calls these and nothing else to keep a download's bytes: append (take, hand_over, flush),
describe and checkpoint the sidecar, restart, then commit or discard.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from crawler.worker.audiostore import AudioStore

URL = "http://cdn.test/a.mp3"


def _sidecar(store: AudioStore, key: str) -> dict[str, object]:
    loaded = json.loads(store.sidecar_path(key).read_text())
    assert isinstance(loaded, dict)
    return loaded


async def test_a_new_partial_touches_no_disk_until_bytes_must_be_kept(tmp_path: Path) -> None:
    store = AudioStore(tmp_path)
    partial = store.open_partial("k1", URL, chunk_size=4)
    assert (partial.offset, partial.received, partial.on_disk) == (0, 0, False)
    partial.describe(etag='"e"', last_modified=None, expected_size=3, content_type="audio/mpeg", final_url=URL)
    partial.checkpoint()
    assert not partial.take(b"abc")               # under one chunk: nothing handed over yet
    assert partial.in_memory() == [b"abc"] and partial.head(2) == b"ab"
    await partial.aclose()
    assert not store.partial_dir.exists()


async def test_appended_bytes_survive_and_a_reopened_partial_resumes_them(tmp_path: Path) -> None:
    store = AudioStore(tmp_path)
    partial = store.open_partial("k2", URL, chunk_size=4)
    partial.describe(etag='"e"', last_modified=None, expected_size=10, content_type="audio/mpeg", final_url=URL)
    assert partial.take(b"0123")                  # a full chunk: hand it over
    await partial.hand_over()
    partial.take(b"45")
    await partial.flush()
    partial.checkpoint()
    await partial.aclose()
    assert store.part_path("k2").read_bytes() == b"012345"
    assert _sidecar(store, "k2")["etag"] == '"e"' and _sidecar(store, "k2")["written"] == 6

    again = store.open_partial("k2", URL, chunk_size=4)
    assert (again.offset, again.on_disk, again.record.expected_size) == (6, True, 10)
    await again.rehash()
    again.take(b"6789")
    await again.flush()
    assert again.hasher.hexdigest() == hashlib.sha256(b"0123456789").hexdigest()
    assert again.head(3) == b"012"
    rel = await again.commit(again.hasher.hexdigest(), ".mp3")
    assert (tmp_path / rel).read_bytes() == b"0123456789"
    assert not store.part_path("k2").exists() and not store.sidecar_path("k2").exists()


async def test_restart_truncates_and_forgets_the_old_record(tmp_path: Path) -> None:
    store = AudioStore(tmp_path)
    partial = store.open_partial("k3", URL, chunk_size=2)
    partial.describe(etag='"old"', last_modified=None, expected_size=99, content_type=None, final_url=None)
    partial.take(b"xyz")
    await partial.flush()
    await partial.restart("http://new.test/a.mp3")
    assert (partial.offset, partial.received, partial.record.etag) == (0, 0, None)
    assert store.part_path("k3").read_bytes() == b""
    assert _sidecar(store, "k3")["url"] == "http://new.test/a.mp3"
    assert _sidecar(store, "k3")["expected_size"] is None
    await partial.aclose()


async def test_discard_removes_the_part_file_and_its_sidecar(tmp_path: Path) -> None:
    store = AudioStore(tmp_path)
    partial = store.open_partial("k4", URL, chunk_size=2)
    partial.take(b"abcd")
    await partial.flush()
    assert store.part_path("k4").exists() and store.sidecar_path("k4").exists()
    await partial.discard()
    assert not store.part_path("k4").exists() and not store.sidecar_path("k4").exists()
    assert store.open_partial("k4", URL, chunk_size=2).offset == 0


async def test_a_part_file_without_its_sidecar_is_not_resumed(tmp_path: Path) -> None:
    store = AudioStore(tmp_path)
    store.partial_dir.mkdir(parents=True)
    store.part_path("k5").write_bytes(b"unvouched")
    partial = AudioStore(tmp_path).open_partial("k5", URL, chunk_size=2)
    assert (partial.offset, partial.on_disk) == (0, False)
