"""Benchmarks: long runs that print figures and write result files (never tests)."""
