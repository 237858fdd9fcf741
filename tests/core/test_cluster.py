"""`Cluster.gpu`: a preset name or a concrete Hardware, checked without importing resihp.cost."""

import subprocess
import sys
from types import SimpleNamespace

import pytest

from resihp.core.cluster import HARDWARE_FIELDS, Cluster


def test_cluster_takes_a_preset_name_or_a_hardware_object():
    """A name or any object with the Hardware fields is kept as it is; speeds stay per device."""
    assert Cluster(1, 2).gpu == "a100-80g" and Cluster(1, 2, "cpu").gpu_name == "cpu"
    hw = SimpleNamespace(**{**dict.fromkeys(HARDWARE_FIELDS, 1.0), "name": "cpu-calibrated"})
    c = Cluster(1, 2, hw).with_speed(1, 0.5)
    assert c.gpu is hw and c.gpu_name == "cpu-calibrated" and c.speed == (1.0, 0.5)


@pytest.mark.parametrize(
    "gpu, match",
    [("", "preset name or a Hardware"), (3.0, "missing name, peak_flops"), (object(), "missing name")],
)
def test_cluster_rejects_what_is_neither(gpu, match):
    with pytest.raises(ValueError, match=match):
        Cluster(1, 2, gpu)


def test_core_does_not_import_cost():
    """The Hardware check is duck-typed: importing core loads no resihp.cost module."""
    code = "import sys, resihp.core; assert not [m for m in sys.modules if m.startswith('resihp.cost')]"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
