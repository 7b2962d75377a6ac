"""Folders as tar archives: how adapters, checkpoints and tokenizers travel through the object store.

Archives are deterministic (sorted names, zero times, no owners), so the same files give the
same bytes and the same sha256. Reading is safe: members are regular files with plain names
(no links, no paths), and an archive that must hold a known set of files holds exactly those.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mint.errors import InvalidRequest


def pack_folder(folder: Path, names: Sequence[str] | None = None) -> bytes:
    """The files of `folder` (or just `names`, in that order) as a deterministic, uncompressed tar.

    Written through a temporary file rather than a growing buffer: optimizer states of large
    adapters are big, and the spool keeps one copy in memory instead of several.
    """
    paths = (
        [folder / name for name in names] if names is not None else sorted(p for p in folder.iterdir() if p.is_file())
    )
    with tempfile.TemporaryFile() as spool:
        with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for path in paths:
                info = tarfile.TarInfo(path.name)
                info.size, info.mtime, info.mode = path.stat().st_size, 0, 0o644
                with path.open("rb") as source:
                    archive.addfile(info, source)
        spool.seek(0)
        return spool.read()


def _checked_members(
    archive: tarfile.TarFile, exactly: Sequence[str] | None, param: str | None
) -> list[tarfile.TarInfo]:
    members = archive.getmembers()
    for member in members:
        if not member.isfile() or "/" in member.name or member.name in {"", ".", ".."}:
            raise InvalidRequest(f"an archive holds plain files only; {member.name!r} is not one", param=param)
    if exactly is not None and sorted(m.name for m in members) != sorted(exactly):
        raise InvalidRequest(f"the archive must hold exactly {', '.join(exactly)}", param=param)
    return members


def read_archive(data: bytes, *, exactly: Sequence[str] | None = None, param: str | None = None) -> dict[str, bytes]:
    """The files of an archive by name, in memory; with `exactly`, anything else is refused."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        files = {}
        for member in _checked_members(archive, exactly, param):
            source = archive.extractfile(member)
            assert source is not None  # a regular file, checked above
            files[member.name] = source.read()
        return files


def unpack_folder(data: bytes, folder: Path, *, exactly: Sequence[str] | None = None, param: str | None = None) -> Path:
    """Write the files of an archive into `folder` (created if missing) and return it; file by
    file, so a large optimizer state is never held twice."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in _checked_members(archive, exactly, param):
            source = archive.extractfile(member)
            assert source is not None  # a regular file, checked above
            with (folder / member.name).open("wb") as target:
                shutil.copyfileobj(source, target)
    return folder
