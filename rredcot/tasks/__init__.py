"""Built-in tasks (domains), one module each; ``task.name`` picks one (``common.registry.TASKS``)."""
