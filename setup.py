"""Build hook for svmkit's one optional C extension (all metadata lives in pyproject.toml).

``svmkit.workqueue._cring`` speeds up the host side of ``sk.WorkQueue``.  It is optional: where no
C compiler is available the build skips it and svmkit uses its pure-Python ring
(``svmkit/workqueue/ring.py``), which has the same behaviour.  The ring's layout constants come
from ``svmkit/workqueue/layout.py`` (read here without importing svmkit) as ``-D`` macros.
"""

import os
import runpy
from pathlib import Path

from setuptools import Extension, setup

_layout = runpy.run_path(str(Path(__file__).resolve().parent / "svmkit/workqueue/layout.py"))

setup(
    ext_modules=[
        Extension(
            "svmkit.workqueue._cring",
            sources=["svmkit/workqueue/_cring.c"],
            define_macros=_layout["c_macros"](),
            optional=True,
            extra_compile_args=["-O2"] if os.name != "nt" else [],
        )
    ]
)
