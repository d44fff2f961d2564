"""Launch: the CLI, local services, the Ray driver and cluster scripts."""
