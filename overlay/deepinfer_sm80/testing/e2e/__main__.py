import sys

from deepinfer_sm80.testing.e2e.runner import main

if __name__ == "__main__":  # module discovery (testing/registry) imports this file too
    sys.exit(main())
