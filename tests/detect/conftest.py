"""tests/detect helpers: `ops_traces` (small per-operation traces) is imported by module name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
