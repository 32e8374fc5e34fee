"""The package's public face is small and deliberate: this pins it."""

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
        "kafka",
        "load_settings",
        "max",
        "mean",
        "min",
        "parquet",
        "redis",
        "stateful",
        "sum",
        "testing",
    ]
    for name in kappaflow.__all__:
        assert hasattr(kappaflow, name)


def test_import_has_no_side_effects() -> None:
    import subprocess
    import sys

    code = (
        "import kappaflow, sys; print('pyspark' in sys.modules, 'confluent_kafka' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
