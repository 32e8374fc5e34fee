"""Spark at the edge: sessions, the Kafka source and sink, checkpoints, the standalone
cluster."""
