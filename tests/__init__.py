"""The test processes wait for OpenMP work passively, as a run's workers do (``launch.stages.stage_env``):
the suite's two workers and the whole runs beside them share 2 cores, and a torch thread that spins at a
barrier while its team-mate is descheduled burns the core the others need (``bench/omp_wait.py``). Set
here, as the package loads before its conftest imports torch: OpenMP reads it once, when torch loads."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
