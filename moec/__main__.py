"""`python -m moec ...`: the moec command line."""

import sys

from moec.cli import main

sys.exit(main())
