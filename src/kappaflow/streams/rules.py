"""Declarative alert rules (``Stream.alerts``): a comparison of a record's field with a
threshold, evaluated by Spark SQL in the JVM, so that a job of rules runs in real-time
mode as well as in micro-batches.

Each rule is ``(field, op, threshold)``; a record for which a rule holds gives one alert
record: the stream's key columns, the columns it is asked to carry, ``rule``, ``field``,
``value``, ``op``, ``threshold``, ``status`` ("raised"), ``reason`` (``"value 93.5 >=
80"``) and the record's event time.
A record for which no rule holds gives none; one for which two hold gives two. The rules
keep no state: each record is judged alone (a rule over readings in a row, or a silence,
is a stateful function's work).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kappaflow.errors import InvalidJobError

#: The comparisons a rule makes.
OPS = (">", ">=", "<", "<=", "==", "!=")


@dataclass(frozen=True)
class Rule:
    name: str
    field: str
    op: str
    threshold: float

    def holds(self, value: Column) -> Column:
        limit = F.lit(self.threshold)
        ops = {
            ">": value > limit,
            ">=": value >= limit,
            "<": value < limit,
            "<=": value <= limit,
            "==": value == limit,
            "!=": value != limit,
        }
        return ops[self.op]


def parse_rules(rules: Mapping[str, object], columns: Sequence[str]) -> list[Rule]:
    """``name=(field, op, threshold)`` pairs as rules; KF731 for a malformed one."""
    if not rules:
        raise InvalidJobError("alerts(): declare at least one rule, name=(field, op, threshold)")
    parsed = []
    for name, spec in rules.items():
        if not (isinstance(spec, tuple) and len(spec) == 3):
            raise InvalidJobError(f"alert rule {name!r}: give (field, op, threshold), not {spec!r}")
        field, op, threshold = spec
        if op not in OPS:
            raise InvalidJobError(f"alert rule {name!r}: op {op!r} is not one of {' '.join(OPS)}")
        if not isinstance(threshold, int | float) or isinstance(threshold, bool):
            raise InvalidJobError(f"alert rule {name!r}: the threshold {threshold!r} is no number")
        if field not in columns:
            raise InvalidJobError(
                f"alert rule {name!r}: no column {field!r} (columns: {', '.join(columns)})"
            )
        parsed.append(Rule(name, str(field), str(op), float(threshold)))
    return parsed


#: The fields an alert record has of its own.
ALERT_FIELDS = ("rule", "field", "value", "op", "threshold", "status", "reason")


def carried_columns(carry: Sequence[str] | str, columns: Sequence[str]) -> list[str]:
    """The record's columns an alert carries; KF731 for one the records lack or one
    named as an alert's own field."""
    names = [carry] if isinstance(carry, str) else list(carry)
    for name in names:
        if name not in columns:
            raise InvalidJobError(
                f"alerts(carry=...): no column {name!r} (columns: {', '.join(columns)})"
            )
        if name in ALERT_FIELDS:
            raise InvalidJobError(
                f"alerts(carry=...): {name!r} is an alert's own field; carry it under "
                "another name (Stream.with_column)"
            )
    return list(dict.fromkeys(names))


def alert_rows(frame: DataFrame, rules: Sequence[Rule], keep: Sequence[str]) -> DataFrame:
    """An alert row per record of ``frame`` and rule that holds for it: the ``keep``
    columns (keys, event time, kappaflow's own) and the alert's."""
    alerts = []
    for rule in rules:
        value = F.col(rule.field).cast("double")
        reason = F.format_string(f"{rule.field} %s {rule.op} %s", value, F.lit(rule.threshold))
        alert = F.struct(
            F.lit(rule.name).alias("rule"),
            F.lit(rule.field).alias("field"),
            value.alias("value"),
            F.lit(rule.op).alias("op"),
            F.lit(rule.threshold).alias("threshold"),
            F.lit("raised").alias("status"),
            reason.alias("reason"),
        )
        alerts.append(F.when(F.coalesce(rule.holds(value), F.lit(False)), alert))
    exploded = frame.select(*keep, F.explode(F.array(*alerts)).alias("_kf_alert"))
    return exploded.where(F.col("_kf_alert").isNotNull()).select(*keep, "_kf_alert.*")
