"""``python -m svmkit.cli``: the ``svmkit`` command."""

import sys

from svmkit.cli.main import main

sys.exit(main())
