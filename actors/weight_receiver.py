"""vLLM worker extension that applies published weights inside the worker process.

vLLM mixes this class into its worker (``LLM(worker_extension_cls=...)``); the engine adapter
reaches the methods through ``collective_rpc``. Only a path or raw safetensors bytes cross that
call (tensors cannot cross it in multiprocess mode, and no pickle is used). The tensors are
applied with the worker's ``reload_weights`` (on CPU ``model.load_weights`` fails: linear weights
are prepacked), then a tied ``lm_head`` is repacked from the fresh embedding, because the packed
copy vLLM-CPU keeps for it is not refreshed by the reload.
"""

from __future__ import annotations

from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import load_file as st_load_file


class WeightReceiver:
    """Methods added to vLLM's worker; ``self`` is the worker (``model_runner``, ``reload_weights``)."""

    model_runner: Any

    def rredcot_load_file(self, path: str) -> int:
        """Apply a safetensors file (HF parameter names); returns the number of tensors."""
        return self._rredcot_apply(st_load_file(path))

    def rredcot_load_bytes(self, data: bytes) -> int:
        """Apply safetensors bytes (HF parameter names); returns the number of tensors."""
        return self._rredcot_apply(st_load(bytes(data)))

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
