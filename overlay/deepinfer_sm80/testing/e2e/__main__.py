import sys

from deepinfer_sm80.testing.e2e.runner import main

sys.exit(main())
