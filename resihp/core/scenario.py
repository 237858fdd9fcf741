"""The scenario TOML of architecture §5.1: a job (model, cluster, parallel layout, workload), how
long it runs, and its faults (an explicit list or a named generator).

Every key is checked: an unknown key, a wrong type, an impossible value or a device that does not
exist raises ValueError naming the key, the value and what is allowed.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field

from .cluster import Cluster
from .faults import FaultSpec
from .model_spec import ModelSpec, model_preset
from .plan import SCHEDULES, Plan
from .workload import Workload

_SECTIONS = {
    "name": None,
    "model": {"preset", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "qkv_bias"},
    "cluster": {"nodes", "gpus_per_node", "gpu"},
    "parallel": {"tp", "pp", "dp", "schedule", "microbatches", "seq_len"},
    "workload": {"lengths", "seed", "doc_len"},
    "run": {"duration_s", "iterations"},
    "faults": None,
}
GPU_PRESETS = ("a100-40g", "a100-80g", "h100", "h800", "h200", "cpu")


@dataclass(frozen=True)
class Job:
    """What stays fixed while a job runs: model, hardware, initial layout and data."""

    model: ModelSpec
    cluster: Cluster
    workload: Workload
    tp: int
    pp: int
    dp: int
    schedule: str = "1f1b"

    def initial_plan(self) -> Plan:
        return Plan.uniform(
            self.model, self.tp, self.pp, self.dp, self.workload.num_microbatches, self.schedule
        )

    @property
    def global_microbatches(self) -> int:
        return self.dp * self.workload.num_microbatches


@dataclass(frozen=True)
class Scenario:
    name: str
    job: Job
    duration_s: float | None = None
    iterations: int | None = None
    faults: tuple[FaultSpec, ...] = ()
    generator: dict = field(default_factory=dict)  # named fault generator and its arguments


def _need(table: dict, key: str, section: str, kind: type | tuple, default=None):
    if key not in table:
        if default is None:
            raise ValueError(f"{section}.{key}: missing")
        return default
    value = table[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ValueError(f"{section}.{key} = {value!r}: must be {names}")
    return value


def _check_keys(table: dict, section: str, allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            raise ValueError(f"{section}.{key}: unknown key; allowed: {', '.join(sorted(allowed))}")


def parse_model(raw: dict) -> ModelSpec:
    _check_keys(raw, "model", _SECTIONS["model"])
    if "preset" in raw:
        extra = sorted(set(raw) - {"preset"})
        if extra:
            raise ValueError(f"model.{extra[0]}: give either model.preset or explicit sizes, not both")
        return model_preset(_need(raw, "preset", "model", str))
    sizes = {k: _need(raw, k, "model", int) for k in ("layers", "hidden", "heads", "ffn", "vocab")}
    kv = _need(raw, "kv_heads", "model", int, sizes["heads"])
    return ModelSpec(
        "custom", sizes["layers"], sizes["hidden"], sizes["heads"], kv, sizes["ffn"], sizes["vocab"],
        bool(raw.get("qkv_bias", False)),
    )  # fmt: skip


def parse_scenario(raw: dict) -> Scenario:
    _check_keys(raw, "scenario", set(_SECTIONS))
    for section in ("model", "cluster", "parallel"):
        if section not in raw:
            raise ValueError(f"[{section}]: missing section")
        if not isinstance(raw[section], dict):
            raise ValueError(f"[{section}]: must be a table")
    model = parse_model(raw["model"])
    c = raw["cluster"]
    _check_keys(c, "cluster", _SECTIONS["cluster"])
    gpu = _need(c, "gpu", "cluster", str, "a100-80g")
    if gpu not in GPU_PRESETS:
        raise ValueError(f"cluster.gpu = {gpu!r}: unknown; allowed: {', '.join(GPU_PRESETS)}")
    cluster = Cluster(_need(c, "nodes", "cluster", int), _need(c, "gpus_per_node", "cluster", int), gpu)
    p = raw["parallel"]
    _check_keys(p, "parallel", _SECTIONS["parallel"])
    tp, pp, dp = (_need(p, k, "parallel", int) for k in ("tp", "pp", "dp"))
    for key, v in (("tp", tp), ("pp", pp), ("dp", dp)):
        if v < 1:
            raise ValueError(f"parallel.{key} = {v}: must be >= 1")
    if tp * pp * dp != cluster.num_devices:
        raise ValueError(
            f"parallel: tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp} must equal the cluster's "
            f"{cluster.nodes}*{cluster.gpus_per_node} = {cluster.num_devices} devices"
        )
    if pp > model.num_layers:
        raise ValueError(f"parallel.pp = {pp}: more stages than the model's {model.num_layers} layers")
    if tp > model.heads:
        raise ValueError(f"parallel.tp = {tp}: more TP ranks than the model's {model.heads} heads")
    schedule = _need(p, "schedule", "parallel", str, "1f1b")
    if schedule not in SCHEDULES:
        raise ValueError(f"parallel.schedule = {schedule!r}: allowed: {', '.join(SCHEDULES)}")
    w = raw.get("workload", {})
    if not isinstance(w, dict):
        raise ValueError("[workload]: must be a table")
    _check_keys(w, "workload", _SECTIONS["workload"])
    workload = Workload(
        seq_len=_need(p, "seq_len", "parallel", int, 4096),
        num_microbatches=_need(p, "microbatches", "parallel", int, 2 * pp),
        lengths=_need(w, "lengths", "workload", str, "github"),
        seed=_need(w, "seed", "workload", int, 0),
        doc_len=w.get("doc_len"),
    )
    job = Job(model, cluster, workload, tp, pp, dp, schedule)
    r = raw.get("run", {})
    if not isinstance(r, dict):
        raise ValueError("[run]: must be a table")
    _check_keys(r, "run", _SECTIONS["run"])
    duration = r.get("duration_s")
    iterations = r.get("iterations")
    if duration is not None and iterations is not None:
        raise ValueError("run: give duration_s or iterations, not both")
    if duration is not None and (not isinstance(duration, int | float) or duration <= 0):
        raise ValueError(f"run.duration_s = {duration!r}: must be a number > 0")
    if iterations is not None and (not isinstance(iterations, int) or iterations < 1):
        raise ValueError(f"run.iterations = {iterations!r}: must be an integer >= 1")
    if duration is None and iterations is None:
        duration = 3600.0
    faults, generator = parse_faults(raw.get("faults", []), cluster)
    return Scenario(
        str(raw.get("name", "scenario")), job, duration, iterations, faults, generator
    )  # fmt: skip


def parse_faults(raw, cluster: Cluster) -> tuple[tuple[FaultSpec, ...], dict]:
    if isinstance(raw, dict):
        if "generator" not in raw or not isinstance(raw["generator"], str):
            raise ValueError("faults: a table must name a generator (faults = { generator = ... })")
        return (), dict(raw)
    if not isinstance(raw, list):
        raise ValueError("faults: must be a list of [[faults]] tables or { generator = ... }")
    faults = []
    for k, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ValueError(f"faults[{k}]: must be a table")
        fault = FaultSpec.from_dict(entry)
        for key, dev in (("device", fault.device), ("src", fault.src), ("dst", fault.dst)):
            if dev is not None:
                cluster.check_device(dev, f"faults[{k}].{key}")
        faults.append(fault)
    return tuple(faults), {}


def load_scenario(path: str) -> Scenario:
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ValueError(f"scenario file {path!r}: not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"scenario file {path!r}: not valid TOML ({exc})") from None
    return parse_scenario(raw)


def loads_scenario(text: str) -> Scenario:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"scenario: not valid TOML ({exc})") from None
    return parse_scenario(raw)
