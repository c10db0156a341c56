"""Build hook for svmkit's C extensions (all metadata lives in pyproject.toml).

* ``svmkit.resources._cpool`` (required) is the pool's hot path: size classes, counters, the
  allocation record and the ready-block cache, and NumPy's data-memory handler (NEP 49) over
  svmkit resources, which needs NumPy's C headers at build time.  Users get it in binary wheels (the
  ``[tool.cibuildwheel]`` configuration in pyproject.toml); building from source needs a C
  compiler.
* ``svmkit.workqueue._cring`` (optional) speeds up the host side of ``sk.WorkQueue``: where no C
  compiler is available the build skips it and svmkit uses its pure-Python ring
  (``src/svmkit/workqueue/ring.py``), which has the same behaviour.  The ring's layout constants
  come from ``src/svmkit/workqueue/layout.py`` (read here without importing svmkit) as ``-D``
  macros.
"""

import os
import runpy
from pathlib import Path

import numpy
from setuptools import Extension, setup

_layout = runpy.run_path(str(Path(__file__).resolve().parent / "src/svmkit/workqueue/layout.py"))

_O2 = ["-O2"] if os.name != "nt" else []

setup(
    ext_modules=[
        Extension(
            "svmkit.resources._cpool",
            sources=[
                "src/svmkit/resources/_cpool.c",
                "src/svmkit/resources/_record.c",
                "src/svmkit/resources/_numpy_handler.c",
            ],
            depends=["src/svmkit/resources/_cpool.h"],
            include_dirs=[numpy.get_include()],  # NumPy's C API: the NEP 49 handler
            extra_compile_args=_O2,
        ),
        Extension(
            "svmkit.workqueue._cring",
            sources=["src/svmkit/workqueue/_cring.c"],
            define_macros=_layout["c_macros"](),
            optional=True,
            extra_compile_args=_O2,
        )
    ]
)
