"""The DCP checkpoint format in one process: owned chunks tile every tensor under uneven TP and
replicated kv heads, DCP reads them back bitwise into full tensors, every damaged piece is caught
by `verify` with a fallback to the previous checkpoint, retention keeps the newest K."""

import json
import os
import re

import pytest
import torch

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan, Stage
from resihp.model import init_state, slice_tensor, stage_param_names
from resihp.runtime.state import chunks
from resihp.runtime.state.checkpoint import Saver, load_full, load_init, load_meta, prune, savers, write_meta
from resihp.runtime.state.layout import complete, iter_dir
from resihp.runtime.state.transfer import Holding
from resihp.runtime.state.verify import check_model, newest_usable, verify

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)  # GQA: 4 query heads per kv head
# TP 3 with (3, 3, 2) heads: kv head 0 is read by ranks 0 and 1 (replicated), FFN split unevenly
R0 = (Stage((0, 1, 2), (0, 1), (3, 3, 2), (20, 16, 12)), Stage((3,), (1, 4), (8,), (48,)))
R1 = (Stage((4,), (0, 1), (8,), (48,)), Stage((5, 6), (1, 4), (5, 3), (10, 38)))
PLAN = Plan(SPEC, (R0, R1), (2, 2), "1f1b")


def _full(seed: int):
    params = init_state(SPEC, seed)
    moments = tuple({n: t * (k + 2) for n, t in params.items()} for k in range(2))
    return params, moments


def _holding(plan: Plan, device: int, full) -> Holding:
    r, i = plan.stage_of(device)
    st = plan.replicas[r][i]
    rank = st.devices.index(device)
    names = stage_param_names(SPEC, st.layers)

    def cut(d):
        return {n: slice_tensor(SPEC, n, d[n], st.tp_split, st.ffn_split, rank) for n in names}

    return Holding(cut(full[0]), (cut(full[1][0]), cut(full[1][1])))


def _write(root: str, iteration: int, full, mode: str = "sync", keep=None) -> str:
    saver = Saver(mode)
    for d in savers(PLAN):
        assert saver.save(root, iteration, 0, PLAN, d, _holding(PLAN, d, full))
    assert [k for k, _ in saver.wait()] == [iteration] * len(savers(PLAN))
    return write_meta(root, iteration, PLAN, keep=keep)


def test_chunks_tile_every_tensor_and_load_back_bitwise_into_any_plan(tmp_path):
    """Every device writes only what it owns (rank 0's copy of kv head 0 and of the norms); the
    merged metadata's chunks tile each tensor; full tensors and moments read back bitwise, also
    with the background writer (`async_save`), and a stage of another plan loads its names only."""
    root = str(tmp_path)
    full = _full(1)
    path = _write(root, 3, full, mode="async")
    meta = load_meta(path)
    assert meta["iteration"] == 3 and meta["moments"] and meta["savers"] == [0, 1, 2, 3]
    assert json.loads(json.dumps(meta)) == meta  # plain JSON: nothing pickled
    got = load_full(path)
    for n, t in full[0].items():
        assert torch.equal(got.params[n], t), n
        assert torch.equal(got.moments[0][n], full[1][0][n]) and torch.equal(got.moments[1][n], full[1][1][n])
    assert got.steps == 3
    other = Plan.uniform(SPEC, 1, 2, 1, 2)
    init = load_init(path, other, other.replicas[0][1].devices[0])
    assert sorted(init.params) == sorted(stage_param_names(SPEC, other.replicas[0][1].layers))
    # rank 1 of stage (0, 1, 2) holds kv head 0 too, but rank 0 owns it: one chunk per row range
    md = chunks.merge(path, [f"dev{d}" for d in savers(PLAN)])
    wk = md.state_dict_metadata["param/layers.0.attn.wk"].chunks
    assert sorted((c.offsets[0], c.sizes[0]) for c in wk) == [(0, 4), (4, 4)]


def test_check_cover_rejects_overlapping_and_missing_chunks():
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata as C
    from torch.distributed.checkpoint.metadata import TensorProperties, TensorStorageMetadata

    def md(*spans):
        return TensorStorageMetadata(
            TensorProperties(),
            torch.Size([8, 4]),
            [C(torch.Size([a, 0]), torch.Size([n, 4])) for a, n in spans],
        )

    chunks.check_cover("x", md((0, 4), (4, 4)))
    with pytest.raises(ValueError, match="do not tile"):
        chunks.check_cover("x", md((0, 4), (2, 4)))
    with pytest.raises(ValueError, match="do not tile"):
        chunks.check_cover("x", md((0, 4)))


def _damage(path: str, how: str) -> str:
    shard = os.path.join(path, "dev2", "__0_0.distcp")
    if how == "truncated shard":
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) // 2)
    elif how == "deleted shard":
        os.remove(shard)
    elif how == "garbage shard":
        size = os.path.getsize(shard)
        with open(shard, "wb") as f:
            f.write(os.urandom(size))
    elif how == "truncated metadata":
        meta = os.path.join(path, "meta.json")
        with open(meta, "r+b") as f:
            f.truncate(os.path.getsize(meta) // 2)
    elif how == "truncated DCP metadata":
        md = os.path.join(path, ".metadata")
        with open(md, "r+b") as f:
            f.truncate(os.path.getsize(md) - 3)
    return REASONS[how]


REASONS = {
    "truncated shard": "dev2/__0_0.distcp has",
    "deleted shard": "dev2/__0_0.distcp is missing",
    "garbage shard": "dev2/__0_0.distcp is corrupt",
    "truncated metadata": "meta.json is not valid JSON",
    "truncated DCP metadata": ".metadata has",
}


@pytest.mark.parametrize(
    "how",
    ["truncated shard", "deleted shard", "garbage shard", "truncated metadata", "truncated DCP metadata"],
)
def test_a_damaged_checkpoint_falls_back_to_the_previous_one_with_one_line(tmp_path, how):
    root = str(tmp_path)
    _write(root, 3, _full(1))
    newest = _write(root, 6, _full(2))
    assert newest_usable(root) == (newest, load_meta(newest))
    assert newest_usable(root, at_most=5)[0] == iter_dir(root, 3)  # (a restart before iteration 6)
    reason = _damage(newest, how)
    with pytest.raises(ValueError, match="^" + re.escape(reason)):
        verify(newest)  # (the message lacks the directory: newest_usable adds it)
    lines = []
    for path in (root, newest):  # the checkpoint_dir, or the damaged checkpoint itself
        got, meta = newest_usable(path, warn=lines.append)
        assert got == iter_dir(root, 3) and meta["iteration"] == 3
    assert len(lines) == 2 and all("skipping iter_00000006: " + reason in ln for ln in lines), lines
    assert all("resuming from iter_00000003 (iteration 3)" in ln and "\n" not in ln for ln in lines)
    _damage(iter_dir(root, 3), "deleted shard")
    with pytest.raises(
        ValueError, match=r"^--resume .*: no complete checkpoint \(iter_00000006: .*; iter_00000003"
    ):
        newest_usable(root)


def test_retention_keeps_the_newest_k_complete_checkpoints(tmp_path):
    """keep = 2: after the third checkpoint the first is removed; an incomplete older directory
    (a crash mid-save) goes too, a newer incomplete one (in flight) stays."""
    root = str(tmp_path)
    full = _full(1)
    _write(root, 2, full, keep=2)
    os.makedirs(os.path.join(iter_dir(root, 3), "dev0"))  # crashed mid-save
    _write(root, 4, full, keep=2)
    assert complete(root) == [2, 4] and os.path.isdir(iter_dir(root, 3))
    os.makedirs(os.path.join(iter_dir(root, 8), "dev0"))  # in flight
    _write(root, 6, full, keep=2)
    assert complete(root) == [4, 6]
    assert not os.path.exists(iter_dir(root, 2)) and not os.path.exists(iter_dir(root, 3))
    assert os.path.isdir(iter_dir(root, 8))
    assert prune(root, 1) == [4] and complete(root) == [6]


def test_another_model_is_refused_naming_the_field(tmp_path):
    path = _write(str(tmp_path), 3, _full(1))
    meta = load_meta(path)
    check_model(meta, SPEC, "--resume x")
    wider = ModelSpec("t", 4, 32, 8, 2, 64, 256)
    with pytest.raises(
        ValueError, match=r"^--resume x: the checkpoint's model has ffn = 48, the config's model\.ffn = 64"
    ):
        check_model(meta, wider, "--resume x")


def test_resume_warns_once_and_refuses_another_model_before_any_process(tmp_path, capsys):
    """`resihp train --resume`: a damaged newest checkpoint is skipped with one warning line; a
    checkpoint of another model exits 2 with one line naming the field, before anything starts."""
    from resihp.cli.main import main

    root = str(tmp_path / "ck")
    _write(root, 2, _full(1))
    _damage(_write(root, 4, _full(1)), "truncated shard")
    assert main(["train", "--resume", root, "--iterations", "8", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith(
        f"resihp: warning: --resume {root}: skipping iter_00000004: dev2/__0_0.distcp has"
    )
    assert err[0].endswith("resuming from iter_00000002 (iteration 2)")
    assert re.match(r"resihp: error: --resume .*iter_00000002: the checkpoint's model has \w+ = ", err[1]), (
        err
    )


def test_without_a_cpu_backend_the_write_runs_on_the_savers_own_thread(tmp_path, monkeypatch):
    """An NCCL member's default group has no CPU backend, which `async_save` refuses: the same
    files come from the Saver's own thread, and read back bitwise."""
    from resihp.runtime.state import checkpoint

    monkeypatch.setattr(checkpoint, "_cpu_backend", lambda: False)
    full = _full(3)
    path = _write(str(tmp_path), 2, full, mode="async")
    got = load_full(path)
    assert all(torch.equal(got.params[n], t) for n, t in full[0].items())
    assert verify(path)["iteration"] == 2


def test_verification_imports_without_torch():
    """`--resume` is checked before the runtime (and torch) loads: `state.verify` is torch-free."""
    import subprocess
    import sys

    code = "import sys, resihp.runtime.state.verify; assert 'torch' not in sys.modules, 'torch imported'"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": repo})
