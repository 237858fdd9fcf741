"""Bring your own model and data, end to end: a tokenizer trained here on a few standard-library
files, `resihp data tokenize` on others, tiny random transformers models (Llama with GQA and
Llama 3.1 RoPE, Qwen2 with q/k/v bias and tied embeddings) saved to disk, `resihp train` on the
result through faults, replans and a resume, `resihp export` back to transformers.

Three multi-process runs, each checking several things (a spawn costs ~10 s here)."""

import os
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_models import load_hf, make_hf_model  # noqa: E402

from resihp.cli.main import main  # noqa: E402
from resihp.core.plan import Plan, Stage  # noqa: E402
from resihp.runtime.config import TrainConfig  # noqa: E402
from resihp.runtime.state.checkpoint import iter_dir, load_meta  # noqa: E402
from resihp.runtime.train import run_training  # noqa: E402

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TRAIN_TOKENIZER_ON = ("textwrap.py", "string.py", "bisect.py")
TOKENIZE = ("heapq.py", "copy.py", "fnmatch.py", "colorsys.py", "keyword.py", "abc.py")
SEQ_LEN = 64


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained tokenizer, a token file made by the CLI, and two HF model directories."""
    root = tmp_path_factory.mktemp("byo")
    lib = sysconfig.get_paths()["stdlib"]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([os.path.join(lib, f) for f in TRAIN_TOKENIZER_ON], trainer)
    tok.save(str(root / "tokenizer.json"))
    texts = root / "texts"
    texts.mkdir()
    for f in TOKENIZE:
        shutil.copy(os.path.join(lib, f), texts / f"{f}.txt")
    data = root / "data.bin"
    args = ["data", "tokenize", "--tokenizer", str(root / "tokenizer.json"), "--out", str(data), str(texts)]
    assert main(args) == 0
    make_hf_model("llama", root / "llama", seed=1)
    make_hf_model("qwen2", root / "qwen2", seed=2)
    return root


def _data_ok(world):
    """The token file holds the documents encoded by the tokenizer, each ended by its eos."""
    import numpy as np

    tok = tokenizers.Tokenizer.from_file(str(world / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    ids = np.fromfile(world / "data.bin", dtype=np.uint16)
    docs = np.split(ids, np.flatnonzero(ids == eos) + 1)[:-1]
    files = sorted((world / "texts").iterdir())
    assert len(docs) == len(files) and eos == 0
    for doc, f in zip(docs, files):
        assert doc.tolist() == tok.encode(f.read_text(), add_special_tokens=False).ids + [eos]


def _config(world, model, **run):
    raw = {
        "model": {"hf": str(world / model)},
        "parallel": {"microbatches": 2, "seq_len": SEQ_LEN},
        "data": {"path": str(world / "data.bin"), "eos_id": 0},
        "optim": {"lr": 3e-3, "warmup_iters": 3, "schedule": "cosine", "min_lr": 3e-4, "grad_clip": 0.5},
        "run": {"detect_slow": False, **run},
    }
    return raw


def _reference(config, plan):
    """The single-process oracle from the HF weights: (losses, final state, per-iteration lr and norm)."""
    from resihp.model.hf import read_full
    from resihp.runtime.reference import train_reference

    history = []
    losses, state = train_reference(
        plan.model, config.workload(), plan.global_microbatches, config.iterations,
        optim=config.optim(), init=read_full(config.weights_dir(), plan.model), history=history,
    )  # fmt: skip
    return losses, state, history


def _norms(result) -> dict[int, set[float]]:
    out: dict[int, set[float]] = {}
    for rec in result["trace"]:
        out.setdefault(rec["iter"], set()).add(rec["grad_norm"])
    return out


def _logits(model, spec, state, ids):
    from resihp.model import build_stage

    with torch.no_grad():
        ours = build_stage(spec, state=state)(ids, torch.zeros_like(ids), torch.arange(len(ids)))
        return ours, model(ids[None]).logits[0]


@pytest.mark.slow
def test_llama_through_a_fail_stop_a_resume_and_export(world, tmp_path):
    """Llama (GQA, Llama 3.1 RoPE) on the tokenized file, tp 2 x pp 2 x dp 2 with uneven head and
    FFN splits that differ between replicas, cosine schedule with warm-up and clipping, 20
    iterations with device 5 stopping at iteration 10: the losses and global gradient norms equal
    the single-process reference's (1e-6 relative while the plan is the initial one, 1e-4 after
    the replan); the checkpoint written under the post-failure plan exports to a transformers
    model whose logits equal the reference's after the same 20 steps at 1e-4. Resumed from the
    iteration-10 checkpoint under another plan (tp 1 x pp 2 x dp 2), iterations 10..19 read the
    same samples: their losses equal the uninterrupted run's at 1e-5."""
    _data_ok(world)
    ckpt, faults = tmp_path / "ck", tmp_path / "faults.toml"
    faults.write_text("[[faults]]\nkind = 'stop'\ndevice = 5\nat_iter = 10\n")
    raw = _config(
        world, "llama", iterations=20, checkpoint_every=10, checkpoint_dir=str(ckpt), faults=str(faults)
    )
    config = TrainConfig.from_dict(raw)
    spec = config.spec
    r0 = (Stage((0, 1), (0, 2), (5, 3), (60, 36)), Stage((2, 3), (2, 4), (3, 5), (40, 56)))
    r1 = (Stage((4, 5), (0, 2), (3, 5), (50, 46)), Stage((6, 7), (2, 4), (6, 2), (70, 26)))
    plan = Plan(spec, (r0, r1), (2, 2))
    result = run_training(config, plan, progress=False)
    losses = [r["loss"] for r in result["iterations"]]
    ref, ref_state, history = _reference(config, plan)
    assert {"inject-stop", "fail-stop", "replan"} <= {e["kind"] for e in result["events"] if e["iter"] == 10}
    assert losses[:10] == pytest.approx(ref[:10], rel=1e-6)
    assert losses == pytest.approx(ref, rel=1e-4)
    norms = _norms(result)
    for it in range(20):
        assert len(norms[it]) == 1, norms[it]  # every device computed the same global norm
        (got,) = norms[it]
        assert got == pytest.approx(history[it]["grad_norm"], rel=1e-6 if it < 10 else 1e-4), it
    assert history[0]["grad_norm"] > 0.5  # clipping was active
    assert [h["lr"] for h in history[:4]] == pytest.approx([1e-3, 2e-3, 3e-3, 3e-3])

    meta = load_meta(iter_dir(str(ckpt), 20))
    assert meta["plan"]["generation"] >= 1 and meta["plan"] != plan.to_dict()  # under the replanned plan
    assert meta["data"]["tokens"] == 20 * 4 * SEQ_LEN and meta["hf_config"]["architectures"] == [
        "LlamaForCausalLM"
    ]
    out = tmp_path / "exported"
    assert main(["export", str(ckpt), "--hf", str(out)]) == 0
    model, info = load_hf(out)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids = torch.arange(SEQ_LEN) * 7 % 300
    ours, theirs = _logits(model, spec, ref_state, ids)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)

    again = TrainConfig.from_dict(_config(world, "llama", iterations=20, workers=4))
    other = Plan.uniform(spec, 1, 2, 2, 2)
    resumed = run_training(again, other, progress=False, resume=iter_dir(str(ckpt), 10))
    assert [r["iter"] for r in resumed["iterations"]] == list(range(10, 20))
    assert [r["loss"] for r in resumed["iterations"]] == pytest.approx(losses[10:], rel=1e-5)


@pytest.mark.slow
def test_qwen2_lr0_round_trip_is_bitwise(world, tmp_path, capsys):
    """Qwen2 (q/k/v bias, tied embeddings) through `resihp train` at lr = 0, tp 3 (heads 3/3/2, kv
    heads replicated) x pp 2, with clipping on: the global gradient norms — the tied embedding's
    gradient summed from both stages, counted once — equal the reference's at 1e-6, and `resihp
    export` gives back every input tensor bitwise, loading in transformers without a missing or
    unexpected key."""
    ckpt = tmp_path / "ck"
    raw = _config(world, "qwen2", iterations=2, workers=6, checkpoint_every=2, checkpoint_dir=str(ckpt))
    raw["parallel"].update(tp=3, pp=2, dp=1)
    raw["optim"] = {"lr": 0.0, "grad_clip": 1.0}
    cfg_file = tmp_path / "train.toml"
    cfg_file.write_text(_toml(raw))
    run_json = tmp_path / "run.json"
    assert main(["train", "--config", str(cfg_file), "--quiet", "--json", str(run_json)]) == 0
    printed = capsys.readouterr().out
    assert f"weights: {world / 'qwen2'}" in printed and f"data: {world / 'data.bin'}" in printed
    import json

    result = json.loads(run_json.read_text())
    config = TrainConfig.from_dict(raw)
    plan = config.plan()
    assert plan.replicas[0][0].tp_split == (3, 3, 2)
    ref, _, history = _reference(config, plan)
    assert [r["loss"] for r in result["iterations"]] == pytest.approx(ref, rel=1e-6)
    norms = _norms(result)
    for it in range(2):
        (got,) = norms[it]
        assert got == pytest.approx(history[it]["grad_norm"], rel=1e-6)
    out = tmp_path / "exported"
    assert main(["export", str(ckpt), "--hf", str(out)]) == 0
    before = safetensors_torch.load_file(str(world / "qwen2" / "model.safetensors"))
    after = safetensors_torch.load_file(str(out / "model.safetensors"))
    assert after.keys() == before.keys() and "lm_head.weight" not in after
    assert all(torch.equal(after[k], before[k]) for k in before)
    model, info = load_hf(out)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert model.config.tie_word_embeddings
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


def _toml(raw: dict) -> str:
    lines = []
    for section, body in raw.items():
        lines.append(f"[{section}]")
        for k, v in body.items():
            lines.append(f"{k} = {v!r}" if not isinstance(v, bool) else f"{k} = {str(v).lower()}")
    return "\n".join(lines).replace("'", '"') + "\n"


def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys):
    """`export` without a checkpoint, `tokenize` with a missing tokenizer, one without a known
    end-of-document token, or an id outside its vocabulary: exit 2, one line naming the input."""
    import numpy as np

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    plain = str(tmp_path / "plain.json")
    tok.save(plain)
    text = tmp_path / "t.txt"
    text.write_text("a b a")
    out = str(tmp_path / "o.bin")
    tokenize = ["data", "tokenize", "--out", out, str(text), "--tokenizer"]
    cases = [
        (["export", str(tmp_path), "--hf", str(tmp_path / "x")], "no complete checkpoint"),
        (tokenize + [str(tmp_path / "none.json")], "no such file"),
        (tokenize + [plain], "give --eos-id"),
        (tokenize + [plain, "--eos-id", "3"], "--eos-id 3: outside the tokenizer's vocabulary of 3"),
        (tokenize + [str(text)], "not a tokenizer.json"),
    ]
    for argv, match in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert match in err and len(err.splitlines()) == 1, err
    assert not os.path.exists(out)
    twice = ["data", "tokenize", "--tokenizer", plain, "--out", out, "--eos-id", "2", str(text), str(text)]
    assert main(twice) == 0  # one document per file
    assert np.fromfile(out, dtype=np.uint16).tolist() == [0, 1, 0, 2, 0, 1, 0, 2]
