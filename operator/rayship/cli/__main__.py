"""`python -m rayship.cli`: the `rayship` command."""

import sys

from rayship.cli import main

sys.exit(main())
