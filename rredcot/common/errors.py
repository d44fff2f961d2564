"""The one error type the command line shows as a single line: a mistake in what the user gave."""

from __future__ import annotations

from typing import ClassVar


class UserError(ValueError):
    """A mistake in the user's input (config, data, paths, services); the message names the key,
    file or row, and the fix. ``rredcot`` prints it as one line and exits 2 (traceback with ``--debug``)."""

    label: ClassVar[str] = "error"  # how the command line introduces it: ``rredcot: <label>: <message>``
