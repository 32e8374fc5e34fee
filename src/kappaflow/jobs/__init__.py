"""Running jobs: the contract a job's driver fulfils (parts of a pipeline), each job as a
supervised driver process of its own managed by name, its plan, status, savepoints,
restores and removal."""
