"""Benchmarks: one sweep per handout problem, each turning configurations into records."""
