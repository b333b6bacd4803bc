"""``python -m lsr`` = the ``lsr`` command."""

import sys

from lsr.cli import main

sys.exit(main())
