"""Tests of kappaflow's benchmarks (a package, so that its conftest is not mistaken for
the product's ``conftest`` module)."""
