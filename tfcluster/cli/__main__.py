"""`python -m tfcluster.cli`."""

from tfcluster.cli import main

main()
