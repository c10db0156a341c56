"""How a bundled demo runs from the command line: options parsed, errors as one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

import pyopencl as cl

from svmkit.errors import SVMError

__all__ = ["run_demo"]

Run = Callable[[argparse.Namespace, TextIO, TextIO], int]


def run_demo(
    prog: str, parser: argparse.ArgumentParser, run: Run, argv: Sequence[str] | None
) -> int:
    """Parse ``argv`` with ``parser`` and ``run(args, stdout, stderr)``: its status, 2 on a
    bad option (argparse has printed the usage error naming it), 130 on Ctrl-C and 1 on an
    OpenCL or svmkit error, each said in one line with no traceback."""
    out, err = sys.stdout, sys.stderr
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        return run(args, out, err)
    except KeyboardInterrupt:
        err.write(f"\n{prog}: interrupted\n")
        return 130
    except (SVMError, cl.Error, TimeoutError, OSError) as exc:
        err.write(f"{prog}: error: {exc}\n")
        return 1
