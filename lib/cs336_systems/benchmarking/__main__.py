import sys

from cs336_systems.benchmarking.cli import main

sys.exit(main())
