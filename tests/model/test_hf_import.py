"""Hugging Face models in: config.json -> ModelSpec, safetensors slices -> stage shards, logits
equal to transformers' own; and out: the exported directory loads in transformers bit for bit."""

import importlib
import json
from pathlib import Path

import pytest
import torch
from hf_models import KINDS, SEQ_LEN, load_hf, make_hf_model, tp_stage_forward

from resihp.core.hf_config import read_config, spec_from_config
from resihp.core.plan import Plan, Stage
from resihp.model import build_stage, full_shape, slice_tensor, stage_param_names

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")
hf = importlib.import_module("resihp.model.hf")
importlib.import_module("safetensors.torch")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """kind -> (directory, transformers model) for every supported architecture."""
    out = {}
    for kind in KINDS:
        d = tmp_path_factory.mktemp(kind)
        out[kind] = (d, make_hf_model(kind, d, seed=KINDS.index(kind)))
    return out


def _plan(spec) -> Plan:
    """One replica, 2 stages, uneven TP: 8 heads as (5, 3) (kv head 1 replicated on both ranks)
    over layer 0, then (1, 4, 3) over layers 1-3; FFN columns split unevenly too."""
    return Plan(
        spec,
        ((Stage((0, 1), (0, 1), (5, 3), (60, 36)), Stage((2, 3, 4), (1, 4), (1, 4, 3), (10, 50, 36))),),
        (1,),
    )


def _import(directory):
    return spec_from_config(read_config(str(directory)), "model.hf", SEQ_LEN, name=Path(directory).name)


def _pipeline_logits(directory, spec, ids, seg, pos):
    plan = _plan(spec)
    x = ids
    for st in plan.replicas[0]:
        shards = [
            build_stage(spec, st.layers, st.tp_split, st.ffn_split, r,
                        shard=hf.read_shard(str(directory), spec, st.layers, st.tp_split, st.ffn_split, r))
            for r in range(st.tp)
        ]  # fmt: skip
        x = tp_stage_forward(shards, x, seg, pos)
    return x  # (N, V)


@pytest.mark.parametrize("kind", KINDS)
def test_logits_equal_transformers_under_uneven_tp_and_two_stages(models, kind):
    """Each architecture, read slice by slice into an uneven-TP 2-stage plan, gives transformers'
    logits at 1e-5 (fp32) — on one document, and on two documents packed in one window (attention
    and RoPE positions restart at the boundary, as transformers sees each document alone)."""
    directory, model = models[kind]
    spec = _import(directory)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, spec.vocab, (SEQ_LEN,), generator=g)
    with torch.no_grad():
        got = _pipeline_logits(directory, spec, ids, torch.zeros_like(ids), torch.arange(SEQ_LEN))
        want = model(ids[None]).logits[0]  # (N, V)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        cut = 23
        seg = torch.cat([torch.zeros(cut), torch.ones(SEQ_LEN - cut)]).long()
        pos = torch.cat([torch.arange(cut), torch.arange(SEQ_LEN - cut)])
        got = _pipeline_logits(directory, spec, ids, seg, pos)
        want = torch.cat([model(ids[None, :cut]).logits[0], model(ids[None, cut:]).logits[0]])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_imported_fields(models):
    """What each config asks for arrives in the ModelSpec."""
    llama, qwen, mistral = (_import(models[k][0]) for k in KINDS)
    assert (llama.kv_heads, llama.rope_theta, llama.rms_norm_eps) == (2, 500000.0, 1e-5)
    assert llama.rope_scaling.factor == 8.0 and llama.rope_scaling.original_max_position_embeddings == 512
    assert not llama.qkv_bias and not llama.tie_word_embeddings
    assert qwen.qkv_bias and qwen.tie_word_embeddings and qwen.rope_theta == 1e6 and qwen.rope_scaling is None
    assert not mistral.qkv_bias and mistral.vocab == 320 and mistral.ffn == 96


def test_each_member_reads_only_its_shards(models, monkeypatch):
    """Counted at safetensors itself: every device of the plan reads exactly as many elements as its
    shards hold (a fraction of the file), never a whole tensor it does not own."""
    directory, _ = models["qwen2"]
    spec = _import(directory)
    read = [0]
    real_open = safetensors.safe_open

    class Counting:
        def __init__(self, *args, **kwargs):
            self.f = real_open(*args, **kwargs)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def get_slice(self, name):
            sl = self.f.get_slice(name)

            class Slice:
                def __getitem__(self, idx):
                    t = sl[idx]
                    read[0] += t.numel()
                    return t

            return Slice()

        def get_tensor(self, name):  # a whole tensor: counted in full
            t = self.f.get_tensor(name)
            read[0] += t.numel()
            return t

    monkeypatch.setattr(safetensors, "safe_open", Counting)
    plan = _plan(spec)
    total = sum(
        torch.Size(full_shape(spec, n)).numel() for n in stage_param_names(spec, (0, spec.num_layers))
    )
    for st in plan.replicas[0]:
        for r, device in enumerate(st.devices):
            read[0] = 0
            shard = hf.read_shard(str(directory), spec, st.layers, st.tp_split, st.ffn_split, r)
            want = {
                n: slice_tensor(
                    spec, n, torch.empty(full_shape(spec, n)), st.tp_split, st.ffn_split, r
                ).numel()
                for n in stage_param_names(spec, st.layers)
            }
            assert {n: t.numel() for n, t in shard.items()} == want, device
            assert read[0] == sum(want.values()) < total, (device, read[0], total)


def test_export_round_trip_is_bitwise_and_loads_without_warnings(models, tmp_path):
    """A full state read from an HF directory and exported again loads in transformers with no
    missing or unexpected key, every tensor bitwise equal to the original's (tied head once)."""
    for kind in KINDS:
        directory, model = models[kind]
        spec = _import(directory)
        out = tmp_path / kind
        hf.save_hf(str(out), spec, hf.read_full(str(directory), spec), read_config(str(directory)))
        loaded, info = load_hf(out)
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        want = model.state_dict()
        got = loaded.state_dict()
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (kind, name)
        assert loaded.config.tie_word_embeddings == spec.tie_word_embeddings
        written = json.loads((out / "config.json").read_text())
        assert spec_from_config(written, "export", SEQ_LEN, name=spec.name) == spec


def test_preset_export_is_a_llama_transformers_runs(tmp_path):
    """A preset (no HF source) exports as LlamaForCausalLM (Qwen2 with q/k/v bias) whose logits
    equal ours."""
    from resihp.core.model_spec import ModelSpec, model_preset
    from resihp.model import init_state

    for spec in (model_preset("tiny-gqa"), ModelSpec("bias", 2, 64, 8, 2, 96, 256, qkv_bias=True)):
        state = {n: t + 0.05 * torch.randn_like(t) for n, t in init_state(spec, seed=2).items()}
        hf.save_hf(str(tmp_path / spec.name), spec, state)
        loaded, info = load_hf(tmp_path / spec.name)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        ids = torch.arange(40) % spec.vocab
        with torch.no_grad():
            got = build_stage(spec, state=state)(ids, torch.zeros_like(ids), torch.arange(40))
            torch.testing.assert_close(got, loaded(ids[None]).logits[0], atol=1e-5, rtol=0)


def test_sharded_index_and_bf16_weights_are_read(tmp_path):
    """A directory saved in several files with model.safetensors.index.json, and one in bf16,
    read into the same shards as the single fp32 file (bf16 values widened exactly)."""
    one, many, half = tmp_path / "one", tmp_path / "many", tmp_path / "half"
    model = make_hf_model("llama", one, seed=5)
    model.save_pretrained(str(many), max_shard_size="60KB")
    assert (many / "model.safetensors.index.json").exists()
    assert len(list(many.glob("*.safetensors"))) > 1
    model.to(torch.bfloat16).save_pretrained(str(half))
    spec = _import(one)
    st = _plan(spec).replicas[0][1]
    for r in range(st.tp):
        want = hf.read_shard(str(one), spec, st.layers, st.tp_split, st.ffn_split, r)
        got = hf.read_shard(str(many), spec, st.layers, st.tp_split, st.ffn_split, r)
        low = hf.read_shard(str(half), spec, st.layers, st.tp_split, st.ffn_split, r)
        assert all(torch.equal(got[n], want[n]) for n in want)
        assert all(low[n].dtype == torch.float32 for n in low)
        assert all(torch.equal(low[n], want[n].to(torch.bfloat16).float()) for n in want)


def test_weights_are_checked_against_the_config(models, tmp_path):
    """Headers only: a missing tensor or one of another shape is named before any worker starts;
    a directory without weights has none (random start)."""
    directory, _ = models["mistral"]
    spec = _import(directory)
    assert hf.check_weights(str(directory), spec)
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((directory / "config.json").read_text())
    del tensors["model.layers.2.mlp.up_proj.weight"]
    safetensors.torch.save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="no tensor model.layers.2.mlp.up_proj.weight"):
        hf.check_weights(str(broken), spec)
    tensors["model.layers.2.mlp.up_proj.weight"] = torch.zeros(95, 64)
    safetensors.torch.save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(
        ValueError, match=r"up_proj.weight has shape \[95, 64\]; config.json implies \[96, 64\]"
    ):
        hf.check_weights(str(broken), spec)
    (broken / "model.safetensors").unlink()
    assert not hf.check_weights(str(broken), spec)
