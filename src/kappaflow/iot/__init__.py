"""The IoT telemetry application: home-automation devices stream readings into Kafka,
jobs on the job API clean, store and score them, and rules raise alerts.

``telemetry`` defines what a device sends; ``fleet`` models the devices' physics;
``anomalies`` the labelled faults injected into them; ``simulator`` schedules the fleet's
sends and writes them to Kafka (or JSON lines) with the ground truth beside them.
"""
