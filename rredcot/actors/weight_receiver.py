"""vLLM worker extension that applies published weights inside the worker process.

vLLM mixes this class into its worker (``LLM(worker_extension_cls=...)``); the engine adapter
reaches the methods through ``collective_rpc``. Only raw safetensors bytes or plain
lists and dicts cross that call (tensors cannot cross it in multiprocess mode, and no pickle is
used); on the collective transport the worker joins the learner's weight group itself and receives
the buckets into its own memory (``transports.group``), on the ipc transport it copies the
learner's shared slot into its own memory (``transports.slots``); either is applied when the
engine says so. The tensors are
applied with the worker's ``reload_weights`` (on CPU ``model.load_weights`` fails: linear weights
are prepacked), then a tied ``lm_head`` is repacked from the fresh embedding, because the packed
copy vLLM-CPU keeps for it is not refreshed by the reload.
"""

from __future__ import annotations

from typing import Any

import torch
from safetensors.torch import load as st_load

from rredcot.transports.group import GroupInfo, device_for, open_group, receive_tensors, unflatten
from rredcot.transports.slots import copy_slot


class WeightReceiver:
    """Methods added to vLLM's worker; ``self`` is the worker (``model_runner``, ``reload_weights``)."""

    model_runner: Any

    def rredcot_load_bytes(self, data: bytes) -> int:
        """Apply safetensors bytes (HF parameter names); returns the number of tensors."""
        return self._rredcot_apply(st_load(bytes(data)))

    def rredcot_join_group(self, info: dict[str, Any], rank: int, timeout_s: float) -> None:
        """Join the learner's weight group as ``rank`` plus this worker's rank in its engine (a
        tensor-parallel engine's workers each receive every bucket and load their own shard; blocks
        until every member joined)."""
        group_info = GroupInfo(**info)
        self._rredcot_group = open_group(group_info, rank + self.rank, timeout_s)  # type: ignore[attr-defined]
        self._rredcot_device = device_for(group_info.backend)

    def rredcot_leave_group(self) -> None:
        self._rredcot_group = None
        self._rredcot_received = None

    def rredcot_receive(self, names: list[str], shapes: list[list[int]], dtypes: list[str], buckets: list[int]) -> int:
        """Receive the next broadcast version into memory (not applied yet); returns its number."""
        version, self._rredcot_received = receive_tensors(
            self._rredcot_group, names, shapes, dtypes, buckets, self._rredcot_device
        )
        return version

    def rredcot_copy_slot(
        self, handle: dict[str, Any], names: list[str], shapes: list[list[int]], dtypes: list[str]
    ) -> None:
        """Copy the learner's shared slot into this worker's memory (not applied yet)."""
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        own = copy_slot(handle, device)
        self._rredcot_received = dict(zip(names, unflatten(own, shapes, dtypes), strict=True))

    def rredcot_drop_received(self) -> None:
        """Forget what was received (a slot overwritten while it was copied)."""
        self._rredcot_received = None

    def rredcot_apply_received(self) -> int:
        """Apply what ``rredcot_receive`` got; returns the number of tensors."""
        tensors, self._rredcot_received = self._rredcot_received, None
        return self._rredcot_apply(tensors)

    def _rredcot_apply(self, tensors: dict[str, torch.Tensor]) -> int:
        self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        repack_tied_lm_head(self.model_runner.get_model())
        return len(tensors)


def repack_tied_lm_head(model: torch.nn.Module) -> bool:
    """Re-run the CPU prepacking of a tied ``lm_head`` after its embedding changed; True if done."""
    config = getattr(model, "config", None)
    lm_head = getattr(model, "lm_head", None)
    method = getattr(lm_head, "quant_method", None)
    if not getattr(config, "tie_word_embeddings", False) or method is None:
        return False
    method.process_weights_after_loading(lm_head)
    return True
