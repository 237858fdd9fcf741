"""The detector of a running job: online MTP, the ITP, change points and peer-aware localization.

Per Plan generation, fed one committed iteration at a time (`OnlineDetector.observe`):

* **Work classes** (`work_classes`): devices doing the same work — the same stage index, layers and
  head / FFN share, in any replica or TP position — form one class. A stage with more work (the LM
  head, an uneven split) is its own class, so it is only ever compared with itself.
* **MTP** (`OnlineMTP`): per (class, kind F/B/W) `c0 + α·N + β·Σl²` (`cost.calibration`'s robust
  fit), fitted on the generation's first `fit_iters` iterations after `skip` (lazy initialisation)
  and refitted every iteration on the last `keep` iterations of the class members in good health
  (never on a suspect's or a known-slow device's chunks), so it follows drift and load.
* **Residuals**: a device's r = the `quantile` (0.75) over its chunks of predicted ÷ measured this
  iteration: its fast chunks. Contention (other processes on the cores) only ever makes a chunk
  slower, and some chunks escape it; a slow device is slow in every chunk (the injection, like a
  throttled device, stretches each by 1/p), so its fast chunks are slow too. Its speed s = r ÷ the
  median r of its healthy class peers (not known slow), or ÷ that of every other healthy device
  when it has no healthy peer. A global slowdown (a co-tenant process, load from other jobs) moves
  the peers alike and cancels; the micro-batches' different documents are in the prediction, so
  replicas with different Σl² compare fairly.
* **Warm-up check**: after the fit, a device whose warm-up speed against its class peers is below
  `cut` is taken out of its class's fit (a device slow from iteration 0 would otherwise be baked
  into the prediction) and the class refitted; its own prediction is then its peers', so it is
  found like any other onset. One that is not suspect in its first predicted iteration was noise
  and is a peer again.
* **Decision**: a device is suspect in an iteration when its judged speed is below `cut`. Judged:
  on CPU workers (`Chunks.cpu_s`) the same peer comparison on Σ predicted ÷ CPU seconds, relative
  to its class's level at the fit (`_cpu_levels`: CPU time does not include waiting for a core,
  ±8 % per iteration where chunk wall times swing ±30 % on 2 shared cores), and also below `back`
  in wall time, s or the median of its chunk speeds against its TP partner (`_chunk_speeds`, the
  severity's lockstep pairs; its chunks are slower too: CPU time includes polling in a collective
  or a receive, which a healthy device waiting on a slow neighbour spends); otherwise s, and also
  r < `cut` (slower than its own prediction, not only than peers that happen to run fast). Suspect
  in `persistence` of the last `persistence + tolerate` iterations (3 of 4: one noisy iteration
  neither blames nor hides a slow device, which is still reported in its third slow iteration) →
  `fail-slow`. Severity (the wall-time speed p: what the job loses; busy-wait injection makes
  compute t/p): the median, over its suspect iterations' chunks, of each chunk's predicted ÷
  measured over that of the same chunk of a healthy TP partner (`_chunk_speeds`; no TP partner:
  the class peers', no peer: every other healthy device's median chunk). Partners run the same
  micro-batch at the same moment in lockstep, so the prediction's error for that micro-batch and
  the load of that moment cancel (10 live runs: 0.2-8.5 % off, median 2.9 %, where the median of
  3 per-iteration s was 2-29 % off, median 11.5 %; docs/detector.md). A confirmed change point
  of the iteration time's observed ÷ predicted series (`ResiHPDetector`, normalize mode)
  shortens the persistence by one: the alarm already confirms that something changed.
* **ITP**: `detect.itp.ITP`, the one DAG evaluator, on the fitted rows (a TP group at its slowest
  member's class), scaled online (`detect.itp.ITPScale`): × the median observed ÷ DAG of the
  generation's last `itp_keep` calm iterations (no device suspect, no report; the DAG misses idle
  gaps and thread contention, a bias that drifts with the load on shared cores). Each iteration is
  predicted before it joins the scale, so `itp_errors` (calm iterations with no known-slow
  device) are out of sample. A report or a recovery restarts the scale: a new state of the job.
* **Known slow devices** (`known`: device → speed estimate, the runtime's knowledge carried across
  generations): judged on their speed × baked, baked = the estimate their own fit already holds (a
  device that had no healthy peer at fit time is fitted on its slow self). Reported again only when
  slower than `cut`² × the judged speed it was reported at (one `cut` of margin is within the noise
  of a slow device on shared cores: its injected busy-wait stretches with the contention); back at
  speed (judged ≥ `back` in `persistence` of the last `persistence + tolerate`) → `recovered`.

Torch-free; used live by `runtime/adapt/slowwatch.py` and offline by `benchmarks/live_detect.py`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from resihp.core.plan import Plan
from resihp.core.trace_format import COMPUTE_OPS
from resihp.cost.calibration import LinearTime, chunk_table

from .changepoint import DetectorConfig, ResiHPDetector
from .itp import ITP, ITPScale
from .online_mtp import Chunks, OnlineMTP, record_chunks, work_classes
from .report import FailureReport

__all__ = ["Chunks", "OnlineConfig", "OnlineDetector", "OnlineMTP", "record_chunks", "work_classes"]


@dataclass(frozen=True)
class OnlineConfig:
    skip: int = 1  # first iterations of a generation ignored (lazy initialisation, allocations)
    fit_iters: int = 3  # then these fit the MTP
    keep: int = 10  # iterations the MTP is refitted on, newest kept
    cut: float = 0.8  # speed below which a device is suspect
    back: float = 0.85  # judged speed at or above which a known-slow device is back
    persistence: int = 3  # suspect iterations before a report ...
    tolerate: int = 1  # ... among the last persistence + tolerate (3 of 4)
    itp_keep: int = 5  # calm iterations whose median observed ÷ DAG scales the ITP
    min_chunk_s: float = 1e-4  # chunks shorter than this did no work (W folded into B, say)
    quantile: float = 0.75  # of a device's chunk ratios predicted ÷ measured: its fast chunks

    def __post_init__(self) -> None:
        for name in ("skip", "fit_iters", "keep", "persistence", "tolerate", "itp_keep"):
            v, least = getattr(self, name), 0 if name in ("skip", "tolerate") else 1
            if not isinstance(v, int) or v < least:
                raise ValueError(f"online.{name} = {v!r}: must be an integer >= {least}")
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"online.quantile = {self.quantile!r}: must lie in (0, 1)")
        if not 0.0 < self.cut < self.back <= 1.0:
            raise ValueError(f"online.cut = {self.cut!r}, back = {self.back!r}: need 0 < cut < back <= 1")


class OnlineDetector:
    """The live detector of one job (module docstring). `known` is shared with the caller: the
    speed estimate of every device reported slow and not back yet; `observe` keeps it current."""

    def __init__(self, config: OnlineConfig | None = None, known: dict[int, float] | None = None) -> None:
        self.config = config or OnlineConfig()
        self.known = known if known is not None else {}
        self.generation = -1
        self.itp_errors: list[float] = []  # |observed − predicted| / observed of calm iterations
        self.alarms: list[int] = []  # iterations of confirmed change points (observed ÷ predicted)
        self.speeds: dict[int, list[float]] = {}  # device -> its speed s per observed iteration
        self.predicted: dict[int, float] = {}  # iteration -> the ITP's healthy iteration seconds
        self.judged_at: dict[int, float] = {}  # known-slow device -> its judged speed when reported

    def start(self, plan: Plan) -> None:
        """A new generation: new work per device, new fits, new series."""
        c = self.config
        self.plan, self.classes, self.seen = plan, work_classes(plan), 0
        self.group = {dev: (r, i) for r, stages in enumerate(plan.replicas) for i, st in enumerate(stages)
                      for dev in st.devices}  # fmt: skip
        self.mtp = OnlineMTP(c.keep)
        self.fit_members: dict[tuple, set[int]] = {}
        self.baked: dict[int, float] = {}  # device -> the speed its own fit holds (wall)
        self.baked_judged: dict[int, float] = {}  # likewise, on the judged (CPU) scale
        self.excluded: set[int] = set()  # slow already in the warm-up: out of the fits
        # device -> its last persistence + tolerate judgements (flag "slow" / "back" / None, wall
        # speed, judged speed), kept while one of them is flagged
        self.flags: dict[int, deque[tuple]] = {}
        self.itp: ITP | None = None
        self.scale = ITPScale(c.itp_keep)
        self.cpd = ResiHPDetector(DetectorConfig(min_shift=0.05, persist_all=True), mode="normalize")
        self.last_alarm = -(1 << 30)
        self.fit_buffer: list[dict[int, Chunks]] = []
        self.level: dict[tuple, float] | None = None  # class -> CPU level at the fit (`_cpu_levels`)

    def observe(
        self, it: int, plan: Plan, chunks: Mapping[int, Chunks], iteration_s: float, tokens=None, sum_sq=None
    ) -> list[FailureReport]:
        """One committed iteration of `plan`: every plan device's chunks, the observed iteration
        seconds, and the iteration's micro-batches (N and Σl² in global order, for the ITP).
        Returns new reports: `fail-slow` (severity p̂) and `recovered` (severity 1)."""
        c = self.config
        if plan.generation != self.generation:
            self.generation = plan.generation
            self.start(plan)
        self.seen += 1
        if self.seen <= c.skip:
            return []
        if self.seen <= c.skip + c.fit_iters:
            self.fit_buffer.append(dict(chunks))
            if self.seen == c.skip + c.fit_iters:
                self._fit()
            return []
        resid = self._residuals(chunks)
        speed = self._speeds(resid)
        cpu = self._cpu_levels(chunks)
        judge = self._speeds({d: x / self.level[self.classes[d]] for d, x in cpu.items()}) if cpu else speed
        for d, s in judge.items():
            self.speeds.setdefault(d, []).append(s * self.baked.get(d, 1.0))
        dag = self._dag(tokens, sum_sq)
        predicted = None if dag is None else self.scale.predict(dag)
        if predicted is not None and predicted > 0:
            self.predicted[it] = predicted
            if self.cpd.observe(it, iteration_s, predicted) is not None:
                self.alarms.append(it)
                self.last_alarm = it
        reports = self._decide(it, resid, speed, judge if cpu else None, self._chunk_speeds(chunks))
        if reports:  # a new state of the job: the scale starts over
            self.scale.clear()
        elif dag is not None and not self.flags:  # calm: nobody suspect
            if predicted is not None and predicted > 0 and not self.known:
                self.itp_errors.append(abs(iteration_s - predicted) / iteration_s)
            self.scale.add(iteration_s, dag)
        unfit = self.known.keys() | self.suspects() | self.excluded
        healthy = {d for d in chunks if d not in unfit}
        self.mtp.add(self._rows({d: chunks[d] for d in healthy}))
        self.mtp.refit()
        return reports

    # ------------------------------------------------------------------ fitting
    def _rows(self, chunks: Mapping[int, Chunks]) -> list[tuple]:
        out = []
        for d, ch in chunks.items():
            cls = self.classes.get(d)
            ok = ch.measured >= self.config.min_chunk_s
            out += [((cls, int(k)), n, s, t) for k, n, s, t in zip(ch.kinds[ok], ch.n[ok], ch.sum_sq[ok],
                                                                   ch.measured[ok])]  # fmt: skip
        return out

    def _fit(self) -> None:
        """Fit on the warm-up iterations over each class's members not known slow (all of them when
        none is healthy); then take out of the fit whoever was slow against its peers, and refit."""
        members: dict[tuple, set[int]] = {}
        for d, cls in self.classes.items():
            members.setdefault(cls, set()).add(d)
        for cls, devs in members.items():
            healthy = {d for d in devs if d not in self.known}
            self.fit_members[cls] = healthy or set(devs)
        for _ in range(2):
            for buf in self.fit_buffer:
                use = {d: ch for d, ch in buf.items() if d in self.fit_members.get(self.classes.get(d), ())}
                self.mtp.add(self._rows({d: ch for d, ch in use.items() if d not in self.excluded}))
            self.mtp.refit()
            if self.excluded:
                break
            resid = {}
            for buf in self.fit_buffer:
                for d, r in (self._cpu_levels(buf) or self._residuals(buf)).items():
                    resid.setdefault(d, []).append(r)
            med = {d: float(np.median(v)) for d, v in resid.items()}
            speed = self._speeds(med)
            self.excluded = {d for d, s in speed.items() if s < self.config.cut and d not in self.known}
            if not self.excluded:
                break
            self.mtp.window.clear()
        for devs in self.fit_members.values():
            for d in devs:
                if d in self.known:
                    self.baked[d] = self.known[d]
                    self.baked_judged[d] = self.judged_at.get(d, self.known[d])
        levels: dict[tuple, list[float]] = {}
        for buf in self.fit_buffer:
            for d, x in self._cpu_levels(buf).items():
                if d in self.fit_members[self.classes[d]] and d not in self.excluded:
                    levels.setdefault(self.classes[d], []).append(x)
        self.level = {cls: float(np.median(v)) for cls, v in levels.items()}

    def _cpu_levels(self, chunks: Mapping[int, Chunks]) -> dict[int, float]:
        """device -> Σ predicted chunk seconds ÷ its CPU seconds (CPU workers; {} otherwise).

        On shared CPU cores a chunk's wall time includes waiting for a core (±30 % per iteration on
        the 2-core machine); CPU time does not (±8 %), and an injected busy-wait burns it. The
        level of a class at its fit (`level`) makes it ≈ 1 for a device as fast as the fit."""
        out = {}
        for d, ch in chunks.items():
            if ch.cpu_s > 0 and (self.level is None or self.classes.get(d) in self.level):
                pred = self.mtp.predict(self.classes.get(d), ch)
                ok = (ch.measured >= self.config.min_chunk_s) & (pred > 0)
                if ok.any():
                    out[d] = float(pred[ok].sum()) / ch.cpu_s
        return out

    def _ratios(self, chunks: Mapping[int, Chunks]) -> dict[int, np.ndarray]:
        """device -> predicted ÷ measured of each of its chunks (NaN: did no work, or no prediction)."""
        out = {}
        for d, ch in chunks.items():
            pred = self.mtp.predict(self.classes.get(d), ch)
            ok = (ch.measured >= self.config.min_chunk_s) & (pred > 0)
            if ok.any():
                out[d] = np.where(ok, pred / np.where(ok, ch.measured, 1.0), np.nan)
        return out

    def _residuals(self, chunks: Mapping[int, Chunks]) -> dict[int, float]:
        """device -> the `quantile` of predicted ÷ measured over its working chunks with a prediction."""
        return {d: float(np.nanquantile(r, self.config.quantile)) for d, r in self._ratios(chunks).items()}

    def _references(self, devices, partners: bool = False) -> dict[int, list[int]]:
        """device -> the devices it is measured against: its healthy class peers, or every other
        healthy device when it has none (healthy: not known slow, not taken out at the warm-up). A
        known-slow peer is no reference: its estimate may be off, and a second device would
        inherit the error. With `partners`, the healthy class peers of its own TP group first
        (the same micro-batches at the same moments, `_chunk_speeds`)."""
        pool = [d for d in devices if d not in self.known and d not in self.excluded]
        out = {}
        for d in devices:
            cls = self.classes.get(d)
            peers = [p for p in pool if p != d and self.classes.get(p) == cls]
            near = [p for p in peers if self.group.get(p) == self.group.get(d)] if partners else []
            out[d] = near or peers or [p for p in pool if p != d]
        return out

    def _speeds(self, resid: Mapping[int, float]) -> dict[int, float]:
        """device -> r ÷ the median r of its references (`_references`)."""
        out = {}
        for d, peers in self._references(resid).items():
            ref = float(np.median([resid[p] for p in peers])) if peers else 1.0
            out[d] = resid[d] / ref if ref > 0 else 1.0
        return out

    def _chunk_speeds(self, chunks: Mapping[int, Chunks]) -> dict[int, np.ndarray]:
        """device -> its chunk-by-chunk speeds against each reference (`_references`, TP partners
        first): chunk j's predicted ÷ measured over the reference's for its chunk j (a class peer
        runs the same schedule; a TP partner the same micro-batch at the same moment, in lockstep,
        so the prediction's error for that micro-batch and the load of that moment cancel: live,
        such pairs spread ±15 % where chunks against the other replica's spread ±35 %), or over
        the reference's median chunk when their schedules differ. The severity is their median
        over the suspect iterations (~24 chunk pairs: robust to the chunks that waited for a core)."""
        ratios = self._ratios(chunks)
        out = {}
        for d, peers in self._references(ratios, partners=True).items():
            own, kinds = ratios[d], chunks[d].kinds
            vals = []
            for p in peers:
                ref = ratios[p]
                same = chunks[p].kinds.shape == kinds.shape and bool((chunks[p].kinds == kinds).all())
                vals.append(own / (ref if same else np.nanmedian(ref)))
            v = np.concatenate(vals) if vals else own
            out[d] = v[np.isfinite(v) & (v > 0)]
        return out

    # ------------------------------------------------------------------ the iteration time
    def _dag(self, tokens, sum_sq) -> float | None:
        """The DAG evaluator's iteration seconds of these micro-batches on the current fits (None
        without micro-batches or fits); `ITPScale` makes it the job's prediction."""
        if sum_sq is None:
            return None
        tokens = np.full(len(sum_sq), float(tokens)) if np.ndim(tokens) == 0 else np.asarray(tokens, float)
        fits = self._group_fits(float(np.mean(tokens)), float(np.mean(sum_sq)))
        if fits is None:
            return None
        if self.itp is None:
            self.itp = ITP(self.plan, fits)
        else:
            self.itp.table = {
                g: chunk_table(fits[(g, "F")], fits[(g, "B")], fits.get((g, "W")))
                for g in self.itp.program.chunks
            }
        return self.itp.predict(tokens, sum_sq)

    def _group_fits(self, n: float, sum_sq: float) -> dict | None:
        """(group, kind) -> the row of its slowest member's class (a TP group runs at its slowest)."""
        fits = {}
        for d, stages in enumerate(self.plan.replicas):
            for i, st in enumerate(stages):
                for k, op in enumerate(COMPUTE_OPS):
                    have = [self.mtp.fits[(self.classes[dev], k)] for dev in st.devices
                            if (self.classes[dev], k) in self.mtp.fits]  # fmt: skip
                    if have:
                        fits[((d, i), op)] = max(have, key=lambda f: f.predict(n, sum_sq))
                if not any(((d, i), op) in fits for op in COMPUTE_OPS):
                    return None
                for op in ("F", "B"):  # a kind that did no work here (zbh1's first-stage B)
                    fits.setdefault(((d, i), op), LinearTime(0.0, 0.0, 0.0))
        return fits

    # ------------------------------------------------------------------ decisions
    def suspects(self) -> set[int]:
        """Devices flagged slow in one of their last `persistence + tolerate` iterations."""
        return {d for d, win in self.flags.items() if any(f == "slow" for f, _, _ in win)}

    def _decide(
        self, it: int, resid: dict[int, float], speed: dict[int, float], cpu: dict[int, float] | None,
        chunk_speeds: dict[int, np.ndarray],
    ) -> list[FailureReport]:  # fmt: skip
        """Who is slow, who is back, how slow. `speed`: from the fast chunks' wall times; `cpu`:
        from CPU time where measured (who is slow: far less noisy on shared cores), else the
        decision takes `speed` and the own-prediction check r < cut; `chunk_speeds` (wall time:
        what the job loses): the severity, their median over the suspect iterations. A known-slow device
        is judged against the judged speed it was reported at (`judged_at`: CPU and wall speeds
        differ under an injected busy-wait on oversubscribed cores)."""
        c = self.config
        need = c.persistence - (1 if it - self.last_alarm < c.persistence else 0)
        out = []
        for d, s in sorted(speed.items()):
            on_cpu = cpu is not None and d in cpu
            own = chunk_speeds.get(d)
            wall = (own if own is not None and own.size else np.array([s])) * self.baked.get(d, 1.0)
            judged = (cpu[d] if on_cpu else s) * self.baked_judged.get(d, 1.0)
            known = self.known.get(d)
            if known is None:  # on CPU: and slower in wall time too, its fast chunks or its chunks' median
                pair = float(np.median(own)) if own is not None and own.size else s  # (against partners)
                slow = judged < c.cut and (min(s, pair) < c.back if on_cpu else resid[d] < c.cut)
            else:
                slow = judged < c.cut * c.cut * self.judged_at.get(d, known)
            back = known is not None and judged >= c.back
            flag = "back" if back else "slow" if slow else None
            win = self.flags.setdefault(d, deque(maxlen=c.persistence + c.tolerate))
            win.append((flag, wall, judged))
            if all(f is None for f, _, _ in win):
                self.flags.pop(d)
                self.excluded.discard(d)  # the warm-up's suspicion not borne out: a peer again
                continue
            run = [(w, j) for f, w, j in win if f == flag] if flag else []
            if len(run) < (c.persistence if back else need):
                continue
            est = min(float(np.median(np.concatenate([w for w, _ in run]))), 1.0)
            self.flags.pop(d)
            if back:
                self.known.pop(d)
                self.judged_at.pop(d, None)
                out.append(FailureReport("recovered", (d,), severity=1.0, iteration=it))
            else:
                self.known[d] = est
                self.judged_at[d] = float(np.median([j for _, j in run]))
                out.append(FailureReport("fail-slow", (d,), severity=est, iteration=it))
        return out
