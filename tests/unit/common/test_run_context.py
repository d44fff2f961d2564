import pytest

from rredcot.common.config import ConfigError, load_config
from rredcot.common.run_context import RunContext


def test_a_stage_without_redis_url_is_told_what_to_set():
    with pytest.raises(ConfigError, match=r"redis.url is not set: a generator needs the run's Redis server"):
        RunContext.connect(load_config("tests"), "a generator")


def test_the_context_reaches_the_runs_state(redis_server, run_id):
    run = RunContext.connect(load_config("tests", [f"redis.url={redis_server.url}", f"run.name={run_id}"]), "x")
    assert run.run_id == run_id and run.client.ping()
    run.control.request_stop("test")
    assert run.control.stop_requested() and run.ledger.run_id == run_id
    assert run.lineage.key == f"rredcot:{run_id}:version_lineage"
