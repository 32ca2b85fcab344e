"""Benchmarks of the checkout: run from the repository root as `python -m benchmarks.<name>`."""
