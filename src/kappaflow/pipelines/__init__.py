"""What the jobs compute. Each pipeline is registered by name for ``kappaflow jobs start``."""

from kappaflow.pipelines.base import Pipeline, get_pipeline, pipeline_names

__all__ = ["Pipeline", "get_pipeline", "pipeline_names"]
