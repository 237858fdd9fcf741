import subprocess
import sys


def test_detect_and_calibration_import_without_torch():
    """resihp.detect and resihp.cost.calibration import in a fresh interpreter without loading torch."""
    code = (
        "import sys, resihp.detect, resihp.detect.synth, resihp.cost.calibration; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
