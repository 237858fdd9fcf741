"""Write scenario families that are not in the paper to scenarios/extra/ (issue 19).

    python scripts/make_extra_scenarios.py [OUT_DIR]

Same jobs as the paper's (paper Table 3 shapes, scripts/make_paper_scenarios.py), 4 h runs, faults
listed explicitly (seeded choices, written out so a reader sees every one):

- lemon: one device fails every 20 min from 10 min on and re-joins 5 min after each failure;
- node: a whole node (all 8 devices at the same instant) is lost at 30 min and re-joins after 1 h,
  then another node is lost for good at 2.5 h;
- burst: failures correlated in time: three stops within 40 s at 30 min, a fail-slow (speed 0.5)
  and two stops within a minute at 1.5 h, two stops at the same instant at 2.5 h; devices drawn
  from different nodes.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_paper_scenarios import MODELS, header  # noqa: E402

JOBS = ("llama2-7b", "llama2-13b", "qwen2.5-32b")
DURATION_S = 14400


def fault(kind: str, at_s: float, device: int, severity: float | None = None) -> str:
    extra = f"severity = {severity}\n" if severity is not None else ""
    return f'[[faults]]\nkind = "{kind}"\nat_s = {at_s}\ndevice = {device}\n{extra}'


def lemon(nodes: int, rng: random.Random) -> str:
    device = rng.randrange(nodes * 8)
    out = ""
    for t in range(600, DURATION_S, 1200):
        out += fault("stop", t, device) + fault("rejoin", t + 300, device)
    return out


def node(nodes: int, rng: random.Random) -> str:
    first, second = rng.sample(range(nodes), 2)
    out = "".join(fault("stop", 1800, d) for d in range(first * 8, first * 8 + 8))
    out += "".join(fault("rejoin", 5400, d) for d in range(first * 8, first * 8 + 8))
    return out + "".join(fault("stop", 9000, d) for d in range(second * 8, second * 8 + 8))


def burst(nodes: int, rng: random.Random) -> str:
    devices = []
    for k in range(8):  # eight distinct devices, spread over the nodes
        n = k % nodes
        devices.append(rng.choice([d for d in range(n * 8, n * 8 + 8) if d not in devices]))
    rng.shuffle(devices)
    times = [(1800, "stop"), (1820, "stop"), (1840, "stop"), (5400, "slow"), (5430, "stop"), (5460, "stop")]
    times += [(9000, "stop"), (9000, "stop")]
    return "".join(fault(kind, t, d, 0.5 if kind == "slow" else None) for (t, kind), d in zip(times, devices))


FAMILIES = {"lemon": lemon, "node": node, "burst": burst}


def scenarios() -> dict[str, str]:
    out = {}
    for family, make in FAMILIES.items():
        for model in JOBS:
            shape = MODELS[model]
            name = f"{model}-{family}"
            rng = random.Random(f"{family}:{model}")
            text = header(name, model, shape, f"duration_s = {DURATION_S}", "")
            out[f"{family}/{name}.toml"] = text + make(shape[0], rng)
    return out


def main(argv: list[str]) -> None:
    root = Path(argv[0] if argv else Path(__file__).resolve().parent.parent / "scenarios" / "extra")
    for rel, text in scenarios().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(scenarios())} scenarios under {root}")


if __name__ == "__main__":
    main(sys.argv[1:])
