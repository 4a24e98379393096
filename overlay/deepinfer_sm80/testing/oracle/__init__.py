"""An independent fp32 forward of the tiny DeepSeek-V4.1 checkpoint (docs/ORACLE.md)."""
