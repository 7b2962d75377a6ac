"""bench/gpu_check.sh on a machine without a GPU: it says so and exits 77 (skipped), and its
Python parts import and compute their figures' arithmetic here. The GPU paths themselves run
where there is a GPU, by the script."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import gpu_train_mfu, worker_group
from mint.config import PROJECT_ROOT

pytestmark = pytest.mark.backend_free

SCRIPT = PROJECT_ROOT / "bench" / "gpu_check.sh"
NO_GPU = 77


def run_script(path: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env={**os.environ, "PATH": path, **env}, cwd="/"
    )


def path_without_nvidia_smi() -> str:
    return os.pathsep.join(
        folder
        for folder in os.environ.get("PATH", "").split(os.pathsep)
        if folder and not (Path(folder) / "nvidia-smi").exists()
    )


def test_without_nvidia_smi_the_script_says_so_and_skips() -> None:
    run = run_script(path_without_nvidia_smi())
    assert run.returncode == NO_GPU, run.stderr
    assert "no NVIDIA GPU here (nvidia-smi is not on PATH)" in run.stderr
    assert run.stdout == ""


def test_without_cuda_in_torch_the_script_says_so_and_skips(tmp_path: Path) -> None:
    # A driver tool that answers, and a torch that sees no device (CUDA_VISIBLE_DEVICES empty):
    # the script must ask torch itself rather than trust nvidia-smi.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    python = shutil.which("python", path=str(PROJECT_ROOT / ".venv" / "bin")) or "python3"
    run = run_script(f"{bin_dir}{os.pathsep}{path_without_nvidia_smi()}", PY=python, CUDA_VISIBLE_DEVICES="")
    assert run.returncode == NO_GPU, run.stderr
    assert "torch.cuda is not available" in run.stderr


def test_the_bench_dense_base_is_mid_size_and_mfu_is_its_formula() -> None:
    parameters = gpu_train_mfu.parameter_count()
    assert 0.5e9 < parameters < 1.0e9
    spec = gpu_train_mfu.dense_spec(parameters)
    assert spec.source.kind == "seeded" and not spec.moe
    assert gpu_train_mfu.peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_train_mfu.peak_bf16_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu_train_mfu.peak_bf16_tflops("NVIDIA H200") == 989.0
    assert gpu_train_mfu.peak_bf16_tflops("Some Future GPU") is None
    # 1B parameters at 50k tokens/s on 989 TFLOP/s: 6 * 1e9 * 5e4 / 9.89e14.
    assert gpu_train_mfu.mfu(10**9, 5e4, 989.0) == pytest.approx(0.30334, rel=1e-4)
    assert len(worker_group.batch(length=16, rows=3)) == 3
