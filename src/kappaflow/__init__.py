"""kappaflow: Kafka as the event log, Spark Structured Streaming as the engine."""

from kappaflow.errors import KappaflowError
from kappaflow.settings import Settings, load_settings

__version__ = "0.1.0"

__all__ = ["KappaflowError", "Settings", "__version__", "load_settings"]
