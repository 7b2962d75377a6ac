"""Folder archives: deterministic bytes, round trips, and refusal of anything but plain files,
before a byte is read: sparse bombs, other member types, declared sizes past the archive or the
caller's limit, oversized extended headers, and what is no tar at all."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from mint.errors import InvalidRequest
from mint.storage.archives import MAX_EXTENDED_HEADER_BYTES, pack_folder, read_archive, unpack_folder
from tests import hostile_archives as hostile

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


CONFIG = b'{"peft_type": "LORA", "r": 4, "lora_alpha": 8}'
NAMES = ["adapter_config.json", "adapter_model.safetensors"]


@pytest.mark.parametrize(
    "sparse_member", [hostile.gnu_sparse, hostile.pax_sparse_01, hostile.pax_sparse_10], ids=["gnu", "pax0.1", "pax1.0"]
)
def test_a_sparse_bomb_is_refused_before_anything_is_read_or_written(
    tmp_path: Path, sparse_member: Callable[[str], bytes]
) -> None:
    """A few KiB that tarfile lists as a TiB file and would extract as a TiB of zeros (the API
    once wrote such a file's declared size to temporary disk and read it into memory)."""
    bomb = hostile.of(hostile.regular(NAMES[0], CONFIG), sparse_member(NAMES[1]))
    assert len(bomb) < 8 * 1024
    assert max(hostile.declared_sizes(bomb).values()) == hostile.TIB
    with pytest.raises(InvalidRequest, match="plain files only; .*GNU sparse file") as refused:
        read_archive(bomb, exactly=NAMES, param="files", max_bytes=1024**3)
    assert refused.value.param == "files" and "tar -cf" in refused.value.message
    with pytest.raises(InvalidRequest, match="GNU sparse file"):
        unpack_folder(bomb, tmp_path / "target", exactly=NAMES)
    assert not (tmp_path / "target").exists()


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        (tarfile.DIRTYPE, "a directory"),
        (tarfile.SYMTYPE, "a symbolic link"),
        (tarfile.LNKTYPE, "a hard link"),
        (tarfile.FIFOTYPE, "a FIFO"),
        (tarfile.CHRTYPE, "a character device"),
        (tarfile.BLKTYPE, "a block device"),
        (tarfile.CONTTYPE, "a contiguous file"),
    ],
)
def test_members_that_are_not_regular_files_are_refused_saying_what_they_are(kind: bytes, said: str) -> None:
    member = tarfile.TarInfo("adapter_model.safetensors")
    member.type = kind
    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        member.linkname = "adapter_config.json"
    archive = hostile.of(hostile.regular(NAMES[0], CONFIG), member.tobuf(format=tarfile.GNU_FORMAT))
    with pytest.raises(InvalidRequest, match=f"'adapter_model.safetensors' is {said}"):
        read_archive(archive, exactly=NAMES)


def test_declared_sizes_are_bounded_before_any_file_is_read(tmp_path: Path) -> None:
    # A member that declares a TiB in a 3 KiB archive: past the limit, and past the archive's end.
    forged = hostile.of(hostile.regular(NAMES[0], CONFIG), hostile.declared(NAMES[1]))
    assert hostile.declared_sizes(forged)[NAMES[1]] == hostile.TIB
    with pytest.raises(InvalidRequest, match=f"declare {hostile.TIB + len(CONFIG)} bytes .* more than the 4096 bytes"):
        read_archive(forged, exactly=NAMES, max_bytes=4096)
    with pytest.raises(InvalidRequest, match="ends before them: it is truncated or forged"):
        unpack_folder(forged, tmp_path / "forged")
    assert not (tmp_path / "forged").exists()

    # Honest files over the caller's limit are refused by their declared sizes, within it read.
    honest = hostile.of(hostile.regular(NAMES[0], CONFIG), hostile.regular(NAMES[1], b"\0" * 3000))
    with pytest.raises(InvalidRequest, match="more than the 3000 bytes it may hold here"):
        read_archive(honest, exactly=NAMES, max_bytes=3000)
    assert read_archive(honest, exactly=NAMES, max_bytes=3000 + len(CONFIG))[NAMES[1]] == b"\0" * 3000


def test_an_oversized_extended_header_is_refused_before_tarfile_parses_it() -> None:
    """tarfile parses a PAX header whole into Python objects (listing a 20 MB sparse map took 480 MB):
    a header longer than plain files need is refused unread."""
    archive = hostile.of(hostile.long_extended_header(NAMES[0], CONFIG, MAX_EXTENDED_HEADER_BYTES))
    with pytest.raises(InvalidRequest, match=r"extended header \(type 'x'\) of \d+ bytes"):
        read_archive(archive)
    short = hostile.of(hostile.long_extended_header(NAMES[0], CONFIG, 1000))
    assert read_archive(short) == {NAMES[0]: CONFIG}


@pytest.mark.parametrize("data", [b"", b"not a tar archive" * 40, b"\x1f\x8b" + b"\0" * 600])
def test_what_is_not_a_tar_archive_is_refused(data: bytes) -> None:
    with pytest.raises(InvalidRequest, match="not a readable uncompressed tar"):
        read_archive(data, param="files")


def test_an_archive_that_must_hold_two_files_stops_at_a_third() -> None:
    archive = hostile.of(*(hostile.regular(f"file{i}", b"x") for i in range(3)))
    with pytest.raises(InvalidRequest, match="exactly file0, file1"):
        read_archive(archive, exactly=["file0", "file1"])
