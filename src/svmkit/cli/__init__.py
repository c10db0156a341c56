"""The ``svmkit`` command: ``info``, ``demo`` and ``bench``."""

from svmkit.cli.main import main

__all__ = ["main"]
