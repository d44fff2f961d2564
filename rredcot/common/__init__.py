"""Shared pieces of rredcot: config, registries, records and codec, streams, run control, files.

Imports nothing above it: no domain folder (tasks, transports, models) and no stage (actors,
redistributor, learner, launch); the registries name their built-ins by module strings.
"""
