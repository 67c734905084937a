"""One table of audio extensions and media types, shared by the resolvers and the audio store."""

from crawler.web import media
from crawler.worker.audiostore import extension_for


def test_every_stored_extension_from_a_media_type_is_a_known_one() -> None:
    assert set(media.EXTENSION_BY_TYPE.values()) <= media.STORED_EXTENSIONS
    assert media.AUDIO_EXTENSIONS <= media.STORED_EXTENSIONS


def test_a_link_names_audio_only_by_an_audio_extension() -> None:
    assert media.is_audio_url("http://h/a/b.AU") and media.is_audio_url("http://h/x.caf?y=1")
    assert media.is_audio_url("http://h/song.mpc") and media.is_audio_url("http://h/s.ac3")
    # Containers that carry video as often as audio are not taken for audio by their name.
    assert not media.is_audio_url("http://h/film.mp4") and not media.is_audio_url("http://h/clip.webm")


def test_the_stored_extension_comes_from_the_address_then_the_media_type() -> None:
    assert extension_for(["http://h/a%20b.FLAC"], "audio/mpeg") == ".flac"
    assert extension_for(["http://h/stream", "http://h/final.mp4"], None) == ".mp4"
    assert extension_for(["http://h/track.wv"], None) == ".wv"
    assert extension_for(["http://h/stream"], "Audio/MPEG; charset=binary") == ".mp3"
    assert extension_for(["http://h/page.html"], "text/html") == ""


def test_media_type_drops_parameters_and_case() -> None:
    assert media.media_type(" Text/HTML ; charset=UTF-8") == "text/html"
    assert media.media_type(None) == "" and media.media_type("") == ""
