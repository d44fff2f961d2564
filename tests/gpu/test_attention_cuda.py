"""Varlen attention on CUDA, where sdpa takes its flash kernel: a packed row equals the sdpa model
with its block-diagonal mask, forward and backward (``tests/unit/learner/test_attention.py`` on CPU)."""

from __future__ import annotations

import pytest
import torch

from tests.unit.learner.test_attention import check_packed_row_matches_sdpa

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_packed_row_matches_sdpa_block_mask_on_cuda():
    check_packed_row_matches_sdpa("cuda")
