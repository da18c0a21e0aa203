"""Benchmarks and quality evaluation: speed next to the AR baseline on the same model, seeds and prompts."""
