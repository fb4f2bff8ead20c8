import sys

from replicator.cli import main

sys.exit(main())
