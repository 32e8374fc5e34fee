"""The processing engine: Spark sessions, Kafka sources and sinks, jobs."""
