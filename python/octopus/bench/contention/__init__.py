"""``octopus-bench contention``: latency-critical (LC) jobs sharing one GPU with best-effort
(BE) work, every way of running them side by side, on workloads of three families unlike each
other (``workloads.py``): several LC jobs, each arriving on a fixed open-loop schedule and
timed from its scheduled arrival to its completion (a backlog counts), beside several BE
jobs looping in threads of their own.

Per workload, one run of: the LC jobs alone; the BE jobs alone; plain streams; priority
streams; a sweep of fixed lease configurations (partitions, slice lengths, in-flight bounds,
throttling: the best of them is the oracle a user would find by hand); and octopus's latency
controller with no settings, at targets of 1.5x and 3x each LC job's alone p99
(``modes.py``). Reported (``report.py``): each LC job's p50 and p99 over its alone p50 and
p99 and its share of jobs within the target, every BE job's throughput over its alone
throughput and their minimum, the SM clock and power, and whether the target holds: at
least 99% of every LC job's jobs within it, its p50 within 2x its alone p50, every BE job at
80% of its alone throughput or more. Also the cost of acquire + release and of a checkpoint
from Python, and the Batcher's per request. Without a GPU only those costs are measured, on
the simulated backend. ``--judge FILE ...`` runs nothing and judges the runs of earlier raw
results against one reference per family, the median of all their alone rows (``pooled.py``).
"""

from .cli import main

__all__ = ["main"]
