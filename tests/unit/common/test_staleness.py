from rredcot.common.staleness import Admission


def _drain(adm: Admission) -> list[int]:
    got = []
    while (i := adm.try_admit()) is not None:
        got.append(i)
    return got


def test_eta_bounds_admission_per_learner_step(redis_client, run_id):
    adm = Admission(redis_client, run_id, prompts_per_step=3, eta=1)
    assert _drain(adm) == list(range(6))  # (0 + 1 + 1) * 3
    adm.publish_version(1)
    assert _drain(adm) == [6, 7, 8]
    assert not adm.exhausted


def test_eta_zero_is_one_step_at_a_time_shared_by_generators(redis_client, run_id):
    a = Admission(redis_client, run_id, 2, 0)
    b = Admission(redis_client, run_id, 2, 0)
    assert [a.try_admit(), b.try_admit(), a.try_admit(), b.try_admit()] == [0, 1, None, None]
    a.publish_version(1)
    assert _drain(b) == [2, 3]


def test_rejected_prompt_frees_its_slot_but_keeps_its_position(redis_client, run_id):
    adm = Admission(redis_client, run_id, 2, 0, budget=4)
    assert _drain(adm) == [0, 1]
    adm.reject()  # prompt 1 was unusable
    assert _drain(adm) == [2]  # a replacement, at the next dataset position
    adm.publish_version(1)
    assert _drain(adm) == [3, 4]
    assert adm.exhausted and adm.admitted() == 5 and adm.rejected() == 1  # 4 usable prompts


def test_budget_ends_admission(redis_client, run_id):
    adm = Admission(redis_client, run_id, 4, 10, budget=3)
    assert _drain(adm) == [0, 1, 2] and adm.exhausted


def test_rebase_restores_counters(redis_client, run_id):
    adm = Admission(redis_client, run_id, 2, 0)
    adm.rebase(admitted=10, version=5)
    assert adm.admitted() == 10 and adm.learner_version() == 5
    assert _drain(adm) == [10, 11]
