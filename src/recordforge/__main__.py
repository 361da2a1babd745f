"""`python -m recordforge`: the same CLI as the `recordforge` console script."""

import sys

from recordforge.cli import main

sys.exit(main())
