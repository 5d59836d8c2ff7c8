"""`python -m clustersim` is the `clustersim` command."""
import sys

from clustersim.sim.cli import main

sys.exit(main())
