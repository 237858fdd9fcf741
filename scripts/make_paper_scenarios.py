"""Write the paper's evaluation scenarios (ResiHP §8, paper.md §6–§7) to scenarios/paper/.

    python scripts/make_paper_scenarios.py [OUT_DIR]

Families: table6 (6 models x fail-stop every 2 h / 1 h / 30 min), fig9 (6 models x fail-slow
W / M / S), fig10 (6 models x mixed at 2 h / 1 h / 30 min), fig11 (the three ablation cells) and
fig14 (LLaMA 2-70B on 256 GPUs, ~10,000 iterations, recurring mixed failures with re-joins).
Run lengths follow the stress preset: the 30-min schedule kills half of the N GPUs, so a run
lasts N/2 x 30 min (4 h for 16 GPUs, 8 h for 32, 16 h for 64), the paper's "4–16 h".
"""

from __future__ import annotations

import sys
from pathlib import Path

# model preset -> (nodes, tp, dp, pp, seq_len, microbatches per replica)  (paper Table 3)
MODELS = {
    "llama2-7b": (2, 4, 2, 2, 8192, 8),
    "llama2-13b": (4, 4, 2, 4, 16384, 8),
    "llama2-30b": (8, 4, 2, 8, 8192, 16),
    "qwen2.5-7b": (2, 4, 2, 2, 8192, 8),
    "qwen2.5-14b": (4, 4, 2, 4, 16384, 8),
    "qwen2.5-32b": (8, 4, 2, 8, 8192, 16),
}
FREQS = {"2h": 7200, "1h": 3600, "30m": 1800}
ABLATION = (("llama2-7b", "2h"), ("llama2-13b", "1h"), ("llama2-30b", "30m"))


def header(name: str, model: str, shape, run: str, faults: str) -> str:
    nodes, tp, dp, pp, seq, m = shape
    return (
        f'name = "{name}"\n{faults}[model]\npreset = "{model}"\n'
        f"[cluster]\nnodes = {nodes}\ngpus_per_node = 8\n"
        f'gpu = "a100-80g"\n[parallel]\ntp = {tp}\ndp = {dp}\npp = {pp}\nschedule = "1f1b"\n'
        f'microbatches = {m}\nseq_len = {seq}\n[workload]\nlengths = "github"\nseed = 0\n[run]\n{run}\n'
    )


def scenarios() -> dict[str, str]:
    out = {}
    for model, shape in MODELS.items():
        gpus = shape[0] * 8
        duration = gpus // 2 * 1800
        for tag, interval in FREQS.items():
            name = f"{model}-stop-{tag}"
            faults = f'faults = {{ generator = "stop-every", interval_s = {interval} }}\n'
            out[f"table6/{name}.toml"] = header(name, model, shape, f"duration_s = {duration}", faults)
            name = f"{model}-mixed-{tag}"
            faults = f'faults = {{ generator = "mixed", interval_s = {interval} }}\n'
            text = header(name, model, shape, f"duration_s = {duration}", faults)
            out[f"fig10/{name}.toml"] = text
            if (model, tag) in ABLATION:
                out[f"fig11/{name}.toml"] = text
        for level in ("W", "M", "S"):
            name = f"{model}-slow-{level}"
            faults = f'faults = {{ generator = "fail-slow", level = "{level}" }}\n'
            out[f"fig9/{name}.toml"] = header(name, model, shape, "duration_s = 7200", faults)
    name = "llama2-70b-large"
    faults = 'faults = { generator = "mixed", interval_s = 14400, rejoin_after_s = 7200 }\n'
    shape = (32, 4, 4, 16, 8192, 32)
    out[f"fig14/{name}.toml"] = header(name, "llama2-70b", shape, "iterations = 10000", faults)
    return out


def main(argv: list[str]) -> None:
    root = Path(argv[0] if argv else Path(__file__).resolve().parent.parent / "scenarios" / "paper")
    for rel, text in scenarios().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(scenarios())} scenarios under {root}")


if __name__ == "__main__":
    main(sys.argv[1:])
