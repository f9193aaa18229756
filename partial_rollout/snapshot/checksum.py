"""Checksums that make any damage to a snapshot file detectable.

CRC-32 (the zlib / ISO-HDLC polynomial, as ``zlib.crc32``, ``binascii.crc32``, Java's ``CRC32``
and Go's ``hash/crc32.ChecksumIEEE`` compute it) runs at several GB/s, is in every standard
library, and detects every burst of up to 32 flipped bits, so any single damaged byte. It guards
against accidents, not attackers. Checksums are written as 8 lowercase hex digits.

* Each tensor's checksum covers its raw little-endian bytes as stored in the file.
* The metadata checksum covers every ``__metadata__`` entry except ``checksums`` itself, sorted
  by key, each encoded as ``u32 LE key length, key UTF-8, u64 LE value length, value UTF-8``. The
  tensor checksums live in ``checksums``, so a change there breaks a tensor's checksum instead.

Together with the reader's exact checks of the safetensors header (tensor names, dtypes, shapes,
offsets covering the data with no gap), every byte of the file is covered.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping

import numpy as np

from partial_rollout.snapshot.container import Chunks

ALGORITHM = "crc32"
"""Value of ``checksums.algorithm`` in version 1."""
CHECKSUMS_KEY = "checksums"


def tensor_checksum(tensor: np.ndarray | Chunks) -> str:
    """CRC-32 of a contiguous little-endian tensor's bytes (of its pieces in order), as 8 hex digits."""
    crc = 0
    for piece in tensor if isinstance(tensor, Chunks) else (tensor,):
        crc = zlib.crc32(piece.data, crc)
    return f"{crc & 0xFFFFFFFF:08x}"


def metadata_checksum(metadata: Mapping[str, str]) -> str:
    """CRC-32 of every metadata entry except ``checksums``, in the length-prefixed encoding above."""
    crc = 0
    for key in sorted(k for k in metadata if k != CHECKSUMS_KEY):
        key_bytes, value_bytes = key.encode("utf-8"), metadata[key].encode("utf-8")
        crc = zlib.crc32(struct.pack("<I", len(key_bytes)), crc)
        crc = zlib.crc32(key_bytes, crc)
        crc = zlib.crc32(struct.pack("<Q", len(value_bytes)), crc)
        crc = zlib.crc32(value_bytes, crc)
    return f"{crc & 0xFFFFFFFF:08x}"
