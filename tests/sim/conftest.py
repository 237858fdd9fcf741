"""tests/sim helpers: `oracle` (the chunk-by-chunk evaluation) is imported by module name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
