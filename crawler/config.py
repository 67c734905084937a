"""Reading a daemon's YAML config into checked values, with errors that name the key and the problem.

Each daemon's config is a frozen dataclass whose fields are its YAML keys: `setting()` gives a field its kind,
default and check, and a field whose type is another such dataclass is a section. `keys_of` derives from that the
table of `Key`s `parse_keys` checks a YAML mapping against, and `from_values` builds the dataclass from what
`parse_keys` returns, so each key is written once (see master/config.py, worker/config.py). Unknown keys are
errors: a typo must not silently fall back to a default in a crawl that runs for days.
"""

from __future__ import annotations

import difflib
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

import yaml

from crawler.errors import ConfigError

REQUIRED = object()


# ConfigError lives in crawler/errors.py so that modules below the config layer (crawler/http/proxies.py,
# crawler/sites.py) raise it without importing this module; it is re-exported here for everyone else.
__all__ = ["ConfigError"]


@dataclass(frozen=True)
class Key:
    kind: str                                   # int, float, bool, str, path, hostport, hostport|off, list[str],
    #                                             map, section
    default: Any = REQUIRED
    check: Callable[[Any], str | None] | None = None   # returns a problem, or None
    section: Mapping[str, Key] | None = None    # for kind="section"
    # kind="custom": the key's own parser (dotted name, raw YAML value, the config file's folder) -> value;
    # it raises ConfigError itself (the proxies list, the sites table).
    parser: Callable[[str, Any, Path], Any] | None = None

    def parse(self, name: str, value: Any, base: Path) -> Any:
        if self.parser is not None:
            out = self.parser(name, value, base)
        else:
            out = _PARSERS[self.kind](name, value, base, self)
        if self.check is not None and out is not None:
            problem = self.check(out)
            if problem:
                raise ConfigError(name, problem)
        return out


def _type_name(v: Any) -> str:
    return "nothing" if v is None else type(v).__name__


def _p_int(name: str, v: Any, base: Path, key: Key) -> Any:
    if isinstance(v, bool) or not isinstance(v, int):
        if key.default is None and v is None:
            return None
        raise ConfigError(name, f"expected an integer, got {_type_name(v)} {v!r}")
    return v


def _p_float(name: str, v: Any, base: Path, key: Key) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        if key.default is None and v is None:
            return None
        raise ConfigError(name, f"expected a number, got {_type_name(v)} {v!r}")
    return float(v)


def _p_bool(name: str, v: Any, base: Path, key: Key) -> Any:
    if not isinstance(v, bool):
        raise ConfigError(name, f"expected true or false, got {_type_name(v)} {v!r}")
    return v


def _p_str(name: str, v: Any, base: Path, key: Key) -> Any:
    if not isinstance(v, str) or not v:
        if key.default is None and v is None:
            return None
        raise ConfigError(name, f"expected a non-empty string, got {_type_name(v)} {v!r}")
    return v


def _p_path(name: str, v: Any, base: Path, key: Key) -> Any:
    s = _p_str(name, v, base, key)
    if s is None:
        return None
    p = Path(s).expanduser()
    # Resolved, so logs and messages say /srv/crawl/master, not etc/../master.
    return p if p.is_absolute() else (base / p).resolve()


def _p_hostport(name: str, v: Any, base: Path, key: Key) -> Any:
    s = _p_str(name, v, base, key)
    return parse_hostport(s, name)


def _p_hostport_or_off(name: str, v: Any, base: Path, key: Key) -> Any:
    # YAML reads a bare `off` as false; null, false and "off" all switch the listener off.
    if v is None or v is False or (isinstance(v, str) and v.lower() == "off"):
        return None
    if not isinstance(v, str):
        raise ConfigError(name, f"expected host:port or off, got {_type_name(v)} {v!r}")
    return parse_hostport(v, name)


def _p_strlist(name: str, v: Any, base: Path, key: Key) -> Any:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise ConfigError(name, f"expected a list of strings, got {_type_name(v)}")
    return tuple(v)


def _p_map(name: str, v: Any, base: Path, key: Key) -> Any:
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ConfigError(name, f"expected a mapping, got {_type_name(v)}")
    return dict(v)


def _p_section(name: str, v: Any, base: Path, key: Key) -> Any:
    if v is None:
        v = {}
    if not isinstance(v, dict):
        raise ConfigError(name, f"expected a mapping, got {_type_name(v)}")
    return parse_keys(v, key.section or {}, base, prefix=name + ".")


_PARSERS: dict[str, Callable[[str, Any, Path, Key], Any]] = {
    "int": _p_int, "float": _p_float, "bool": _p_bool, "str": _p_str, "path": _p_path,
    "hostport": _p_hostport, "hostport|off": _p_hostport_or_off, "list[str]": _p_strlist, "map": _p_map, "section": _p_section,
}


def parse_hostport(s: str, name: str = "address") -> tuple[str, int]:
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(name, f"expected host:port, got {s!r}")
    return host.strip("[]"), int(port)


def unknown_key(key: object, known: Iterable[str]) -> str:
    """The problem with a key that is not in the spec: the closest one first (a typo is the usual cause), then the
    whole list."""
    known = sorted(known)
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key ({hint}known keys: {', '.join(known)})"


def parse_keys(raw: Mapping[str, Any], spec: Mapping[str, Key], base: Path, prefix: str = "") -> dict[str, Any]:
    """A daemon's YAML mapping checked against its table of keys: each value parsed, defaults filled in, an
    unknown key refused. (A resolver's own section is read by crawler.resolvers.base.parse_section.)"""
    for k in raw:
        if k not in spec:
            raise ConfigError(f"{prefix}{k}", unknown_key(k, spec))
    out: dict[str, Any] = {}
    for k, key in spec.items():
        name = prefix + k
        if k in raw:
            out[k] = key.parse(name, raw[k], base)
        elif key.kind == "section":
            out[k] = key.parse(name, {}, base)
        elif key.default is REQUIRED:
            raise ConfigError(name, "required key is missing")
        else:
            out[k] = key.default
    return out


@dataclass(frozen=True)
class Setting:
    """What setting() keeps in a dataclass field's metadata."""

    key: Key
    yaml: str | None                               # the YAML key, when it is not the field's name
    convert: Callable[[Any, str], Any] | None      # parsed value, dotted key name -> the value the field holds


_SETTING = "crawler.config.setting"
T = TypeVar("T")


def setting(kind: str, default: Any = REQUIRED, check: Callable[[Any], str | None] | None = None, *,
            yaml: str | None = None, convert: Callable[[Any, str], Any] | None = None,
            parser: Callable[[str, Any, Path], Any] | None = None) -> Any:
    """A config dataclass field that is also a YAML key: its kind, default and check, as for `Key`.

    yaml: the key's name in the file when the field holds something else (`secret_file` for `secret`).
    convert: turns the parsed value (the default when the key is absent) into the one the field holds, given the
    key's dotted name for its errors (the secret read from that file); such a field has no dataclass default, as
    the YAML default is not a value it can hold. Otherwise the default is the field's too, so code that builds the
    dataclass with some fields gets the same defaults as the YAML. Keyword-only, so the fields may come in the
    order their keys are best read in, required or not.
    parser: the key's own parser, for a kind the table above has no parser for ("custom")."""
    meta = {_SETTING: Setting(Key(kind, default, check, parser=parser), yaml, convert)}
    if default is REQUIRED or convert is not None:
        return field(kw_only=True, metadata=meta)
    return field(default=default, kw_only=True, metadata=meta)


def _section_type(cls: type, name: str) -> type | None:
    hint = get_type_hints(cls)[name]
    return hint if isinstance(hint, type) and is_dataclass(hint) else None


def keys_of(cls: type) -> dict[str, Key]:
    """The key table (what parse_keys takes) of a config dataclass, in field order: a key for each field made by
    setting(), a section for each field whose type is itself a config dataclass. Other fields are no YAML key
    (a core's internal tuning, left at its default)."""
    out: dict[str, Key] = {}
    for f in fields(cls):
        s: Setting | None = f.metadata.get(_SETTING)
        if s is not None:
            out[s.yaml or f.name] = s.key
        elif (sub := _section_type(cls, f.name)) is not None:
            out[f.name] = Key("section", section=keys_of(sub))
    return out


def from_values(cls: type[T], values: Mapping[str, Any], prefix: str = "") -> T:
    """The config dataclass made from parse_keys' answer for keys_of(cls): each setting's value, converted when
    it says how, each section made the same way. A dataclass's own checks (a ValueError from its __post_init__)
    become a config error named after its section."""
    kwargs: dict[str, Any] = {}
    for f in fields(cls):   # type: ignore[arg-type]   # cls is a dataclass: keys_of(cls) made the values
        s: Setting | None = f.metadata.get(_SETTING)
        if s is not None:
            name = s.yaml or f.name
            kwargs[f.name] = values[name] if s.convert is None else s.convert(values[name], prefix + name)
        elif (sub := _section_type(cls, f.name)) is not None:
            kwargs[f.name] = from_values(sub, values[f.name], f"{prefix}{f.name}.")
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ConfigError(prefix.rstrip("."), str(e)) from None


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError("", f"cannot read config {path}: {e.strerror or e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError("", f"{path} is not valid YAML{where}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("", f"{path}: expected a mapping of keys at the top level")
    return raw


# A shared secret must be worth guessing against: at least this long, this varied, and this many bits by a
# plain estimate (length x the Shannon entropy of its own byte counts). `head -c 32 /dev/urandom | base64`
# gives 44 characters and about 220 bits; "passwordpassword" (7 distinct bytes, letters only) is refused.
SECRET_MIN_BYTES = 16
SECRET_MIN_DISTINCT = 10
SECRET_MIN_BITS = 80
SECRET_HOWTO = "(umask 077; head -c 32 /dev/urandom | base64 > {path})"


def secret_strength(secret: bytes) -> float:
    """Estimated bits: length x entropy per byte of the secret's own byte distribution. It overrates words
    and runs (it cannot know a dictionary), so those are discounted: a secret of letters and spaces only
    counts 1.5 bits a byte (English text carries about that), and a secret made mostly of runs ("abcd",
    "aaaa", "4321") counts nothing."""
    n = len(secret)
    if not n:
        return 0.0
    bits = -sum(c * math.log2(c / n) for c in Counter(secret).values())
    if n > 1 and sum(abs(a - b) <= 1 for a, b in pairwise(secret)) * 2 > n - 1:
        return 0.0
    if all(chr(b).isalpha() or b == 0x20 for b in secret):
        bits = min(bits, 1.5 * n)
    return bits


def read_secret(path: Path, key: str = "secret_file") -> bytes:
    """The shared secret from its file, refused unless only the owner can read it and it is hard to guess."""
    try:
        mode = path.stat().st_mode
        secret = path.read_bytes().strip()
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror or e}") from None
    if mode & 0o077:
        raise ConfigError(key, f"{path} is readable or writable by group or others; fix: chmod 600 {path}")
    howto = SECRET_HOWTO.format(path=path)
    if len(secret) < SECRET_MIN_BYTES:
        raise ConfigError(key, f"{path} holds a secret of {len(secret)} bytes; use at least {SECRET_MIN_BYTES}, "
                               f"e.g.: {howto}")
    distinct = len(set(secret))
    if distinct < SECRET_MIN_DISTINCT or secret_strength(secret) < SECRET_MIN_BITS:
        raise ConfigError(key, f"{path} holds a guessable secret ({distinct} distinct bytes, about "
                               f"{secret_strength(secret):.0f} bits; need {SECRET_MIN_BITS}); make one with: {howto}")
    return secret


# Checks shared by both daemons
def positive(v: Any) -> str | None:
    return None if v > 0 else "must be greater than 0"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"expected one of {', '.join(choices)}, got {v!r}"
    return check


def non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must not be negative"


def probability(v: float) -> str | None:
    return None if 0 < v < 1 else "must be between 0 and 1 (exclusive)"


def regexes(v: tuple[str, ...]) -> str | None:
    """Every pattern compiles: a typo must stop the daemon at load, before it writes any state."""
    for pattern in v:
        try:
            re.compile(pattern)
        except re.error as e:
            return f"{pattern!r} is not a valid regular expression: {e}"
    return None
