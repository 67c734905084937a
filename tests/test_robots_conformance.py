"""Google's robots.txt test suite (google/robotstxt, robots_test.cc, in tests/data) run through crawler.robots.

The expectations are read out of the C++ source by a small interpreter of the subset of C++ the file uses
(string literals, declarations, StrCat/StrAppend, a while loop, the EXPECT_* macros), so the cases are
Google's own, not a retelling. Every form is run:

- ``EXPECT_TRUE/FALSE(IsUserAgentAllowed(robotstxt, agent, url))``: ``parse(robotstxt, agent).allowed(url)``,
  and beside it protego (the parser the crawl used before, through the same decode it did);
- ``RobotsMatcher::IsValidUserAgentToObey(x)``: ``is_product_token``;
- ``ParseRobotsTxt`` with the stats reporter (directive counts, last line, the sitemap): ``scan``;
- ``TestPath`` (GetPathParamsQuery) and ``TestEscape`` (MaybeEscapePattern): ``path_of``, ``escape_pattern``.

Our failures must be exactly DELIBERATE (each explained), and our pass count at least protego's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from protego import Protego

from crawler import robots

SOURCE = Path(__file__).parent / "data" / "robots_test.cc"

# Cases where the crawler deliberately reads robots.txt differently from Google, keyed by (test, source line).
# None today: every case of the suite passes.
DELIBERATE: dict[tuple[str, int], str] = {}


# ---- reading the expectations out of the C++ source -----------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<skip>\s+|//[^\n]*|/\*.*?\*/|^\#[^\n]*)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<chr>'(?:[^'\\\n]|\\.)*')
  | (?P<num>\d+)
  | (?P<id>(?:::)?[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)
  | (?P<op>->|<<|==|!=|<=|>=|&&|\|\||\+\+|--|\+=|[-+*/%<>=!&|^~?:;,.(){}\[\]])
""", re.VERBOSE | re.DOTALL | re.MULTILINE)
_TYPES = {"static", "const", "absl::string_view", "std::string", "size_t", "int", "char", "RobotsStatsReporter"}


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    line: int


@dataclass(frozen=True)
class Call:
    """A call into the parser under test, evaluated later: what an EXPECT_* compares."""
    kind: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Case:
    test: str
    line: int
    kind: str
    args: tuple[Any, ...]
    expected: Any


class Reporter:
    def __init__(self) -> None:
        self.body: bytes | None = None


class Ref:
    def __init__(self, name: str) -> None:
        self.name = name


def tokenize(text: str) -> list[Tok]:
    out, pos, line = [], 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SyntaxError(f"robots_test.cc:{line}: cannot read {text[pos:pos + 20]!r}")
        if m.lastgroup != "skip":
            out.append(Tok(m.lastgroup or "", m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    return out


def c_string(literal: str) -> bytes:
    body, out, i = literal[1:-1], bytearray(), 0
    simple = {"n": b"\n", "r": b"\r", "t": b"\t", "\\": b"\\", '"': b'"', "'": b"'"}
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
        elif body[i + 1] == "x":
            digits = re.match(r"[0-9A-Fa-f]+", body[i + 2:])
            assert digits is not None
            out.append(int(digits.group(), 16) & 0xFF)
            i += 2 + len(digits.group())
        elif body[i + 1] in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[i + 1:])
            assert digits is not None
            out.append(int(digits.group(), 8) & 0xFF)
            i += 1 + len(digits.group())
        else:
            out += simple[body[i + 1]]
            i += 2
    return bytes(out)


class Interpreter:
    """Runs every TEST(...) body of the file, collecting the expectations as Cases."""

    def __init__(self, tokens: list[Tok]) -> None:
        self.toks = tokens
        self.i = 0
        self.scopes: list[dict[str, Any]] = []
        self.test = ""
        self.cases: list[Case] = []

    # -- tokens
    def peek(self, ahead: int = 0) -> Tok:
        return self.toks[self.i + ahead]

    def take(self, text: str | None = None) -> Tok:
        tok = self.toks[self.i]
        if text is not None and tok.text != text:
            raise SyntaxError(f"robots_test.cc:{tok.line}: expected {text!r}, found {tok.text!r}")
        self.i += 1
        return tok

    def error(self, what: str) -> SyntaxError:
        return SyntaxError(f"robots_test.cc:{self.peek().line}: {what} ({self.peek().text!r})")

    # -- the file
    def run(self) -> list[Case]:
        while self.i < len(self.toks):
            if self.peek().text == "TEST" and self.peek(1).text == "(":
                self.take()
                self.take("(")
                self.take()
                self.take(",")
                self.test = self.take().text
                self.take(")")
                self.scopes = [{}]
                self.block(run=True)
            else:
                self.i += 1
        return self.cases

    def block(self, run: bool) -> None:
        self.take("{")
        self.scopes.append({})
        while self.peek().text != "}":
            self.statement(run)
        self.take("}")
        self.scopes.pop()

    def statement(self, run: bool) -> None:
        tok = self.peek()
        if tok.text == "{":
            self.block(run)
        elif tok.text == "while":
            self.take()
            self.take("(")
            start = self.i
            while True:
                self.i = start
                go = self.expr(run)
                self.take(")")
                if run and go:
                    self.block(True)
                    continue
                self.block(False)
                break
        elif tok.text in _TYPES:
            self.declaration(run)
        elif tok.kind == "id":
            self.call_statement(run)
        else:
            raise self.error("unexpected statement")

    def declaration(self, run: bool) -> None:
        words = []
        while self.peek().text in _TYPES or self.peek().text == "&":
            words.append(self.take().text)
        name = self.take().text
        if self.peek().text == "[":
            self.take("[")
            self.take("]")
        if self.peek().text == "=":
            self.take()
            value = self.expr(run)
        else:
            value = Reporter() if "RobotsStatsReporter" in words else b""
        self.take(";")
        if run:
            self.scopes[-1][name] = value

    def call_statement(self, run: bool) -> None:
        name = self.take().text
        line = self.peek().line
        args = self.arguments(run)
        self.take(";")
        if not run:
            return
        if name in ("EXPECT_TRUE", "EXPECT_FALSE"):
            (call,) = args
            assert isinstance(call, Call), f"line {line}: {name} of {call!r}"
            self.expect(line, call, name == "EXPECT_TRUE")
        elif name == "EXPECT_EQ":
            want, call = args
            assert isinstance(call, Call), f"line {line}: EXPECT_EQ of {call!r}"
            self.expect(line, call, want)
        elif name == "TestPath":
            self.expect(line, Call("path", (args[0],)), args[1])
        elif name == "TestEscape":
            self.expect(line, Call("escape", (args[0],)), args[1])
        elif name == "absl::StrAppend":
            ref, *parts = args
            self.assign(ref.name, self.lookup(ref.name) + b"".join(parts))
        elif name == "googlebot::ParseRobotsTxt":
            body, ref = args
            self.lookup(ref.name).body = body
        else:
            raise SyntaxError(f"robots_test.cc:{line}: unknown call {name}")

    def expect(self, line: int, call: Call, expected: Any) -> None:
        self.cases.append(Case(self.test, line, call.kind, call.args, expected))

    def lookup(self, name: str) -> Any:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise self.error(f"unknown name {name}")

    def assign(self, name: str, value: Any) -> None:
        for scope in reversed(self.scopes):
            if name in scope:
                scope[name] = value
                return
        raise self.error(f"unknown name {name}")

    # -- expressions
    def arguments(self, run: bool) -> list[Any]:
        self.take("(")
        args = []
        while self.peek().text != ")":
            args.append(self.expr(run))
            if self.peek().text == ",":
                self.take()
        self.take(")")
        return args

    def expr(self, run: bool) -> Any:
        left = self.additive(run)
        if self.peek().text == "<":
            self.take()
            right = self.additive(run)
            return run and left < right
        return left

    def additive(self, run: bool) -> Any:
        value = self.product(run)
        while self.peek().text in ("+", "-"):
            op = self.take().text
            right = self.product(run)
            if run:
                value = value + right if op == "+" else value - right
        return value

    def product(self, run: bool) -> Any:
        value = self.postfix(run)
        while self.peek().text == "*":
            self.take()
            right = self.postfix(run)
            if run:
                value = value * right
        return value

    def postfix(self, run: bool) -> Any:
        value = self.primary(run)
        while self.peek().text == ".":
            self.take()
            method = self.take().text
            self.take("(")
            self.take(")")
            if not run:
                continue
            if method in ("length", "size"):
                value = len(value)
            elif isinstance(value, Reporter):
                value = Call(method, (value.body,))
            else:
                raise self.error(f"unknown method {method}")
        return value

    def primary(self, run: bool) -> Any:
        tok = self.take()
        if tok.kind == "str":
            parts = [c_string(tok.text)]
            while self.peek().kind == "str":
                parts.append(c_string(self.take().text))
            return b"".join(parts)
        if tok.kind == "num":
            return int(tok.text)
        if tok.text == "&":
            return Ref(self.take().text)
        if tok.text == "(":
            value = self.expr(run)
            self.take(")")
            return value
        if tok.kind != "id":
            raise SyntaxError(f"robots_test.cc:{tok.line}: unexpected {tok.text!r}")
        if self.peek().text != "(":
            return self.lookup(tok.text) if run else None
        args = self.arguments(run)
        if not run:
            return None
        if tok.text == "IsUserAgentAllowed":
            return Call("allowed", tuple(args))
        if tok.text == "RobotsMatcher::IsValidUserAgentToObey":
            return Call("valid_agent", tuple(args))
        if tok.text in ("absl::string_view", "std::string"):
            return args[0] if args else b""
        if tok.text == "absl::StrCat":
            return b"".join(args)
        raise SyntaxError(f"robots_test.cc:{tok.line}: unknown function {tok.text}")


def load_cases() -> list[Case]:
    return Interpreter(tokenize(SOURCE.read_text(encoding="utf-8"))).run()


CASES = load_cases()


# ---- running them -----------------------------------------------------------------------------------------

def ours(case: Case) -> Any:
    if case.kind == "allowed":
        body, agent, url = case.args
        return robots.parse(body, agent.decode()).allowed(url.decode())
    if case.kind == "valid_agent":
        return robots.is_product_token(case.args[0].decode())
    if case.kind == "path":
        return robots.path_of(case.args[0].decode()).encode()
    if case.kind == "escape":
        return robots.escape_pattern(case.args[0]).encode()
    lines = list(robots.scan(case.args[0]))
    known = [ln for ln in lines if ln.kind in (robots.USER_AGENT, robots.ALLOW, robots.DISALLOW, robots.SITEMAP)]
    if case.kind == "valid_directives":
        return len(known)
    if case.kind == "unknown_directives":
        return len(lines) - len(known)   # Crawl-delay is an unknown line to Google; the suite has none
    if case.kind == "last_line_seen":
        return max((ln.number for ln in lines), default=0)
    if case.kind == "sitemap":
        return b"".join(ln.value for ln in known if ln.kind == robots.SITEMAP)
    raise AssertionError(f"no runner for {case.kind}")


def protego(case: Case) -> bool:
    """What the crawl did before: the body decoded as UTF-8 (errors replaced), then protego."""
    body, agent, url = case.args
    try:
        return Protego.parse(body.decode("utf-8", errors="replace")).can_fetch(url.decode(), agent.decode())
    except Exception:     # an exception is a failed case, not a broken test
        return not case.expected


def key(case: Case) -> tuple[str, int]:
    return case.test, case.line


def test_every_expectation_of_the_source_was_read():
    text = SOURCE.read_text(encoding="utf-8")
    kinds = [c.kind for c in CASES]
    assert kinds.count("allowed") == len(re.findall(r"EXPECT_(?:TRUE|FALSE)\(\s*IsUserAgentAllowed\(", text))
    assert kinds.count("valid_agent") == len(re.findall(r"EXPECT_(?:TRUE|FALSE)\(RobotsMatcher::IsValid", text))
    assert kinds.count("path") == len(re.findall(r"^\s*TestPath\(", text, re.M))
    assert kinds.count("escape") == len(re.findall(r"^\s*TestEscape\(", text, re.M))
    # Every EXPECT_* and helper call is one case, but for the two EXPECT_EQ inside TestPath's and TestEscape's
    # definitions (their calls are the cases).
    assert len(CASES) == len(re.findall(r"EXPECT_(?:TRUE|FALSE|EQ)\(|^\s*Test(?:Path|Escape)\(", text, re.M)) - 2
    assert len({key(c) for c in CASES}) == len(CASES)      # one case a source line: keys are unique
    assert (len(CASES), kinds.count("allowed")) == (201, 145)   # the file is pinned: nothing skipped silently


def test_googles_robots_cases_pass_and_beat_protego():
    allowed = [c for c in CASES if c.kind == "allowed"]
    failed = {key(c) for c in CASES if ours(c) != c.expected}
    lines = []
    for label, group in (("RFC 9309 (ID_ tests)", [c for c in allowed if c.test.startswith("ID_")]),
                         ("Google-specific", [c for c in allowed if not c.test.startswith("ID_")]),
                         ("all", allowed)):
        mine = sum(key(c) not in failed for c in group)
        theirs = sum(protego(c) == c.expected for c in group)
        lines.append(f"robots.txt IsUserAgentAllowed, {label}: ours {mine}/{len(group)}, "
                     f"protego {theirs}/{len(group)}")
        assert mine >= theirs, lines[-1]
    helpers = [c for c in CASES if c.kind != "allowed"]
    lines.append(f"robots.txt helper forms (agent token, line scan, path, escape): ours "
                 f"{sum(key(c) not in failed for c in helpers)}/{len(helpers)}")
    print("\n" + "\n".join(lines))
    unexpected = sorted(failed - DELIBERATE.keys())
    assert not unexpected, [(k, next(c for c in CASES if key(c) == k)) for k in unexpected]
    assert not DELIBERATE.keys() - failed, "a listed difference now passes: take it off the list"


@pytest.mark.parametrize("case", [c for c in CASES if c.kind == "allowed"], ids=lambda c: f"{c.test}:{c.line}")
def test_case(case):
    if key(case) in DELIBERATE:
        pytest.skip(DELIBERATE[key(case)])
    assert ours(case) == case.expected
