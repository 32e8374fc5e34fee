"""The schema registry: a Confluent-compatible REST API over a compacted Kafka topic
(server.py), its process (service.py), a client (client.py) and Avro compatibility
(compat.py). docs/registry.md."""
