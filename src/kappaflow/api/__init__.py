"""The kappaflow service: an HTTP API over the jobs, their status and their results."""
