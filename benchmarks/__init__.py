"""Benchmarks for torchops: one ``bench_<op>.py`` per op plus the shared ``harness``."""
