"""The engine's outputs: the batch writer and its backends (Kafka, Redis), the lake's
Parquet tables and manifests, and reading them back. Internal: jobs declare sinks with
``kf.topic``, ``kf.store`` and ``kf.lake``."""
