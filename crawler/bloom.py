"""The master's Bloom filter: sizing, add/contains (one key or a batch), and a durable snapshot.

Index scheme. Each key is hashed once with 128-bit MurmurHash3 (x64), and the k indices come from three values
of that digest by triple hashing (Dillinger and Manolios): ``x_0 = a``, ``y_0 = b | 1``, then
``x_{i+1} = x_i + y_i`` and ``y_{i+1} = y_i + c``, all mod 2**H, each ``x_i`` mapped onto ``[0, m)`` by a
multiply-shift, ``(x_i * m) >> H``. Plain double hashing (``a + i*b``) is cheaper by one addition, but two keys
whose (a, b) land close together share all k indices, which puts a floor of about n/m**2 under the
false-positive rate: 200 times the rate asked for in a small, tight filter (45 keys at 5e-7), the size of the
first layers of a growing filter. A third value lowers that floor to about n/m**3. The multiply-shift avoids a
modulo. H is 32 while m fits in 32 bits (filters up to 512 MiB): a and b are the low 32 bits of the digest's two
64-bit words and c the high 32 bits of the first. Above that H is 64: a and b are the whole words and c is mixed
from both (``(a * C mod 2**64) ^ b``), since the digest has no third word; the narrow form halves the integer
work of the batch path below and, with m <= 2**32, loses nothing.

Batches are where the master spends its time, so the batch path does no per-index Python work: the hash
pairs of a chunk of keys are packed into big integers with one lane (2H bits) per key, the double-hash
arithmetic runs on all lanes at once as ordinary integer operations (no lane ever carries into the next,
since every intermediate stays below 2**(2H)), and the low halves of the lanes are read back as an
unsigned-int memoryview that ``bitarray``'s sequence indexing takes directly. The high halves are never
read, which is why the shift needs no mask. The single-key path computes the same indices in a plain loop;
tests hold the two together.

Snapshot format (little endian). One filter (version 3; versions 1 and 2 used double hashing and are refused as
"mismatched", so the master rebuilds from its URL table)::

    magic b"CRBLOOM\\0" | version u16 | k u16 | m u64 | capacity u64 | count u64 | sha256 32 bytes | bits

The digest covers the header fields before it and the bit payload, so a flipped bit anywhere is caught. A growing
filter (version 4) is a header of its own followed by one version-3 record per layer, oldest first::

    magic b"CRBLOOM\\0" | version u16 = 4 | layers u16 | fp_rate f64 | sha256 32 bytes | layer records

A one-filter file loads as a growing filter of one layer.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import sys
import threading
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from io import BufferedIOBase
from itertools import compress
from pathlib import Path

import mmh3
from bitarray import bitarray

__all__ = ["BloomFileError", "BloomFilter", "GrowingBloomFilter", "capacity_at"]

_M64 = (1 << 64) - 1
_NARROW_MAX_M = 1 << 32
# Keys per vectorised step. Small enough that the lane integers stay in cache, large enough that the
# per-chunk Python overhead disappears; 256..1024 measured best on the target machine.
_CHUNK = 512
_SAVE_BLOCK = 1 << 20   # bytes of bits copied out, hashed and written at a time by save()
_BIG_ENDIAN = sys.byteorder == "big"
assert struct.calcsize("I") == 4 and struct.calcsize("Q") == 8
_WORD = 64  # m is rounded up to whole 64-bit words so the snapshot payload has no padding bits

_MAGIC = b"CRBLOOM\0"
_VERSION = 3       # 1: double hashing
_PREFIX = struct.Struct("<8sHHQQQ")
_DIGEST_LEN = 32
_HEADER_LEN = _PREFIX.size + _DIGEST_LEN
_CHAIN_VERSION = 4  # 2: layers of version 1
_CHAIN_PREFIX = struct.Struct("<8sHHd")
_CHAIN_HEADER_LEN = _CHAIN_PREFIX.size + _DIGEST_LEN
_MAX_LAYERS = 64       # doubling capacities: 64 layers is 2**64 times the first capacity
_DIGEST_SIZE = 16      # bytes of one key's MurmurHash3 x64 128
_MIX = 0x9E3779B97F4A7C15   # odd 64-bit constant (2**64 / golden ratio): makes the wide form's third value
_READ_BLOCK = 1 << 22


class BloomFileError(Exception):
    """A snapshot that cannot be used: missing, corrupt, or built with other parameters.

    ``reason`` is one of ``"missing"``, ``"corrupt"``, ``"mismatched"`` so the caller can tell a first
    start (no snapshot yet) from damage, which must never be papered over.
    """

    def __init__(self, path: Path, reason: str, detail: str) -> None:
        super().__init__(f"bloom snapshot {path}: {reason}: {detail}")
        self.path = path
        self.reason = reason


def _digests(keys: Sequence[str | bytes]) -> bytes:
    """The 128-bit hashes of keys, concatenated: the only hashing a batch does, whatever the layers."""
    return b"".join(map(mmh3.hash_bytes, keys))   # little-endian words, as mmh3 defines them


def _triple(h: int, half: int) -> tuple[int, int, int]:
    """The triple-hashing start (x, y, z) of a key whose 128-bit MurmurHash3 is h (see the module's note)."""
    mask = (1 << half) - 1
    a, b = h & _M64, h >> 64
    if half == 32:
        return a & mask, (b & mask) | 1, a >> 32
    return a, b | 1, ((a * _MIX) & _M64) ^ b


def _lanes(n: int, value: int, width: int) -> int:
    """``value`` repeated in n lanes of ``width`` bytes."""
    return int.from_bytes(value.to_bytes(width, "little") * n, "little")


class BloomFilter:
    """A Bloom filter of ``m`` bits and ``k`` hash functions, sized for ``capacity`` keys.

    ``count`` counts the adds that changed at least one bit: the number of distinct keys, less the
    ones the filter already (falsely) believed it had seen.
    """

    __slots__ = ("_bits", "_half", "_masks", "capacity", "count", "k", "m")

    def __init__(self, m: int, k: int, capacity: int = 0) -> None:
        if k < 1 or k > 0xFFFF:
            raise ValueError(f"k must be in 1..65535, got {k}")
        if m < 1 or m > _M64:
            raise ValueError(f"m must be in 1..2**64-1, got {m}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.m = -(-m // _WORD) * _WORD
        self.k = k
        self.capacity = capacity
        self.count = 0
        self._bits = bitarray(self.m, endian="little")
        self._bits.setall(0)
        self._setup()

    def _setup(self) -> None:
        self._half = 32 if self.m <= _NARROW_MAX_M else 64
        self._masks: dict[int, tuple[int, int]] = {}

    # -- sizing ---------------------------------------------------------------------------------------

    @classmethod
    def for_capacity(cls, capacity: int, fp_rate: float) -> BloomFilter:
        """The smallest filter whose false-positive rate at ``capacity`` keys is at most ``fp_rate``."""
        return cls(*cls.sizing(capacity, fp_rate), capacity)

    @staticmethod
    def sizing(capacity: int, fp_rate: float) -> tuple[int, int]:
        """The (m, k) of ``for_capacity``, without the bits."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not 0.0 < fp_rate < 1.0:
            raise ValueError(f"fp_rate must be in (0, 1), got {fp_rate}")
        ln2 = math.log(2)
        m = math.ceil(-capacity * math.log(fp_rate) / (ln2 * ln2))
        m = -(-m // _WORD) * _WORD
        # k must be a whole number, which costs a little against the real-valued optimum: grow m until
        # the rate the caller asked for really holds.
        while True:
            k = max(1, round(m / capacity * ln2))
            if _fp_rate(m, k, capacity) <= fp_rate:
                return m, k
            m += max(_WORD, (m // 1000) // _WORD * _WORD)

    @classmethod
    def with_bits_per_item(cls, capacity: int, bits_per_item: float, k: int) -> BloomFilter:
        """A filter with a fixed budget per key (the paper's choice is 16 bits and k = 8)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if bits_per_item <= 0:
            raise ValueError(f"bits_per_item must be > 0, got {bits_per_item}")
        return cls(math.ceil(capacity * bits_per_item), k, capacity)

    def expected_fp_rate(self, n: int | None = None) -> float:
        """Theoretical false-positive rate after ``n`` distinct keys (default: ``count``)."""
        return _fp_rate(self.m, self.k, self.count if n is None else n)

    @property
    def nbytes(self) -> int:
        """Bytes held by the bit array."""
        return self.m // 8

    def fill_ratio(self) -> float:
        """Share of bits set; about ``1 - exp(-k*n/m)`` for a healthy filter."""
        return self._bits.count() / self.m

    # -- one key --------------------------------------------------------------------------------------

    def _key_indices(self, key: str | bytes) -> list[int]:
        return self._hash_indices(mmh3.hash128(key))

    def _hash_indices(self, h: int) -> list[int]:
        """The k indices of a key whose 128-bit MurmurHash3 is h."""
        half, m = self._half, self.m
        mask = (1 << half) - 1
        x, y, z = _triple(h, half)
        out = []
        for _ in range(self.k):
            out.append((x * m) >> half)
            x = (x + y) & mask
            y = (y + z) & mask
        return out

    def add(self, key: str | bytes) -> bool:
        """Mark ``key`` seen; True if it was (probably) new."""
        bits = self._bits
        new = False
        for i in self._key_indices(key):
            if not bits[i]:
                bits[i] = 1
                new = True
        if new:
            self.count += 1
        return new

    def __contains__(self, key: str | bytes) -> bool:
        return self._holds(mmh3.hash128(key))

    def _holds(self, h: int) -> bool:
        """Whether all k bits of the key whose hash is h are set; stops at the first clear one (an absent key
        mostly needs one or two look-ups, not k)."""
        bits, half, m = self._bits, self._half, self.m
        mask = (1 << half) - 1
        x, y, z = _triple(h, half)
        for _ in range(self.k):
            if not bits[(x * m) >> half]:
                return False
            x = (x + y) & mask
            y = (y + z) & mask
        return True

    # -- batches --------------------------------------------------------------------------------------

    def _lane_masks(self, n: int) -> tuple[int, int]:
        """Per-lane masks for n keys: the low half of every lane, and the value 1 in every lane."""
        masks = self._masks.get(n)
        if masks is None:
            width = self._half // 4
            masks = (_lanes(n, (1 << self._half) - 1, width), _lanes(n, 1, width))
            if n == _CHUNK or len(self._masks) < 8:
                self._masks[n] = masks
        return masks

    def _chunk_indices(self, keys: Sequence[str | bytes]) -> list[memoryview | array[int]]:
        """The k index sequences of a chunk: element j of sequence i is index i of ``keys[j]``."""
        return self._indices(_digests(keys), len(keys))

    def _indices(self, digests: bytes, n: int) -> list[memoryview | array[int]]:
        """``_chunk_indices`` of the n keys whose hashes ``_digests`` gave."""
        return list(self._index_rows(digests, n))

    def _index_rows(self, digests: bytes, n: int) -> Iterator[memoryview | array[int]]:
        """The k index sequences of ``_indices``, made one at a time."""
        low, ones = self._lane_masks(n)
        half = self._half
        if half == 32:
            # Slicing moves whole 8-byte words without reading them, so the bytes stay little endian.
            words = array("Q", digests)
            first = int.from_bytes(words[::2], "little")
            g = first & low
            h3 = (first >> 32) & low
            h2 = (int.from_bytes(words[1::2], "little") & low) | ones
        else:
            lanes = int.from_bytes(digests, "little")
            g = lanes & low
            h2 = (lanes >> 64) & low
            h3 = ((g * _MIX) & low) ^ h2     # a lane's product stays under 2**128: no carry into the next
            h2 |= ones
        m = self.m
        nbytes = n * half // 4
        code = "I" if half == 32 else "Q"
        for i in range(self.k):
            if i:
                g = (g + h2) & low
                h2 = (h2 + h3) & low
            raw = ((g * m) >> half).to_bytes(nbytes, "little")
            if _BIG_ENDIAN:
                seq = array(code, raw)
                seq.byteswap()
                yield seq[::2]
            else:
                view = memoryview(raw)
                yield (view.cast("I") if half == 32 else view.cast("Q"))[::2]

    def _holds_chunk(self, digests: bytes, n: int) -> bitarray:
        """Which of the n keys this filter holds, for a look-up only: it stops once no key of the chunk is left
        (absent keys mostly fail on their first few bits; a chain's older layers are asked about every absent key)."""
        bits = self._bits
        rows = self._index_rows(digests, n)
        found = bits[next(rows)]
        for idx in rows:
            if not found.any():
                break
            found &= bits[idx]
        return found

    def _present(self, indices: list[memoryview | array[int]]) -> bitarray:
        bits = self._bits
        found = bits[indices[0]]
        for idx in indices[1:]:
            found &= bits[idx]
        return found

    def contains_many(self, keys: Sequence[str | bytes]) -> list[bool]:
        """``[key in self for key in keys]``, computed a chunk at a time."""
        out: list[bool] = []
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start:start + _CHUNK]
            out.extend(map(bool, self._holds_chunk(_digests(chunk), len(chunk)).tolist()))
        return out

    def add_many(self, keys: Sequence[str | bytes]) -> list[bool]:
        """Add every key; True where the key was new.

        A key repeated within the batch is new only the first time. Membership is decided per chunk
        before the chunk's bits are set, so two different keys of one chunk never make each other look
        seen: a batch can only report fewer false positives than the same adds done one by one.
        """
        out: list[bool] = []
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start:start + _CHUNK]
            out.extend(self._add_chunk(chunk, _digests(chunk), ()))
        return out

    def _add_chunk(self, chunk: Sequence[str | bytes], digests: bytes, older: Sequence[BloomFilter]) -> list[bool]:
        """Add a chunk of at most ``_CHUNK`` keys to this filter, except those ``older`` filters already hold."""
        n = len(chunk)
        bits = self._bits
        indices = self._indices(digests, n)
        found = self._present(indices)
        if older and not found.all():
            here = found.copy()
            for f in reversed(older):
                found |= f._holds_chunk(digests, n)
                if found.all():
                    break
            if (found & ~here).any():
                # Keys an older layer holds must not take bits here: this layer's rate is counted from its own keys.
                fresh_at = list(found.search(0))
                indices = self._indices(b"".join(digests[j * _DIGEST_SIZE:(j + 1) * _DIGEST_SIZE]
                                                 for j in fresh_at), len(fresh_at)) if fresh_at else []
        for idx in indices:
            bits[idx] = 1
        found.invert()
        new = list(map(bool, found.tolist()))
        # A repeat in a later chunk finds its bits set; only repeats inside this chunk need a look,
        # and the common case (none) is told apart without a Python-level loop.
        fresh = dict.fromkeys(compress(chunk, new))
        if len(fresh) != found.count():
            fresh.clear()
            for j in compress(range(n), new):
                if chunk[j] in fresh:
                    new[j] = False
                else:
                    fresh[chunk[j]] = None
        self.count += len(fresh)
        return new

    def update(self, keys: Iterable[str | bytes]) -> None:
        """Add keys whose novelty nobody asks about (rebuilding from the URL store)."""
        _in_chunks(self.add_many, keys)

    # -- snapshot -------------------------------------------------------------------------------------

    def _prefix(self) -> bytes:
        return _PREFIX.pack(_MAGIC, _VERSION, self.k, self.m, self.capacity, self.count)

    def save(self, path: Path) -> None:
        """Write a snapshot atomically: a temporary file beside ``path``, fsync, rename, fsync the dir.

        Safe on another thread while this filter goes on taking keys: the master saves its live filter that way,
        with no copy of the bits (a copy held its event loop 15-30 ms at the default size, seconds at a billion
        URLs). Each block of bits is copied out in one step that no add can split, and that copy is both hashed
        and written, so the digest matches the file. The file holds every key added before the call, and maybe
        some added during it: for a Bloom filter a superset is still right (no false negative)."""
        prefix = self._prefix()     # the count as of the call
        _write_atomic(Path(path), lambda f: self._write(f, prefix))

    def _write(self, f: BufferedIOBase, prefix: bytes) -> None:
        """This filter's record at f's position: ``prefix`` (from ``_prefix``), digest, bits (see ``save``)."""
        payload = memoryview(self._bits)
        digest = hashlib.sha256(prefix)
        at = f.tell()
        f.write(prefix)
        f.write(bytes(digest.digest_size))   # the digest, once the bits are written
        for start in range(0, len(payload), _SAVE_BLOCK):
            block = bytes(payload[start:start + _SAVE_BLOCK])
            digest.update(block)
            f.write(block)
        end = f.tell()
        f.seek(at + len(prefix))
        f.write(digest.digest())
        f.seek(end)

    @classmethod
    def load(cls, path: Path, *, expect_m: int | None = None, expect_k: int | None = None) -> BloomFilter:
        """Read a snapshot written by ``save``; anything doubtful raises ``BloomFileError``."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                return cls._read(f, path, expect_m, expect_k)
        except FileNotFoundError:
            raise BloomFileError(path, "missing", "no such file") from None

    @classmethod
    def _read(cls, f: BufferedIOBase, path: Path, expect_m: int | None, expect_k: int | None, *,
              last: bool = True) -> BloomFilter:
        """One record at f's position; ``last``: it must end the file (else more may follow it)."""
        start = f.tell()
        header = f.read(_HEADER_LEN)
        if len(header) < _HEADER_LEN:
            raise BloomFileError(path, "corrupt", f"truncated header ({len(header)} bytes)")
        magic, version, k, m, capacity, count = _PREFIX.unpack_from(header)
        if magic != _MAGIC:
            raise BloomFileError(path, "corrupt", "not a bloom snapshot (bad magic)")
        if version != _VERSION:
            raise BloomFileError(path, "mismatched", f"format version {version}, expected {_VERSION}")
        if k < 1 or m < 1 or m % _WORD:
            raise BloomFileError(path, "corrupt", f"impossible parameters m={m} k={k}")
        if (expect_m is not None and m != expect_m) or (expect_k is not None and k != expect_k):
            raise BloomFileError(path, "mismatched", f"file has m={m} k={k}, expected m={expect_m} k={expect_k}")
        size = os.fstat(f.fileno()).st_size - start
        if size < _HEADER_LEN + m // 8 or (last and size != _HEADER_LEN + m // 8):
            raise BloomFileError(path, "corrupt", f"size {size} bytes, expected {_HEADER_LEN + m // 8}")
        bf = cls.__new__(cls)
        bf.m, bf.k, bf.capacity, bf.count = m, k, capacity, count
        bf._setup()
        bf._bits = bitarray(m, endian="little")
        # Read straight into the bit array's buffer: a snapshot can be larger than the memory left for a copy.
        digest = hashlib.sha256(header[:_PREFIX.size])
        view = memoryview(bf._bits)
        pos = 0
        while pos < len(view):
            got = f.readinto(view[pos:pos + _READ_BLOCK])
            if not got:
                raise BloomFileError(path, "corrupt", "truncated payload")
            digest.update(view[pos:pos + got])
            pos += got
        if digest.digest() != header[_PREFIX.size:]:
            raise BloomFileError(path, "corrupt", "checksum mismatch")
        return bf


class GrowingBloomFilter:
    """A Bloom filter for a set with no known bound: a chain of filters (layers), each with twice the capacity of
    the one before, at a false-positive rate that halves down the chain (Almeida et al.'s scalable filter).

    Layer i may answer "seen" falsely at ``fp_rate / 2**(i+1)`` at most, so the chain's rate stays under
    ``fp_rate`` however many keys arrive (the shares sum to less), and a thousand times the first capacity takes
    ten layers. A layer's capacity is the number of keys it takes within its share. Keys go into the last layer
    until it holds its capacity; a look-up asks every layer, with one hash of the key for the whole chain. Adding
    is safe from several threads at once, and so is looking up or saving while another thread adds.
    """

    __slots__ = ("_filters", "_lock", "fp_rate")

    def __init__(self, capacity: int, fp_rate: float, *, bits_per_item: float | None = None,
                 hashes: int | None = None) -> None:
        """The first layer holds ``capacity`` keys at ``fp_rate / 2``: the smallest filter that does, or, with
        ``bits_per_item`` and ``hashes`` (the paper's 16 and 8), ``bits_per_item * capacity`` bits and that many
        hashes, whose capacity is then what that geometry takes at ``fp_rate / 2`` (see ``capacity_at``)."""
        self.fp_rate = fp_rate
        if bits_per_item is None and hashes is None:
            first = BloomFilter.for_capacity(capacity, fp_rate / 2)
        elif bits_per_item is None or hashes is None:
            raise ValueError("bits_per_item and hashes go together")
        else:
            first = BloomFilter.with_bits_per_item(capacity, bits_per_item, hashes)
            first.capacity = self.first_capacity(capacity, fp_rate, bits_per_item, hashes)
            if first.capacity < 1:
                raise ValueError(f"{bits_per_item} bits and {hashes} hashes per key never reach a false-positive "
                                 f"rate of {fp_rate / 2:g}")
        self._filters = [first]
        self._lock = threading.Lock()

    @staticmethod
    def first_capacity(capacity: int, fp_rate: float, bits_per_item: float, hashes: int) -> int:
        """The keys a first layer of ``bits_per_item * capacity`` bits and ``hashes`` hashes takes within its share
        of ``fp_rate``, computed without making it."""
        m = -(-math.ceil(capacity * bits_per_item) // _WORD) * _WORD
        return capacity_at(m, hashes, fp_rate / 2)

    @property
    def layers(self) -> tuple[BloomFilter, ...]:
        return tuple(self._filters)

    @property
    def count(self) -> int:
        return sum(f.count for f in self._filters)

    @property
    def capacity(self) -> int:
        """Keys the layers there are now take in all before another is added."""
        return sum(f.capacity for f in self._filters)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self._filters)

    def expected_fp_rate(self) -> float:
        """The chain's false-positive rate now, from each layer's keys (a key is falsely seen if any layer says so)."""
        clear = 1.0
        for f in self._filters:
            clear *= 1.0 - f.expected_fp_rate()
        return 1.0 - clear

    def __contains__(self, key: str | bytes) -> bool:
        h = mmh3.hash128(key)     # once for the whole chain
        for f in self._filters:   # a loop, not any() over a generator: asked once a download
            if f._holds(h):
                return True
        return False

    def contains_many(self, keys: Sequence[str | bytes]) -> list[bool]:
        """``[key in self for key in keys]``, a chunk at a time, each key hashed once."""
        out: list[bool] = []
        filters = self._filters[:]
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start:start + _CHUNK]
            digests, n = _digests(chunk), len(chunk)
            found = filters[-1]._holds_chunk(digests, n)
            for f in reversed(filters[:-1]):
                if found.all():
                    break
                found |= f._holds_chunk(digests, n)
            out.extend(map(bool, found.tolist()))
        return out

    def add_many(self, keys: Sequence[str | bytes]) -> list[bool]:
        """Add every key; True where no layer held it (see ``BloomFilter.add_many``). Only new keys take room."""
        out: list[bool] = []
        with self._lock:
            start = 0
            while start < len(keys):
                last = self._filters[-1]
                room = last.capacity - last.count
                if room <= 0:
                    last = self._grow()
                    room = last.capacity
                # A slice no longer than the room left cannot overfill the layer, whatever share of it is new.
                chunk = keys[start:start + min(room, _CHUNK)]
                out.extend(last._add_chunk(chunk, _digests(chunk), self._filters[:-1]))
                start += len(chunk)
        return out

    def update(self, keys: Iterable[str | bytes]) -> None:
        """Add keys whose novelty nobody asks about (rebuilding from the URL store)."""
        _in_chunks(self.add_many, keys)

    def _grow(self) -> BloomFilter:
        if len(self._filters) >= _MAX_LAYERS:
            raise OverflowError(f"a growing Bloom filter has {_MAX_LAYERS} layers already")
        layer = BloomFilter.for_capacity(2 * self._filters[-1].capacity,
                                         self.fp_rate / 2 ** (len(self._filters) + 1))
        self._filters.append(layer)
        return layer

    # -- snapshot -------------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Write every layer to one file atomically, as ``BloomFilter.save`` writes one (and as safe beside adds
        on another thread: a layer added meanwhile holds only keys added after the call)."""
        layers = [(layer, layer._prefix()) for layer in self._filters[:]]
        head = _CHAIN_PREFIX.pack(_MAGIC, _CHAIN_VERSION, len(layers), self.fp_rate)

        def write(f: BufferedIOBase) -> None:
            f.write(head)
            f.write(hashlib.sha256(head).digest())
            for layer, prefix in layers:
                layer._write(f, prefix)

        _write_atomic(Path(path), write)

    @classmethod
    def load(cls, path: Path, fp_rate: float, *,
             expect_first: Collection[tuple[int, int]] | None = None) -> GrowingBloomFilter:
        """Read a snapshot written by ``save``, or by ``BloomFilter.save`` (one layer, whose capacity is then what
        its bits take at ``fp_rate / 2``). ``expect_first``: the (m, k) pairs the first layer may have. Anything
        doubtful, or built for another ``fp_rate``, raises ``BloomFileError``."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                return cls._read(f, path, fp_rate, expect_first)
        except FileNotFoundError:
            raise BloomFileError(path, "missing", "no such file") from None

    @classmethod
    def _read(cls, f: BufferedIOBase, path: Path, fp_rate: float,
              expect_first: Collection[tuple[int, int]] | None) -> GrowingBloomFilter:
        head = f.read(_CHAIN_HEADER_LEN)
        magic, version = (_CHAIN_PREFIX.unpack_from(head)[:2] if len(head) >= _CHAIN_PREFIX.size
                          else (head[:8], None))
        chain = cls.__new__(cls)
        chain.fp_rate = fp_rate
        chain._lock = threading.Lock()
        if magic == _MAGIC and version == _VERSION:
            f.seek(0)
            layer = BloomFilter._read(f, path, None, None)
            layer.capacity = min(layer.capacity, capacity_at(layer.m, layer.k, fp_rate / 2))
            if layer.count > layer.capacity:
                raise BloomFileError(path, "mismatched", f"{layer.count} keys in one layer, over the "
                                                         f"{layer.capacity} it takes at {fp_rate / 2:g}")
            chain._filters = [layer]
        else:
            if len(head) < _CHAIN_HEADER_LEN:
                raise BloomFileError(path, "corrupt", f"truncated header ({len(head)} bytes)")
            if magic != _MAGIC:
                raise BloomFileError(path, "corrupt", "not a bloom snapshot (bad magic)")
            if version != _CHAIN_VERSION:
                raise BloomFileError(path, "mismatched", f"format version {version}, expected {_CHAIN_VERSION}")
            if hashlib.sha256(head[:_CHAIN_PREFIX.size]).digest() != head[_CHAIN_PREFIX.size:]:
                raise BloomFileError(path, "corrupt", "checksum mismatch")
            _, _, layers, saved_rate = _CHAIN_PREFIX.unpack_from(head)
            if not 1 <= layers <= _MAX_LAYERS:
                raise BloomFileError(path, "corrupt", f"impossible number of layers {layers}")
            if saved_rate != fp_rate:
                raise BloomFileError(path, "mismatched", f"built for a false-positive rate of {saved_rate:g}, "
                                                         f"expected {fp_rate:g}")
            chain._filters = [BloomFilter._read(f, path, None, None, last=i == layers - 1) for i in range(layers)]
        first = chain._filters[0]
        if expect_first is not None and (first.m, first.k) not in expect_first:
            raise BloomFileError(path, "mismatched", f"first layer has m={first.m} k={first.k}, expected one of "
                                                     f"{sorted(expect_first)}")
        return chain


def _in_chunks(add_many: Callable[[Sequence[str | bytes]], object], keys: Iterable[str | bytes]) -> None:
    """Feed an iterable of any length to a batch add, _CHUNK keys at a time (one definition for both filters)."""
    batch: list[str | bytes] = []
    for key in keys:
        batch.append(key)
        if len(batch) == _CHUNK:
            add_many(batch)
            batch = []
    if batch:
        add_many(batch)


def _fp_rate(m: int, k: int, n: int) -> float:
    return (1.0 - math.exp(-k * n / m)) ** k


def capacity_at(m: int, k: int, fp_rate: float) -> int:
    """The most keys a filter of m bits and k hashes takes before its false-positive rate passes ``fp_rate``."""
    n = int(-m / k * math.log1p(-fp_rate ** (1.0 / k)))
    while n > 0 and _fp_rate(m, k, n) > fp_rate:   # the float formula may land one over
        n -= 1
    return n


def _write_atomic(path: Path, write: Callable[[BufferedIOBase], None]) -> None:
    """``write`` into a temporary file beside ``path``, fsync, rename over ``path``, fsync the directory: a crash
    at any point leaves the previous file or the new one, never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # The rename is only durable once the directory entry is; not every platform lets a directory be opened.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
