"""A config dataclass is its YAML schema: the key table derived from its fields accepts, refuses and fills in
exactly what the fields say, and builds the dataclass from what it read."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from crawler.config import ConfigError, Key, from_values, keys_of, parse_keys, positive, setting


def _shout(v: str | None, key: str) -> str:
    if v == "bad":
        raise ConfigError(key, "is bad")
    return (v or "nothing").upper()


@dataclass(frozen=True)
class Inner:
    size: int = setting("int", 3, positive)
    tuning: float = 0.5                         # no setting: not a YAML key

    def __post_init__(self) -> None:
        if self.size == 13:
            raise ValueError("size 13 is unlucky")


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str = setting("str")                  # required
    word: str = setting("str", None, yaml="word_file", convert=_shout)
    inner: Inner


def load(raw: dict) -> Outer:
    return from_values(Outer, parse_keys(raw, keys_of(Outer), Path("/")))


def test_the_key_table_is_the_fields_with_settings_and_sections_in_field_order():
    spec = keys_of(Outer)
    assert list(spec) == ["name", "word_file", "inner"]
    assert spec["name"] == Key("str")
    assert spec["word_file"] == Key("str", None)
    assert spec["inner"].kind == "section" and spec["inner"].section == {"size": Key("int", 3, positive)}


def test_defaults_are_filled_in_and_shared_with_the_dataclass():
    cfg = load({"name": "a"})
    assert cfg == Outer(name="a", word="NOTHING", inner=Inner(size=3, tuning=0.5))
    assert Inner().size == keys_of(Outer)["inner"].section["size"].default == 3


def test_values_are_parsed_checked_and_converted_under_their_yaml_name():
    assert load({"name": "a", "word_file": "hi", "inner": {"size": 7}}) == Outer(name="a", word="HI",
                                                                                  inner=Inner(size=7))
    with pytest.raises(ConfigError, match="^word_file: is bad$"):
        load({"name": "a", "word_file": "bad"})


@pytest.mark.parametrize("raw, message", [
    ({}, "name: required key is missing"),
    ({"name": "a", "word": "x"}, "word: unknown key (known keys: inner, name, word_file)"),
    ({"name": "a", "inner": {"tuning": 1.0}}, "inner.tuning: unknown key (known keys: size)"),
    ({"name": "a", "inner": {"size": 0}}, "inner.size: must be greater than 0"),
    ({"name": "a", "inner": {"size": "3"}}, "inner.size: expected an integer, got str '3'"),
    ({"name": "a", "inner": {"size": 13}}, "inner: size 13 is unlucky"),   # the dataclass's own check
])
def test_bad_input_is_a_one_line_error_naming_the_key(raw, message):
    with pytest.raises(ConfigError) as e:
        load(raw)
    assert str(e.value) == message


def test_a_field_with_a_conversion_has_no_dataclass_default():
    with pytest.raises(TypeError):
        Outer(name="a", inner=Inner())   # type: ignore[call-arg]
