"""Iteration-time predictor (ITP): the pipeline simulator on the current Program with fitted MTP rows.

`ITP` holds the compiled Program of the current Plan and one fitted `LinearTime` per (group, kind)
(the micro-batch time predictor of `resihp.cost.calibration`); `predict(tokens, sum_sq)` builds a
`Costs` from them with `chunk_table` and runs `resihp.evaluator.pipeline.evaluate`, i.e. the healthy
iteration time of *this* iteration's micro-batches. After a Plan change the old rows are stale (a
stage's layers or TP degree changed): `refit(plan, samples)` compiles the new Plan and fits again
from the new warm-up samples.

`BatchDag` feeds the same evaluator (`resihp.evaluator.dag.Dag`) many iterations at once, with
arbitrary per-chunk durations, incoming transfer times and blocking-send times instead of the
linear form: the benchmark needs the truth and the prediction of ~10⁶ iterations.

`ITPScale` is the one rule that turns a DAG prediction into the running job's: × the median of
observed ÷ DAG over its newest healthy iterations.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from resihp.core.costs import Costs
from resihp.core.plan import Plan
from resihp.core.program import B, F, Program, W, compile_plan
from resihp.core.schedule import get_schedule
from resihp.cost.calibration import LinearTime, chunk_table, fit_linear_times
from resihp.evaluator.dag import Dag
from resihp.evaluator.pipeline import evaluate

GroupKey = tuple[int, int]
KINDS = {"F": F, "B": B, "W": W}


class ITP:
    """Healthy iteration time of one iteration's actual micro-batches on the current Program."""

    def __init__(
        self,
        plan: Plan,
        fits: Mapping[tuple[GroupKey, str], LinearTime],
        p2p: Callable[[GroupKey, GroupKey], float] | float = 0.0,
        step_s: float = 0.0,
        segment_s: Mapping[tuple[int, int], float] | None = None,
        send_blocks: bool = True,
    ) -> None:
        self.plan = plan
        self.program = compile_plan(plan)
        missing = [g for g in self.program.chunks if (g, "F") not in fits or (g, "B") not in fits]
        if missing:
            raise ValueError(f"itp: no fitted F/B rows for groups {missing[:4]}")
        self.fits = dict(fits)
        self.table = {
            g: chunk_table(fits[(g, "F")], fits[(g, "B")], fits.get((g, "W"))) for g in self.program.chunks
        }
        self.p2p = p2p if callable(p2p) else (lambda a, b, c=float(p2p): c)
        self.step_s = step_s
        self.segment_s = dict(segment_s or {})  # exposed gradient sync per segment (layers -> s)
        self.send_blocks = send_blocks

    @classmethod
    def fit(cls, plan: Plan, samples: Iterable[tuple[GroupKey, str, float, float, float]], **options) -> ITP:
        """Fit the MTP on `(group, kind, n, sum_sq, measured_s)` warm-up samples and build the ITP."""
        fits = fit_linear_times(((g, k), n, s, t) for g, k, n, s, t in samples)
        return cls(plan, fits, **options)

    @classmethod
    def fit_devices(
        cls, plan: Plan, samples: Iterable[tuple[int, str, float, float, float]], **options
    ) -> ITP:
        """Fit the MTP per (device, kind) on `(device, kind, n, sum_sq, measured_s)` samples; a group's
        row is its slowest member's at the samples' mean batch (a TP group runs at its slowest rank),
        so a device already slow in the warm-up is not averaged away by its healthy peers."""
        rows = list(samples)
        fits = fit_linear_times(((d, k), n, s, t) for d, k, n, s, t in rows)
        n_mean = float(np.mean([r[2] for r in rows]))
        sq_mean = float(np.mean([r[3] for r in rows]))
        group_fits = {}
        for d, stages in enumerate(plan.replicas):
            for i, st in enumerate(stages):
                for k in KINDS:
                    have = [fits[(dev, k)] for dev in st.devices if (dev, k) in fits]
                    if have:
                        group_fits[((d, i), k)] = max(have, key=lambda f: f.predict(n_mean, sq_mean))
        return cls(plan, group_fits, **options)

    def refit(self, plan: Plan, samples, **options) -> ITP:
        """A new ITP for a changed Plan, fitted on samples measured under it (old rows dropped)."""
        kept = {"p2p": self.p2p, "step_s": self.step_s, "send_blocks": self.send_blocks}
        return ITP.fit(plan, samples, **{**kept, **options})

    def costs(self, tokens, sum_sq) -> Costs:
        tokens = np.asarray(tokens, dtype=np.float64)
        sum_sq = np.asarray(sum_sq, dtype=np.float64)
        if tokens.shape != (self.plan.global_microbatches,) or sum_sq.shape != tokens.shape:
            raise ValueError(
                f"itp: need {self.plan.global_microbatches} micro-batches, "
                f"got {tokens.shape} / {sum_sq.shape}"
            )
        return Costs(
            tokens, sum_sq, self.table, p2p=self.p2p, segment_s=self.segment_s, step_s=self.step_s,
            send_blocks=self.send_blocks,
        )  # fmt: skip

    def predict(self, tokens, sum_sq) -> float:
        """Predicted healthy iteration seconds for this iteration's micro-batches (global order)."""
        return evaluate(self.program, self.costs(tokens, sum_sq)).iteration_s


class ITPScale:
    """A DAG prediction scaled to the running job: × the median of observed ÷ DAG over the newest
    `keep` healthy iterations (`add`). The DAG of fitted chunk times misses what is in no chunk:
    idle gaps, thread contention, collectives, the optimizer; on shared CPU cores a bias of 10-30 %
    that drifts with the load. A prediction uses only earlier iterations (`predict` before `add`),
    so its error is out of sample; the caller restarts it (`clear`) when the job's state changes."""

    def __init__(self, keep: int) -> None:
        self.ratios: deque[float] = deque(maxlen=keep)

    def predict(self, dag_s: float) -> float | None:
        """The scaled prediction of an iteration the DAG puts at `dag_s`; None until `keep` are in."""
        if len(self.ratios) < (self.ratios.maxlen or 0):
            return None
        return dag_s * float(np.median(self.ratios))

    def add(self, observed_s: float, dag_s: float) -> None:
        """A healthy iteration: observed `observed_s`, the DAG's `dag_s`."""
        if observed_s > 0.0 and dag_s > 0.0:
            self.ratios.append(observed_s / dag_s)

    def clear(self) -> None:
        self.ratios.clear()


class BatchDag:
    """The DAG evaluator fed explicit per-chunk times of a batch of iterations.

    Per group g, chunk k (program order): `kind[g][k]`, `mb[g][k]` (global micro-batch index), and
    for dp = 1 plans `in_xfer[g][k]` / `out_xfer[g][k]`: the index of the transfer it waits for /
    sends (−1: none), transfer index = (direction·(pp − 1) + boundary)·m + micro-batch, direction 0
    = activation from stage b to b + 1, 1 = gradient from b + 1 to b.
    """

    def __init__(self, program: Program) -> None:
        self.dag = dag = Dag.of(program)
        self.groups: list[GroupKey] = [g for g in dag.groups if dag.where[g] is not None]
        self.kind, self.mb = {}, {}
        for g in self.groups:
            k, r, v = dag.vertices(g)
            self.kind[g], self.mb[g] = dag.units[k].kind[v], dag.units[k].mb[v, r]
        plan = program.plan
        self.pp, self.m = max(len(s) for s in plan.replicas), max(plan.microbatches)
        if plan.dp == 1 and not plan.assignment:
            grad_kind = get_schedule(plan.schedule).grad_kind
            self.in_xfer, self.out_xfer = {}, {}
            for g in self.groups:
                i, kind, j = g[1], self.kind[g], self.mb[g]
                inn = np.full(kind.size, -1)
                out = np.full(kind.size, -1)
                last = self.pp - 1
                inn[(kind == F) & (i > 0)] = ((i - 1) * self.m + j)[(kind == F) & (i > 0)]
                inn[(kind == B) & (i < last)] = (((last + i) * self.m) + j)[(kind == B) & (i < last)]
                out[(kind == F) & (i < last)] = (i * self.m + j)[(kind == F) & (i < last)]
                down = (kind == grad_kind) & (i > 0)
                out[down] = ((last + i - 1) * self.m + j)[down]
                self.in_xfer[g], self.out_xfer[g] = inn, out

    def iteration_s(
        self,
        dur: Mapping[GroupKey, np.ndarray],
        edge: Mapping[GroupKey, np.ndarray] | None = None,
        send: Mapping[GroupKey, np.ndarray] | None = None,
        tail_s: float | Mapping[GroupKey, float] = 0.0,
    ) -> np.ndarray:
        """(batch,) iteration seconds; `dur[g]`, `edge[g]`, `send[g]` are (batch, chunks of g).

        `tail_s`: optimizer step (per group, or one for all) after the gradient sync, which here
        takes no time of its own: a group steps once every holder of its segments is done.
        """
        dag = self.dag
        shape = next(iter(dur.values())).shape[:-1]
        n = int(np.prod(shape))
        lanes = []
        for u in dag.units:
            lanes.append(tuple(np.zeros((u.V, len(u.replicas), n)) for _ in range(3)))
        for which, given in enumerate((dur, edge, send)):
            if given is None:
                continue
            for g in self.groups:
                k, r, v = dag.vertices(g)
                rows = np.broadcast_to(given[g], (*shape, len(v)))
                lanes[k][which][v, r] = rows.reshape(n, -1).T
        times = dag.run(lanes)
        step = np.array([tail_s.get(g, 0.0) for g in dag.groups]) if isinstance(tail_s, Mapping) else tail_s
        done = dag.sync([free for _, free in times], {}, 0.0)
        done = done + (step[:, None] if isinstance(step, np.ndarray) else step)
        return done.max(axis=0).reshape(shape)


def iteration_time_seam(plan: Plan) -> Callable[[np.ndarray], float]:
    """`synth.synthesize`'s seam on a real Program: chunk_s (pp, m, 2) forward/backward seconds of
    a dp = 1 plan → the DAG iteration time (W chunks take 0; no transfers)."""
    dag = BatchDag(compile_plan(plan))

    def iteration_time(chunk_s: np.ndarray) -> float:
        full = np.concatenate([chunk_s, np.zeros(chunk_s.shape[:2] + (1,))], axis=2)  # (pp, m, 3)
        dur = {g: full[g[1], dag.mb[g], dag.kind[g]][None] for g in dag.groups}
        return float(dag.iteration_s(dur)[0])

    return iteration_time
