"""Shared pieces of rredcot: config, records and codec, streams, data, verifier, models.

Imports nothing from the stages (actors, redistributor, learner, launch).
"""
