"""Queue benchmark: 25k-token rollout records through the stream layer vs raw redis-py, and the codec.

Both paths move the same encoded payloads through a real embedded server in the same run, in
rounds of ``--batch`` records: put each record, read the batch through a consumer group, ack and
delete it. The raw path uses plain XADD / XREADGROUP / XACK / XDEL; the layer adds the bounded
put (Lua), reclaim check and transactional ack+delete. Last line: one JSON object.

    python bench/queue.py [--records 400] [--tokens 25000] [--batch 16]

This file is named like the standard library's ``queue``, which redis-py imports; the code lives
in ``bench/stream_queue.py`` and this entry point stands in for the stdlib module when imported.
"""

import os
import sys

if __name__ == "queue":
    # Running any ``python bench/<x>.py`` puts bench/ first on sys.path, so a plain ``import queue``
    # (redis-py does one) lands here. Hand the importer the standard-library module instead: the
    # import system returns whatever sys.modules holds under the name once this file has run.
    import importlib.util
    import sysconfig

    _spec = importlib.util.spec_from_file_location("queue", os.path.join(sysconfig.get_paths()["stdlib"], "queue.py"))
    sys.modules["queue"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["queue"])
elif __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from stream_queue import main

    main()
