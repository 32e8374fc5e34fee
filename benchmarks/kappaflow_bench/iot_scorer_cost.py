"""The likelihood model's cost per reading: the Python trainer and scorer, and the JVM
real-time scorer (``io.kappaflow.iot.SeriesScorer``), on the repository's labelled series.

Every series of ``data/anomaly/dev`` is replayed as ``kappaflow iot evaluate --path local``
replays it (rounds of 16, 32, ... up to ``batch`` readings, each scored with the
parameters of the rounds before). The Python side times the trainer's rounds and the
scorer's readings apart. The JVM side runs a small harness (compiled here against each
jar given) that scores the same readings with the same parameters, read from a file:
``SeriesScorer.restore`` per series, ``Params.parse`` per round, ``score`` per reading,
``repeats`` times over the whole set, the first pass a warm-up; each jar's passes
alternate with the others', so that a machine's load moves all of them alike.

Several Python sources (``label=src``: a checkout's ``src`` folder) and several jars
(``label=path``) can be timed in one run, to compare a change with the code before it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kappaflow.iot.evaluation import corpus, read_series, rounds

_HARNESS = """
import io.kappaflow.iot.Params;
import io.kappaflow.iot.SeriesScorer;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;

public final class ScorerCost {
  public static void main(String[] args) throws Exception {
    List<String> lines = Files.readAllLines(Paths.get(args[0]));
    int passes = Integer.parseInt(args[1]);
    List<List<String>> series = new ArrayList<>();
    List<List<double[]>> chunks = new ArrayList<>();
    long readings = 0;
    for (String line : lines) {
      if (line.equals("series")) {
        series.add(new ArrayList<>());
        chunks.add(new ArrayList<>());
        continue;
      }
      String[] parts = line.split("\\t", 2);
      series.get(series.size() - 1).add(parts[0]);
      String[] texts = parts[1].split(",");
      double[] values = new double[texts.length];
      for (int i = 0; i < texts.length; i++) {
        values[i] = Double.parseDouble(texts[i]);
      }
      readings += values.length;
      chunks.get(chunks.size() - 1).add(values);
    }
    double sink = 0.0;
    for (int pass = 0; pass < passes; pass++) {
      long began = System.nanoTime();
      for (int s = 0; s < series.size(); s++) {
        SeriesScorer scorer = SeriesScorer.restore("likelihood", "");
        List<String> params = series.get(s);
        for (int r = 0; r < params.size(); r++) {
          Params given = params.get(r).equals("-") ? null : Params.parse(params.get(r));
          for (double value : chunks.get(s).get(r)) {
            sink += scorer.score(value, given);
          }
        }
      }
      long took = System.nanoTime() - began;
      System.out.println(readings + " " + took);
    }
    System.err.println("checksum " + sink);
  }
}
"""

_PYTHON = """
import json, sys, time
from kappaflow.iot.evaluation import corpus, read_series, rounds
from kappaflow.iot.models import MODELS, Scorer
import math

data, batch, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = MODELS["likelihood"]
every = [read_series(p).values for p in corpus(__import__("pathlib").Path(data))]
for _ in range(passes):
    train = score = 0.0
    readings = 0
    for values in every:
        trainer, scorer, params = model.trainer(), Scorer(model), None
        for rows in rounds(len(values), batch):
            chunk = [v for v in values[rows.start : rows.stop] if not math.isnan(v)]
            began = time.perf_counter()
            for v in chunk:
                scorer.score(v, params)
            score += time.perf_counter() - began
            began = time.perf_counter()
            params = trainer.learn(chunk)
            train += time.perf_counter() - began
            readings += len(chunk)
    print(json.dumps({"readings": readings, "train_s": train, "score_s": score}))
"""


def _named(pairs: Sequence[str]) -> list[tuple[str, Path]]:
    found = []
    for pair in pairs:
        label, _, path = pair.partition("=")
        found.append((label, Path(path)))
    return found


def _inputs(data: Path, batch: int, target: Path) -> int:
    """The readings and parameters the JVM harness scores, written to ``target``."""
    from kappaflow.iot.models import MODELS

    model = MODELS["likelihood"]
    readings = 0
    with target.open("w") as out:
        for path in corpus(data):
            values = [v for v in read_series(path).values if not math.isnan(v)]
            out.write("series\n")
            trainer, params = model.trainer(), None
            for rows in rounds(len(values), batch):
                chunk = values[rows.start : rows.stop]
                given = "-" if params is None else json.dumps(params)
                out.write(given + "\t" + ",".join(repr(v) for v in chunk) + "\n")
                params = trainer.learn(chunk)
                readings += len(chunk)
    return readings


def _classpath(jar: Path) -> str:
    from kappaflow.install.javabuild import pyspark_jars

    jars = pyspark_jars(
        "jackson-core-*.jar",
        "jackson-databind-*.jar",
        "jackson-annotations-*.jar",
        "commons-math3-*.jar",
    )
    return os.pathsep.join(str(p) for p in [jar, *jars])


def run(
    data: Path,
    out_dir: Path,
    jars: Sequence[str],
    sources: Sequence[str],
    batch: int,
    passes: int,
) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="scorer-cost-"))
    inputs = work / "inputs.txt"
    readings = _inputs(data, batch, inputs)
    named_jars = _named(jars)
    classes: dict[str, Path] = {}
    for label, jar in named_jars:
        folder = work / f"classes-{label}"
        folder.mkdir()
        source = folder / "ScorerCost.java"
        source.write_text(_HARNESS)
        subprocess.run(
            ["javac", "-cp", _classpath(jar), "-d", str(folder), str(source)], check=True
        )
        classes[label] = folder
    jvm: dict[str, list[float]] = {label: [] for label, _ in named_jars}
    python: dict[str, list[dict[str, float]]] = {label: [] for label, _ in _named(sources)}
    # Alternate: one JVM run of every jar, one Python pass of every source, and again.
    for _ in range(passes):
        for label, jar in named_jars:
            cp = os.pathsep.join([str(classes[label]), _classpath(jar)])
            done = subprocess.run(
                ["java", "-cp", cp, "ScorerCost", str(inputs), "6"],
                check=True,
                capture_output=True,
                text=True,
            )
            times = [line.split() for line in done.stdout.splitlines()]
            # The first pass warms the JIT up; the best of the rest.
            jvm[label].append(min(int(t) / int(n) for n, t in times[1:]) / 1000.0)
        for label, src in _named(sources):
            env = {**os.environ, "PYTHONPATH": str(src)}
            done = subprocess.run(
                [sys.executable, "-c", _PYTHON, str(data), str(batch), "1"],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            )
            python[label].append(json.loads(done.stdout.splitlines()[-1]))
    result: dict[str, Any] = {
        "data": str(data),
        "batch": batch,
        "readings": readings,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "jvm_us_per_reading": {k: sorted(v) for k, v in jvm.items()},
        "python": {
            label: [
                {
                    "train_us": round(r["train_s"] / r["readings"] * 1e6, 2),
                    "score_us": round(r["score_s"] / r["readings"] * 1e6, 2),
                }
                for r in runs
            ]
            for label, runs in python.items()
        },
    }
    (out_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
