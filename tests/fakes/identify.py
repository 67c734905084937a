"""A reference index that behaves like crawler.identify.ReferenceIndex on fingerprints made for tests: a
fingerprint is ASCII text of space-separated tokens, one a second of audio; a copy matches a work when the work's
first token is among the copy's and at least MIN_RUN of the work's tokens follow in order from there. The score is
the run's length, the offset the run's start in the work (seconds)."""

from __future__ import annotations

from pathlib import Path

from crawler.identify import IdentifyError, Match

MIN_RUN = 3


def fingerprint_of(*tokens: str) -> bytes:
    return " ".join(tokens).encode()


def fake_fingerprint_file(path: Path) -> bytes:
    """The fingerprint of a test "audio" file: the file's text itself (refused when it is not text of tokens)."""
    data = path.read_bytes()
    if not data.strip() or not data.isascii():
        raise IdentifyError(f"{path.name}: not audio")
    return b" ".join(data.split())


class FakeIndex:
    def __init__(self) -> None:
        self.works: dict[str, list[str]] = {}
        self.queries = 0

    def add(self, work: str, fingerprint: bytes) -> None:
        self.works[work] = fingerprint.decode().split()

    def remove(self, work: str) -> None:
        self.works.pop(work, None)

    def match(self, fingerprint: bytes) -> list[Match]:
        self.queries += 1
        copy = fingerprint.decode().split()
        out = []
        for work, tokens in self.works.items():
            best = (0, 0)
            for start in range(len(tokens)):
                if tokens[start] not in copy:
                    continue
                i = copy.index(tokens[start])
                run = 0
                while start + run < len(tokens) and i + run < len(copy) and tokens[start + run] == copy[i + run]:
                    run += 1
                best = max(best, (run, -start))
            if best[0] >= MIN_RUN:
                out.append(Match(work, float(best[0]), float(-best[1])))
        return sorted(out, key=lambda m: -m.score)

    def __len__(self) -> int:
        return len(self.works)


class StrictIndex(FakeIndex):
    """As FakeIndex, but adding a work it holds or removing one it does not is a mistake (a real index may refuse
    both)."""

    def add(self, work: str, fingerprint: bytes) -> None:
        assert work not in self.works, f"{work} added twice"
        super().add(work, fingerprint)

    def remove(self, work: str) -> None:
        assert work in self.works, f"{work} removed but not there"
        super().remove(work)
