import sys

from deepinfer_harness.cli import main

sys.exit(main())
