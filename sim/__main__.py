"""`python -m sim` is the `clustersim` command."""
import sys

from .cli import main

sys.exit(main())
