"""The scenario TOML of architecture §5.1: a job (model, cluster, parallel layout, workload), how
long it runs, and its faults (an explicit list or a named generator).

Every key is checked here, once, for every command that reads a scenario (`plan`, `simulate`,
`detect`): an unknown key, a wrong type, an impossible value, a device that does not exist, a fault
list that `core.faults.check_faults` rejects, or a generator table that `generator_args` rejects
raises ValueError naming the key, the value and what is allowed.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field

from .cluster import Cluster
from .faults import FaultSpec, check_faults, faults_from_tables
from .files import read_toml
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

# Fault generators (`faults = { generator = NAME, ... }`, built in `resihp.sim.faultgen`): each
# argument's default (None: required) and its rule ("> 0", ">= 0", "(0, 1)" or the allowed words).
LEVELS = {"W": 0.35, "M": 0.55, "S": 0.70}  # fail-slow level -> unmitigated throughput drop
GENERATOR_ARGS = {
    "stop-every": {"interval_s": (None, "> 0"), "start_s": (300.0, ">= 0"), "rejoin_after_s": (0.0, ">= 0"),
                   "max_fraction": (0.5, "(0, 1)")},
    "fail-slow": {"level": ("M", tuple(LEVELS)), "kind": ("both", ("compute", "link", "both")),
                  "start_s": (60.0, ">= 0")},
    "mixed": {"interval_s": (None, "> 0"), "level": ("M", tuple(LEVELS)), "start_s": (300.0, ">= 0"),
              "rejoin_after_s": (0.0, ">= 0")},
    "llama3-rates": {"stop_rate_per_gpu_h": (2.0e-5, ">= 0"), "slow_rate_per_node_h": (5.8e-4, ">= 0"),
                     "repair_median_s": (7200.0, "> 0")},
}  # fmt: skip
_RULES = {
    "> 0": lambda v: 0 < v < math.inf,
    ">= 0": lambda v: 0 <= v < math.inf,
    "(0, 1)": lambda v: 0 < v < 1,
}


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
    if duration is not None and (
        isinstance(duration, bool) or not isinstance(duration, int | float) or not 0 < duration < math.inf
    ):
        raise ValueError(f"run.duration_s = {duration!r}: must be a finite number > 0")
    if iterations is not None and (not isinstance(iterations, int) or iterations < 1):
        raise ValueError(f"run.iterations = {iterations!r}: must be an integer >= 1")
    if duration is None and iterations is None:
        duration = 3600.0
    faults, generator = parse_faults(raw.get("faults", []), cluster, iterations, duration)
    return Scenario(
        str(raw.get("name", "scenario")), job, duration, iterations, faults, generator
    )  # fmt: skip


def generator_args(gen: dict) -> tuple[str, dict]:
    """(name, every argument with defaults filled in) of a `faults = { generator = ... }` table."""
    name = gen.get("generator")
    if not isinstance(name, str) or name not in GENERATOR_ARGS:
        raise ValueError(f"faults.generator = {name!r}: unknown; allowed: {', '.join(GENERATOR_ARGS)}")
    spec = GENERATOR_ARGS[name]
    out = {}
    for key, value in gen.items():
        if key == "generator":
            continue
        if key not in spec:
            raise ValueError(f"faults.{key}: unknown key for {name}; allowed: {', '.join(spec)}")
        rule = spec[key][1]
        if isinstance(rule, tuple):
            if value not in rule:
                raise ValueError(f"faults.{key} = {value!r}: allowed: {', '.join(rule)}")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not _RULES[rule](value):
            raise ValueError(
                f"faults.{key} = {value!r}: must be a number {'in ' if '(' in rule else ''}{rule}"
            )
        out[key] = value
    for key, (default, _) in spec.items():
        if key not in out:
            if default is None:
                raise ValueError(f"faults.{key}: missing; generator {name} needs it")
            out[key] = default
    return name, out


def parse_faults(
    raw, cluster: Cluster, iterations: int | None = None, duration_s: float | None = None
) -> tuple[tuple[FaultSpec, ...], dict]:
    """(checked faults in list order, {}) or ((), the generator table) of a scenario's `faults`."""
    if isinstance(raw, dict):
        if "generator" not in raw:
            raise ValueError("faults: a table must name a generator (faults = { generator = ... })")
        generator_args(raw)
        return (), dict(raw)
    if not isinstance(raw, list):
        raise ValueError("faults: must be a list of [[faults]] tables or { generator = ... }")
    faults = faults_from_tables(raw)
    check_faults(faults, range(cluster.num_devices), iterations=iterations, duration_s=duration_s)
    return faults, {}


def load_scenario(path: str, what: str = "scenario") -> Scenario:
    """The scenario in file `path` (`what`: how the user named it, for messages)."""
    return parse_scenario(read_toml(path, what))


def loads_scenario(text: str) -> Scenario:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"scenario: not valid TOML ({exc})") from None
    return parse_scenario(raw)
