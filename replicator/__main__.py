import sys

from replicator.cli.main import main

sys.exit(main())
