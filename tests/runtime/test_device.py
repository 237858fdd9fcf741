"""Device backend configuration: `run.device`, `run.backend`, `run.precision`,
`model.activation_checkpointing`, and the GPU checks that run before any process starts."""

import subprocess
import sys

import pytest
import torch

from resihp.core.model_spec import model_preset
from resihp.core.plan import Plan
from resihp.runtime.checks import check_fits
from resihp.runtime.config import TrainConfig
from resihp.runtime.exec.device import check_cuda, local_rank


def test_defaults_and_keys():
    """cpu / gloo / fp32 / no checkpointing by default; nccl is the default on cuda; the keys load."""
    cfg = TrainConfig()
    assert (cfg.device, cfg.backend_name, cfg.precision, cfg.activation_checkpointing) == (
        "cpu", "gloo", "fp32", False,
    )  # fmt: skip
    cfg = TrainConfig.from_dict(
        {"run": {"device": "cuda", "precision": "bf16"}, "model": {"activation_checkpointing": True}}
    )
    assert (cfg.device, cfg.backend_name, cfg.precision, cfg.activation_checkpointing) == (
        "cuda", "nccl", "bf16", True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"run": {"device": "tpu"}}, r"run\.device = 'tpu': allowed: cpu, cuda"),
        ({"run": {"backend": "mpi"}}, r"run\.backend = 'mpi': allowed: gloo, nccl"),
        ({"run": {"backend": "nccl"}}, r"run\.backend = 'nccl' with run\.device = 'cpu': allowed: 'gloo'"),
        ({"run": {"device": "cuda", "backend": "gloo"}}, r"run\.backend = 'gloo' with run\.device = 'cuda'"),
        ({"run": {"precision": "fp16"}}, r"run\.precision = 'fp16': allowed: fp32, bf16"),
        ({"model": {"activation_checkpointing": 1}}, r"model\.activation_checkpointing = 1: must be true"),
    ],
)
def test_bad_device_values_name_the_key(changes, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(changes)


def test_gpus_are_checked_and_the_cpu_limit_is_the_cpus_only():
    """Each member gets the GPU of its local rank; too few GPUs, none, or several nodes sharing this
    host's GPUs fail in one line; the cores limit applies to CPU workers only."""
    assert [local_rank(d, 4) for d in (0, 3, 4, 7)] == [0, 3, 0, 3] and local_rank(5, None) == 5
    check_cuda(list(range(8)), None, available=8)
    with pytest.raises(ValueError, match=r"the job needs 8 GPUs on this host, it has 2"):
        check_cuda(list(range(8)), None, available=2)
    with pytest.raises(ValueError, match=r"run\.device = 'cuda': this machine has no CUDA device"):
        check_cuda([0], None, available=0)
    with pytest.raises(ValueError, match=r"run\.devices_per_node = 4: the 2 nodes' agents"):
        check_cuda(list(range(8)), 4, available=8)
    big = Plan.uniform(model_preset("tiny"), 1, 1, 4096, 1)
    with pytest.raises(ValueError, match="cores"):
        check_fits(big, 4096)
    check_fits(big, 4096, "cuda")  # the GPUs are the limit there (check_cuda)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_train_on_cuda_without_cuda_exits_2_in_one_line(tmp_path):
    """`resihp train` with run.device = "cuda" on a machine without CUDA: exit 2, one line, before
    any worker starts."""
    cfg = tmp_path / "cuda.toml"
    cfg.write_text('[run]\ndevice = "cuda"\niterations = 2\n')
    proc = subprocess.run(
        [sys.executable, "-m", "resihp.cli.main", "train", "--config", str(cfg), "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "no CUDA device" in lines[0], proc.stderr


def test_an_agent_checks_its_own_machine_for_the_nodes_gpus():
    """A `resihp agent` of a controller run refuses a node it cannot serve, in one line: other
    `--devices` than run.devices_per_node; on CUDA fewer GPUs than the node's devices (the
    controller's host is not asked: its GPUs are not the nodes')."""
    from resihp.runtime.control.serve import check_node

    info = {"controller_timeout_s": 2.0, "devices_per_node": 4, "device": "cuda"}
    assert check_node(info, 4, available=4) is None and check_node(info, None, available=8) is None
    needs = "run.device = 'cuda': the job needs 4 GPUs on this host, it has 2"
    assert check_node(info, 4, available=2) == needs
    assert "no CUDA device" in check_node(info, None, available=0)
    assert check_node(info, 2, available=8) == "--devices = 2, but the run has run.devices_per_node = 4"
    assert check_node({**info, "device": "cpu"}, None, available=0) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_a_cuda_controller_run_is_refused_by_the_agent_on_a_machine_without_gpus(tmp_path):
    """`resihp controller` of a CUDA run on this GPU-less host starts (the nodes' GPUs are the
    agents' to check); its agent here exits 2 with one line naming the node and why."""
    import socket

    cfg = tmp_path / "cuda-nodes.toml"
    cfg.write_text(
        "[parallel]\ntp = 1\npp = 1\ndp = 2\n[run]\n"
        'device = "cuda"\nworkers = 2\niterations = 2\nnodes = 1\ndevices_per_node = 2\n'
        "controller_wait_s = 60\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cli = [sys.executable, "-m", "resihp.cli.main"]
    controller = subprocess.Popen(
        [*cli, "controller", "--config", str(cfg), "--listen", f"127.0.0.1:{port}", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        agent = subprocess.run(
            [*cli, "agent", "--controller", f"127.0.0.1:{port}", "--node-rank", "0", "--wait-s", "60"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert controller.poll() is None, controller.stderr.read()  # still waiting for its agent
    finally:
        controller.kill()
        controller.wait()
    lines = agent.stderr.strip().splitlines()
    assert agent.returncode == 2, agent.stderr
    assert len(lines) == 1 and lines[0].startswith("resihp agent: node 0: run.device = 'cuda'"), agent.stderr
    assert "no CUDA device" in lines[0]
