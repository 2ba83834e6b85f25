"""Benchmarks of octopus's ops against what a PyTorch user writes today
(``python -m octopus.bench``)."""
