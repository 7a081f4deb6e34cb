"""Keep one GPU architecture's code in a shared library's CUDA fat binaries, blanking the rest in place.

The faiss-gpu wheel's ``libfaiss.so`` (199 MB) carries every kernel for sm_70, 75, 80, 86, 89 and 90 (and PTX
for 90). The device tool moves at most 64 MiB, and an H200 loads only the sm_90 code: the other entries'
bytes are set to zero (their headers stay, so the loader still reads the fat binary and picks the sm_90 entry),
and zeros compress to nothing. The file keeps its size and layout.
"""

from __future__ import annotations

import struct
import sys
from collections import Counter
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "elf"}


def _fatbin_section(data: bytes | bytearray) -> tuple[int, int]:
    """(offset, size) of the ``.nv_fatbin`` section of a 64-bit little-endian ELF file."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    for h in headers:
        start = names + h[0]
        if bytes(data[start : data.index(b"\0", start)]) == b".nv_fatbin":
            return h[4], h[5]
    raise ValueError("no .nv_fatbin section")


def entries(data: bytes | bytearray) -> list[tuple[str, int, int, int]]:
    """(kind, arch, payload offset, payload size) of every entry of every fat binary in the file."""
    base, size = _fatbin_section(data)
    out, off, end_all = [], base, base + size
    while off + 16 <= end_all:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, off)
        if magic != FATBIN_MAGIC:   # fat binaries are 8-byte aligned in the section
            off += 8
            continue
        p, end = off + header_size, off + header_size + fat_size
        while p < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, p)
            arch = struct.unpack_from("<I", data, p + 28)[0]
            out.append((KINDS.get(kind, str(kind)), arch, p + entry_header, payload))
            p += entry_header + payload
        off = end
    return out


def keep_only(path: Path, arch: int = 90, keep_ptx: bool = False) -> Counter:
    """Zero every entry of ``path`` but the ``arch`` ELF (and its PTX with ``keep_ptx``); returns what was kept
    and blanked, by (kind, arch). Refuses a file that has no ``arch`` ELF code."""
    data = bytearray(path.read_bytes())
    found = entries(data)
    if not any(k == "elf" and a == arch for k, a, _, _ in found):
        raise ValueError(f"{path} has no sm_{arch} code: {sorted(Counter((k, a) for k, a, _, _ in found))}")
    seen: Counter = Counter()
    for kind, a, start, size in found:
        keep = a == arch and (kind == "elf" or keep_ptx)
        if not keep:
            data[start : start + size] = bytes(size)
        seen[("kept" if keep else "blanked", kind, a)] += 1
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(path.stat().st_mode)
    tmp.replace(path)
    return seen


if __name__ == "__main__":
    for f in sys.argv[1:]:
        print(f, sorted(Counter((k, a) for k, a, _, _ in entries(Path(f).read_bytes())).items()))
