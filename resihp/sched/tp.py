"""TP-level adaptation: the paper's selective device exclusion (eq. 3, eq. 4) and our uneven TP.

Paper (§4.1): candidate degrees K = {k power of two | k_min <= k <= |G'|}; S_k = the k fastest
survivors; S* = argmax_k k·min_{S_k} p (ties: larger k by default); the rest become node-local
standbys. Ours: any k >= k_min, heads and FFN columns split in proportion to speed, scored by the
resulting group speed (model.group_speed), so one half-speed device is not allowed to drag the
whole group down to half speed.
"""

from __future__ import annotations

from resihp.core.plan import Stage, build_stage


def _ranked(devices, speeds) -> list[int]:
    """Devices fastest first; ties by id, so the choice is deterministic."""
    return sorted(devices, key=lambda d: (-speeds[d], d))


def candidate_degrees(k_min: int, survivors: int, power_of_two: bool = True) -> list[int]:
    """Eq. 3: admissible TP degrees, smallest first."""
    k_min = max(1, k_min)
    if not power_of_two:
        return list(range(k_min, survivors + 1))
    out, k = [], 1
    while k <= survivors:
        if k >= k_min:
            out.append(k)
        k *= 2
    return out


def select_tp_subgroup(
    devices, speeds, k_min: int = 1, power_of_two: bool = True, prefer_larger: bool = True
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Eq. 4: (kept, standby). `devices` are the live members; `speeds` maps device -> p.

    kept = the top-k devices by speed maximising k·min p over the eq. 3 degrees; ties go to the
    larger k unless `prefer_larger` is False. Returns ((), devices) when no degree is admissible.
    """
    ranked = _ranked(devices, speeds)
    best, best_score = 0, -1.0
    for k in candidate_degrees(k_min, len(ranked), power_of_two):
        score = k * min(speeds[d] for d in ranked[:k])
        better = score > best_score + 1e-12
        tie = abs(score - best_score) <= 1e-12
        if better or (tie and prefer_larger):
            best, best_score = k, score
    kept = tuple(sorted(ranked[:best]))
    return kept, tuple(sorted(ranked[best:]))


def uneven_stage(
    model, devices, layers, speeds, k_min: int = 1, max_k: int | None = None, group_speed=None
) -> tuple[Stage, tuple]:
    """Ours: the best speed-proportional TP group over the top-k of `devices`, any k >= k_min.

    Returns (stage, standby). The group speed counts the rounding of heads and FFN columns, so a
    device too slow to earn one head of work is left out. An empty result is a hollow stage.
    """
    from .model import group_speed as _gs

    score_fn = group_speed or _gs
    ranked = _ranked(devices, speeds)
    best, best_score = None, 0.0
    top = min(len(ranked), model.heads, max_k or len(ranked))
    for k in range(max(1, k_min), top + 1):
        sub = ranked[:k]
        st = build_stage(model, sorted(sub), layers, [speeds[d] for d in sorted(sub)])
        score = score_fn(model, st, speeds)
        if score > best_score * (1 + 1e-9):
            best, best_score = st, score
    if best is None:
        return Stage((), tuple(layers)), tuple(sorted(devices))
    return best, tuple(sorted(set(devices) - set(best.devices)))
