"""The ``svmkit`` command: ``info``, ``demo workqueue``, ``bench``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def _info(args: argparse.Namespace) -> int:
    from svmkit.cli.info import collect, render_table

    report = collect()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_table(report))
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.demo == "workqueue":
        from svmkit.cli.demo_workqueue import main as demo_main

        return int(demo_main(args.demo_args))
    return 2


def _bench(args: argparse.Namespace) -> int:
    import runpy
    from pathlib import Path

    script = Path.cwd() / "benchmarks" / f"{args.which}.py"
    if not script.is_file():
        sys.stderr.write(f"svmkit bench: {script} not found (run from a source checkout)\n")
        return 2
    sys.argv = [str(script), *args.bench_args]
    sys.path.insert(0, str(script.parent))  # as `python benchmarks/NAME.py` would
    runpy.run_path(str(script), run_name="__main__")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="svmkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="platforms, devices and their SVM capabilities")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(run=_info)
    demo = sub.add_parser("demo", help="bundled demos")
    demo.add_argument("demo", choices=["workqueue"])
    demo.add_argument("demo_args", nargs=argparse.REMAINDER)
    demo.set_defaults(run=_demo)
    bench = sub.add_parser("bench", help="run a benchmark script from benchmarks/")
    bench.add_argument("which", choices=["ops", "pools", "workqueue"])
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``svmkit`` console script."""
    args: Any = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
