"""The counting workload written as user jobs on the job API (``build(job)``), for the
job API benchmark (api.py). They are ordinary user code: the benchmark starts them as
``kappaflow jobs start NAME --app kappaflow_bench.jobs.MODULE:build -P topic=TOPIC``
would, and kappaflow ships them to Spark's executors like any job's module."""
