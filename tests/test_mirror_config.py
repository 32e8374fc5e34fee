"""The mirror's pure parts: the MirrorMaker configuration it renders for secured clusters,
and MirrorMaker's checkpoint records decoded (the mirror itself runs in test_mirror.py)."""

from __future__ import annotations

from pathlib import Path

from kappaflow.kafka.mirror import Mirror, MirrorPlan, mm2_properties
from kappaflow.kafka.mirror_status import decode_checkpoint
from kappaflow.settings import load_settings


def test_mirror_configuration_for_secured_clusters(tmp_path: Path) -> None:
    """Each cluster's Java client properties go under its alias; the passwords stay out
    of reach of others (the file is its owner's only while the mirror runs)."""
    settings = load_settings(
        state_dir=tmp_path,
        kafka={
            "bootstrap_servers": "p1:9093",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "admin",
            "sasl_password": 'pa"ss',
            "ssl_ca_location": "/ca/primary.pem",
        },
        mirror={
            "target": "b1:9093",
            "target_security_protocol": "SASL_SSL",
            "target_sasl_mechanism": "PLAIN",
            "target_sasl_username": "mm2",
            "target_sasl_password": "secret",
            "target_ssl_ca_location": "/ca/backup.pem",
        },
    )
    mirror = Mirror(settings)
    plan = MirrorPlan("p1:9093", "b1:9093", "orders", "billing")
    text = mm2_properties(settings, plan, mirror.primary, mirror.backup())
    props = dict(line.split(" = ", 1) for line in text.splitlines())
    assert props["primary.bootstrap.servers"] == "p1:9093"
    # Escaped for a properties file: Java reads back password="pa\"ss".
    assert props["primary.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="admin" password="pa\\\\"ss";'
    )
    assert props["primary.ssl.truststore.location"] == "/ca/primary.pem"
    assert props["backup.security.protocol"] == "SASL_SSL"
    assert props["backup.sasl.mechanism"] == "PLAIN"
    assert props["backup.ssl.truststore.location"] == "/ca/backup.pem"
    assert (props["primary->backup.topics"], props["primary->backup.groups"]) == (
        "orders",
        "billing",
    )
    assert props["replication.policy.class"].endswith("IdentityReplicationPolicy")
    assert props["sync.group.offsets.enabled"] == "true"
    assert props["primary.consumer.isolation.level"] == "read_committed"


def test_checkpoint_records_decode() -> None:
    """MirrorMaker's checkpoint records, as Checkpoint.java writes them."""

    def string(text: str) -> bytes:
        return len(text).to_bytes(2, "big") + text.encode()

    key = string("billing") + string("orders") + (3).to_bytes(4, "big")
    value = (0).to_bytes(2, "big") + (120).to_bytes(8, "big") + (118).to_bytes(8, "big")
    assert decode_checkpoint(key, value + string("")) == ("billing", "orders", 3, 120, 118)
    assert decode_checkpoint(key, (1).to_bytes(2, "big") + value[2:]) is None
    assert decode_checkpoint(b"\x00", value) is None
