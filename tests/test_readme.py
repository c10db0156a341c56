"""The README's code blocks run as written, and its two commands are what CI uses."""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from pathlib import Path

import pytest
from _helpers import assert_quiet_exit, run_python

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(), flags=re.S)


def caps_fine_or_system(namespace: dict[str, object]) -> bool:
    """Whether the README's context has SVM NumPy can use without maps."""
    caps = namespace["sk"].capabilities(namespace["ctx"])  # type: ignore[attr-defined]
    return bool(caps.fine_grain_buffer or caps.fine_grain_system)


@pytest.mark.skipif(not README.is_file(), reason="README.md is not beside the tests")
def test_readme_python_blocks_run_in_order():
    namespace: dict[str, object] = {"__name__": "__main__"}  # as a script runs
    out = io.StringIO()
    blocks = _blocks("python")
    assert len(blocks) >= 3
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block, str(README), "exec"), namespace)
    printed = out.getvalue()
    assert "[ 0.  1.  4.  9. 16. 25. 36. 49.]" in printed
    assert "refused: MapStateError" in printed
    assert "[9. 9.]" in printed  # a raw kernel recorded with sk.record
    assert "CL_INVALID_VALUE" in printed
    assert "no commands on mapped memory\n21.0" in printed
    assert "[1.5 7.  1.5]" in printed and "CL_MEM_COPY_OVERLAP" in printed
    assert "[9 3 6 0]" in printed  # the kernel followed pointers the host stored
    assert "1000 0 1" in printed and "limit reached: 8388608" in printed
    assert "matches NumPy: True" in printed  # map_kernel on a real LocalCluster
    assert "16 pooled allocations" in printed  # two per chunk, from the workers' pools
    assert "[ 49. 225. 529.] 12488.0" in printed  # NumPy on pooled SVM, then a kernel
    assert "1000000.0" in printed and "5.0" in printed  # pyopencl.array reductions
    if caps_fine_or_system(namespace):
        assert "[0.    0.    0.    0.    0.327 0.51  0.735 1.   ]" in printed
        found = re.search(r"(\d+) NumPy arrays in SVM from (\d+) new pool blocks", printed)
        assert found is not None, printed
        assert int(found[1]) >= 300 and int(found[2]) <= 4  # temporaries reuse pool blocks
    else:
        assert "no fine-grain SVM: NumPy keeps its own memory" in printed
    if namespace["y"].policy.needs_map:  # type: ignore[attr-defined]
        assert "[0. 1. 2. 3.]" in printed
    else:
        assert "[10.  1.  2.  3.]" in printed  # the DLPack export outlived free()
    caps = namespace["sk"].capabilities(namespace["ctx"])  # type: ignore[attr-defined]
    if caps.fine_grain_buffer and caps.atomics:
        assert "[   9 9801]" in printed
    else:
        assert "no work queue here" in printed


@pytest.mark.skipif(not README.is_file(), reason="README.md is not beside the tests")
def test_readme_has_exactly_the_two_marked_commands():
    text = README.read_text()
    for marker in ("<!-- main-command -->", "<!-- test-command -->"):
        assert text.count(marker) == 1
        after = text.split(marker, 1)[1].lstrip()
        assert after.startswith("```bash\npython3 -m venv .venv && . .venv/bin/activate")


@pytest.mark.skipif(not README.is_file(), reason="README.md is not beside the tests")
def test_readme_dask_block_runs_as_a_script():
    pytest.importorskip("distributed")
    section = README.read_text().split("## svmkit on Dask", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert 'if __name__ == "__main__":' in block
    # Saved as a file and run with `python`: Dask's worker processes start with spawn and
    # import the file again.  Dask's scratch space goes to the same temporary directory,
    # removed afterwards with the script.
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "readme_dask.py"
        script.write_text(block)
        proc = run_python(
            args=[str(script)],
            env={"DASK_TEMPORARY_DIRECTORY": scratch, "PYOPENCL_CTX": None},
            cwd=scratch,
        )
    assert_quiet_exit(proc)
    assert "matches NumPy: True\n" in proc.stdout
    assert "16 pooled allocations\n" in proc.stdout  # two per chunk, from the workers' pools
