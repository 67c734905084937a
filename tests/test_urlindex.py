"""The URL index (crawler/master/urlindex.py): hash -> row ids in a stack of hash tables in a mapped file, and how
the SQLite store keeps it whole across a kill, a lost file, a file of another store and a machine crash."""

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from tests.disks import small_tmpfs
from crawler.master import urlindex
from crawler.master.store import MasterStore, StoreError
from crawler.master.urlindex import FileUrlIndex
from tests.store_reads import url_info


@pytest.fixture
def tiny_tables(monkeypatch):
    # Tables of 16 slots, then 32, 64...: a few hundred keys fill a dozen of them.
    monkeypatch.setattr(urlindex, "FIRST_SLOTS", 16)


def keys(n, seed=1):
    rnd = random.Random(seed)
    return [rnd.getrandbits(64) - (1 << 63) for _ in range(n)]


def as_map(pairs, hashes):
    out = {}
    for pos, i in pairs:
        out.setdefault(hashes[pos], set()).add(i)
    return out


@pytest.mark.parametrize("n", [10, 300, 5000])     # below and above the plain-Python lookup's limit
def test_every_entry_is_found_across_tables(tmp_path, tiny_tables, n):
    ix = FileUrlIndex(tmp_path / "i", "t")
    hs = keys(n)
    for start in range(0, n, 97):                     # batches that straddle table boundaries
        ix.add(hs[start:start + 97], range(start + 1, start + 1 + len(hs[start:start + 97])))
    assert (ix.tables > 3 or n < 100) and sum(ix.counts) == n
    assert all(c <= len(ix._table(t)) * urlindex.MAX_LOAD for t, c in enumerate(ix.counts))
    found = as_map(ix.find(hs), hs)
    assert found == {h: {k + 1} for k, h in enumerate(hs)}
    assert ix.find(keys(n, seed=2)) == []             # hashes never added
    ix.close()


def test_large_and_small_lookups_agree(tmp_path, tiny_tables):
    ix = FileUrlIndex(tmp_path / "i", "t")
    hs = keys(2000)
    # Some hashes share their top bits (the tag) or their low bits (the slot) with others.
    hs += [h ^ 1 for h in hs[:50]] + [h ^ (1 << 62) for h in hs[50:100]]
    ix.add(hs, range(1, len(hs) + 1))
    probe = hs[::7] + keys(100, seed=3)
    small = sorted((probe[p], i) for chunk in range(0, len(probe), 100)
                   for p, i in [(chunk + q, i) for q, i in ix.find(probe[chunk:chunk + 100])])
    large = sorted((probe[p], i) for p, i in ix.find(probe))
    assert small == large
    # Every entry is found; a hash sharing its top bits with another may also bring that one's id (the store
    # reads the row and compares its text), never more than those.
    want = {(h, k + 1) for k, h in enumerate(hs) if k % 7 == 0}
    assert want <= set(large) and len(set(large) - want) <= 50


def test_an_entry_added_twice_is_kept_once_and_one_hash_may_name_many_rows(tmp_path, tiny_tables):
    ix = FileUrlIndex(tmp_path / "i", "t")
    ix.add([5, 5, 5], [1, 1, 2])                      # a repeat inside a batch, and a second row on one hash
    ix.add([5], [2])                                  # a repeat of an earlier batch
    assert sum(ix.counts) == 2
    assert sorted(i for _, i in ix.find([5])) == [1, 2]
    with pytest.raises(ValueError):
        ix.add([6], [1 << 41])                        # beyond the 40-bit id
    ix.close()


def test_reopened_it_keeps_its_entries_and_a_reader_follows_new_tables(tmp_path, tiny_tables):
    path = tmp_path / "i"
    ix = FileUrlIndex(path, "t")
    hs = keys(100)
    ix.add(hs[:50], range(1, 51))
    reader = FileUrlIndex(path, "t", readonly=True)
    ix.add(hs[50:], range(51, 101))                   # the writer grows tables the reader did not map
    assert len(reader.find(hs)) == 100
    ix.close()
    again = FileUrlIndex(path, "t")
    assert not again.fresh and len(again.find(hs)) == 100 and sum(again.counts) == 100
    again.close()
    # A file written for another store, or damaged, is started again rather than trusted.
    other = FileUrlIndex(path, "another store")
    assert other.fresh and other.find(hs) == []
    other.close()
    path.write_bytes(b"\0" * 5000)
    assert FileUrlIndex(path, "t").fresh


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: room for the first table (2 MiB), not for the second (4 MiB)."""
    with small_tmpfs(tmp_path / "small", "3m") as mnt:
        yield mnt


def test_a_full_disk_fails_the_insert_not_the_process(small_disk):
    # A new table's space is taken before it is used: without that, the first write to a page the disk has no
    # room for kills the process with SIGBUS. This runs in a child so that such a death would show as one.
    code = ("import sys, random; sys.path.insert(0, %r)\n"
            "from pathlib import Path\n"
            "from crawler.master.urlindex import FileUrlIndex, FIRST_SLOTS\n"
            "ix = FileUrlIndex(Path(%r), 't')\n"
            "rnd = random.Random(1)\n"
            "hs = [rnd.getrandbits(64) - (1 << 63) for _ in range(FIRST_SLOTS)]\n"
            "try:\n"
            "    ix.add(hs, range(1, len(hs) + 1))\n"
            "except OSError as e:\n"
            "    print('refused', e.errno, ix.tables, len(ix.find(hs[:1000])))\n") % (os.getcwd(),
                                                                                   str(small_disk / "i"))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["refused", "28", "1", "1000"]    # ENOSPC; the first table still whole
    assert (small_disk / "i").stat().st_size == urlindex.HEADER + 8 * urlindex.FIRST_SLOTS


# -- the store around it --------------------------------------------------------------------------------------------

def urls(n, tag="u"):
    return [(f"http://h{i % 7}.example/{tag}/{i}", 0, 0, "a", None) for i in range(n)]


def synced_through(path):
    return int.from_bytes(path.read_bytes()[48:56], "little")


def test_a_killed_master_loses_no_entry(tmp_path):
    db = tmp_path / "m.db"
    code = ("import os, sys; sys.path.insert(0, %r)\n"
            "from crawler.master.store import MasterStore\n"
            "s = MasterStore(%r)\n"
            "s.push([(f'http://h{i %% 7}.example/u/{i}', 0, 0, 'a', None) for i in range(3000)])\n"
            "s.commit()\n"
            "os._exit(0)\n") % (os.getcwd(), str(db))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert synced_through(tmp_path / "m.db.urlidx") == 0        # killed before the index was ever synced
    with MasterStore(db) as s:
        assert s.known([u for u, *_ in urls(3000)]) == {u for u, *_ in urls(3000)}
        assert s.push(urls(3000)) == 0 and s.url_count() == 3000
        assert sum(s.core.index.counts) == 3000                     # indexing the rows again added nothing twice


def test_entries_lost_with_the_machine_are_indexed_again(tmp_path):
    db = tmp_path / "m.db"
    with MasterStore(db) as s:
        s.push(urls(2000))
    assert synced_through(tmp_path / "m.db.urlidx") == 2000    # a master that stops syncs the index
    # A machine crash loses page-cache writes made after the last sync: here, every slot.
    with open(tmp_path / "m.db.urlidx", "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(urlindex.HEADER)
        f.write(b"\0" * (size - urlindex.HEADER))
        f.seek(0)
        head = bytearray(f.read(urlindex.HEADER))
        head[48:56] = (0).to_bytes(8, "little")        # synced through no row
        f.seek(0)
        f.write(head)
    with MasterStore(db) as s:
        assert len(s.known([u for u, *_ in urls(2000)])) == 2000


def test_a_missing_index_is_rebuilt_by_the_master_and_a_reader_says_what_is_missing(tmp_path):
    db = tmp_path / "m.db"
    with MasterStore(db) as s:
        s.push(urls(500))
    (tmp_path / "m.db.urlidx").unlink()
    reader = MasterStore.open_readonly(db)
    assert reader.status()["states"]["queued"] == 500          # what needs no lookup by text still reads
    with pytest.raises(StoreError, match="URL index is missing"):
        url_info(reader, "http://h0.example/u/0")
    reader.close()
    with MasterStore(db) as s:
        assert len(s.known([u for u, *_ in urls(500)])) == 500
    with MasterStore.open_readonly(db) as r:
        assert url_info(r, "http://h0.example/u/0")["state"] == "queued"


def test_rows_rolled_back_leave_entries_that_name_other_urls_harmlessly(tmp_path):
    with MasterStore(tmp_path / "m.db") as s:
        with pytest.raises(RuntimeError), s.atomic():
            s.push(urls(10, "gone"))
            raise RuntimeError("a failed write")       # ids 1-10 are handed out again below
        s.push(urls(10, "kept"))
        s.commit()
        assert s.known([u for u, *_ in urls(10, "gone")]) == set()
        assert len(s.known([u for u, *_ in urls(10, "kept")])) == 10
        assert s.push(urls(10, "gone")) == 10 and s.url_count() == 20


def test_ingest_touches_the_index_once_per_url_whatever_its_size(tmp_path, monkeypatch):
    # unseen pushes add entries without probing the tables: a lookup would cost one probe per table.
    with MasterStore(tmp_path / "m.db") as s:
        calls = []
        real = s.core.index.find
        monkeypatch.setattr(s.core.index, "find", lambda hs: calls.append(len(hs)) or real(hs))
        s.push(urls(1000), unseen=True)
        assert calls == [] and s.url_count() == 1000
        s.push(urls(1000))
        assert calls == [1000] and s.url_count() == 1000


def test_slot_values_hold_the_tag_and_the_id(tmp_path):
    ix = FileUrlIndex(tmp_path / "i", "t")
    h = -(1 << 63) + 12345
    ix.add([h], [77])
    slot = np.uint64(h & ((1 << 64) - 1)) & np.uint64(urlindex.FIRST_SLOTS - 1)
    value = int(ix._table(0)[int(slot)])
    assert value & urlindex.ID_MASK == 77 and value >> urlindex.ID_BITS == (h & ((1 << 64) - 1)) >> 40
    ix.close()


def test_small_and_large_inserts_index_the_same_entries(tmp_path, tiny_tables):
    # A batch under _SMALL keys goes in by plain Python, a larger one by numpy: the same keys (repeats within and
    # across batches, hashes sharing their slot or their tag, tables filling and growing) give the same lookups.
    hs = keys(1500)
    hs += [h ^ 1 for h in hs[:60]] + [h ^ (1 << 62) for h in hs[60:120]] + hs[200:230]
    ids = list(range(1, len(hs) + 1))
    ids[-30:] = ids[200:230]                           # repeats of entries already there
    small, large = FileUrlIndex(tmp_path / "s", "t"), FileUrlIndex(tmp_path / "l", "t")
    rnd = random.Random(5)
    start = 0
    while start < len(hs):
        n = rnd.choice([1, 2, 17, 100, urlindex._SMALL - 1])
        small.add(hs[start:start + n], ids[start:start + n])
        start += n
    large.add(hs, ids)
    assert small.tables == large.tables and small.counts == large.counts
    probe = hs + keys(300, seed=9)
    hash_of = {i: h for h, i in zip(hs, ids)}
    # What a lookup keeps once the rows are read (the store compares their text): the entries of the very hash;
    # another hash with the same tag may come up in one layout's probe chain and not in the other's.
    exact = [sorted((p, i) for p, i in ix.find(probe) if hash_of[i] == probe[p]) for ix in (small, large)]
    assert exact[0] == exact[1]
    assert set(exact[0]) == {(p, i) for p, h in enumerate(probe) for hh, i in zip(hs, ids) if hh == h}
    for ix in (small, large):
        assert all(hash_of[i] >> 40 == probe[p] >> 40 for p, i in ix.find(probe))
    assert np.array_equal(np.sort(small._slots), np.sort(large._slots))     # the same slot values, maybe elsewhere
    with pytest.raises(ValueError):
        small.add([6, 7], [3, 0])                      # an id out of range: nothing of the batch is written
    assert small.find([6]) == []
    small.close()
    large.close()
