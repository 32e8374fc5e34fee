"""The engine's jar: built at setup, loaded by every session, reachable from Python."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from kappaflow.errors import JarBuildError
from kappaflow.install.engine import ENGINE, engine_jar
from kappaflow.settings import Settings
from kappaflow.spark.session import session_conf
from kappaflow.streams import jvm


def test_every_session_loads_the_engine_jar(kafka: Settings) -> None:
    jars = session_conf(kafka, "t")["spark.jars"].split(",")
    assert str(engine_jar(kafka).resolve()) in jars


def test_the_session_reaches_the_engine_through_its_gateway(spark: SparkSession) -> None:
    engine = jvm.jvm_engine(spark)
    assert int(engine.Engine.contract()) == jvm.CONTRACT


def test_a_jar_of_another_contract_is_refused(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jvm, "CONTRACT", jvm.CONTRACT + 1)
    with pytest.raises(JarBuildError, match="run `make setup`"):
        jvm.jvm_engine(spark)


def test_the_jar_is_rebuilt_when_its_sources_change(kafka: Settings) -> None:
    jar = engine_jar(kafka)
    stamp = ENGINE.directory(kafka) / ".built"
    stamp.write_text("stale\n")
    assert ENGINE.jar(kafka) is None
    assert engine_jar(kafka) == jar
    assert ENGINE.jar(kafka) == jar


def test_without_javac_setup_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from kappaflow.errors import SetupError
    from kappaflow.install import jdk

    monkeypatch.setattr(jdk, "jdk_tool", lambda name: None)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(SetupError, match=r"javac not found: .*sudo apt-get install openjdk-17"):
        jdk.ensure_javac()


def test_with_javac_setup_installs_nothing() -> None:
    from kappaflow.install import jdk

    assert jdk.ensure_javac() is None
