"""msgpack codec for records: dataclasses as maps, numpy arrays as raw little-endian bytes.

No pickle: an array travels as a msgpack extension whose payload is a short text header
(``<dtype>|<shape>|``) followed by the array's bytes; decoding wraps those bytes with
``np.frombuffer`` (no further copy; the arrays are read-only views). Every message is an envelope
``{"v": schema version, "kind": record kind, "body": ...}`` and is validated on decode.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, TypeVar

import msgpack
import numpy as np

from rredcot.common.records import (
    SCHEMA_VERSION,
    RecordError,
    RolloutGroup,
    RolloutRecord,
    WeightedGroup,
    WeightedSample,
)

_ARRAY_EXT = 1
KINDS: dict[str, type] = {
    "rollout_group": RolloutGroup,
    "weighted_group": WeightedGroup,
    "rollout": RolloutRecord,
    "weighted_sample": WeightedSample,
}
_KIND_OF = {cls: kind for kind, cls in KINDS.items()}
T = TypeVar("T")


def encode(record: Any) -> bytes:
    """Serialise a record dataclass (validated first) to msgpack bytes."""
    kind = _KIND_OF.get(type(record))
    if kind is None:
        raise RecordError(f"cannot encode {type(record).__name__}; known kinds: {sorted(KINDS)}")
    record.validate()
    return msgpack.packb({"v": SCHEMA_VERSION, "kind": kind, "body": _plain(record)}, default=_ext)


def decode(data: bytes | memoryview, expect: type[T] | None = None) -> T:
    """Parse and validate msgpack bytes; raises ``RecordError`` with the reason on any defect."""
    try:
        msg = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except RecordError:
        raise
    except Exception as e:  # msgpack raises several unrelated types for corrupt input
        raise RecordError(f"not a valid msgpack message: {type(e).__name__}: {e}") from None
    if not isinstance(msg, dict) or not {"v", "kind", "body"} <= msg.keys():
        raise RecordError("message is not a record envelope (needs keys v, kind, body)")
    if type(msg["v"]) is not int or msg["v"] != SCHEMA_VERSION:  # an array, or True, would pass ``!=``
        raise RecordError(f"schema version {msg['v']!r} is not supported (this build reads {SCHEMA_VERSION})")
    cls = KINDS.get(msg["kind"]) if isinstance(msg["kind"], str) else None
    if cls is None:
        raise RecordError(f"unknown record kind {msg['kind']!r}; known: {sorted(KINDS)}")
    if expect is not None and cls is not expect:
        raise RecordError(f"expected a {_KIND_OF[expect]} record, got {msg['kind']!r}")
    record = _build(cls, msg["body"], msg["kind"])
    record.validate()
    return record


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [_plain(x) for x in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _ext(obj: Any) -> msgpack.ExtType:
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj, dtype=obj.dtype.newbyteorder("<"))
        header = f"{a.dtype.str}|{','.join(map(str, a.shape))}|".encode()
        return msgpack.ExtType(_ARRAY_EXT, header + a.tobytes())
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code != _ARRAY_EXT:
        raise RecordError(f"unknown msgpack extension type {code}")
    try:
        dtype_str, shape_str, _ = data.split(b"|", 2)
        dtype = np.dtype(dtype_str.decode())
        shape = tuple(int(s) for s in shape_str.decode().split(",") if s)
        offset = len(dtype_str) + len(shape_str) + 2
        arr = np.frombuffer(data, dtype=dtype, offset=offset)
        return arr.reshape(shape).astype(dtype.newbyteorder("="), copy=False)
    except Exception as e:
        raise RecordError(f"corrupt array payload: {e}") from None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise RecordError(f"{where} must be a map, got {type(value).__name__}")
        hints = _hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _build(hints[f.name], value[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError(f"{where} is missing required field {f.name!r}")
        return tp(**kwargs)
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where} must be a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [_build(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where} must be a map, got {type(value).__name__}")
        return value
    if tp is np.ndarray:
        if not isinstance(value, np.ndarray):
            raise RecordError(f"{where} must be an array, got {type(value).__name__}")
        return value
    if tp is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise RecordError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp in (int, str) and not (isinstance(value, tp) and not isinstance(value, bool)):
        raise RecordError(f"{where} must be {tp.__name__}, got {value!r}")
    return value
