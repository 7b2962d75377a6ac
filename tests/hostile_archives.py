"""Tar archives that claim more than they hold, built byte by byte with Python's tarfile: GNU
sparse members (old GNU headers, PAX 0.1 and PAX 1.0), members whose declared size the archive
does not hold, and oversized extended headers. Each is a few KiB; tarfile itself would expand a
sparse one to its declared size on extraction, zeros for every hole."""

from __future__ import annotations

import io
import tarfile

# What the sparse members below declare: a TiB, from a few KiB of archive.
TIB = 1024**4


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)


def regular(name: str, data: bytes) -> bytes:
    """A regular file member (header and data), as any tar writes it."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(format=tarfile.GNU_FORMAT) + _padded(data)


def of(*members: bytes) -> bytes:
    """An archive of these members, closed by the two zero blocks that end a tar."""
    return b"".join(members) + b"\0" * (2 * tarfile.BLOCKSIZE)


def gnu_sparse(name: str, real_size: int = TIB) -> bytes:
    """An old-GNU sparse member (type 'S'): one block of data stored at the end of a file of
    `real_size` bytes, the rest a hole that tarfile fills with zeros."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = tarfile.BLOCKSIZE  # the bytes stored
    header = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    # The sparse map (offset, bytes) of its first entry, then the real size, as GNU tar writes them.
    header[386:398] = tarfile.itn(real_size - tarfile.BLOCKSIZE, 12, tarfile.GNU_FORMAT)
    header[398:410] = tarfile.itn(tarfile.BLOCKSIZE, 12, tarfile.GNU_FORMAT)
    header[483:495] = tarfile.itn(real_size, 12, tarfile.GNU_FORMAT)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + b"x" * tarfile.BLOCKSIZE


def _pax(name: str, pax_headers: dict[str, str], data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.pax_headers = pax_headers
    return info.tobuf(format=tarfile.PAX_FORMAT) + _padded(data)


def pax_sparse_01(name: str, real_size: int = TIB) -> bytes:
    """A PAX 0.1 sparse member: `GNU.sparse.size` and `GNU.sparse.map` in its extended header."""
    headers = {"GNU.sparse.size": str(real_size), "GNU.sparse.map": f"{real_size - 1},1"}
    return _pax(name, headers, b"x")


def pax_sparse_10(name: str, real_size: int = TIB) -> bytes:
    """A PAX 1.0 sparse member: the map leads the member's data (one entry: the last byte)."""
    headers = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": name,
        "GNU.sparse.realsize": str(real_size),
    }
    return _pax(f"GNUSparseFile.0/{name}", headers, _padded(f"1\n{real_size - 1}\n1\n".encode()) + b"x")


def declared(name: str, size: int = TIB) -> bytes:
    """A regular member whose header declares `size` bytes, followed by one block of them."""
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.GNU_FORMAT) + b"x" * tarfile.BLOCKSIZE


def long_extended_header(name: str, data: bytes, header_bytes: int) -> bytes:
    """A regular member after a PAX extended header of about `header_bytes` (a comment)."""
    return _pax(name, {"comment": "x" * header_bytes}, data)


def declared_sizes(archive: bytes) -> dict[str, int]:
    """What tarfile itself (no Mint checks) lists in an archive: name -> declared size."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as opened:
        members = []
        while (member := opened.next()) is not None:  # stops before a member past the end is sought
            members.append(member)
            if member.size > len(archive):
                break
        return {member.name: member.size for member in members}
