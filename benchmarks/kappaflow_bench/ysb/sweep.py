"""``kappaflow-bench ysb-sweep``: each engine's maximum sustainable rate.

For every engine, one YSB run (``kappaflow_bench.ysb.bench.run``) per rate, from the lowest
rate up, until a run is not sustainable; the engine's maximum sustainable rate is the
last rate before that. A run is sustainable when

- its window p99 (by the original method) is at most ``max_p99_ms`` (1 s, the
  original notebooks' "keeping up" criterion);
- the engine kept up: it accounted for every event (no mismatched window: a window
  still short when the drain gave up is one) and the run had measured windows;
- the generator offered the rate: it achieved at least 95% of it, or the machine
  could not offer the rate and the point says nothing about the engine.

A run that fails (the engine does not start, does not count its warm-up in time) ends
the engine's sweep too, with the error as the reason. Each run keeps its own directory
(``<out>/<engine>/<rate>/``, as ``kappaflow-bench ysb`` writes it); the sweep writes
``<out>/sweep.json`` and ``<out>/p99.png``, p99 against rate for every engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kappaflow.errors import CommandLineError, KappaflowError
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow_bench.report import machine, write_json
from kappaflow_bench.ysb.bench import ENGINES, RunSpec, run
from kappaflow_bench.ysb.results import RunResult

#: The rates a sweep climbs by default, events/s.
DEFAULT_RATES = (10_000, 20_000, 50_000, 100_000, 200_000)
MAX_P99_MS = 1_000
#: Below this share of the offered rate, the generator, not the engine, was the limit.
GENERATOR_SHARE = 0.95


@dataclass
class SweepPoint:
    """One run of the sweep: its rate, the verdict, and the run's result (None if the
    run failed)."""

    engine: str
    rate: int
    sustainable: bool
    reason: str
    out_dir: Path
    result: RunResult | None = None

    def as_json(self) -> dict[str, Any]:
        res = self.result
        return {
            "engine": self.engine,
            "rate": self.rate,
            "sustainable": self.sustainable,
            "reason": self.reason,
            "dir": str(self.out_dir),
            "rate_achieved": None if res is None else round(res.rate_achieved),
            "latency_ms": None if res is None else res.latency_ms,
            "windows_measured": None if res is None else res.windows_measured,
            "mismatched_windows": None if res is None else res.mismatched_windows,
            "load_average_at_start": self.load_average(),
        }

    def load_average(self) -> Any:
        return None if self.result is None else self.result.machine.get("load_average_at_start")

    def row(self) -> list[str]:
        lat = {} if self.result is None else self.result.latency_ms

        def ms(key: str) -> str:
            value = lat.get(key)
            return "-" if value is None else f"{value:,}"

        load = self.load_average()
        return [
            self.engine,
            f"{self.rate:,}",
            ms("p50"),
            ms("p99"),
            "-" if self.result is None else str(self.result.mismatched_windows),
            "-" if load is None else f"{load[0]:.1f}",
            "yes" if self.sustainable else f"no: {self.reason}",
        ]


COLUMNS = ("engine", "events/s", "p50 ms", "p99 ms", "mismatched", "load", "sustainable")


@dataclass
class SweepResult:
    engines: list[str]
    sink: str
    rates: list[int]
    max_p99_ms: int
    config: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    points: list[SweepPoint] = field(default_factory=list)

    def max_sustainable(self, engine: str) -> int | None:
        """The highest rate the engine sustained with every lower rate sustained too."""
        best = None
        for point in self.points:
            if point.engine == engine:
                if not point.sustainable:
                    break
                best = point.rate
        return best

    def as_json(self) -> dict[str, Any]:
        return {
            "engines": self.engines,
            "sink": self.sink,
            "rates": self.rates,
            "max_p99_ms": self.max_p99_ms,
            "max_sustainable_rate": {e: self.max_sustainable(e) for e in self.engines},
            "config": self.config,
            "machine": self.machine,
            "points": [p.as_json() for p in self.points],
        }


def verdict(result: RunResult, max_p99_ms: int) -> tuple[bool, str]:
    p99 = result.latency_ms.get("p99")
    if result.rate_achieved < GENERATOR_SHARE * result.rate_offered:
        return False, f"the generator reached only {result.rate_achieved:,.0f}/s"
    if result.mismatched_windows:
        return False, f"fell behind: {result.mismatched_windows} windows short at the end"
    if p99 is None:
        return False, "no measured windows"
    if p99 > max_p99_ms:
        return False, f"p99 {p99:,} ms > {max_p99_ms:,} ms"
    return True, f"p99 {p99:,} ms"


def validate(engines: Sequence[str], rates: Sequence[int], base: RunSpec) -> None:
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        known = ", ".join(ENGINES)
        raise CommandLineError(f"unknown engine {', '.join(unknown) or '(none)'}: {known}")
    if len(set(engines)) != len(engines):
        raise CommandLineError("--engines names an engine twice")
    if not rates or any(r < 1 for r in rates) or list(rates) != sorted(set(rates)):
        raise CommandLineError("--rates must be rising rates of at least 1 event/s")
    for engine in engines:
        replace(base, engine=engine, rate=rates[0]).validate()


def sweep(
    settings: Settings,
    engines: Sequence[str],
    rates: Sequence[int],
    out_dir: Path,
    *,
    base: RunSpec,
    max_p99_ms: int = MAX_P99_MS,
    overrides: SettingsOverrides,
    say: Callable[[str], None],
) -> SweepResult:
    """Sweep every engine over ``rates``; ``base`` gives everything of a run but its
    engine and rate."""
    validate(engines, rates, base)
    result = SweepResult(
        engines=list(engines),
        sink=base.sink,
        rates=list(rates),
        max_p99_ms=max_p99_ms,
        config={
            "duration_s": base.duration_s,
            "warmup_s": base.warmup_s,
            "partitions": base.partitions,
            "generator_processes": base.processes,
        },
        machine=machine(),
    )
    for engine in engines:
        for rate in rates:
            spec = replace(base, engine=engine, rate=rate)
            run_dir = out_dir / engine / str(rate)
            say(f"sweep: {engine} at {rate:,} events/s")
            try:
                outcome = run(settings, spec, run_dir, overrides=overrides, say=say)
            except (KappaflowError, TimeoutError) as exc:
                point = SweepPoint(engine, rate, False, f"run failed: {exc}", run_dir)
            else:
                ok, why = verdict(outcome, max_p99_ms)
                point = SweepPoint(engine, rate, ok, why, run_dir, outcome)
            result.points.append(point)
            held = "sustained" if point.sustainable else "not sustained"
            say(f"sweep: {engine} at {rate:,}/s {held} ({point.reason})")
            write(out_dir, result)
            if not point.sustainable:
                break
    result.machine["load_average_at_end"] = os.getloadavg()
    write(out_dir, result)
    return result


def write(out_dir: Path, result: SweepResult) -> None:
    """sweep.json and p99.png, rewritten after every run: an interrupted sweep keeps
    what it measured."""
    write_json(out_dir / "sweep.json", result.as_json())
    plot_p99(out_dir / "p99.png", result)


def plot_p99(path: Path, result: SweepResult) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    plotted = False
    for engine in result.engines:
        points = [p for p in result.points if p.engine == engine and p.result is not None]
        measured = [(p.rate, p.result.latency_ms.get("p99")) for p in points if p.result]
        xs = [rate for rate, p99 in measured if p99 is not None]
        ys = [p99 for _, p99 in measured if p99 is not None]
        best = result.max_sustainable(engine)
        label = f"{engine} (max {best:,}/s)" if best else f"{engine} (none sustained)"
        ax.plot(xs, ys, marker="o", label=label)
        plotted = plotted or any(y > 0 for y in ys)
    ax.axhline(result.max_p99_ms, color="grey", ls="--", lw=1)
    if plotted:  # log scales need a positive value to draw
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("offered events/s")
    ax.set_ylabel("window p99, ms after the window closed")
    ax.set_title(f"YSB sweep, {result.sink} sink: p99 against rate")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
