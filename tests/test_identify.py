"""Acoustic identification: every copy an uploader makes of a work matches it at the right offset, nothing else
matches, and a hostile file is one IdentifyError."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from crawler.identify import MAX_FINGERPRINT_BYTES, IdentifyError, ReferenceIndex, fingerprint_file
from crawler.identify.decode import decode
from crawler.identify.fingerprint import TRIPLET, Fingerprint, decode_fingerprint, encode, fingerprint_pcm
from testkit import music

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg makes the copies")

WORKS = {"aria": (1, 75.0), "bolero": (2, 90.0), "canon": (3, 65.0)}


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path], ReferenceIndex]:
    root = tmp_path_factory.mktemp("identify")
    paths = {name: music.write_wav(root / f"{name}.wav", music.work(seed, seconds))
             for name, (seed, seconds) in WORKS.items()}
    index = ReferenceIndex()
    for name, path in paths.items():
        index.add(name, fingerprint_file(path))
    return root, paths, index


@pytest.mark.parametrize("transform", music.TRANSFORMS, ids=lambda t: t.name)
def test_each_copy_matches_its_work_at_its_offset(library: tuple[Path, dict[str, Path], ReferenceIndex],
                                                  transform: music.Transform) -> None:
    root, paths, index = library
    # Each transform on one of the works in turn, so every work is copied.
    name = list(WORKS)[music.TRANSFORMS.index(transform) % len(WORKS)]
    copy = music.make_copy(paths[name], transform, root / f"{name}.{transform.name}{transform.suffix}")
    found = index.match(fingerprint_file(copy))
    assert [m.work for m in found] == [name], found
    assert abs(found[0].offset - transform.offset) <= 0.5, found
    assert found[0].score > 0


def test_unrelated_audio_matches_nothing(library: tuple[Path, dict[str, Path], ReferenceIndex]) -> None:
    root, _paths, index = library
    decoys = [music.work(seed, 60.0) for seed in (11, 12, 13)]
    decoys += [music.speech(21, 40.0), music.noise(31, 30.0)]
    for k, pcm in enumerate(decoys):
        path = music.write_wav(root / f"decoy{k}.wav", pcm)
        assert index.match(fingerprint_file(path)) == [], k


def test_a_decoy_encoded_like_a_copy_matches_nothing(library: tuple[Path, dict[str, Path], ReferenceIndex]) -> None:
    root, _paths, index = library
    src = music.write_wav(root / "other.wav", music.work(14, 40.0))
    for transform in (music.TRANSFORMS[0], music.TRANSFORMS[-1]):
        copy = music.make_copy(src, transform, root / f"other.{transform.name}{transform.suffix}")
        assert index.match(fingerprint_file(copy)) == []


def test_remove_and_re_add(library: tuple[Path, dict[str, Path], ReferenceIndex]) -> None:
    _root, paths, _index = library
    index = ReferenceIndex()
    prints = {name: fingerprint_file(path) for name, path in paths.items()}
    for name, fp in prints.items():
        index.add(name, fp)
    assert len(index) == 3
    index.remove("aria")
    index.remove("no such work")
    assert len(index) == 2
    assert index.match(prints["aria"]) == []
    assert [m.work for m in index.match(prints["bolero"])] == ["bolero"]
    index.add("aria-again", prints["aria"])
    assert [m.work for m in index.match(prints["aria"])] == ["aria-again"]
    index.add("bolero", prints["canon"])          # a work added again replaces its fingerprint
    assert len(index) == 3
    assert sorted(m.work for m in index.match(prints["canon"])) == ["bolero", "canon"]
    assert index.match(prints["bolero"]) == []


def test_many_small_adds_merge_segments() -> None:
    index = ReferenceIndex()
    prints = {}
    for k in range(12):
        fp = fingerprint_pcm(music.work(100 + k, 25.0, rate=8000))
        prints[f"w{k}"] = fp
        index.add(f"w{k}", encode(fp, MAX_FINGERPRINT_BYTES))
        index.match(encode(fp, MAX_FINGERPRINT_BYTES))      # each match turns the pending works into a segment
    index.remove("w3")
    for k in range(12, 15):
        index.add(f"w{k}", encode(fingerprint_pcm(music.work(100 + k, 25.0, rate=8000)), MAX_FINGERPRINT_BYTES))
    for name, fp in prints.items():
        expected = [] if name == "w3" else [name]
        assert [m.work for m in index.match(encode(fp, MAX_FINGERPRINT_BYTES))] == expected


def test_fingerprint_bytes_round_trip_and_are_cut_not_refused() -> None:
    fp = fingerprint_pcm(music.work(5, 30.0, rate=8000))
    data = encode(fp, MAX_FINGERPRINT_BYTES)
    back = decode_fingerprint(data)
    assert back.hop == pytest.approx(fp.hop)
    assert back.triplets.tobytes() == fp.triplets.tobytes()
    assert len(fp.triplets) > 100
    cut = encode(fp, 1000)
    assert len(cut) <= 1000
    assert 0 < len(decode_fingerprint(cut).triplets) < len(fp.triplets)
    # A long file: the fingerprint fits the wire limit.
    many = Fingerprint(hop=fp.hop, triplets=np.resize(fp.triplets, MAX_FINGERPRINT_BYTES // TRIPLET.itemsize + 50))
    assert len(encode(many, MAX_FINGERPRINT_BYTES)) <= MAX_FINGERPRINT_BYTES


@pytest.mark.parametrize("data", [b"", b"AF", b"XYZ\x01" + bytes(8), b"AFP\x09" + bytes(8),
                                  b"AFP\x01" + struct.pack("<II", 32000, 5) + bytes(3)])
def test_a_broken_fingerprint_is_an_identify_error(data: bytes) -> None:
    with pytest.raises(IdentifyError):
        ReferenceIndex().match(data)
    with pytest.raises(IdentifyError):
        ReferenceIndex().add("w", data)


def _hostile(tmp: Path) -> dict[str, bytes]:
    rng = np.random.default_rng(9)
    wav = (tmp / "ok.wav")
    music.write_wav(wav, music.work(6, 5.0))
    good = wav.read_bytes()
    huge = bytearray(good[:44])
    huge[40:44] = struct.pack("<I", 0xFFFFFF00)     # a data chunk claiming 4 GB, none present
    return {
        "empty.mp3": b"",
        "random.mp3": rng.bytes(50_000),
        "text.ogg": b"<html><body>not audio</body></html>" * 100,
        "truncated.wav": bytes(huge),
        "header-only.flac": b"fLaC" + bytes(40),
        "mpeg-sync-garbage.mp3": b"\xff\xfb\x90\x00" * 5000,
        "short.wav": good[:44 + 22050 * 4 // 2],
    }


def test_hostile_files_are_an_identify_error(tmp_path: Path) -> None:
    for name, data in _hostile(tmp_path).items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(IdentifyError):
            fingerprint_file(path)
    with pytest.raises(IdentifyError):
        fingerprint_file(tmp_path / "missing.mp3")


def test_decode_is_bounded_and_mono_at_the_low_rate(tmp_path: Path) -> None:
    path = music.write_wav(tmp_path / "w.wav", music.work(7, 20.0))
    pcm = decode(path)
    assert pcm.dtype == np.float32 and pcm.ndim == 1
    assert abs(len(pcm) - 20 * 8000) < 800
    assert len(decode(path, max_seconds=5.0)) == 5 * 8000
    assert decode(path, rate=11025).shape[0] == pytest.approx(20 * 11025, abs=1200)


def test_copies_still_match_among_many_references(library: tuple[Path, dict[str, Path], ReferenceIndex]) -> None:
    # 3,000 references of random triplets at a real fingerprint's density beside the works: the index answers
    # the works' copies as before and matches nothing to the random ones.
    root, paths, _index = library
    rng = np.random.default_rng(4)
    real = {name: decode_fingerprint(fingerprint_file(path)) for name, path in paths.items()}
    hop = real["aria"].hop
    index = ReferenceIndex()
    for k in range(3000):
        n = 1000
        rec = np.zeros(n, TRIPLET)
        rec["t1"] = np.sort(rng.integers(0, 4000, n))
        rec["lf1"], rec["dt"], rec["r"] = rng.integers(0, 233, n), rng.integers(3, 46, n), rng.integers(10, 245, n)
        rec["d12"], rec["d13"] = rng.integers(-125, 126, n), rng.integers(-125, 126, n)
        index.add(f"random{k}", encode(Fingerprint(hop=hop, triplets=rec), MAX_FINGERPRINT_BYTES))
    for name, fp in real.items():
        index.add_fingerprint(name, fp)
    assert len(index) == 3003
    transform = next(t for t in music.TRANSFORMS if t.name == "tempo-pitch-1.05")
    copy = music.make_copy(paths["canon"], transform, root / f"canon.many{transform.suffix}")
    found = index.match(fingerprint_file(copy))
    assert [m.work for m in found] == ["canon"]
    assert abs(found[0].offset - transform.offset) <= 0.5
    assert index.match(fingerprint_file(music.write_wav(root / "speech.wav", music.speech(8, 30.0)))) == []


def test_merging_two_segments_equals_building_one() -> None:
    from crawler.identify.index import _build, _merge

    rng = np.random.default_rng(2)

    def part(n: int, work: int) -> tuple[np.ndarray, ...]:
        return (rng.integers(0, 1 << 22, n).astype(np.uint32), np.full(n, work, np.int32),
                rng.integers(0, 60000, n).astype(np.uint16), rng.integers(0, 233, n).astype(np.uint8),
                rng.integers(3, 46, n).astype(np.uint8))

    first, second = [part(5000, 0), part(300, 1)], [part(7000, 2)]
    merged, built = _merge(_build(first), _build(second)), _build(first + second)
    for field in ("offsets", "work", "t1", "lf1", "dt"):
        assert np.array_equal(getattr(merged, field), getattr(built, field)), field
