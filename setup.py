"""Build hook for svmkit's one optional C extension (all metadata lives in pyproject.toml).

``svmkit.workqueue._cring`` speeds up the host side of ``sk.WorkQueue``.  It is optional: where no
C compiler is available the build skips it and svmkit uses its pure-Python ring
(``svmkit/workqueue/ring.py``), which has the same behaviour.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "svmkit.workqueue._cring",
            sources=["svmkit/workqueue/_cring.c"],
            optional=True,
            extra_compile_args=["-O2"] if __import__("os").name != "nt" else [],
        )
    ]
)
