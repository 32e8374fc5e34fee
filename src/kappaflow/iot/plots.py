"""Pictures of scored series: ``kappaflow iot evaluate --plot`` draws one PNG per series.

Each picture has two panels over the series' time: above, the values, with the labelled
anomalies' windows shaded (NAB's windows, ``kappaflow.iot.nab.windows``), the labelled
rows marked and the alarms (the first reading of each run at or above the threshold)
marked in red; below, the anomaly score with the threshold. The probation period, where
NAB scores nothing, is shaded grey in both.

matplotlib is imported here only, when a picture is asked for (``pip install
kappaflow[plot]``), and drawn on a figure of its own (no pyplot state, no display).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kappaflow.errors import CommandLineError
from kappaflow.iot import nab
from kappaflow.iot.evaluation import Series, parse_time

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_WIDTH_IN, _HEIGHT_IN, _DPI = 12.0, 5.0, 100


def alarm_rows(scores: Sequence[float], threshold: float) -> list[int]:
    """The first row of each run of rows scored at or above ``threshold``."""
    return [
        row
        for row, score in enumerate(scores)
        if score >= threshold and (row == 0 or scores[row - 1] < threshold)
    ]


def series_figure(title: str, series: Series, scores: Sequence[float], threshold: float) -> Figure:
    """The picture of one scored series (see the module's description)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CommandLineError(
            "--plot draws with matplotlib, which is not installed: pip install 'kappaflow[plot]'"
        ) from None
    times = [parse_time(stamp) for stamp in series.timestamps]
    figure = Figure(figsize=(_WIDTH_IN, _HEIGHT_IN), dpi=_DPI, layout="constrained")
    values_axes, score_axes = figure.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    values_axes.plot(times, series.values, color="#31688e", linewidth=0.7, label="value")
    values_axes.set_title(title, loc="left", fontsize=10)
    if times:
        ending = min(nab.probation(len(times)), len(times) - 1)
        for axes in (values_axes, score_axes):
            axes.axvspan(times[0], times[ending], color="#dddddd", alpha=0.6, linewidth=0)
    if series.labels is not None:
        for index, (start, end) in enumerate(nab.windows(series.labels)):
            values_axes.axvspan(
                times[start],
                times[min(end, len(times) - 1)],
                color="#fde725",
                alpha=0.35,
                linewidth=0,
                label="anomaly window" if index == 0 else None,
                gid="window",
            )
        labelled = [row for row, flag in enumerate(series.labels) if flag]
        values_axes.plot(
            [times[r] for r in labelled],
            [series.values[r] for r in labelled],
            linestyle="none",
            marker="|",
            markersize=14,
            color="#b8860b",
            label="labelled",
        )
    alarms = alarm_rows(scores, threshold)
    values_axes.plot(
        [times[r] for r in alarms],
        [series.values[r] for r in alarms],
        linestyle="none",
        marker="o",
        markersize=6,
        markerfacecolor="none",
        color="#d62728",
        label=f"alarm ({len(alarms)})",
        gid="alarms",
    )
    values_axes.legend(loc="upper left", fontsize=8)
    score_axes.plot(times, scores, color="#440154", linewidth=0.7, gid="scores")
    score_axes.axhline(threshold, color="#d62728", linewidth=0.7, linestyle="--")
    score_axes.set_ylim(0.0, 1.02)
    score_axes.set_ylabel("score", fontsize=8)
    return figure


def write_plot(
    path: Path, title: str, series: Series, scores: Sequence[float], threshold: float
) -> None:
    """Draw the series' picture into the PNG file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    series_figure(title, series, scores, threshold).savefig(path, format="png")


def plot_name(name: str) -> str:
    """Where the picture of the series at relative path ``name`` goes: beside its scores,
    ending in ``.png``."""
    return name.removesuffix(".gz").removesuffix(".csv") + ".png"
