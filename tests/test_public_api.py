"""The package's public face is small and deliberate: this pins it."""

import ast
import importlib
from importlib import metadata
from pathlib import Path

import pytest

import kappaflow


def test_exported_members() -> None:
    assert sorted(kappaflow.__all__) == [
        "EventTime",
        "InvalidParameterError",
        "Job",
        "KappaflowError",
        "Reference",
        "Settings",
        "StateContext",
        "StatefulFunction",
        "Stream",
        "Table",
        "Windowed",
        "__version__",
        "approx_distinct",
        "approx_quantiles",
        "avro",
        "count",
        "from_epoch_ms",
        "lake",
        "load_settings",
        "logged_at",
        "max",
        "mean",
        "min",
        "parse_duration",
        "postgres",
        "protobuf",
        "stateful",
        "store",
        "sum",
        "testing",
        "to_epoch_ms",
        "topic",
    ]
    for name in kappaflow.__all__:
        assert hasattr(kappaflow, name)
    # No public name is shadowed by a subpackage of the same name once that is imported.
    importlib.import_module("kappaflow.kafka.topics")
    importlib.import_module("kappaflow.serving.client")
    importlib.import_module("kappaflow.postgresql.server")

    assert callable(kappaflow.topic) and callable(kappaflow.store) and callable(kappaflow.lake)
    assert callable(kappaflow.postgres)
    assert kappaflow.__version__ == metadata.version("kappaflow")


def test_type_checkers_see_the_public_names_from_where_they_load() -> None:
    """The names type checkers are told of (the TYPE_CHECKING imports) are the public
    ones, from the module each loads from at run time."""
    tree = ast.parse(Path(kappaflow.__file__).read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If))
    imports = [n for n in guarded.body if isinstance(n, ast.ImportFrom)]
    # Each as itself (``import X as X``): an explicit re-export, which mypy strict wants.
    assert all(a.asname == a.name for n in imports for a in n.names)
    told = {alias.name: (node.module or "kappaflow") for node in imports for alias in node.names}
    loaded = {name: importlib.import_module(module) for name, module in kappaflow._API.items()}
    assert told == {"testing": "kappaflow", **{n: m.__name__ for n, m in loaded.items()}}


def test_examples_and_the_built_in_jobs_use_the_public_api_only() -> None:
    """A user's job and kappaflow's own are written on the same API: examples import
    ``kappaflow`` (and ``kappaflow.testing``) only. The built-in jobs are held to it by
    an import contract in pyproject.toml (make lint)."""
    root = Path(__file__).resolve().parents[1]
    found = {}
    for path in sorted((root / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                assert isinstance(node, ast.stmt)
                if name.startswith("kappaflow") and name not in ("kappaflow", "kappaflow.testing"):
                    found[f"{path.name}:{node.lineno}"] = name
    assert found == {}


def test_a_scoped_job_reads_its_own_parameters() -> None:
    from kappaflow.errors import MissingParameterError
    from kappaflow.streams.job import Job

    job = Job("iot", {"parts": "clean", "clean.source": "raw"}, None, None)  # type: ignore[arg-type]
    clean = job.scoped("clean")
    assert clean.param("source") == "raw"
    assert clean.param("dest", "clean") == "clean"
    assert job.param("parts") == "clean"
    with pytest.raises(MissingParameterError, match=r"'clean\.parts'"):
        clean.param("parts")
    # What the scope declares is the job's.
    assert clean.outputs is job.outputs and clean.sources is job.sources


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
