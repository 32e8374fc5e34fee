"""Nexmark: the online-auction model's generator, its queries on kappaflow's job API and
on Flink SQL, and the run that compares them (``kappaflow-bench nexmark``)."""
