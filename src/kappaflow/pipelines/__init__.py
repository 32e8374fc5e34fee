"""Built-in pipelines that belong to no larger subsystem (``clean``)."""
