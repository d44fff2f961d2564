"""Redistributor workers: segmentation, exit-point values and per-token credit σ."""
