import sys
from pathlib import Path

import pytest
import torch

# The repository root on the path: a test's function given to a `spawn` child (which inherits
# sys.path) is found there as `tests.runtime.<module>` (pytest's importlib mode adds no path itself).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def check_state():
    """Compare a run's final parameters (`run_training(..., return_state=True)["state"]`, per
    replica) with the reference's, at an lr-scaled tolerance: AdamW's first steps move each entry
    by about lr·sign(g), and a sign flip of a tiny gradient after another reduction order moves it
    by up to 2·lr."""

    def check(res: dict, ref_state: dict, lr: float) -> None:
        assert res["state"], "no final state returned"
        for d, state in res["state"].items():
            for name, value in state.items():
                torch.testing.assert_close(
                    value, ref_state[name], atol=2.5 * lr, rtol=0, msg=f"replica {d} {name}"
                )

    return check
