"""Every number of ResiHP's Table 6 and Figs. 9–11 that we compare with (paper.md §7).

A value is a float, `None` for an abort ("–"), or a `(lo, hi)` range where the figure labels only
bound the bars (paper.md §7.2 caveat).
"""

from __future__ import annotations

MODELS = ("llama2-7b", "llama2-13b", "llama2-30b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b")
FREQS = ("2h", "1h", "30m")

# Table 6: samples/s. model -> (fault-free, Oobleck 2h/1h/30m, ReCycle 2h/1h/30m, ResiHP 2h/1h/30m)
TABLE6 = {
    "llama2-7b": (8.22, (6.04, 4.59, None), (4.16, 3.94, None), (7.55, 6.48, 5.46)),
    "llama2-13b": (8.05, (6.47, 4.79, None), (4.91, 4.66, None), (7.95, 7.23, 5.95)),
    "llama2-30b": (5.05, (4.48, 3.31, None), (3.48, 3.36, None), (4.80, 4.38, 3.53)),
    "qwen2.5-7b": (7.07, (5.37, 4.37, None), (4.37, 4.23, None), (6.57, 5.95, 5.62)),
    "qwen2.5-14b": (5.89, (4.74, 3.65, None), (3.73, 3.58, None), (5.59, 5.06, 4.45)),
    "qwen2.5-32b": (5.59, (4.47, 3.42, None), (3.58, 3.47, None), (4.80, 4.23, 3.86)),
}

# Fig. 9: throughput / unmitigated. model -> level -> {policy: value or (lo, hi)}
_R = (1.30, 1.30), (1.30, 1.33), (1.13, 1.20), (1.06, 1.09), (1.19, 1.26), (1.13, 1.26)
_W = (1.81, 1.66, 1.52, 1.32, 1.48, 1.51)
_M = {
    "llama2-7b": (1.40, 2.01, 2.47),
    "llama2-13b": (1.37, 1.80, 2.40),
    "llama2-30b": ((1.31, 1.45), (1.31, 1.45), 2.02),
    "qwen2.5-7b": (1.21, 1.44, 1.76),
    "qwen2.5-14b": (1.20, 1.41, 1.83),
    "qwen2.5-32b": ((1.22, 1.26), (1.22, 1.26), 1.74),
}
_S = {
    "llama2-7b": (1.45, 2.66, 3.31),
    "llama2-13b": (1.39, 2.23, 3.20),
    "llama2-30b": (1.36, 1.72, 2.51),
    "qwen2.5-7b": (1.32, 1.70, 2.13),
    "qwen2.5-14b": (1.29, 1.74, 2.23),
    "qwen2.5-32b": (1.20, 1.42, 1.99),
}
FIG9 = {
    m: {
        "W": {"adaptra": _R[k], "greyhound": _R[k], "resihp-paper": _W[k]},
        "M": dict(zip(("adaptra", "greyhound", "resihp-paper"), _M[m])),
        "S": dict(zip(("adaptra", "greyhound", "resihp-paper"), _S[m])),
    }
    for k, m in enumerate(MODELS)
}

# Fig. 10: throughput / ReCycle. Only the values that can be assigned to bars (paper.md §7.3):
# ResiHP where Fig. 11's stacks confirm it; S-ReCycle "near 1x" (0.97–1.04) in every cell.
FIG10 = {m: {f: {"recycle+greyhound": (0.97, 1.04)} for f in FREQS} for m in MODELS}
FIG10["llama2-7b"]["2h"]["resihp-paper"] = 2.21
FIG10["llama2-13b"]["1h"]["resihp-paper"] = 3.20
FIG10["llama2-30b"]["30m"]["resihp-paper"] = 1.88

# Fig. 11: stacked gains over ReCycle (cumulative: DE, DE+LR, DE+LR+WM).
FIG11 = {
    ("llama2-7b", "2h"): (1.01, 0.18, 1.03),
    ("llama2-13b", "1h"): (1.82, 0.22, 1.16),
    ("llama2-30b", "30m"): (1.47, 0.17, 0.24),
}
