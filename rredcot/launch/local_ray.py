"""The run's Ray: a cluster's (``cluster.address``), or a local one that listens on 127.0.0.1 only."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os

from rredcot.common.config import Config
from rredcot.launch.observe.logs import route_library_loggers, route_ray_errors_to_log
from rredcot.launch.plan import local_cores, local_ray_cpus
from rredcot.launch.stages import WAIT_POLICY, wait_policy


def local_ray_env(cfg: Config) -> None:
    """Before ``import ray``: a local Ray (no ``cluster.address``) listens on 127.0.0.1 only."""
    if not cfg.cluster.address:
        # Ray reads this when it is imported: with clusters "disabled" every Ray server of a local
        # instance (GCS, raylet, agents, workers) binds 127.0.0.1 instead of the node's network IP.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        # If the local GCS dies first (a signal sent to the whole process group), give up on it in
        # seconds rather than Ray's default minute, so that a stop still ends within 30 s.
        os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "5")
        # Ray prestarts an idle worker a CPU for the first driver. While every actor of the run carried
        # a runtime_env, which such a worker cannot take, they only took CPU from the actors' start (a
        # 3-step `rredcot train tests`: start-up phase 6.5 → 3.4-4.5 s); without one they buy nothing
        # (a 2-step run: 22.0-23.0 s with them, 21.8-24.1 s without; docs/benchmarks.md)
        os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
        # the workers' OpenMP wait policy (launch.stages.wait_policy) in the environment the local Ray's
        # processes start with, before any library of theirs can load OpenMP (launch.stages.process_options)
        os.environ.setdefault(WAIT_POLICY, wait_policy())
    # Ray starts its workers at niceness 15; here the workers are the run, so anything else at the
    # default priority would starve them (docs/benchmarks.md: the learner 33 -> 131-197 s a step
    # beside a bench and tests at niceness 5-10). The run's workers share the driver's priority.
    os.environ.setdefault("RAY_worker_niceness", "0")


def init_ray(cfg: Config, stack: contextlib.ExitStack) -> str | None:
    """Connect to ``cluster.address``, or start a local Ray that listens on 127.0.0.1 only; returns the
    session directory of a local Ray it started (None for a cluster's, or a Ray this process had)."""
    local_ray_env(cfg)
    import ray

    if ray.is_initialized():
        return None
    route_library_loggers("ray")
    route_ray_errors_to_log()
    stack.callback(ray.shutdown)  # before init: a Ctrl-C during it still stops what it started
    if cfg.cluster.address:
        ray.init(address=cfg.cluster.address, log_to_driver=False)
        return None
    num_cpus = local_ray_cpus(cfg, local_cores())  # fails first if the plan cannot fit this machine
    if not ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback:
        raise RuntimeError(
            "a local Ray would listen on this machine's network address because ray was imported "
            "before rredcot could set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: set it in the environment, "
            "or set cluster.address to a Ray cluster you started"
        )
    ray.init(
        address="local",  # a Ray of its own even when another instance runs here (the doctor warns)
        num_cpus=num_cpus,
        include_dashboard=cfg.cluster.dashboard,
        dashboard_host=cfg.cluster.dashboard_host,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    return ray._private.worker._global_node.get_session_dir_path()
