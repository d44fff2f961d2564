import dataclasses

import msgpack
import numpy as np
import pytest

from rredcot.common.codec import decode, encode
from rredcot.common.records import RecordError, RolloutGroup, WeightedGroup
from tests.factories import rollout_group, weighted_group


def _assert_equal(a, b):
    assert type(a) is type(b)
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _assert_equal(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_equal(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("length", [0, 1, 25_000])
def test_rollout_group_round_trip(length):
    group = rollout_group(g=4, length=length)
    out = decode(encode(group), RolloutGroup)
    _assert_equal(group, out)


def test_weighted_group_round_trip_and_versions():
    wg = weighted_group()
    wg.samples[0].rollout.version_runs = np.array([[0, 3], [10, 4]], dtype=np.int32)
    out = decode(encode(wg), WeightedGroup)
    _assert_equal(wg, out)
    versions = out.samples[0].rollout.token_versions()
    assert versions[:10].tolist() == [3] * 10 and set(versions[10:].tolist()) == {4}


def test_mc_fields_round_trip_and_are_checked():
    """A sample's MC standard errors (one per exit value, NaN allowed) and the version that sampled
    them travel with it; standard errors that do not match the exit values are refused."""
    wg = weighted_group()
    wg.samples[0].exit_stderr = np.array([0.25, np.nan, 0.0], np.float32)
    wg.samples[0].values_version = 7
    out = decode(encode(wg), WeightedGroup)
    assert np.array_equal(out.samples[0].exit_stderr, wg.samples[0].exit_stderr, equal_nan=True)
    assert out.samples[0].values_version == 7 and out.samples[1].values_version == -1
    assert out.samples[1].exit_stderr.size == 0
    wg.samples[0].exit_stderr = np.zeros(2, np.float32)
    with pytest.raises(RecordError, match="exit_stderr"):
        encode(wg)


def test_arrays_are_raw_little_endian_bytes_and_zero_copy_views():
    group = rollout_group(length=1000)
    data = encode(group)
    raw = group.samples[0].completion_ids.astype("<i4").tobytes()
    assert raw in data  # the array travels as its raw little-endian bytes
    out = decode(data, RolloutGroup)
    assert not out.samples[0].completion_ids.flags.writeable  # a view over the message, not a copy


def test_big_endian_input_is_normalised():
    group = rollout_group(length=8)
    group.prompt_ids = group.prompt_ids.astype(">i4")
    with pytest.raises(RecordError, match="dtype int32"):
        encode(group)  # validation insists on native int32


def test_25k_record_size_is_about_raw_size():
    group = rollout_group(g=1, length=25_000)
    assert len(encode(group)) < 25_000 * 8 * 1.02 + 2000


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (
            lambda g: setattr(g.samples[0], "behaviour_logprobs", np.zeros(3, np.float32)),
            "behaviour_logprobs has length",
        ),
        (lambda g: setattr(g.samples[0], "completion_ids", np.zeros(32, np.int64)), "dtype int32"),
        (lambda g: setattr(g.samples[0], "finish_reason", "tired"), "finish_reason"),
        (lambda g: setattr(g.samples[0], "reward", float("nan")), "reward must be finite"),
        (lambda g: g.samples[0].behaviour_logprobs.__setitem__(5, np.nan), "token 5 has nan"),
        (lambda g: g.samples[0].behaviour_logprobs.__setitem__(0, -np.inf), "token 0 has -inf"),
        (lambda g: setattr(g.samples[0], "version_runs", np.array([[1, 0]], np.int32)), "version_runs"),
        (lambda g: setattr(g.samples[0], "group_id", "other"), "belongs to group"),
        (lambda g: setattr(g, "samples", []), "at least one sample"),
        (lambda g: g.ref_answer_ids.append(np.zeros(1, np.int32)), "reference solutions"),
        (
            lambda g: g.samples[0].completion_ids.__setitem__(3, -7),
            "completion_ids must hold token ids >= 0, got -7 at",
        ),
        (lambda g: setattr(g, "prompt_ids", np.array([5, -1], np.int32)), "prompt_ids must hold token ids >= 0"),
        (lambda g: g.ref_solution_ids.__setitem__(0, np.array([-2], np.int32)), r"ref_solution_ids\[0\] must hold"),
    ],
)
def test_invalid_records_are_rejected_with_reason(mutate, reason):
    group = rollout_group()
    mutate(group)
    with pytest.raises(RecordError, match=reason):
        encode(group)


def _envelope(body, kind="rollout_group", v=1):
    return msgpack.packb({"v": v, "kind": kind, "body": body})


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xc1garbage", "not a valid msgpack"),
        (msgpack.packb([1, 2]), "envelope"),
        (_envelope({}, v=99), "schema version 99"),
        (_envelope({}, kind="pizza"), "unknown record kind"),
        (_envelope({}, kind=[1]), "unknown record kind"),  # unhashable: a RecordError, not a TypeError
        (_envelope({}, kind={"a": 1}), "unknown record kind"),
        (_envelope({"group_id": "g"}), "missing required field"),
        (
            msgpack.packb(
                {
                    "v": 1,
                    "kind": "rollout_group",
                    "body": {
                        "group_id": "g",
                        "prompt_id": "p",
                        "prompt_ids": msgpack.ExtType(1, b"<i4|2|\x00"),
                        "ref_solution_ids": [],
                        "ref_answer_ids": [],
                        "samples": [],
                    },
                }
            ),
            "corrupt array",
        ),
    ],
)
def test_malformed_bytes_are_rejected_with_reason(data, reason):
    with pytest.raises(RecordError, match=reason):
        decode(data)


def test_decode_checks_expected_kind():
    with pytest.raises(RecordError, match="expected a weighted_group"):
        decode(encode(rollout_group()), WeightedGroup)
