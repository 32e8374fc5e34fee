import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from kappaflow.errors import ConfigError, InvalidSettingError
from kappaflow.settings import SettingsOverrides, brokers_marker, load_settings


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_defaults() -> None:
    settings = load_settings()
    assert settings.kafka.embedded
    assert settings.kafka.bootstrap == "127.0.0.1:9092"
    assert settings.spark.master == "local[*]"
    assert settings.redis.effective_url == "redis://127.0.0.1:6379/0"
    assert settings.jars_path == Path(".kappaflow/jars")
    assert settings.checkpoint_root == Path(".kappaflow/checkpoints")


def test_precedence_flags_over_env_over_file_over_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kappaflow.toml").write_text(
        'state_dir = "from-file"\n[kafka]\nport = 1111\ntimeout_s = 3.0\n'
        '[spark]\nmaster = "local[1]"\nshuffle_partitions = 7\n'
    )
    settings = load_settings()
    assert (settings.state_dir, settings.kafka.port, settings.spark.master) == (
        Path("from-file"),
        1111,
        "local[1]",
    )

    monkeypatch.setenv("KAPPAFLOW_KAFKA__PORT", "2222")
    monkeypatch.setenv("KAPPAFLOW_SPARK__MASTER", "local[2]")
    settings = load_settings()
    assert (settings.kafka.port, settings.spark.master) == (2222, "local[2]")
    assert settings.kafka.timeout_s == 3.0  # untouched keys keep the file's value

    settings = load_settings(kafka={"port": 3333}, state_dir=Path("from-flag"))
    assert settings.kafka.port == 3333
    assert settings.state_dir == Path("from-flag")
    assert settings.spark.master == "local[2]"
    assert settings.spark.shuffle_partitions == 7


def test_config_file_from_env_and_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other.toml"
    other.write_text("[redis]\nport = 7777\n")
    monkeypatch.setenv("KAPPAFLOW_CONFIG", str(other))
    assert load_settings().redis.port == 7777
    explicit = tmp_path / "explicit.toml"
    explicit.write_text("[redis]\nport = 8888\n")
    assert load_settings(explicit).redis.port == 8888


def test_errors_name_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text('[kafka]\nport = "lots"\n')
    with pytest.raises(ConfigError, match=r"kafka\.port"):
        load_settings(bad)
    bad.write_text("[kafka]\nprot = 1\n")
    with pytest.raises(ConfigError, match=r"kafka\.prot"):
        load_settings(bad)
    bad.write_text("[kafka\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_settings(bad)
    monkeypatch.setenv("KAPPAFLOW_SPARK__MASTER", "mainframe")
    with pytest.raises(ConfigError, match="unknown Spark master"):
        load_settings()


@pytest.mark.parametrize(
    "master", ["local", "local[4]", "local[*]", "spark://h:7077", "yarn", "k8s://https://h:6443"]
)
def test_spark_masters(master: str) -> None:
    assert load_settings(spark={"master": master}).spark.master == master


def test_a_master_spark_no_longer_has_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown Spark master"):
        load_settings(spark={"master": "mesos://h:5050"})  # removed in Spark 4


def test_external_cluster_and_security_options() -> None:
    settings = load_settings(
        kafka={
            "bootstrap_servers": "b1:9093,b2:9093",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "alice",
            "sasl_password": 'p"w',
            "ssl_ca_location": "/etc/ca.pem",
            "client_options": {"client.id": "me"},
        }
    )
    assert not settings.kafka.embedded
    client = settings.kafka.client_config()
    assert client == {
        "bootstrap.servers": "b1:9093,b2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": 'p"w',
        "ssl.ca.location": "/etc/ca.pem",
        "client.id": "me",
    }
    spark = settings.kafka.spark_kafka_options()
    assert spark["kafka.bootstrap.servers"] == "b1:9093,b2:9093"
    assert spark["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="p\\"w";'
    )
    assert spark["kafka.ssl.truststore.type"] == "PEM"
    assert 'p"w' not in repr(settings)  # secrets stay out of logs


def test_settings_are_immutable() -> None:
    settings = load_settings()
    with pytest.raises(ValidationError):
        settings.state_dir = Path("elsewhere")


def test_overrides_survive_a_job_record_and_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAPPAFLOW_SPARK__MASTER", "local[3]")
    cli = SettingsOverrides(state_dir=tmp_path / "s", bootstrap_servers="k:9092")
    stored = json.loads(json.dumps(cli.to_json()))
    assert SettingsOverrides.from_json(stored) == SettingsOverrides(
        state_dir=(tmp_path / "s").resolve(), bootstrap_servers="k:9092"
    )
    part = SettingsOverrides(spark_master="local[4]", spark_conf={"spark.x": "1"}).over(cli)
    settings = load_settings(overrides=part)
    assert settings.state_dir == (tmp_path / "s").resolve()
    assert settings.kafka.bootstrap_servers == "k:9092"
    assert (settings.spark.master, settings.spark.conf) == ("local[4]", {"spark.x": "1"})
    # Not overridden: the environment still decides.
    assert load_settings(overrides=cli).spark.master == "local[3]"


def test_a_job_record_of_0_1_0_still_reads(tmp_path: Path) -> None:
    old = {
        "state_dir": str(tmp_path),
        "kafka": {"bootstrap_servers": "k:9092"},
        "spark": {"master": "local[2]"},
    }
    assert SettingsOverrides.from_json(old) == SettingsOverrides(
        state_dir=tmp_path, bootstrap_servers="k:9092", spark_master="local[2]"
    )


def test_node_ports_that_clash_are_a_setting_error(tmp_path: Path) -> None:
    clash = {"brokers": 3, "port": 9092, "controller_port": 9102}  # node 2's client port
    with pytest.raises(InvalidSettingError, match="none twice") as found:
        load_settings(state_dir=tmp_path, kafka=clash)
    assert found.value.code == "KF101"
    with pytest.raises(InvalidSettingError, match="at most 65535"):
        load_settings(state_dir=tmp_path, kafka={"brokers": 3, "port": 65530})
    with pytest.raises(InvalidSettingError, match=r"kafka\.brokers is for the embedded"):
        load_settings(state_dir=tmp_path, kafka={"brokers": 3, "bootstrap_servers": "k:9092"})
    three = load_settings(state_dir=tmp_path, kafka={"brokers": 3}).kafka
    assert three.bootstrap == "127.0.0.1:9092,127.0.0.1:9102,127.0.0.1:9112"
    # Unset, the number is the one the state directory's storage was made with.
    brokers_marker(tmp_path).parent.mkdir(parents=True)
    brokers_marker(tmp_path).write_text("3\n")
    assert load_settings(state_dir=tmp_path).kafka.nodes == 3
    assert load_settings(state_dir=tmp_path, kafka={"brokers": 1}).kafka.bootstrap.count(",") == 0
