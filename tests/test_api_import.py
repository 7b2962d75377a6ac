"""Importing the API writes nothing and loads no heavy framework (DESIGN.md section 3): an API
replica starts on a read-only image, and torch and Celery belong to the worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_free

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def test_importing_the_api_creates_no_folder_and_imports_neither_torch_nor_celery(tmp_path: Path) -> None:
    home = tmp_path / "not-yet"
    code = (
        "import json, sys, mint.api.app; "
        "print(json.dumps({name: name in sys.modules for name in ('torch', 'celery', 'mint.worker')}))"
    )
    env = {**os.environ, "MINT_HOME": str(home), "PYTHONPATH": str(PROJECT_ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert json.loads(result.stdout) == {"torch": False, "celery": False, "mint.worker": False}
    assert not home.exists()
