"""The package's public face is small and deliberate: this pins it."""

import importlib

import kappaflow


def test_exported_members() -> None:
    assert sorted(kappaflow.__all__) == [
        "EventTime",
        "Job",
        "KappaflowError",
        "Settings",
        "StateContext",
        "Stream",
        "Table",
        "Windowed",
        "__version__",
        "approx_distinct",
        "approx_quantiles",
        "count",
        "lake",
        "load_settings",
        "logged_at",
        "max",
        "mean",
        "min",
        "stateful",
        "store",
        "sum",
        "testing",
        "topic",
    ]
    for name in kappaflow.__all__:
        assert hasattr(kappaflow, name)
    # No public name is shadowed by a subpackage of the same name once that is imported.
    importlib.import_module("kappaflow.kafka.topics")
    importlib.import_module("kappaflow.serving.client")

    assert callable(kappaflow.topic) and callable(kappaflow.store) and callable(kappaflow.lake)


def test_import_has_no_side_effects() -> None:
    import subprocess
    import sys

    code = (
        "import kappaflow, sys; print('pyspark' in sys.modules, 'confluent_kafka' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_count_commands_load_without_pyspark() -> None:
    """`kappaflow counts` and `count status` read Redis and files: starting PySpark for
    them would cost seconds per command."""
    import subprocess
    import sys

    code = (
        "import sys, kappaflow.cli.count, kappaflow.counting.status, kappaflow.counting.store; "
        "print('pyspark' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
