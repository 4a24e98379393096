"""Package marker: harness tests import as harness.tests.*, unique next to tests/ and overlay/tests."""
