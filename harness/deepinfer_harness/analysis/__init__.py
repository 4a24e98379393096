"""Analysis stage: per-run summaries, A/B statistics, tables and charts, from result files only."""
