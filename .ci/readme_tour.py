"""Run README's Python blocks before its Dask section, in order, in one namespace.

CI runs this with the interpreter of a virtual environment that holds only the built wheel
(and its ``[cpu]`` drivers), from a directory outside the checkout, so a wheel that lacks a
kernel header or an extension fails here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

readme = Path(sys.argv[1]).read_text()
tour = readme.split("## svmkit on Dask", 1)[0]
blocks = re.findall(r"```python\n(.*?)```", tour, flags=re.S)
if len(blocks) < 3:
    sys.exit(f"README.md: expected the tour's Python blocks, found {len(blocks)}")
namespace: dict[str, object] = {"__name__": "__main__"}
for block in blocks:
    exec(compile(block, "README.md", "exec"), namespace)
print(f"README tour: {len(blocks)} blocks ran", file=sys.stderr)
