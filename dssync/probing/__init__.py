"""Probing: measuring a job's own network (pairwise latency and bandwidth, rack blasts, NIC fans) over its process group, for topology inference to read."""
