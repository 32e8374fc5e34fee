"""The serving store: where results are kept for queries while jobs run."""
