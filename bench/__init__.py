"""Benchmarks: measured side by side in one run, raw samples kept."""
