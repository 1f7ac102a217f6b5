"""Data with provenance: GPUs, instance types, weight formats, models."""
