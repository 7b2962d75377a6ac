"""Folders as tar archives: how adapters, checkpoints and tokenizers travel through the object store.

Archives are deterministic (sorted names, zero times, no owners), so the same files give the
same bytes and the same sha256. Reading is safe: members are regular files with plain names
(no links, folders, devices or sparse files, no paths), each one's bytes lie within the archive
and all of them together within the caller's limit, and an archive that must hold a known set of
files holds exactly those. All of this is checked member by member as the headers are read,
before a byte is extracted: a tar's headers may claim far more than it holds (a GNU sparse
member of a few hundred bytes expands to any size it declares).
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from mint.errors import InvalidRequest

# The member types that are regular files: '0', and '\0' as old tars write it.
REGULAR_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)
# What each other member type is, to say what an archive holds instead of a file.
MEMBER_KINDS = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.DIRTYPE: "a directory",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.CONTTYPE: "a contiguous file",
    tarfile.GNUTYPE_SPARSE: "a GNU sparse file",
}
# Headers that describe the member after them: PAX (per member, global, Solaris) and GNU long names.
EXTENDED_HEADER_TYPES = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
# An extended header of plain files holds a long name, a size or times: a few hundred bytes.
# tarfile parses one whole into Python objects (a PAX sparse map into one int per number, some
# 25 times the header's bytes), so a longer one is refused before it is parsed.
MAX_EXTENDED_HEADER_BYTES = 64 * 1024
COPY_CHUNK_BYTES = 2**20  # what pack_folder copies a file in
HOW_TO_PACK = (
    "pack the folder's regular files into a plain tar, e.g. "
    "`tar -cf adapter.tar -C folder adapter_config.json adapter_model.safetensors`"
)


class _RefusedHeader(Exception):
    """A header refused before tarfile acts on it; its message says what it is."""


class _RegularFileHeaders(tarfile.TarInfo):
    """tarfile's own header reading, but a header that only sparse or oversized members need is
    refused before tarfile expands it: a GNU sparse member (type 'S', whose map tarfile reads and
    whose holes it would extract as zeros), an extended header longer than
    MAX_EXTENDED_HEADER_BYTES, and PAX headers that make the next member sparse (`GNU.sparse.*`)."""

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> Self:
        source = tarfile_.fileobj
        assert source is not None  # an archive open for reading
        start, extension = source.tell(), b""
        try:
            header = cls.frombuf(source.read(tarfile.BLOCKSIZE), tarfile_.encoding, tarfile_.errors)
            if header.type in EXTENDED_HEADER_TYPES and 0 <= header.size <= MAX_EXTENDED_HEADER_BYTES:
                extension = source.read(header.size)
        except tarfile.HeaderError:
            header = None  # the end of the archive, or a damaged header: tarfile itself says which
        finally:
            source.seek(start)
        if header is not None:
            if header.type == tarfile.GNUTYPE_SPARSE:
                raise _RefusedHeader(f"{header.name!r} is a GNU sparse file")
            if header.type in EXTENDED_HEADER_TYPES:
                if not 0 <= header.size <= MAX_EXTENDED_HEADER_BYTES:
                    raise _RefusedHeader(
                        f"this one has an extended header (type {header.type.decode()!r}) of {header.size} bytes, more "
                        f"than the {MAX_EXTENDED_HEADER_BYTES} bytes plain files need"
                    )
                if b"GNU.sparse." in extension:
                    raise _RefusedHeader("this one holds a GNU sparse file (PAX GNU.sparse.* headers)")
        return super().fromtarfile(tarfile_)


def pack_folder(folder: Path, names: Sequence[str] | None = None) -> bytes:
    """The files of `folder` (or just `names`, in that order) as a deterministic, uncompressed tar.

    Written through a temporary file rather than a growing buffer: optimizer states of large
    adapters are big, and the spool keeps one copy in memory instead of several. Files are
    copied in 1 MiB chunks, not tarfile's 16 KiB (a version's handoff to serving packs it).
    """
    paths = (
        [folder / name for name in names] if names is not None else sorted(p for p in folder.iterdir() if p.is_file())
    )
    with tempfile.TemporaryFile() as spool:
        # TarFile itself, not tarfile.open: only the class takes copybufsize (CPython's, since 3.8).
        with tarfile.TarFile(
            fileobj=spool, mode="w", format=tarfile.PAX_FORMAT, copybufsize=COPY_CHUNK_BYTES
        ) as archive:
            for path in paths:
                info = tarfile.TarInfo(path.name)
                info.size, info.mtime, info.mode = path.stat().st_size, 0, 0o644
                with path.open("rb") as source:
                    archive.addfile(info, source)
        spool.seek(0)
        return spool.read()


@contextmanager
def _opened(data: bytes, param: str | None) -> Iterator[tarfile.TarFile]:
    """`data` open as an uncompressed tar whose refused headers and unreadable parts are
    InvalidRequest (naming `param`), wherever they turn up: opening, listing or extracting."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:", tarinfo=_RegularFileHeaders) as archive:
            yield archive
    except _RefusedHeader as exc:
        raise InvalidRequest(f"an archive holds plain files only; {exc}: {HOW_TO_PACK}", param=param) from None
    except tarfile.TarError as exc:
        raise InvalidRequest(
            f"the archive is not a readable uncompressed tar ({exc}): {HOW_TO_PACK}", param=param
        ) from None


def _member_kind(member: tarfile.TarInfo) -> str | None:
    """What a member is when it is not a regular file with a plain name (None when it is one)."""
    if member.sparse is not None or any(key.startswith("GNU.sparse.") for key in member.pax_headers):
        return "a GNU sparse file"
    if member.type not in REGULAR_FILE_TYPES:
        return MEMBER_KINDS.get(member.type, f"a member of tar type {member.type!r}")
    if "/" in member.name or member.name in {"", ".", ".."}:
        return "not a plain file name (an archive's files are not in folders)"
    return None


def _checked_members(
    archive: tarfile.TarFile,
    *,
    archive_bytes: int,
    exactly: Sequence[str] | None,
    param: str | None,
    max_bytes: int | None,
) -> list[tarfile.TarInfo]:
    """The archive's members, each checked as its header is read, before the next one is: a
    regular file with a plain name, its bytes within the archive (`archive_bytes` long), all
    sizes together at most `max_bytes`, and with `exactly`, no more members than those names."""
    members: list[tarfile.TarInfo] = []
    declared = 0
    for member in archive:
        kind = _member_kind(member)
        if kind is not None:
            raise InvalidRequest(
                f"an archive holds plain files only; {member.name!r} is {kind}: {HOW_TO_PACK}", param=param
            )
        declared += member.size
        if max_bytes is not None and declared > max_bytes:
            raise InvalidRequest(
                f"the archive's files declare {declared} bytes up to {member.name!r}, more than the {max_bytes} "
                f"bytes it may hold here: send smaller files; {HOW_TO_PACK}",
                param=param,
            )
        if not 0 <= member.size <= archive_bytes - member.offset_data:
            raise InvalidRequest(
                f"{member.name!r} declares {member.size} bytes, but the archive ({archive_bytes} bytes) ends before "
                f"them: it is truncated or forged; {HOW_TO_PACK}",
                param=param,
            )
        members.append(member)
        if exactly is not None and len(members) > len(exactly):
            break
    if exactly is not None and sorted(m.name for m in members) != sorted(exactly):
        raise InvalidRequest(f"the archive must hold exactly {', '.join(exactly)}", param=param)
    return members


def read_archive(
    data: bytes, *, exactly: Sequence[str] | None = None, param: str | None = None, max_bytes: int | None = None
) -> dict[str, bytes]:
    """The files of an archive by name, in memory; with `exactly`, anything else is refused, and
    with `max_bytes`, files larger than that in all (checked before any is read)."""
    views = archive_views(data, exactly=exactly, param=param, max_bytes=max_bytes)
    return {name: bytes(view) for name, view in views.items()}


def archive_views(
    data: bytes, *, exactly: Sequence[str] | None = None, param: str | None = None, max_bytes: int | None = None
) -> dict[str, memoryview]:
    """The files of an archive by name, as views of `data` (nothing copied), checked as
    `read_archive` checks them. An uncompressed tar holds each regular file's bytes in one run
    after its header, so a view is all a reader needs: a serving node decodes a fetched adapter
    version from its views."""
    with _opened(data, param) as archive:
        members = _checked_members(archive, archive_bytes=len(data), exactly=exactly, param=param, max_bytes=max_bytes)
    whole = memoryview(data)
    return {member.name: whole[member.offset_data : member.offset_data + member.size] for member in members}


def unpack_folder(
    data: bytes,
    folder: Path,
    *,
    exactly: Sequence[str] | None = None,
    param: str | None = None,
    max_bytes: int | None = None,
) -> Path:
    """Write the files of an archive into `folder` (created if missing) and return it; file by
    file, so a large optimizer state is never held twice. Nothing is written before every
    member is checked (as `read_archive` checks them)."""
    with _opened(data, param) as archive:
        members = _checked_members(archive, archive_bytes=len(data), exactly=exactly, param=param, max_bytes=max_bytes)
        folder.mkdir(parents=True, exist_ok=True)
        for member in members:
            source = archive.extractfile(member)
            assert source is not None  # a regular file, checked above
            with (folder / member.name).open("wb") as target:
                shutil.copyfileobj(source, target)
    return folder
