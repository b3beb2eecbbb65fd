"""Benchmarks, measured side by side in one run with raw samples kept, and the simulator that extends them to cluster scale."""
