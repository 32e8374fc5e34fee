"""Half-space trees (river's online isolation forest) over a reading and its change.

Each reading becomes two features in [0, 1]: its distance from a robust level and its
change since the reading before, both in robust spreads (clipped at ``_RANGE``). river's
``HalfSpaceTrees`` learns them in windows of ``_WINDOW`` readings; a reading in a region
of the feature space the last window seldom visited is surprising.

The trees' shape follows from their seed alone, so the published parameters are the
seed, the robust level and spread, and each tree's node masses of the last full window;
a scorer builds the same trees once and scores with the masses it was sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from kappaflow.iot.models.base import Model, Params, Trainer
from kappaflow.iot.models.robust import RobustTrainer

if TYPE_CHECKING:
    from river.anomaly import HalfSpaceTrees

_SEED = 7
_TREES = 10
_HEIGHT = 6
_WINDOW = 250
_RANGE = 8.0
_TINY = 1e-9


def _features(value: float, before: float | None, level: float, spread: float) -> dict[str, float]:
    spread = max(spread, _TINY)

    def unit(z: float) -> float:
        return min(1.0, max(0.0, 0.5 + z / (2.0 * _RANGE)))

    change = 0.0 if before is None else (value - before) / spread
    return {"level": unit((value - level) / spread), "change": unit(change)}


def _new_trees() -> HalfSpaceTrees:
    # Imported here: river takes a second and a half to import, and every Spark Python
    # worker of a job that imports this package would pay it, used or not.
    from river.anomaly import HalfSpaceTrees

    return HalfSpaceTrees(n_trees=_TREES, height=_HEIGHT, window_size=_WINDOW, seed=_SEED)


@lru_cache(maxsize=1)
def _shape() -> HalfSpaceTrees:
    """The trees a scorer scores with, shared: the same shape as every trainer's."""
    trees = _new_trees()
    # The trees are built on the first reading learnt; its masses are overwritten.
    trees.learn_one({"level": 0.5, "change": 0.5})
    return trees


class HstTrainer(Trainer):
    name = "hst"

    def __init__(self) -> None:
        super().__init__()
        self._robust = RobustTrainer()
        self._trees = _new_trees()
        self._before: float | None = None
        self._windows = 0

    def _x(self, value: float) -> dict[str, float]:
        return _features(value, self._before, self._robust.level, self._robust.spread)

    def update(self, value: float) -> None:
        if self._robust.n >= 10:
            self._trees.learn_one(self._x(value))
            if self._trees.counter == 0:
                self._windows += 1
        self._robust.update(value)
        self._robust.n += 1
        self._before = value

    def surprise(self, value: float) -> float:
        if self._windows == 0:
            return 0.0
        return float(self._trees.score_one(self._x(value)))

    def state(self) -> dict[str, Any]:
        masses = [[node.r_mass for node in tree.iter_dfs()] for tree in self._trees.trees]
        return {
            "level": self._robust.level,
            "spread": self._robust.spread,
            "windows": self._windows,
            "masses": masses,
        }


_loaded: list[object] = [None]


def _raw(params: Params, history: Sequence[float], value: float) -> float:
    if not params["windows"]:
        return 0.0
    trees = _shape()
    if _loaded[0] is not params["masses"]:
        # The shared trees take the masses of the parameters scored with, once per version.
        for tree, masses in zip(trees.trees, params["masses"], strict=True):
            for node, mass in zip(tree.iter_dfs(), masses, strict=True):
                node.r_mass = mass
        _loaded[0] = params["masses"]
    # Scoring reads the masses of the last full window, which the parameters carry; the
    # flag only says that there is one.
    trees._first_window = False
    before = history[-1] if history else None
    x = _features(value, before, float(params["level"]), float(params["spread"]))
    return float(trees.score_one(x))


HST = Model(
    name="hst",
    trainer=HstTrainer,
    raw=_raw,
    history=1,
    summary="river's half-space trees over the level and change in robust spreads",
    shape={
        "$.level": "double",
        "$.spread": "double",
        "$.windows": "bigint",
        "$.masses": "array<array<double>>",
    },
)
