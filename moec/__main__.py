"""`python -m moec ...`: the moec command line (moec.entry, which a Ctrl-C at start-up ends
cleanly)."""

import sys

from moec.entry import main

sys.exit(main())
