"""`python -m clustersim` is the `clustersim` command."""
from clustersim.sim.cli import command

command()
