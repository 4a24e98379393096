"""A/B serving benchmark harness for vLLM 0.32.0; see cli.py for the manual."""

SCHEMA_VERSION = "harness/1"
__version__ = "0.1.0"
