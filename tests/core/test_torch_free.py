"""Planning and simulation packages import on a machine without torch."""

import subprocess
import sys

CODE = """
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
import resihp.core, resihp.cost, resihp.evaluator.pipeline, resihp.evaluator.predict
import resihp.sched, resihp.detect
import resihp.cli.main
import resihp.core.faults, resihp.core.files, resihp.core.scenario
import resihp.cli.report_cmd, resihp.cli.report_plot
# the checks `resihp train` runs before torch loads
import resihp.runtime.state.dirlock, resihp.runtime.faults, resihp.runtime.config
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
print("ok")
"""


def test_core_cost_sim_sched_detect_import_without_torch():
    """Importing core, cost, sim, sched, detect, the CLI and the runtime's input checks never
    imports torch."""
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
