"""Where a shadow of a job writes (``kappaflow jobs shadow``): outputs no consumer of the
live job sees.

The shadow of job NAME is the job ``NAME.shadow``. Everything named after the job is its
own by that name: its output topics (``NAME.shadow.OUTPUT``), commit markers, dead
letters and late events, its serving-store keys (``kf:NAME.shadow:*``), its lake tables
(``<lake>/NAME.shadow/TABLE``) and its checkpoint. What a sink names outright is renamed
here: a topic ``T`` becomes ``T.shadow``, a lake table at a path or URI gets ``.shadow``
after it. A PostgreSQL table has no place of its own to go to: a job that writes one is
not shadowed (KF791).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kappaflow.errors import ShadowUnsupportedError

if TYPE_CHECKING:
    from kappaflow.streams.job import Job

#: The parameter a shadow's driver is started with: the live job's name. Its build sees
#: it (``job.param``) like any other parameter; kappaflow renames the outputs by it.
SHADOW_PARAM = "kf.shadow_of"
SUFFIX = ".shadow"


def shadow_name(live: str) -> str:
    """The job name of ``live``'s shadow."""
    return f"{live}{SUFFIX}"


def rename_outputs(job: Job) -> None:
    """Point the sinks of ``job`` (a shadow) that name a place outright at places of the
    shadow's own."""
    from kappaflow.streams.sinks import KafkaSink, ParquetSink, PostgresSink

    for output in job.outputs:
        sinks = []
        for sink in output.sinks:
            if isinstance(sink, KafkaSink) and sink.topic is not None:
                sink = replace(sink, topic=f"{sink.topic}{SUFFIX}")
            elif isinstance(sink, ParquetSink) and ("/" in sink.table or ":" in sink.table):
                sink = replace(sink, table=f"{sink.table.rstrip('/')}{SUFFIX}")
            elif isinstance(sink, PostgresSink):
                raise ShadowUnsupportedError(
                    f"output {output.name!r} writes the PostgreSQL table {sink.table!r}, "
                    "which a shadow would share with the live job: shadows are for jobs "
                    "writing topics, the serving store and the lake"
                )
            sinks.append(sink)
        output.sinks = tuple(sinks)
