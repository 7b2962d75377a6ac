"""Adapters and their immutable versions: upload one trained elsewhere, list, read, resolve
`name@N`, and download a version in PEFT format to a folder that `peft.PeftModel.from_pretrained` loads,
or, for a whole-model version (`kind` "full", a full-parameter job's), a transformers checkpoint
folder that `from_pretrained` loads.

A download is checked against the version's sha256 before anything is unpacked, and the
archive is unpacked by hand: only regular files with plain names are written, so an archive
cannot place a file outside the folder or plant a link.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from mint.schemas.adapters import AdapterPublic, AdapterVersionPublic
from mint.schemas.common import Page
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, Upload, parse_bytes, parse_list, parse_model
from mint.sdk.errors import BadRequestError, DownloadError, NotFoundError
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager

Folder = str | os.PathLike[str]


def list_adapters(limit: int) -> PageCall:
    return lambda after: Call("GET", "/v1/adapters", parse_model(Page[AdapterPublic]), {"after": after, "limit": limit})


def get_adapter(adapter_id: str) -> Call[AdapterPublic]:
    return Call("GET", f"/v1/adapters/{adapter_id}", parse_model(AdapterPublic))


def list_versions(adapter_id: str) -> Call[list[AdapterVersionPublic]]:
    return Call("GET", f"/v1/adapters/{adapter_id}/versions", parse_list(AdapterVersionPublic))


def get_version(adapter_id: str, version: int) -> Call[AdapterVersionPublic]:
    return Call("GET", f"/v1/adapters/{adapter_id}/versions/{version}", parse_model(AdapterVersionPublic))


def download_call(version: AdapterVersionPublic) -> Call[bytes]:
    return Call("GET", f"/v1/adapters/{version.adapter_id}/versions/{version.version}/download", parse_bytes)


PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def upload_call(name: str, base_model: str, folder: Folder) -> Call[AdapterVersionPublic]:
    """The PEFT folder's two files (what `save_pretrained` writes, less its README) as one tar."""
    missing = [file for file in PEFT_FILES if not (Path(folder) / file).is_file()]
    if missing:
        raise BadRequestError(
            f"{folder} is not a PEFT adapter folder: it has no {' or '.join(missing)}", param="folder"
        )
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for file in PEFT_FILES:
            tar.add(Path(folder) / file, arcname=file)
    form = {"name": name, "base_model": base_model}
    upload = Upload(archive.getvalue(), "adapter.tar", form, field_name="files", content_type="application/x-tar")
    return Call("POST", "/v1/adapters", parse_model(AdapterVersionPublic), upload=upload)


def split_ref(ref: str) -> tuple[str, int | None]:
    """`name@3` -> ("name", 3); `name` (or an adapter id) -> (it, None: the newest version)."""
    name, _, number = ref.partition("@")
    if not number:
        return name, None
    if not number.isdigit() or int(number) < 1:
        raise BadRequestError(f"{ref!r} is not a version reference; write it as name@N, N from 1", param="ref")
    return name, int(number)


def not_found(name: str) -> NotFoundError:
    return NotFoundError(f"no adapter named {name!r} in this organization; list them at /v1/adapters", param="ref")


def newest(adapter: AdapterPublic, versions: builtins.list[AdapterVersionPublic]) -> AdapterVersionPublic:
    ready = [version for version in versions if version.status == "ready"]
    if not ready:
        raise NotFoundError(f"adapter {adapter.name!r} has no ready version yet", param="ref")
    return max(ready, key=lambda version: version.version)


def unpack(archive_path: Path, folder: Path) -> builtins.list[Path]:
    """Write the regular files of a tar into `folder`; any other entry refuses the whole archive."""
    with tarfile.open(archive_path, mode="r:") as archive:
        members = archive.getmembers()
        for member in members:
            name = member.name
            plain = PurePosixPath(name).name == name and name not in ("", ".", "..") and "\\" not in name
            if not member.isfile() or not plain:
                raise DownloadError(
                    f"the adapter archive holds {name!r}, which is not a plain file name; nothing was unpacked"
                )
        written = []
        for member in members:
            source = archive.extractfile(member)
            assert source is not None  # a regular file, checked above
            target = folder / member.name
            with target.open("wb") as sink:
                shutil.copyfileobj(source, sink)
            written.append(target)
    return written


class _Download:
    """A download in progress: bytes go to a temporary file beside the target, hashed as they come."""

    def __init__(self, version: AdapterVersionPublic, folder: Path) -> None:
        self.version = version
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=".mint-download-", suffix=".tar", dir=folder)
        self.path = Path(name)
        self.file = os.fdopen(handle, "wb")
        self.digest = hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        self.digest.update(chunk)
        self.file.write(chunk)

    def finish(self, sent_sha256: str | None) -> Path:
        """Check the hash against the version's (and the server's header), then unpack."""
        self.file.close()
        try:
            got = self.digest.hexdigest()
            if got != self.version.sha256 or (sent_sha256 and sent_sha256 != got):
                raise DownloadError(
                    f"the download of {self.version.model or self.version.id} has sha256 {got}, "
                    f"but the version's is {self.version.sha256}; nothing was unpacked, download it again"
                )
            unpack(self.path, self.folder)
        finally:
            self.path.unlink(missing_ok=True)
        return self.folder

    def abandon(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


class Adapters:
    """`/v1/adapters`: uploads, adapters, their versions, and downloads in PEFT format."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def upload(self, name: str, base_model: str, folder: Folder) -> AdapterVersionPublic:
        """Bring in a LoRA adapter trained elsewhere (a PEFT folder) as the next version of `name`.

        It is `validating` until a worker of its base has loaded it, then `ready` or `invalid`
        (with `error`); poll `version(adapter_id, version)`."""
        return self._http.send(upload_call(name, base_model, folder))

    def list(self, *, limit: int = 20) -> SyncPager[AdapterPublic]:
        """Every adapter of the organization, newest first."""
        return SyncPager(self._http, list_adapters(limit))

    def get(self, adapter_id: str) -> AdapterPublic:
        return self._http.send(get_adapter(adapter_id))

    def versions(self, adapter_id: str) -> builtins.list[AdapterVersionPublic]:
        """Every version, newest first; each `model` is the reference to evaluate or deploy, and
        `kind` says what it is: a LoRA adapter, or a whole model (evaluated and downloaded, not deployed)."""
        return self._http.send(list_versions(adapter_id))

    def version(self, adapter_id: str, version: int) -> AdapterVersionPublic:
        return self._http.send(get_version(adapter_id, version))

    def find(self, name: str) -> AdapterPublic:
        """The adapter with this name (or id); NotFoundError if the organization has none."""
        adapter = next((a for a in self.list(limit=100) if name in (a.name, a.id)), None)
        if adapter is None:
            raise not_found(name)
        return adapter

    def resolve(self, ref: str) -> AdapterVersionPublic:
        """The version a reference names: `name@N`, or `name` / an adapter id for its newest ready version."""
        name, number = split_ref(ref)
        adapter = self.find(name)
        if number is not None:
            return self.version(adapter.id, number)
        return newest(adapter, self.versions(adapter.id))

    def download(self, ref: str | AdapterVersionPublic, out: Folder) -> Path:
        """Download a version (a reference, or a version as `resolve` returns it) into folder `out`.

        Returns the folder, holding `adapter_config.json` and `adapter_model.safetensors`, or for
        a whole-model version (`kind` "full") its config, safetensors weights and tokenizer files.
        """
        version = self.resolve(ref) if isinstance(ref, str) else ref
        download = _Download(version, Path(out))
        try:
            response = self._http.open_stream(download_call(version))
            try:
                for chunk in response.iter_bytes():
                    download.write(chunk)
            finally:
                response.close()
        except BaseException:
            download.abandon()
            raise
        return download.finish(response.headers.get("x-mint-sha256"))


class AsyncAdapters:
    """`/v1/adapters`, for asyncio: the twin of `Adapters`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def upload(self, name: str, base_model: str, folder: Folder) -> AdapterVersionPublic:
        return await self._http.send(upload_call(name, base_model, folder))

    def list(self, *, limit: int = 20) -> AsyncPager[AdapterPublic]:
        return AsyncPager(self._http, list_adapters(limit))

    async def get(self, adapter_id: str) -> AdapterPublic:
        return await self._http.send(get_adapter(adapter_id))

    async def versions(self, adapter_id: str) -> builtins.list[AdapterVersionPublic]:
        return await self._http.send(list_versions(adapter_id))

    async def version(self, adapter_id: str, version: int) -> AdapterVersionPublic:
        return await self._http.send(get_version(adapter_id, version))

    async def find(self, name: str) -> AdapterPublic:
        async for adapter in self.list(limit=100):
            if name in (adapter.name, adapter.id):
                return adapter
        raise not_found(name)

    async def resolve(self, ref: str) -> AdapterVersionPublic:
        name, number = split_ref(ref)
        adapter = await self.find(name)
        if number is not None:
            return await self.version(adapter.id, number)
        return newest(adapter, await self.versions(adapter.id))

    async def download(self, ref: str | AdapterVersionPublic, out: Folder) -> Path:
        version = await self.resolve(ref) if isinstance(ref, str) else ref
        download = _Download(version, Path(out))
        try:
            response = await self._http.open_stream(download_call(version))
            try:
                async for chunk in response.aiter_bytes():
                    download.write(chunk)
            finally:
                await response.aclose()
        except BaseException:
            download.abandon()
            raise
        return download.finish(response.headers.get("x-mint-sha256"))
