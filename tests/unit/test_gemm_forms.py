"""The roofline benchmark's gemm_forms mode, its `--linear` forms: every form of a `Linear`'s forward and input
gradient computes the same product (the rates it reports compare like with like), at an odd row count so that the
halves are unequal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from suite.roofline import gemm_forms  # noqa: E402


@pytest.mark.parametrize("tokens", [7, 1])
def test_linear_forms_are_one_product(tokens):
    torch.manual_seed(0)
    fs = gemm_forms.linear_forms(tokens, 6, 10)
    assert set(fs) == {"linear", "linear_t", "linear_halves", "grad", "grad_t", "grad_halves"}
    forward, grad = fs["linear"](), fs["grad"]()
    assert forward.shape == (tokens, 6) and grad.shape == (tokens, 10)
    for form, fn in fs.items():
        out = fn()
        ref = grad if form.startswith("grad") else forward
        assert out.shape == ref.shape and out.is_contiguous(), form
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2, msg=form)
