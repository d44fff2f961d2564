"""rredcot: asynchronous actor-learner RL for reasoning LLMs with RREDCoT reward redistribution.

Each subpackage is one room of docs/architecture.md: ``common`` (shared types and the stream
protocol), ``tasks`` and ``transports`` (extension points), ``models`` (built-in tiny models), the
three stages ``actors``, ``redistributor`` and ``learner``, then ``launch`` (the CLI and the run's
driver) and ``configs`` (the bundled YAML). The folder list is this folder: tests and checks read it
from here."""

from pathlib import Path

SUBPACKAGES = tuple(sorted(p.parent.name for p in Path(__file__).parent.glob("*/__init__.py")))
