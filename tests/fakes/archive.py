"""An Archive that keeps what it is given, for tests of the parts that call one."""

from __future__ import annotations

from crawler.archive import Exchange


class Collected:
    """An Archive that keeps what it is given in lists: for tests of the parts that call one."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []
        self.metadatas: list[tuple[str, tuple[tuple[str, str], ...], str, str, str]] = []
        self.resources: list[tuple[str, str, bytes, str, str, str]] = []

    def exchange(self, ex: Exchange) -> str:
        self.exchanges.append(ex)
        return f"<urn:uuid:exchange-{len(self.exchanges)}>"

    def metadata(self, target: str, fields: tuple[tuple[str, str], ...], *, refers_to: str, page: str,
                 role: str, now: float, sha256: str = "") -> str:
        self.metadatas.append((target, fields, refers_to, page, role))
        return f"<urn:uuid:metadata-{len(self.metadatas)}>"

    def resource(self, target: str, content_type: str, block: bytes, *, refers_to: str, page: str, role: str,
                 now: float) -> str:
        self.resources.append((target, content_type, block, refers_to, page, role))
        return f"<urn:uuid:resource-{len(self.resources)}>"
