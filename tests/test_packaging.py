"""The package as users get it: the installed copy is what imports, wherever Python starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import svmkit

ROOT = Path(__file__).resolve().parent.parent


def test_import_from_the_checkout_root_finds_the_installed_package():
    # A checkout's root is where README's commands leave a user; the source tree there must
    # not shadow the installed package (whose C extensions a bare source tree lacks).
    result = subprocess.run(
        [sys.executable, "-c", "import svmkit, svmkit.resources._cpool; print(svmkit.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == Path(svmkit.__file__)


def test_the_package_ships_its_kernels_and_type_marker():
    package = Path(svmkit.__file__).parent
    assert (package / "py.typed").is_file()
    headers = {p.name for p in svmkit.kernels_dir().iterdir()}
    assert {"svmkit_atomics.h", "svmkit_workqueue.h", "workqueue_demo.cl"} <= headers
