"""C{python -m kestrel.tools.load}: the same as the C{kestrel-load} console script."""

import sys

from kestrel.tools.load.cli import main

sys.exit(main())
