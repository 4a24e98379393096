"""Marker only: lets pytest import harness/tests as the package harness.tests (unique names)."""
