"""Watching a run: the live monitor, the report (summary, curves, timeline, heatmaps), the split
advice, where logs go and how they are gathered, heap traces and the run-time memory."""
