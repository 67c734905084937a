"""Data inside inline scripts: string literals with the object that holds them, and assigned literals.

Sites put their song lists in scripts as JSON or as JavaScript object literals (unquoted keys, single
quotes, trailing commas). Everything here is driven by one regular expression so that a script of
megabytes costs one C-speed pass, and every function returns "nothing found" rather than raising on
input that is not what it expects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# Hostile pages may carry scripts of any size; beyond this nothing useful is expected.
MAX_SCRIPT_CHARS = 4 * 1024 * 1024
MAX_DEPTH = 64

_TOKEN = re.compile(
    r"""(?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`)
      |(?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))
      |(?P<punct>[{}\[\]:,])
      |(?P<ident>[A-Za-z_$][\w$]*)
      |(?P<num>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
      |(?P<other>\S)""",
    re.DOTALL | re.VERBOSE,
)
_ESCAPE = re.compile(r"\\(u\{[0-9a-fA-F]{1,6}\}|u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|\r\n|.)", re.DOTALL)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0",
                   "\n": "", "\r\n": "", "\r": ""}
_CONSTANTS = {"true": True, "false": False, "null": None, "undefined": None}


def unescape_js(body: str) -> str:
    """The value of a JS string literal's body (quotes already removed)."""
    if "\\" not in body:
        return body

    def one(m: re.Match[str]) -> str:
        esc = m.group(1)
        if esc.startswith("u{"):
            code = int(esc[2:-1], 16)
            return chr(code) if code <= 0x10FFFF else ""
        if esc[0] in "ux" and len(esc) > 1:
            return chr(int(esc[1:], 16))
        return _SIMPLE_ESCAPES.get(esc, esc)

    text = _ESCAPE.sub(one, body)
    # \uD83D\uDE00 pairs arrive as two surrogates; fold them into one character.
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    start: int


def tokens(script: str) -> Iterator[Token]:
    for m in _TOKEN.finditer(script[:MAX_SCRIPT_CHARS]):
        kind = m.lastgroup or "other"
        if kind != "comment":
            yield Token(kind, m.group(), m.start())


# Only what pairing strings with their objects needs; everything else is skipped inside the regex engine.
_CONTEXT_TOKEN = re.compile(
    r"""(?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`)
      |(?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))
      |(?P<punct>[{}:])
      |(?P<ident>(?<![\w$])[A-Za-z_$][\w$]*(?=\s*:))""",
    re.DOTALL | re.VERBOSE,
)


@dataclass(frozen=True)
class ScriptString:
    value: str
    keys: dict[str, str]     # the string-valued keys of the object literal holding the string (lower case)
    order: int


def strings_with_context(script: str, wanted: Callable[[str], bool]) -> list[ScriptString]:
    """Every string literal for which ``wanted(value)`` holds, with its enclosing object's string keys."""
    # Each frame is one open object literal: [its string keys, the wanted strings inside it].
    frames: list[tuple[dict[str, str], list[tuple[int, str]]]] = [({}, [])]
    out: list[ScriptString] = []
    # The last two tokens as (kind, text): a key is a string or identifier, then ":", then the value.
    prev: tuple[str, str] = ("", "")
    prev2: tuple[str, str] = ("", "")
    order = 0

    def close(frame: tuple[dict[str, str], list[tuple[int, str]]]) -> None:
        keys, found = frame
        out.extend(ScriptString(value, keys, n) for n, value in found)

    for m in _CONTEXT_TOKEN.finditer(script, 0, min(len(script), MAX_SCRIPT_CHARS)):
        kind, text = m.lastgroup or "", m.group()
        if kind == "comment":
            continue
        if text == "{":
            frames.append(({}, []))
        elif text == "}":
            if len(frames) > 1:
                close(frames.pop())
        elif kind == "str":
            value = unescape_js(text[1:-1])
            keys, found = frames[-1]
            if prev[1] == ":" and prev2[0] in ("str", "ident"):
                key = prev2[1][1:-1] if prev2[0] == "str" else prev2[1]
                keys.setdefault(unescape_js(key).lower(), value)
            if wanted(value):
                found.append((order, value))
                order += 1
        prev2, prev = prev, (kind, text)
    while frames:
        close(frames.pop())
    out.sort(key=lambda s: s.order)
    return out


def find_literal(script: str, name: str) -> str | None:
    """The text of the array or object literal assigned to ``name`` (``name = [...]``), or None."""
    m = re.search(r"(?<![\w$.])" + re.escape(name) + r"\s*=\s*(?=[\[{])", script[:MAX_SCRIPT_CHARS])
    if m is None:
        return None
    return _balanced(script, m.end())


_BRACKETS = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[\[\]{}]""", re.DOTALL)


def _balanced(script: str, start: int) -> str | None:
    depth = 0
    end_limit = min(len(script), MAX_SCRIPT_CHARS)
    for m in _BRACKETS.finditer(script, start, end_limit):
        ch = m.group()
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                return script[start:m.end()]
    return None


class LiteralError(ValueError):
    """The text is not a data literal we can read."""


def parse_literal(text: str) -> Any:
    """JSON first; failing that, a JavaScript data literal (unquoted keys, single quotes, trailing commas)."""
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise LiteralError("nested too deeply") from exc
    except ValueError:
        pass
    toks = list(tokens(text))
    value, pos = _value(toks, 0, 0)
    if pos != len(toks):
        raise LiteralError(f"unexpected {toks[pos].text!r} after the literal")
    return value


def _value(toks: list[Token], pos: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise LiteralError("nested too deeply")
    if pos >= len(toks):
        raise LiteralError("literal ends early")
    tok = toks[pos]
    if tok.kind == "str":
        return unescape_js(tok.text[1:-1]), pos + 1
    if tok.kind == "num":
        try:
            number = float(tok.text)
        except ValueError as exc:
            raise LiteralError(f"bad number {tok.text!r}") from exc
        return (int(number) if number.is_integer() and re.fullmatch(r"-?\d+", tok.text) else number), pos + 1
    if tok.kind == "ident" and tok.text in _CONSTANTS:
        return _CONSTANTS[tok.text], pos + 1
    if tok.text == "[":
        items: list[Any] = []
        pos += 1
        while pos < len(toks) and toks[pos].text != "]":
            item, pos = _value(toks, pos, depth + 1)
            items.append(item)
            pos = _separator(toks, pos, "]")
        return items, _expect(toks, pos, "]")
    if tok.text == "{":
        obj: dict[str, Any] = {}
        pos += 1
        while pos < len(toks) and toks[pos].text != "}":
            key_tok = toks[pos]
            if key_tok.kind == "str":
                key = unescape_js(key_tok.text[1:-1])
            elif key_tok.kind in ("ident", "num"):
                key = key_tok.text
            else:
                raise LiteralError(f"bad key {key_tok.text!r}")
            pos = _expect(toks, pos + 1, ":")
            obj[key], pos = _value(toks, pos, depth + 1)
            pos = _separator(toks, pos, "}")
        return obj, _expect(toks, pos, "}")
    raise LiteralError(f"unexpected {tok.text!r}")


def _separator(toks: list[Token], pos: int, closer: str) -> int:
    if pos < len(toks) and toks[pos].text == ",":
        return pos + 1
    if pos < len(toks) and toks[pos].text == closer:
        return pos
    raise LiteralError(f"expected ',' or {closer!r}")


def _expect(toks: list[Token], pos: int, text: str) -> int:
    if pos >= len(toks) or toks[pos].text != text:
        raise LiteralError(f"expected {text!r}")
    return pos + 1
