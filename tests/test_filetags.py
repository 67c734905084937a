"""Tags, duration, bitrate and codec of finished downloads, read with mutagen from files tagged by mutagen."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawler.worker.filetags import read_file_tags
from tests.fakes import audiofiles


@pytest.mark.parametrize("kind, codec", [("mp3", "mp3"), ("ogg", "vorbis"), ("flac", "flac"), ("m4a", "aac")])
def test_each_container_gives_its_tags_and_stream_facts(tmp_path: Path, kind: str, codec: str) -> None:
    path = audiofiles.write(tmp_path / f"a.{kind}", kind, "Título", "Artíst 歌手", "Albüm")
    tags = read_file_tags(path)
    assert (tags["title"], tags["artist"], tags["album"], tags["codec"]) == ("Título", "Artíst 歌手", "Albüm", codec)
    assert tags["duration"] > 0 and tags["bitrate"] > 0


def test_m4a_duration_and_bitrate_come_from_the_movie_header_and_decoder_config(tmp_path: Path) -> None:
    tags = read_file_tags(audiofiles.write(tmp_path / "a.m4a", "m4a", "t", "a", "b"))
    assert (tags["duration"], tags["bitrate"]) == (95.0, 96)


@pytest.mark.parametrize("body", [b"", b"not audio at all", b"ID3\x04\x00\x00\xff\xff\xff\xff", b"fLaC\x00\x00",
                                  b"\x00\x00\x00\x18ftypM4A " + b"\xff" * 64])
def test_garbage_gives_nothing_and_never_raises(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "x"
    path.write_bytes(body)
    assert read_file_tags(path) == {}


def test_a_missing_file_gives_nothing(tmp_path: Path) -> None:
    assert read_file_tags(tmp_path / "gone.mp3") == {}


def test_asf_tags_are_read_though_its_stream_header_states_no_length(tmp_path: Path) -> None:
    tags = read_file_tags(audiofiles.write(tmp_path / "a.wma", "wma", "Título", "Artíst", "Albüm"))
    assert tags == {"title": "Título", "artist": "Artíst", "album": "Albüm", "codec": "wma"}
