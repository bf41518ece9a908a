"""`python -m raydpfl` runs the command line."""

import sys

from raydpfl.cli.main import main

sys.exit(main())
