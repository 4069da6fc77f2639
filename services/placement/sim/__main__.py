"""`python -m services.placement.sim` and the `trainmaster-sim` console script."""

import sys

from services.placement.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
