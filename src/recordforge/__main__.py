"""`python -m recordforge`: the same CLI as the `recordforge` console script."""

from recordforge.cli.main import console

console()
