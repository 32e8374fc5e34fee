"""A pipeline as a user writes one against Spark, with JobContext alone: the pages of the
events on ``source`` to ``dest``, in upper case; events without a page to the job's own
dead-letter topic, ``NAME.dlq``. Started by tests/test_user_pipelines.py."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from kappaflow.jobs.pipeline import JobContext, Pipeline


def start(ctx: JobContext) -> list[StreamingQuery]:
    source, dest, dlq = ctx.param("source"), ctx.param("dest"), f"{ctx.name}.dlq"
    ctx.partitions(source)  # refused before anything is created if it does not exist
    ctx.create_topic(dest, partitions=1)
    ctx.create_topic(dlq, partitions=1, owned=True)
    page = F.get_json_object(F.col("value").cast("string"), "$.page")
    routed = ctx.kafka_stream(source).select(
        F.when(page.isNull(), F.lit(dlq)).otherwise(F.lit(dest)).alias("topic"),
        F.coalesce(F.upper(page), F.col("value").cast("string")).alias("value"),
    )
    query = (
        ctx.kafka_sink(routed)
        .queryName(ctx.name)
        .option("checkpointLocation", str(ctx.checkpoint_dir / "pages"))
        .start()
    )
    return [query]


PIPELINE = Pipeline(start=start)
