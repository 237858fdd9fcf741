import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/hf_models.py, by module name


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _perturbed(state: dict, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        if t.ndim == 1:
            t = t + 0.1 * torch.randn(t.shape, generator=g)
        out[name] = t
    return out


@pytest.fixture
def perturbed():
    """`state` with norm weights and biases moved off their 1 / 0 init, so parity checks see them."""
    return _perturbed
