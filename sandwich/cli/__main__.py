"""`python -m sandwich.cli` runs `sandwichc`."""

import sys

from sandwich.cli import main

sys.exit(main())
