"""Build hook for svmkit's one optional C extension (all metadata lives in pyproject.toml).

``svmkit._wqnative`` speeds up the host side of ``sk.WorkQueue``.  It is optional: where no
C compiler is available the build skips it and svmkit uses its pure-Python ring
(``svmkit/_hostatomics.py``), which has the same behaviour.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "svmkit._wqnative",
            sources=["svmkit/_wqnative.c"],
            optional=True,
            extra_compile_args=["-O2"] if __import__("os").name != "nt" else [],
        )
    ]
)
