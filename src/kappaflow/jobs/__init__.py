"""Streaming jobs: what a job computes (pipelines), and each job as a supervised driver
process of its own, managed by name."""
