"""Folder archives: deterministic bytes, round trips, and refusal of anything but plain files."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from mint.errors import InvalidRequest
from mint.storage.archives import pack_folder, read_archive, unpack_folder

pytestmark = pytest.mark.backend_free


def test_the_same_files_give_the_same_bytes_and_come_back(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "b.bin").write_bytes(b"\x00\x01" * 1000)
    (source / "a.json").write_text('{"r": 8}')
    first = pack_folder(source)
    (source / "a.json").touch()  # a new mtime changes nothing
    assert pack_folder(source) == first
    target = unpack_folder(first, tmp_path / "target")
    assert sorted(p.name for p in target.iterdir()) == ["a.json", "b.bin"]
    assert (target / "b.bin").read_bytes() == b"\x00\x01" * 1000
    assert read_archive(pack_folder(source, ["a.json"]), exactly=["a.json"]) == {"a.json": b'{"r": 8}'}


def test_an_archive_with_other_files_or_links_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.json").write_text("{}")
    with pytest.raises(InvalidRequest, match="exactly a.json, b.bin"):
        read_archive(pack_folder(source), exactly=["a.json", "b.bin"], param="file")

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        link = tarfile.TarInfo("a.json")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    with pytest.raises(InvalidRequest, match="plain files only"):
        unpack_folder(buffer.getvalue(), tmp_path / "target")
    assert not (tmp_path / "target" / "a.json").exists()
