"""A user's job code, shipped to Spark's Python workers wherever they run.

The driver imports the user's module from the directory the job was started in; Python
workers on a cluster's machines have no such directory. Spark ships what
``SparkContext.addPyFile`` is given with the job and puts it on every worker's path, so
kappaflow gives it the user's top-level package (zipped) or module file. A stateful
function and its types are also pickled by value (``ship_by_value``), so that they reach
the workers when their module was never shipped: a test's module, or a job declared in a
session rather than started by ``kappaflow jobs start``. Code installed in site-packages
is not shipped: the workers' environment must have it, as it must have kappaflow and
PySpark.
"""

from __future__ import annotations

import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import SparkSession


def ship_user_code(spark: SparkSession, function: Callable[..., Any]) -> Path | None:
    """Ship the package or module that defines ``function``; what was shipped, if any."""
    top_name = function.__module__.split(".")[0]
    top = sys.modules.get(top_name)
    if top is None:
        return None
    package_dirs = list(getattr(top, "__path__", []))
    source = Path(package_dirs[0]) if package_dirs else Path(getattr(top, "__file__", "") or "")
    if not source.name or _installed(source):
        return None
    if package_dirs:
        archive = Path(tempfile.mkdtemp(prefix="kappaflow-code-")) / f"{top_name}.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
            for path in sorted(source.rglob("*.py")):
                bundle.write(path, Path(top_name) / path.relative_to(source))
        shipped = archive
    else:
        shipped = source
    spark.sparkContext.addPyFile(str(shipped))
    return shipped


def ship_by_value(*objects: Any) -> None:
    """Have Spark pickle the modules defining ``objects`` (the user's functions and
    types) by value, as long as they are the user's: not kappaflow's, PySpark's, an
    installed package's or ``__main__`` (which Spark pickles by value anyway)."""
    for obj in objects:
        name = getattr(obj, "__module__", None) or "builtins"
        module = sys.modules.get(name)
        if (
            module is None
            or name in ("__main__", "builtins")
            or name.split(".")[0] in ("kappaflow", "pyspark")
            or _installed(Path(getattr(module, "__file__", None) or ""))
        ):
            continue
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]


def _installed(path: Path) -> bool:
    return any(part in ("site-packages", "dist-packages") for part in path.parts)
