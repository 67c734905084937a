"""HLS streams made in the test: ADTS audio frames cut into segments, AES-128 encrypted like a real packager.

    stream = make_stream(segments=4, key=b"k" * 16, seed=1)
    stream.files            # {"index.m3u8": ..., "audio/index.m3u8": ..., "seg0.aac": ..., "key.bin": ...}
    stream.plain            # the decrypted segments, joined: what the downloaded file must hold

Encryption follows RFC 8216 5.2: AES-128-CBC over the whole segment with PKCS#7 padding; the IV is given on the
EXT-X-KEY tag (``explicit_iv``) or is the segment's media sequence number.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def adts_frames(count: int, seed: int, payload: int = 200) -> bytes:
    """``count`` ADTS frames (AAC-LC, 44.1 kHz, stereo) with random payloads: sniffs as AAC, not a real song."""
    rnd = random.Random(seed)
    out = bytearray()
    for _ in range(count):
        length = 7 + payload
        header = bytes([
            0xFF, 0xF1,                                      # sync, MPEG-4, layer 0, no CRC
            (1 << 6) | (4 << 2) | (0 >> 2),                  # AAC-LC, 44.1 kHz, channel config high bit
            ((2 & 3) << 6) | ((length >> 11) & 0x3),         # 2 channels, frame length (13 bits)
            (length >> 3) & 0xFF,
            ((length & 0x7) << 5) | 0x1F,
            0xFC,
        ])
        out += header + rnd.randbytes(payload)
    return bytes(out)


def encrypt(data: bytes, key: bytes, iv: bytes) -> bytes:
    padder = padding.PKCS7(128).padder()
    padded = padder.update(data) + padder.finalize()
    encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    return encryptor.update(padded) + encryptor.finalize()


@dataclass
class Stream:
    files: dict[str, bytes] = field(default_factory=dict)   # path (relative to the stream's folder) -> bytes
    segments: list[bytes] = field(default_factory=list)     # plain segments in order
    master: str = "index.m3u8"
    media: str = "audio/index.m3u8"

    @property
    def plain(self) -> bytes:
        return b"".join(self.segments)


def make_stream(*, segments: int = 4, key: bytes | None = None, seed: int = 0, explicit_iv: bool = False,
                media_sequence: int = 7, ended: bool = True, frames: int = 40,
                key_uri: str = "../key.bin", with_video_variant: bool = True) -> Stream:
    """A master playlist with an audio-only variant (and a video one to be passed over), its media playlist,
    segments and key. Segment paths are relative to the media playlist, which lives in ``audio/``."""
    s = Stream()
    lines = ["#EXTM3U", "#EXT-X-VERSION:3", "#EXT-X-TARGETDURATION:4", f"#EXT-X-MEDIA-SEQUENCE:{media_sequence}",
             "#EXT-X-PLAYLIST-TYPE:VOD" if ended else "#EXT-X-PLAYLIST-TYPE:EVENT"]
    iv_fixed = bytes(range(16))
    if key is not None:
        s.files["key.bin"] = key
        iv_attr = ",IV=0x" + iv_fixed.hex() if explicit_iv else ""
        lines.append(f'#EXT-X-KEY:METHOD=AES-128,URI="{key_uri}"{iv_attr}')
    for i in range(segments):
        plain = adts_frames(frames, seed * 1000 + i)
        s.segments.append(plain)
        body = plain
        if key is not None:
            iv = iv_fixed if explicit_iv else (media_sequence + i).to_bytes(16, "big")
            body = encrypt(plain, key, iv)
        s.files[f"audio/seg{i}.aac"] = body
        lines += ["#EXTINF:4.0,", f"seg{i}.aac"]
    if ended:
        lines.append("#EXT-X-ENDLIST")
    s.files[s.media] = ("\n".join(lines) + "\n").encode()
    master = ["#EXTM3U", "#EXT-X-VERSION:3"]
    if with_video_variant:
        master += ['#EXT-X-STREAM-INF:BANDWIDTH=2000000,CODECS="avc1.4d401f,mp4a.40.2",RESOLUTION=1280x720',
                   "video/index.m3u8"]
    master += ['#EXT-X-STREAM-INF:BANDWIDTH=64000,CODECS="mp4a.40.2"', "audio/index.m3u8"]
    s.files[s.master] = ("\n".join(master) + "\n").encode()
    return s
