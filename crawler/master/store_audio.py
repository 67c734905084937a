"""The audio catalogue of the master store: one row per item found (per source id or address, per page), its
history, the windows recorded of live streams (live_recordings), who lists each item (audio_refs), the downloads
under way (pending_downloads), and the catalogue's changes counted per refresh cycle. A part of MasterStore (crawler/master/store.py), writing into the transaction it
shares with the frontier and the visits (crawler/master/store_core.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from crawler.items import AUDIO_FIELD_KINDS, PLAYED, RECORDED_AT, says_live
from crawler.master.backend import Backend
from crawler.master.store_core import CHUNK, LEASED, QUEUED, StoreCore, chunks, insert_rows
from crawler.web.memo import Memo


# The most runs of catalogue rows read before add_audio guesses again that a run is new (see _add_run).
GUESS_BACKOFF = 64

# The catalogue changes counted per refresh cycle.
CHANGE_KINDS = ("new", "changed", "removed")

# Catalogue columns in export order, from the one field list of AudioItem (its client identity is never
# stored: cookies are secrets), plus who found the item and when. Map fields are stored as JSON text.
# The fingerprint ("bytes") is kept apart too: it is no catalogue column.
_UNSTORED = ("identity", "bytes")
AUDIO_COLUMNS = (tuple(k for k, kind in AUDIO_FIELD_KINDS.items() if kind not in _UNSTORED)
                 + ("node", "found_at", "last_seen", "changed_at", "removed_at", "returned_at"))
# found_at is when the item first appeared (exports also call it first_seen); last_seen when a visit of its page
# last showed it; changed_at when new bytes were last found at its address; removed_at when no page, playlist
# or feed listed it any more (status "removed"); returned_at when one listed it again after that (cleared by a
# later change). Epoch seconds here, ISO-8601 UTC in exports.
AUDIO_TIMES = ("found_at", "last_seen", "changed_at", "removed_at", "returned_at")
# The time of an item's latest event, for changes_since (and its index): every write keeps at most one of
# removed_at and returned_at set, and clears returned_at when the bytes change.
EVENT_AT = "coalesce(removed_at, returned_at, changed_at, found_at)"
CHANGED, REMOVED = "changed", "removed"
NEW, REPEAT = "new", "repeat"          # what a reported row does besides CHANGED (audio_action)
_JSON_COLUMNS = frozenset(k for k, kind in AUDIO_FIELD_KINDS.items() if kind == "map")
_SQL_TYPES = {"text": "TEXT", "map": "TEXT", "number": "{REAL}"}
COLUMN_TYPES = {**{k: _SQL_TYPES[kind] for k, kind in AUDIO_FIELD_KINDS.items() if kind not in _UNSTORED},
                 "size": "{INT}", "bitrate": "{INT}", "node": "TEXT", "found_at": "{REAL}", "last_seen": "{REAL}",
                 "changed_at": "{REAL}", "removed_at": "{REAL}", "returned_at": "{REAL}"}
_NOT_NULL = frozenset({"page", "url", "status"})
# A repeat report of a known row fills only what the first one lacked; these are decided otherwise.
_NOT_COALESCED = frozenset({"url", "page", "status", "reason", "node", "found_at", "extra", "last_seen", "changed_at",
                            "removed_at", "returned_at"})
# The catalogue key, unique, page first: the items of a page are neighbours in its index, so a visit's new items
# land on a leaf or two of it (led by the item key, each went to a leaf of its own, one more page for the commit
# to write per item), and the same index finds a page's items (no index on page apart).
AUDIO_KEY = ("page", "ukey")
AUDIO_TABLE = ("CREATE TABLE audio (\n    id {AUTO_ID},\n    ukey TEXT NOT NULL,\n"
                + "".join(f"    {c} {COLUMN_TYPES[c]}{' NOT NULL' if c in _NOT_NULL else ''},\n"
                          for c in AUDIO_COLUMNS)
                + f"    UNIQUE ({', '.join(AUDIO_KEY)})\n);")

# A new row's id is given by the store (AudioCatalogue.next_id), so that the ids of what a report wrote are known
# without reading them back. No ON CONFLICT: add_audio inserts only keys it found absent, and a row that met one
# after all would leave its id unused and wrong: it fails the report instead (but see _insert_audio's `guess`).
_INSERT_AUDIO = (f"INSERT INTO audio(id, ukey, {', '.join(AUDIO_COLUMNS)}) "
                 f"VALUES (?, ?{', ?' * len(AUDIO_COLUMNS)})")
_INSERTED = ("id", "ukey", *AUDIO_COLUMNS)
_COALESCED = tuple(c for c in AUDIO_COLUMNS if c not in _NOT_COALESCED)
_UPDATE_AUDIO = ("UPDATE audio SET " + "".join(f"{c} = coalesce({c}, ?), " for c in _COALESCED)
                 + "url = CASE WHEN url = '' THEN ? ELSE url END, "
                 "reason = CASE WHEN ? = 'ok' AND status NOT IN ('ok', 'changed') THEN NULL ELSE reason END, "
                 # A removed item that is back takes the new report's status; "changed" stays until it changes.
                 "status = CASE WHEN status = 'removed' THEN ? WHEN ? = 'ok' AND status != 'changed' THEN 'ok' "
                 "ELSE status END, last_seen = ?, removed_at = NULL, "
                 "returned_at = CASE WHEN status = 'removed' THEN ? ELSE returned_at END "
                 "WHERE id = ?")


def _insert_audio(db: Backend, rows: list[tuple[Any, ...]], *, guess: bool = False) -> int:
    """Insert new rows (values in _INSERTED order), leaving out the columns that none of them sets
    (store_core.insert_rows): a row has some 18 of its 33 values unset, whose binding was 5 of the 7 us an insert
    cost before its indexes.

    guess: the rows' keys were not looked up (AudioCatalogue._add_run): a row whose key is known is not inserted
    (ON CONFLICT DO NOTHING), and the caller compares the count returned, the rows inserted, with its rows."""
    return insert_rows(db, "audio", _INSERTED, rows, suffix=" ON CONFLICT DO NOTHING" if guess else "")


# The windows recorded of live streams (an item whose row says extra.live: a live HLS playlist, a dynamic DASH
# presentation, an internet radio station): each visit records a new window with new bytes, which is the item's
# history, not a change of it. One row per window, in the order stored; the catalogue row shows the latest. The
# window's fingerprint is kept here (one per window: a fingerprint per address would be overwritten by the next
# window) and matched against the works like a file's (crawler/master/store_identify.py); ``checked`` is as
# fingerprints.checked, NULL while no fingerprint came. ``played``: a station's titles, [{"offset", "title"}] as
# JSON text.
LIVE_TABLE = """CREATE TABLE live_recordings (
    id          {AUTO_ID},
    audio_id    {INT} NOT NULL,        -- audio.id
    url         TEXT NOT NULL,         -- the stream's address as reported (audio.url)
    recorded_at {REAL} NOT NULL,       -- wall clock (epoch seconds) of the window's first byte
    duration    {REAL},                -- seconds recorded
    sha256      TEXT NOT NULL,
    size        {INT},
    path        TEXT,
    node        TEXT,
    format      TEXT,                  -- "hls", "dash", "icy"
    played      TEXT,
    stored_at   {REAL} NOT NULL,       -- when the master stored it
    fingerprint {BLOB},
    checked     {INT},
    UNIQUE (audio_id, recorded_at)
);
CREATE INDEX live_recordings_sha ON live_recordings(sha256);
CREATE INDEX live_recordings_due ON live_recordings(checked, id) WHERE checked IS NOT NULL"""
# The export of the windows (export --recordings), in this column order; "window" is live_recordings.id, the
# matches export names it too.
RECORDING_COLUMNS = ("window", "url", "page", "title", "recorded_at", "duration", "sha256", "size", "path", "node",
                     "format", "played", "stored_at")


def is_live(row: Mapping[str, Any]) -> bool:
    """Whether a catalogue row (or an item's extra) is a window recorded of a live stream."""
    extra = row.get("extra") if "extra" in row else None
    return says_live(extra if isinstance(extra, Mapping) else row)


# Downloads a page reported as pending (its catalogue row's status is "pending" until the outcome comes), with
# the node that holds each: when that node dies they are handed to another, and the crawl is not over while
# any is left. One row per (page, address as reported); the item is its wire form as JSON, client identity
# included (a download may need the cookies that asked for its link): the row goes when the download ends.
PENDING_TABLE = """CREATE TABLE pending_downloads (
    page  TEXT NOT NULL,
    url   TEXT NOT NULL,
    node  TEXT,                 -- NULL: no live node to hold it, handed out when one joins
    item  TEXT NOT NULL,
    since {REAL} NOT NULL,
    PRIMARY KEY (page, url)
);
CREATE INDEX pending_node ON pending_downloads(node)"""
PENDING = "pending"   # crawler.items.PENDING: the catalogue status of an item whose download is under way

# Who lists each catalogue item: one row per (referrer, item), the referrer being the URL whose visit reported it
# (its page, the playlist or feed that names it, or its own address when a task of its own found it to be
# audio). A visit of a referrer replaces that referrer's rows only, and an item is "removed" once no referrer
# lists it any more: a page revisited without its playlist's songs (they come in the playlist's own task) takes
# nothing from them.
REFS_TABLE = """CREATE TABLE audio_refs (
    referrer {INT} NOT NULL,    -- url_state.id
    audio_id {INT} NOT NULL,    -- audio.id
    PRIMARY KEY (referrer, audio_id)
) {WITHOUT_ROWID};
CREATE INDEX audio_refs_item ON audio_refs(audio_id)"""


def audio_action(values: Mapping[str, Any], old: tuple[int, str, str | None] | None, live: bool = False
                 ) -> tuple[str, str | None, str, str | None]:
    """What a reported catalogue row (its stored values) does to the row it meets, (id, status, sha256) or None:
    (action, old status, new status, the change counted or None). Actions: NEW, a row of its own; CHANGED, other
    bytes than the row holds at a known item (the old ones go to audio_history); REPEAT, the row seen again,
    filling what the first report lacked. ``live``: the row is a live stream's window, whose new bytes are no
    change (the window is kept as the item's history, live_recordings): a repeat."""
    status = values["status"]
    if old is None:
        return NEW, None, status, NEW
    _, old_status, old_sha = old
    new_sha = values["sha256"]
    # A live stream's new window is no change: it is kept as the item's history (live_recordings).
    if old_sha and new_sha and new_sha != old_sha and not live:
        return CHANGED, old_status, CHANGED, CHANGED
    if old_status == REMOVED:
        return REPEAT, old_status, status, NEW      # back on its page: it appeared again
    if status == "ok" and old_status != CHANGED:
        return REPEAT, old_status, "ok", None
    return REPEAT, old_status, old_status, None


def listed_keys(rows: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, str]]:
    """The catalogue keys, (item key, page), of the audio a visit reported: what its URL lists (see
    AudioCatalogue.follow_refs)."""
    return frozenset(_row_key(r) for r in rows)


def _row_key(row: Mapping[str, Any]) -> tuple[str, str]:
    return _audio_ukey(row).replace("\x00", ""), str(row.get("page") or "").replace("\x00", "")


def _audio_values(row: Mapping[str, Any]) -> dict[str, Any]:
    """A catalogue row's column values as stored: maps as JSON text, fields not in the table kept in extra."""
    # The row laid over the columns, in C: the columns keep their order, the row's other fields follow in its order
    # (a row comes with none but in a test or from an older peer; a row's field at a time cost 1.5 us a row).
    values = {**_NO_VALUES, **row}
    extra = dict(row.get("extra") or {})
    if len(values) > _N_COLUMNS:
        for k in list(values)[_N_COLUMNS:]:
            v = values.pop(k)
            if k != "identity":
                extra[k] = v
    values["extra"] = extra
    for c in _MAP_COLUMNS:
        v = values[c]
        values[c] = _json_text(v) if v else None
    values["url"] = values["url"] or ""
    values["status"] = values["status"] or "ok"
    # Page text may hold NUL; PostgreSQL's text cannot, and no reader wants it: dropped on both stores. (JSON
    # text holds none: the encoder escapes it.) One search over the text of the row finds whether any does.
    texts = [v for v in values.values() if isinstance(v, str)]
    if "\x00" in "".join(texts):
        for c, v in values.items():
            if isinstance(v, str) and "\x00" in v:
                values[c] = v.replace("\x00", "")
    return values


_NO_VALUES: dict[str, Any] = dict.fromkeys(AUDIO_COLUMNS)
_N_COLUMNS = len(AUDIO_COLUMNS)
_MAP_COLUMNS = tuple(c for c in AUDIO_COLUMNS if c in _JSON_COLUMNS)
_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False)
_C_MAKE_ENCODER = getattr(json.encoder, "c_make_encoder", None)


class _JsonText:
    """json.dumps(value, sort_keys=True, ensure_ascii=False), with its C encoder made once: JSONEncoder.encode()
    makes one (and a closure) per call, 1.3 us of its 3 for a small map, and a catalogue row has two or three
    maps. A value the encoder fails on (not JSON, a cycle) is left to JSONEncoder itself, which raises as ever,
    and the C encoder is made again (a failed one may keep the marks of the maps it was in)."""

    # Small maps of text only (where a row's meta_source and extra come from: a few shapes a site) are kept with
    # their text, by their items: a look-up is a third of an encoding. Only text, as keys and values: items of
    # other types may be equal and encode otherwise (True == 1, "true" against "1" as a key).
    CACHED = 1024
    SMALL = 8

    def __init__(self) -> None:
        self._encoder: Callable[[Any, int], Sequence[str]] | None = None
        self._known: Memo[tuple[tuple[Any, Any], ...], str] = Memo(self.CACHED, max_key=self.SMALL)
        self._reset()

    def _reset(self) -> None:
        if _C_MAKE_ENCODER is not None:
            self._encoder = _C_MAKE_ENCODER({}, _JSON.default, json.encoder.encode_basestring, None,
                                            _JSON.key_separator, _JSON.item_separator, True, False, True)

    def __call__(self, value: Any) -> str:
        if type(value) is dict and len(value) <= self.SMALL:
            try:
                items = tuple(value.items())
                text = self._known.get(items)
            except TypeError:      # a list or a map among the values
                return self._encode(value)
            if text is None:
                text = self._encode(value)
                if all(type(k) is str and type(v) is str for k, v in items):
                    self._known.keep(items, text)
            return text
        return self._encode(value)

    def _encode(self, value: Any) -> str:
        encoder = self._encoder
        if encoder is not None:
            try:
                return "".join(encoder(value, 0))
            except Exception:
                self._reset()
        return _JSON.encode(value)


_json_text = _JsonText()


def _audio_ukey(row: Mapping[str, Any]) -> str:
    # A site's own id outlives its download links (they expire and carry per-client tokens), so it
    # identifies the item better than the URL when the resolver knows it.
    source_id = row.get("source_id")
    if source_id:
        return f"{row.get('resolver') or ''}:{source_id}"
    return row.get("url") or ""


class AudioCatalogue:
    """The catalogue's tables, and its figures kept in memory: rows by status (so status() never scans the
    table) and this refresh cycle's changes: {"start": time, "new": n, "changed": n, "removed": n}, saved under
    the meta key "cycle" with each commit that changed it."""

    def __init__(self, core: StoreCore, *, audio_select: str, event_at: str, has_pending: bool,
                 has_live: bool = True) -> None:
        self.core = core
        self.has_live = has_live              # live_recordings exists (a reader of an older store: none)
        self.windows_stored = 0               # live windows stored since start (crawler_recordings_total)
        # What the layout has (migrations.Layout): a reader of an older store sees missing columns as null.
        self._audio_select = audio_select
        self._event_at = event_at
        self.has_pending = has_pending
        self._audio_counts: dict[str, int] = {}
        self._cycle: dict[str, Any] = {}
        self._cycle_dirty = False
        self._first_checked = -float("inf")    # when roll_cycle last looked for URLs never fetched
        # The id the next new row takes (ids are given here: _INSERT_AUDIO), and the ids of the rows the last
        # add_audio() call met or made, by catalogue key: follow_refs() takes the items of the report that wrote
        # them from here instead of reading them back. An item's id never changes and its row is never deleted;
        # an atomic unit that fails forgets them all (restore). Bounded by one call's rows.
        self.next_id = 1
        self._ids: dict[tuple[str, str], int] = {}
        # Runs of rows to read before the next guess that they are new (see _add_run), and the misses in a row.
        self._guess_in = 0
        self._misses = 0
        if not core.readonly:
            self._audio_counts = dict(core.db.execute("SELECT status, count(*) FROM audio GROUP BY status"))
            self._cycle = dict(core.get_meta("cycle", {}))
            self.next_id = int(core.db.execute("SELECT coalesce(max(id), 0) FROM audio").fetchone()[0]) + 1
        core.parts.append(self)

    # -- the figures in the shared transaction (store_core.Part) --------------------------------------

    def stage(self) -> None:
        if self._cycle_dirty:
            self.core.write_meta("cycle", self._cycle)
            self._cycle_dirty = False

    def save(self) -> object:
        return dict(self._audio_counts), dict(self._cycle), self._cycle_dirty, self.windows_stored, self.next_id

    def restore(self, saved: object) -> None:
        (self._audio_counts, self._cycle, self._cycle_dirty, self.windows_stored,
         self.next_id) = saved  # type: ignore[misc]
        self._ids = {}      # rows the failed unit made are gone

    def counts_by_status(self) -> dict[str, int]:
        """Catalogue rows by status (from memory in the master, counted by a reader)."""
        if self.core.readonly:
            return dict(self.core.db.execute("SELECT status, count(*) FROM audio GROUP BY status"))
        return {k: v for k, v in self._audio_counts.items() if v}

    def cycle(self) -> dict[str, Any]:
        """This refresh cycle's figures (see roll_cycle)."""
        return dict(self.core.get_meta("cycle", {})) if self.core.readonly else self._cycle

    def add_audio(self, rows: Sequence[Mapping[str, Any]]) -> list[bool]:
        """Add catalogue rows (AudioItem.catalogue_row() plus "node" and "found_at", the time of the visit).

        One row per (source id or URL, page). A repeat returns False, marks the item seen at found_at, and
        fills only what the first report lacked: the download's sha256/size/content type/path, metadata, the
        URL, and an "ok" status over a failure; a removed item that is back takes the new status. A repeat
        whose download has other bytes than the row holds is a change: the old sha256/size/path go to
        audio_history, the new ones replace them, and the status becomes "changed".

        A live stream's row (extra.live) is different: each report brings a new window recorded of it. Every
        window is kept in live_recordings and the row shows the latest (its sha256, size, path, duration and
        extra); new bytes are no change, the status stays as a repeat's.

        Set-wise: the rows the batch meets are read in one statement, each row's fate is decided in memory
        (audio_action), and the inserts, changes and repeats are written a statement each. A key twice in the
        batch starts a new run, so that a row meets what the ones before it wrote, as one by one.
        """
        self.core.begin()
        self._ids = {}
        out: list[bool] = []
        run: dict[tuple[str, str], dict[str, Any]] = {}
        live: set[tuple[str, str]] = set()       # the keys of live streams' windows
        for row in rows:
            values = _audio_values(row)
            at = values["found_at"]
            values["last_seen"] = at
            values["changed_at"] = values["removed_at"] = values["returned_at"] = None
            key = (_audio_ukey(row).replace("\x00", ""), values["page"])
            if key in run:
                out.extend(self._add_run(run, live))
                run, live = {}, set()
            run[key] = values
            if is_live(row):
                live.add(key)
        if run:
            out.extend(self._add_run(run, live))
        return out

    def _add_run(self, run: Mapping[tuple[str, str], dict[str, Any]], live: Collection[tuple[str, str]]) -> list[bool]:
        """add_audio's rows of distinct keys: read what they meet, decide, write.

        Most rows are new (a page's first visit), so a run is first inserted as if none of its keys were known,
        each row doing nothing where its key is (_insert_audio's guess). When every row went in, that is what
        reading their keys first decides (each row new, its id the next one), and the read is saved; when one
        met a key, the rows just made are deleted (no other row has an id from next_id on) and the run is read
        and decided as ever. After a guess that missed, the next runs are read at once, more of them after each
        miss in a row (GUESS_BACKOFF at most): a revisit's items are all known."""
        db = self.core.db
        found: dict[tuple[str, str], tuple[int, str, str | None]] | None = None
        if self._guess_in > 0:
            self._guess_in -= 1
        else:
            first = self.next_id
            guessed = [(first + i, key[0], *values.values()) for i, (key, values) in enumerate(run.items())]
            if _insert_audio(db, guessed, guess=True) == len(guessed):
                found = {}
                self._misses = 0
            else:
                db.execute("DELETE FROM audio WHERE id >= ?", (first,))
                self._misses = min(2 * self._misses + 1, GUESS_BACKOFF)
                self._guess_in = self._misses
        guessed_right = found is not None
        if found is None:
            found = self._audio_state(run)
        inserts: list[tuple[Any, ...]] = []
        changes: list[tuple[Any, ...]] = []
        repeats: list[tuple[Any, ...]] = []
        out = []
        windows: list[tuple[tuple[str, str], dict[str, Any]]] = []
        ids = self._ids
        for key, values in run.items():
            action, old_status, new_status, event = audio_action(values, found.get(key), key in live)
            if key in live:
                windows.append((key, values))
            at = values["found_at"]
            if action == NEW:
                ids[key] = self.next_id
                self.next_id += 1
                if not guessed_right:      # else the row is in, as `guessed` (the same id, the same values)
                    inserts.append((ids[key], key[0], *values.values()))
            elif action == CHANGED:
                ids[key] = found[key][0]
                changes.append((values["sha256"], values["size"], values["path"], values["content_type"], at, at,
                                ids[key]))
            else:
                ids[key] = found[key][0]
                status = values["status"]
                repeats.append((*(values[c] for c in _COALESCED), values["url"], status, status, status, at, at,
                                ids[key]))
            self._count_audio(old_status, new_status)
            if event is not None:
                self._note_change(event)
            out.append(action == NEW)
        if inserts:
            _insert_audio(db, inserts)
        if changes:
            db.executemany("INSERT INTO audio_history(audio_id, sha256, size, path, replaced_at) "
                           "SELECT id, sha256, size, path, ? FROM audio WHERE id = ?", [(c[4], c[6]) for c in changes])
            db.executemany("UPDATE audio SET sha256 = ?, size = ?, path = ?, "
                           f"content_type = coalesce(?, content_type), status = '{CHANGED}', reason = NULL, "
                           "changed_at = ?, last_seen = ?, removed_at = NULL, returned_at = NULL WHERE id = ?",
                           changes)
        if repeats:
            db.executemany(_UPDATE_AUDIO, repeats)
        for key, values in windows:
            # A live stream's window (rare beside files: one statement or two each): kept, and the row shows the
            # latest one.
            row_id = ids[key]
            if self._add_window(row_id, values) and key in found:
                db.execute("UPDATE audio SET sha256 = ?, size = ?, path = ?, duration = ?, extra = ?, "
                           "content_type = coalesce(?, content_type) WHERE id = ?",
                           (values["sha256"], values["size"], values["path"], values["duration"], values["extra"],
                            values["content_type"], row_id))
        return out

    def settle_audio(self, settled: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[dict[str, Any] | None]:
        """Downloads ended: (the catalogue row as its page reported it, pending; the row as the download ended).
        A row still pending takes the outcome whole (status, reason, sha256, size, path, the file's tags), its
        times kept; the row as it now is comes back, for the catalogue file. A row no longer pending (its page
        was visited again meanwhile) takes the outcome as a repeat report would (add_audio): None for it."""
        self.core.begin()
        out: list[dict[str, Any] | None] = []
        for reported, final in settled:
            ukey = _audio_ukey(reported).replace("\x00", "")
            page = str(reported.get("page") or "").replace("\x00", "")
            found = self.core.db.execute("SELECT id, status FROM audio WHERE ukey = ? AND page = ?",
                                         (ukey, page)).fetchone()
            if found is None or found[1] != PENDING:
                # A download is no listing: an item nothing lists any more stays removed when its last download
                # ends after that.
                if found is None or found[1] != REMOVED:
                    self.add_audio([{**final, "page": page}])
                out.append(None)
                continue
            row_id, _ = found
            values = _audio_values({**final, "page": page})
            cols = [c for c in AUDIO_COLUMNS if c not in AUDIO_TIMES and c != "page"]
            self.core.db.execute(f"UPDATE audio SET {', '.join(f'{c} = ?' for c in cols)} WHERE id = ?",
                                 (*(values[c] for c in cols), row_id))
            self._count_audio(PENDING, values["status"])
            if is_live(final):
                self._add_window(row_id, values)
            out.append(next(self._audio_rows("id = ?", (row_id,))))
        return out

    # -- the windows recorded of live streams ------------------------------------------------------------

    def _add_window(self, audio_id: int, values: Mapping[str, Any]) -> bool:
        """Keep a live row's window (values as _audio_values made them). False when it holds no recording, or was
        stored already (the same report again: the window's start is its key within the item)."""
        if not values["sha256"] or values["status"] != "ok":
            return False
        extra = json.loads(values["extra"]) if values["extra"] else {}
        recorded_at = extra.get(RECORDED_AT)
        if not isinstance(recorded_at, (int, float)) or isinstance(recorded_at, bool):
            recorded_at = values["found_at"]       # a worker that did not say: the visit's time stands for it
        played = extra.get(PLAYED)
        fmt = extra.get("format")
        cur = self.core.db.execute(
            "INSERT INTO live_recordings(audio_id, url, recorded_at, duration, sha256, size, path, node, format, "
            "played, stored_at, fingerprint, checked) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL) "
            "ON CONFLICT(audio_id, recorded_at) DO NOTHING",
            (audio_id, values["url"], float(recorded_at), values["duration"], values["sha256"], values["size"],
             values["path"], values["node"], fmt if isinstance(fmt, str) else None,
             json.dumps(played, ensure_ascii=False) if isinstance(played, list) else None, values["found_at"]))
        if cur.rowcount != 1:
            return False
        self.windows_stored += 1
        return True

    def recordings_of_items(self) -> Iterator[dict[str, Any]]:
        """Every window recorded (RECORDING_COLUMNS, times in epoch seconds, played as a list), in the order
        stored, with its item's page and title; streams a page of rows at a time."""
        if not self.has_live:
            return
        last = 0
        cols = ("l.id, l.url, a.page, a.title, l.recorded_at, l.duration, l.sha256, l.size, l.path, l.node, "
                "l.format, l.played, l.stored_at")
        while True:
            rows = self.core.db.fetchall(f"SELECT {cols} FROM live_recordings l JOIN audio a ON a.id = l.audio_id "
                                         "WHERE l.id > ? ORDER BY l.id LIMIT 1000", (last,))
            if not rows:
                return
            last = rows[-1][0]
            for values in rows:
                d = dict(zip(RECORDING_COLUMNS, values))
                d["played"] = json.loads(d["played"]) if d["played"] else None
                yield d

    # -- pending downloads ---------------------------------------------------------------------------

    def add_pending(self, rows: Sequence[tuple[str, str, str | None, str, float]]) -> None:
        """(page, url, node, item as JSON, since): downloads reported pending. A download already pending for
        the same page and address is the newer report's (its page was fetched again)."""
        if not rows:
            return
        self.core.begin()
        self.core.db.executemany("INSERT INTO pending_downloads(page, url, node, item, since) VALUES (?, ?, ?, ?, ?) "
                                 "ON CONFLICT(page, url) DO UPDATE SET node = excluded.node, item = excluded.item, "
                                 "since = excluded.since",
                                 [(pg.replace("\x00", ""), u.replace("\x00", ""), n, item, t)
                                  for pg, u, n, item, t in rows])

    def pending_holders(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[str | None, str]]:
        """(page, url) -> (node, item JSON) of those of keys still pending."""
        out = {}
        for page, url in keys:
            row = self.core.db.execute("SELECT node, item FROM pending_downloads WHERE page = ? AND url = ?",
                                       (page, url)).fetchone()
            if row is not None:
                out[(page, url)] = (row[0], row[1])
        return out

    def drop_pending(self, keys: Sequence[tuple[str, str]]) -> None:
        if keys:
            self.core.begin()
            self.core.db.executemany("DELETE FROM pending_downloads WHERE page = ? AND url = ?", keys)

    def pending_of(self, nodes: Collection[str], unheld: bool = False) -> list[tuple[str, str, str | None, str]]:
        """(page, url, node, item JSON) of the downloads the nodes hold, and with unheld those no node holds."""
        out: list[tuple[str, str, str | None, str]] = []
        if nodes:
            db = self.core.db
            out += db.execute(f"SELECT page, url, node, item FROM pending_downloads WHERE {db.in_list('node')} "
                              "ORDER BY since", (db.list_arg(list(nodes)),)).fetchall()
        if unheld:
            out += self.core.db.execute("SELECT page, url, node, item FROM pending_downloads WHERE node IS NULL "
                                        "ORDER BY since").fetchall()
        return [tuple(r) for r in out]   # type: ignore[misc]

    def move_pending(self, moves: Sequence[tuple[str | None, str, str]]) -> None:
        """(new node, page, url): the downloads change hands (None: no node holds them for now)."""
        if moves:
            self.core.begin()
            self.core.db.executemany("UPDATE pending_downloads SET node = ? WHERE page = ? AND url = ?", moves)

    def pending_count(self) -> int:
        return int(self.core.db.execute("SELECT count(*) FROM pending_downloads").fetchone()[0])

    def pending_nodes(self) -> list[str]:
        """The nodes that hold pending downloads."""
        return [r[0] for r in self.core.db.execute(
            "SELECT DISTINCT node FROM pending_downloads WHERE node IS NOT NULL")]

    def follow_refs(self, listed: Mapping[int, tuple[frozenset[tuple[str, str]], bool]], confirmed: Sequence[int],
                     at: float) -> None:
        """What URLs list now: url id -> (catalogue keys, whether that is all it lists). A URL's items it no
        longer lists lose its reference, and an item left with none is "removed" (no page, playlist or feed
        lists it any more); the items of the `confirmed` URLs (answered 304) are seen at `at`. Set-wise, a
        statement per chunk: the cost follows the report, not the catalogue."""
        wanted = {k for keys, _ in listed.values() for k in keys}
        known = self._ids
        ids = {k: known[k] for k in wanted if k in known}
        if len(ids) < len(wanted):      # items not of the report just added (a revisit's, a test's)
            ids.update(self._audio_ids(wanted - ids.keys()))
        whole = [ref for ref, (_, full) in listed.items() if full]
        had: dict[int, set[int]] = {}
        for chunk in chunks(whole):
            for ref, audio_id in self.core.db.execute(
                    f"SELECT referrer, audio_id FROM audio_refs WHERE {self.core.db.in_list('referrer')}",
                    (self.core.db.list_arg(chunk),)):
                had.setdefault(ref, set()).add(audio_id)
        adds: list[tuple[int, int]] = []
        drops: list[tuple[int, int]] = []
        for ref, (keys, full) in listed.items():
            now = {ids[k] for k in keys if k in ids}
            before = had.get(ref, set())
            adds.extend((ref, a) for a in sorted(now - before))
            if full:
                drops.extend((ref, a) for a in sorted(before - now))
        if adds:
            self.core.db.executemany(
                "INSERT INTO audio_refs(referrer, audio_id) VALUES (?, ?) ON CONFLICT DO NOTHING", adds)
        if drops:
            self.core.db.executemany("DELETE FROM audio_refs WHERE referrer = ? AND audio_id = ?", drops)
            self._remove_orphans(sorted({a for _, a in drops}), at)
        for chunk in chunks(list(confirmed)):
            self.core.db.execute(f"UPDATE audio SET last_seen = ? WHERE status != '{REMOVED}' AND id IN "
                                 f"(SELECT audio_id FROM audio_refs WHERE {self.core.db.in_list('referrer')})",
                                 (at, self.core.db.list_arg(chunk)))

    def _audio_ids(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Catalogue row ids of (item key, page) keys, those that exist."""
        return {k: row[0] for k, row in self._audio_state(keys).items()}

    def _audio_state(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, str, str | None]]:
        """(id, status, sha256) of the catalogue rows of (item key, page) keys, those that exist."""
        out: dict[tuple[str, str], tuple[int, str, str | None]] = {}
        db = self.core.db
        sql = f"SELECT id, ukey, page, status, sha256 FROM audio WHERE {db.in_pairs('ukey', 'page')}"
        for chunk in chunks(list(keys)):
            for row_id, ukey, page, status, sha in db.execute(sql, (db.pairs_arg(chunk),)):
                out[(ukey, page)] = (row_id, status, sha)
        return out

    def _remove_orphans(self, audio_ids: Sequence[int], at: float) -> None:
        """Of these items, those no URL lists any more become "removed"."""
        still: set[int] = set()
        for chunk in chunks(audio_ids):
            still.update(r[0] for r in self.core.db.execute(
                f"SELECT DISTINCT audio_id FROM audio_refs WHERE {self.core.db.in_list('audio_id')}",
                (self.core.db.list_arg(chunk),)))
        gone: list[tuple[int, str]] = []
        for chunk in chunks([a for a in audio_ids if a not in still]):
            gone.extend((r[0], r[1]) for r in self.core.db.execute(
                f"SELECT id, status FROM audio WHERE {self.core.db.in_list('id')} AND status != '{REMOVED}'",
                (self.core.db.list_arg(chunk),)))
        if not gone:
            return
        self.core.db.executemany(
            f"UPDATE audio SET status = '{REMOVED}', removed_at = ?, returned_at = NULL WHERE id = ?",
            [(at, i) for i, _ in gone])
        for _, status in gone:
            self._count_audio(status, REMOVED)
        self._note_change(REMOVED, len(gone))

    def fill_refs(self) -> int:
        """Fill audio_refs from the catalogue of a store that had none (see REFS_TABLE): each present item is
        listed by the playlist that named it (found_in "playlist"), its own address (found_in "response"), else
        its page; one set-wise pass in id order. Returns the references made."""
        self.core.begin()
        found_in = self.core.db.json_text("extra", "found_in")
        playlist = self.core.db.json_text("extra", "playlist")
        last, made = 0, 0
        while True:
            rows = self.core.db.execute(
                f"SELECT id, url, page, {found_in}, {playlist} FROM audio WHERE id > ? AND status != '{REMOVED}' "
                "ORDER BY id LIMIT ?", (last, CHUNK)).fetchall()
            if not rows:
                return made
            last = rows[-1][0]
            want = {i: (pl if fi == "playlist" and pl else url if fi == "response" and url else page, page)
                    for i, url, page, fi, pl in rows}
            wanted = {u for pair in want.values() for u in pair}
            known = {u: r[1] for u, r in self.core.lookup(wanted, "url, id").items()}
            refs = [(known.get(ref, known.get(page)), i) for i, (ref, page) in want.items()]
            refs = [r for r in refs if r[0] is not None]
            self.core.db.executemany("INSERT INTO audio_refs(referrer, audio_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
                                     refs)
            made += len(refs)

    def _count_audio(self, old: str | None, new: str) -> None:
        if old == new:
            return
        if old is not None:
            self._audio_counts[old] = self._audio_counts.get(old, 0) - 1
        self._audio_counts[new] = self._audio_counts.get(new, 0) + 1

    def _note_change(self, kind: str, n: int = 1) -> None:
        """Count a catalogue change (new, changed, removed) in this refresh cycle's figures (see roll_cycle). What
        the first cycle finds is the site as it is, not news: it is not counted as new."""
        if kind == "new" and self._cycle.get("first", self._cycle.get("start") is None):
            return
        self._cycle[kind] = self._cycle.get(kind, 0) + n
        self._cycle_dirty = True

    def roll_cycle(self, now: float, length: float, due: int = 0) -> bool:
        """Count `due` pages gone back in line for a revisit now, and close the refresh cycle when it is over:
        the first (the crawl's first visit of its pages) once pages came due again and no URL in line was never
        fetched (checked at most every `length` seconds: the check reads the frontier), the others once they
        are `length` seconds old. The closed cycle's counts (pages due again; new, changed and removed items)
        become the last cycle's (the status command and the web page show them). True when it rolled."""
        start = self._cycle.get("start")
        if start is None:
            # A store whose pages are due at once (refresh switched on for a crawl already made) has no first
            # visit to wait for.
            self._cycle = {"start": now, "first": not due, "due": due}
            self._cycle_dirty = True
            return False
        first = bool(self._cycle.get("first"))
        if first:
            over = bool(due or self._cycle.get("due")) and now - self._first_checked >= length
            if over:
                self._first_checked = now
                over = not self._first_visits_left()
        else:
            over = now - start >= length
        if not over:
            if due:
                self._cycle["due"] = self._cycle.get("due", 0) + due
                self._cycle_dirty = True
            return False
        self.core.begin()
        last = {"start": start, "end": now, "first": first, "due": self._cycle.get("due", 0),
                **{k: self._cycle.get(k, 0) for k in CHANGE_KINDS}}
        self.core.write_meta("last_cycle", last)
        self._cycle = {"start": now, "first": False, "due": due}
        self._cycle_dirty = True
        return True

    def _first_visits_left(self) -> bool:
        """Whether a URL in line (queued or leased) was never fetched. Through the frontier's and the leases'
        partial indexes; stops at the first such URL, which while the first visit goes on comes early."""
        return any(self.core.db.execute(
            f"SELECT 1 FROM url_state u WHERE u.state = {state} AND NOT EXISTS "
            f"(SELECT 1 FROM pages p WHERE p.id = u.id AND p.last_crawl IS NOT NULL) LIMIT 1").fetchone()
            for state in (QUEUED, LEASED))

    def changes_since(self, since: float) -> Iterator[dict[str, Any]]:
        """Catalogue items that appeared, changed or were removed at `since` or later, the latest event first
        named in "change" (new, changed, removed), in the order of that event (streams, through an index, a
        page of rows at a time)."""
        when = self._event_at
        last: tuple[float, int] | None = None
        args: tuple[Any, ...]
        while True:
            if last is None:
                cond, args = f"{when} >= ?", (since,)
            else:
                cond, args = f"({when}, id) > (?, ?)", last
            rows = self.core.db.execute(f"SELECT {self._audio_select}, {when}, id FROM audio WHERE {cond} "
                                        f"ORDER BY {when}, id LIMIT 1000", args).fetchall()
            if not rows:
                return
            last = (rows[-1][-2], rows[-1][-1])
            for values in rows:
                d = self._audio_dict(values)
                if d.get("removed_at") is not None and d["status"] == REMOVED:
                    d["change"] = REMOVED
                elif d.get("returned_at") is not None and d["returned_at"] >= since:
                    d["change"] = "new"          # listed again after its removal: it appeared again
                elif d.get("changed_at") is not None and d["changed_at"] >= since:
                    d["change"] = CHANGED
                else:
                    d["change"] = "new"
                yield d

    @staticmethod
    def _audio_dict(row: Sequence[Any]) -> dict[str, Any]:
        d = dict(zip(AUDIO_COLUMNS, row))
        for c in _JSON_COLUMNS:
            d[c] = json.loads(d[c]) if d[c] else {}
        return d

    def _audio_rows(self, where: str = "", args: tuple[Any, ...] = ()) -> Iterator[dict[str, Any]]:
        # Pages of rows by id: streams on either database without holding a cursor open across yields.
        last = 0
        cond = f"({where}) AND " if where else ""
        while True:
            rows = self.core.db.execute(f"SELECT {self._audio_select}, id FROM audio WHERE {cond}id > ? "
                                        f"ORDER BY id LIMIT 1000", (*args, last)).fetchall()
            if not rows:
                return
            last = rows[-1][-1]
            for row in rows:
                yield self._audio_dict(row)

    def catalogue(self, settled: bool = False) -> Iterator[dict[str, Any]]:
        """Every catalogue row in the order found, for export (streams; does not load the table). settled: only
        the rows whose download is not pending (the catalogue file takes a row once its download ended)."""
        return self._audio_rows(f"status != '{PENDING}'") if settled else self._audio_rows()

    def chain_rows(self, wanted: Sequence[str], limit: int = 16) -> list[list[tuple[str | None, str, str]]]:
        """For each item (an audio URL, a page URL or a sha256): (node, page, audio URL) of its catalogue rows, at
        most ``limit``, the first found first: the nodes that reported it hold its chain in their archives. Indexed
        look-ups."""
        out = []
        for w in wanted:
            rows: dict[tuple[str | None, str, str], None] = {}
            for column in ("url", "page", "sha256"):
                for node, page, url in self.core.db.fetchall(
                        f"SELECT node, page, url FROM audio WHERE {column} = ? ORDER BY id LIMIT ?", (w, limit)):
                    rows.setdefault((node, page, url), None)
            out.append(list(rows)[:limit])
        return out

    def search_audio(self, query: str, limit: int = 50) -> list[dict[str, Any]]:
        """Catalogue rows whose title, artist, audio URL or page contains `query` (case-insensitive for
        ASCII), newest first; an empty query gives the newest rows. Bounded by `limit`; a query that matches
        little may read the whole table, so callers run it off the event loop (see master/web.py)."""
        cols = "url, page, title, artist, album, status, node, found_at"
        args: tuple[Any, ...]
        if not query:
            sql, args = f"SELECT {cols} FROM audio ORDER BY id DESC LIMIT ?", (limit,)
        else:
            like = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            cond = " OR ".join(f"{c} {self.core.db.like} ? ESCAPE '\\'" for c in ("title", "artist", "url", "page"))
            sql, args = f"SELECT {cols} FROM audio WHERE {cond} ORDER BY id DESC LIMIT ?", (like,) * 4 + (limit,)
        names = [c.strip() for c in cols.split(",")]
        return [dict(zip(names, row)) for row in self.core.db.fetchall(sql, args)]
