"""Continuous counting per key per event-time window, with corrections for late data."""

from kappaflow.counting.spec import CountSpec

__all__ = ["CountSpec"]
