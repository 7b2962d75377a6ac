"""A serving node decodes a fetched adapter version's archive into views of its bytes.

The tensors an engine copies into its slots are read where they lie in the archive (a tar
holds each file's bytes in one run, a safetensors file each tensor's): equal to what
safetensors' own loader reads, without its copies, and a malformed file is refused saying what
is wrong with it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from mint.errors import InvalidRequest
from mint.services.models.adapters import archive_adapter
from mint.serving.node import decode_archive

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

CONFIG = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def adapter_folder(folder: Path, weights: bytes | None = None, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(CONFIG))
    if tensors is not None:
        save_file(tensors, folder / "adapter_model.safetensors")
    else:
        (folder / "adapter_model.safetensors").write_bytes(weights or b"")
    return folder


def safetensors_bytes(header: dict[str, object], data: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


def test_a_versions_tensors_are_views_of_its_archive_equal_to_what_safetensors_reads(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    tensors = {
        A: torch.randn(4, 16, generator=generator),
        B: torch.randn(16, 4, generator=generator).to(torch.bfloat16),
        "base_model.model.empty.lora_A.weight": torch.zeros(0, 16),
    }
    folder = adapter_folder(tmp_path / "adapter", tensors=tensors)
    archive = archive_adapter(folder)

    decoded = decode_archive(archive)

    expected = load_safetensors((folder / "adapter_model.safetensors").read_bytes())
    assert decoded.config == CONFIG and sorted(decoded.tensors) == sorted(expected)
    for name, tensor in expected.items():
        assert decoded.tensors[name].dtype == tensor.dtype and torch.equal(decoded.tensors[name], tensor)
    start = torch.frombuffer(archive, dtype=torch.uint8).data_ptr()
    for name in (A, B):  # inside the archive's own bytes: nothing was copied
        view = decoded.tensors[name]
        assert start <= view.data_ptr() and view.data_ptr() + view.nbytes <= start + len(archive)


@pytest.mark.parametrize(
    ("weights", "problem"),
    [
        (b"not a safetensors file", "is not a safetensors file"),
        (
            safetensors_bytes({A: {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}, b"\0" * 32),
            "holds 64 bytes",
        ),
        (
            safetensors_bytes({A: {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 32]}}, b"\0" * 32),
            "not its shape",
        ),
        (safetensors_bytes({A: {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16), "a float tensor"),
        (safetensors_bytes({A: {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}}, b"\0" * 16), "a float tensor"),
    ],
    ids=["not-safetensors", "past-the-end", "short-of-its-shape", "integer-dtype", "shape-not-a-list"],
)
def test_a_malformed_weights_file_is_refused_saying_what(tmp_path: Path, weights: bytes, problem: str) -> None:
    archive = archive_adapter(adapter_folder(tmp_path / "adapter", weights))
    with pytest.raises(InvalidRequest, match=problem) as refused:
        decode_archive(archive)
    assert refused.value.param == "model" and "adapter_model.safetensors" in str(refused.value)
