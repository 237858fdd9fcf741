"""The optimizer's schedule and clipping: the rates of every phase, the global norm's partition
over an irregular plan (each element counted once), the tied embedding's reduction group, and
the `[optim]` / `[model]` / `[data]` config keys."""

import math

import pytest
import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan, Stage
from resihp.core.segments import tied_embedding_devices
from resihp.model import full_shape, owned_sq_sum, slice_tensor, stage_param_names
from resihp.runtime.checks import check_paths
from resihp.runtime.config import TrainConfig
from resihp.runtime.exec.groups import _group_device_sets
from resihp.runtime.exec.optim import clip_coefficient, learning_rate, owned_names
from resihp.runtime.job import OptimConfig

SPEC = ModelSpec("t", 4, 64, 8, 2, 96, 320)
TIED = ModelSpec("tied", 4, 64, 8, 2, 96, 320, tie_word_embeddings=True)


def test_schedule_phases():
    """Warm-up reaches lr at its last iteration; the cosine starts at lr after warm-up, passes the
    middle at half-way and stays at min_lr from decay_iters on; constant stays at lr."""
    cos = OptimConfig(lr=1.0, warmup_iters=4, schedule="cosine", min_lr=0.1, decay_iters=14)
    assert [learning_rate(cos, k) for k in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert learning_rate(cos, 4) == 1.0
    assert learning_rate(cos, 9) == pytest.approx(0.55, abs=1e-15)
    assert learning_rate(cos, 14) == pytest.approx(0.1, abs=1e-15) and learning_rate(cos, 99) == 0.1
    assert learning_rate(cos, 6) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2)))
    const = OptimConfig(lr=2.0, warmup_iters=2)
    assert [learning_rate(const, k) for k in range(5)] == [1.0, 2.0, 2.0, 2.0, 2.0]
    assert learning_rate(OptimConfig(lr=0.0), 3) == 0.0


def test_clip_coefficient_is_torchs():
    """The factor of torch.nn.utils.clip_grad_norm_: max / (norm + 1e-6), at most 1."""
    g = [torch.full((3,), 2.0), torch.full((4,), -1.0)]
    norm = math.sqrt(3 * 4 + 4)
    params = [torch.nn.Parameter(torch.zeros_like(t)) for t in g]
    for p, t in zip(params, g):
        p.grad = t.clone()
    assert float(torch.nn.utils.clip_grad_norm_(params, 1.5)) == pytest.approx(norm)
    for p, t in zip(params, g):
        torch.testing.assert_close(p.grad, t * clip_coefficient(norm, 1.5), rtol=0, atol=0)
    assert clip_coefficient(0.5, 1.0) == 1.0 and clip_coefficient(9.0, 0.0) == 1.0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"schedule": "linear"}, "optim.schedule = 'linear'"),
        ({"min_lr": 1e-4}, "only with optim.schedule = 'cosine'"),
        ({"schedule": "cosine"}, "needs optim.decay_iters"),
        ({"schedule": "cosine", "decay_iters": 5, "min_lr": 1.0}, r"optim.min_lr = 1.0: must be in \[0"),
        ({"warmup_iters": 5, "schedule": "cosine", "decay_iters": 5}, "optim.decay_iters = 5"),
        ({"grad_clip": -1.0}, "optim.grad_clip = -1.0"),
        ({"betas": (0.9,)}, "optim.betas"),
        ({"betas": (0.9, 1.0)}, "optim.betas"),
        ({"warmup_iters": -1}, "optim.warmup_iters = -1"),
        ({"eps": 0.0}, "optim.eps = 0.0"),
    ],
)
def test_bad_optimizer_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OptimConfig(**kwargs)


def _irregular_plan(spec) -> Plan:
    """Three replicas with different layer cuts and TP splits (uneven, kv heads replicated), one
    stage hollow with its micro-batch migrated."""
    r0 = (Stage((0, 1), (0, 2), (5, 3), (60, 36)), Stage((2, 3, 4), (2, 4), (1, 4, 3), (10, 50, 36)))
    r1 = (Stage((5,), (0, 2), (8,), (96,)), Stage((), (2, 4)))
    r2 = (Stage((6, 7), (0, 1), (4, 4), (48, 48)), Stage((8, 9), (1, 4), (2, 6), (20, 76)))
    return Plan(spec, (r0, r1, r2), (1, 1, 1), assignment=((1, 0, 1, 0),))


@pytest.mark.parametrize("spec", [SPEC, TIED], ids=lambda s: s.name)
def test_owned_squares_partition_the_model(spec):
    """Summed over every device of an irregular plan, the squares each device owns alone equal the
    full gradient's squared norm (a tied LM head not counted): at 1e-6, as fp32 shard sums give."""
    plan = _irregular_plan(spec)
    g = torch.Generator().manual_seed(0)
    full = {n: torch.randn(full_shape(spec, n), generator=g) for n in stage_param_names(spec, (0, 4))}
    total = 0.0
    for d, stages in enumerate(plan.replicas):
        for i, st in enumerate(stages):
            for r in range(st.tp):
                for n in owned_names(plan, d, i):
                    shard = slice_tensor(spec, n, full[n], st.tp_split, st.ffn_split, r)
                    total += float(owned_sq_sum(spec, n, shard, st.tp_split, st.ffn_split, r).double())
    want = sum(float(t.double().pow(2).sum()) for n, t in full.items())
    if spec.tie_word_embeddings:
        want -= float(full["lm_head.weight"].double().pow(2).sum())
    assert total == pytest.approx(want, rel=1e-6)
    counted = [
        n
        for d, stages in enumerate(plan.replicas)
        for i, _ in enumerate(stages)
        for n in owned_names(plan, d, i)
    ]
    assert sorted(counted) == sorted(
        n for n in full if not (spec.tie_word_embeddings and n == "lm_head.weight")
    )


def test_tied_embedding_group_holds_every_copy():
    """With tied embeddings one more group: every device of a first or last stage (none untied)."""
    plan = _irregular_plan(TIED)
    assert tied_embedding_devices(plan) == (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert tied_embedding_devices(_irregular_plan(SPEC)) == ()
    assert (0, 1, 2, 3, 4, 5, 6, 7, 8, 9) in _group_device_sets(plan)
    assert (0, 1, 2, 3, 4, 5, 6, 7, 8, 9) not in _group_device_sets(_irregular_plan(SPEC))
    one = Plan.uniform(TIED, 1, 1, 1, 1)
    assert tied_embedding_devices(one) == (0,) and _group_device_sets(one) == []


def test_config_keys(tmp_path):
    """[optim] keys reach the OptimConfig (cosine decays over run.iterations unless told); [model]
    takes a preset or a directory, never both; [data] needs eos_id and excludes [workload] lengths."""
    cfg = TrainConfig.from_dict(
        {
            "optim": {
                "schedule": "cosine",
                "warmup_iters": 3,
                "min_lr": 1e-4,
                "grad_clip": 1.0,
                "betas": [0.8, 0.9],
                "eps": 1e-6,
            },
            "run": {"iterations": 40},
        }  # fmt: skip
    )
    o = cfg.optim()
    assert (o.schedule, o.warmup_iters, o.decay_iters, o.min_lr, o.grad_clip) == ("cosine", 3, 40, 1e-4, 1.0)
    assert (o.betas, o.eps) == ((0.8, 0.9), 1e-6)
    assert TrainConfig.from_dict({"optim": {"schedule": "cosine", "decay_iters": 7}}).optim().decay_iters == 7
    for raw, match in [
        ({"model": {"preset": "tiny", "hf": "d"}}, "give one of them"),
        ({"model": {"hf": str(tmp_path / "none")}}, "model.hf = .*no such directory"),
        ({"data": {"path": "x.bin"}}, "data.path needs data.eos_id"),
        ({"data": {"eos_id": 2}}, "need data.path"),
        ({"data": {"path": "x.bin", "eos_id": 2}, "workload": {"lengths": "github"}}, "not both"),
        ({"data": {"path": "x.bin", "eos_id": 2, "dtype": "int32"}}, "data.dtype = 'int32'"),
        ({"optim": {"schedule": "step"}}, "optim.schedule = 'step'"),
        ({"optim": {"betas": 0.9}}, "optim.betas"),
        ({"optim": {"momentum": 0.9}}, "unknown key optim.momentum"),
    ]:
        with pytest.raises(ValueError, match=match):
            TrainConfig.from_dict(raw)
    data = tmp_path / "d.bin"
    torch.tensor([5, 300, 0], dtype=torch.int32).numpy().astype("uint16").tofile(data)
    cfg = TrainConfig.from_dict({"data": {"path": str(data), "eos_id": 0}})
    with pytest.raises(ValueError, match="token id 300 .* vocabulary of 256"):
        check_paths(cfg)


def test_model_hf_directory_keys(tmp_path):
    """`[model] hf` reads the config (checked against parallel.seq_len); its weights are used when
    the directory has some and `hf_weights` is on; a vocabulary below the byte corpus' is refused."""
    import json

    safetensors_torch = pytest.importorskip("safetensors.torch")
    d = tmp_path / "m"
    d.mkdir()
    cfg = {"architectures": ["MistralForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 320,
           "sliding_window": 128}  # fmt: skip
    (d / "config.json").write_text(json.dumps(cfg))
    config = TrainConfig.from_dict({"model": {"hf": str(d)}})
    assert config.spec.name == "m" and config.spec.kv_heads == 2 and config.weights_dir() is None
    safetensors_torch.save_file({"model.norm.weight": torch.ones(64)}, str(d / "model.safetensors"))
    assert config.weights_dir() == str(d)
    assert TrainConfig.from_dict({"model": {"hf": str(d), "hf_weights": False}}).weights_dir() is None
    with pytest.raises(ValueError, match="sliding_window = 128 .* parallel.seq_len = 256"):
        TrainConfig.from_dict({"model": {"hf": str(d)}, "parallel": {"seq_len": 256}})
    (d / "config.json").write_text(json.dumps({**cfg, "vocab_size": 200}))
    with pytest.raises(ValueError, match=r"vocabulary \(200\) does not cover the byte tokens"):
        TrainConfig.from_dict({"model": {"hf": str(d)}})
    with pytest.raises(ValueError, match="model.hf_weights = 'yes'"):
        TrainConfig.from_dict({"model": {"hf": str(d), "hf_weights": "yes"}, "data": {}})
