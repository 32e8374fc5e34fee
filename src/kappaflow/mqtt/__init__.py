"""MQTT: the embedded broker devices publish to, and the bridge from it into Kafka."""
