"""Benchmarks (`phpmq bench`): figures and ratios measured in one run, never test asserts."""
