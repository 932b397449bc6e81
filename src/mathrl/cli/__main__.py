"""`python -m mathrl.cli ...` is the `mathrl` command."""

import sys

from mathrl.cli import main

sys.exit(main())
