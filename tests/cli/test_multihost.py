"""`resihp controller` and `resihp agent` as separate OS processes, the agents advertising 127.0.0.2
and 127.0.0.3 as if on two hosts: run.devices_per_node = 4, (tp 2, pp 2, dp 2), one replica per
node. Every process is started in its own session, so that "nothing left running" is checked on
whole process trees (agents, their forkservers and members)."""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from resihp.runtime.state.verify import newest_usable

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ITERATIONS = 12
CONFIG = """
[parallel]
tp = 2
pp = 2
dp = 2
microbatches = 2
seq_len = 32
[run]
workers = 8
iterations = {iterations}
devices_per_node = 4
nodes = 2
controller_timeout_s = 2.0
controller_wait_s = 120
detect_slow = false
"""


def _config(tmp_path, iterations: int = ITERATIONS) -> str:
    path = tmp_path / "two-nodes.toml"
    path.write_text(CONFIG.format(iterations=iterations))
    return str(path)


def _resihp(*args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "resihp.cli.main", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
        env={**os.environ, "PYTHONPATH": ROOT}, start_new_session=True,
    )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent(port: int, k: int) -> subprocess.Popen:
    return _resihp("agent", "--controller", f"127.0.0.1:{port}", "--node-rank", str(k), "--devices", "4",
                   "--advertise", f"127.0.0.{k + 2}")  # fmt: skip


def _agents(port: int) -> list[subprocess.Popen]:
    return [_agent(port, k) for k in range(2)]


def _session(sid: int, parents: bool = False) -> list[int] | dict[int, int]:
    """The processes of session `sid` still running (zombies excluded); with `parents`, pid -> ppid."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                out[int(entry)] = int(fields[1])
    return out if parents else list(out)


def _members(agent: subprocess.Popen) -> list[int]:
    """The agent's processes that are not its own helpers (its forkserver, multiprocessing's resource
    tracker: its children): the members, forked by the forkserver."""
    return [pid for pid, ppid in _session(agent.pid, parents=True).items() if agent.pid not in (pid, ppid)]


def _line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The next line `proc` writes on stderr, waiting up to `timeout_s` ("" if none came)."""
    ready, _, _ = select.select([proc.stderr], [], [], timeout_s)
    return proc.stderr.readline() if ready else ""


def _tcp(pids: list[int]) -> list[tuple[str, str, int, str]]:
    """(local address, remote address, remote port, state: LISTEN | other) of the TCP sockets the
    processes `pids` hold (IPv4, /proc/net/tcp)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:  # gone meanwhile
            continue

    def ip_port(field: str) -> tuple[str, int]:
        ip, port = field.split(":")
        return socket.inet_ntoa(bytes.fromhex(ip)[::-1]), int(port, 16)

    out = []
    with open("/proc/net/tcp") as f:
        for row in f.read().splitlines()[1:]:
            cols = row.split()
            if cols[9] in inodes:
                (local, _), (remote, rport) = ip_port(cols[1]), ip_port(cols[2])
                out.append((local, remote, rport, "LISTEN" if cols[3] == "0A" else "other"))
    return out


def _none_left(procs, within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while any(_session(p.pid) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for p in procs for pid in _session(p.pid)]


def _losses(path) -> list[tuple[int, float]]:
    return [(r["iter"], r["loss"]) for r in json.loads(open(path).read())["iterations"]]


def _kill_all(procs) -> None:
    for p in procs:
        for pid in _session(p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[tuple[int, float]]:
    """The losses of `resihp train` with the same config (run.nodes is the controller's key only)."""
    tmp = tmp_path_factory.mktemp("train")
    out = tmp / "train.json"
    proc = _resihp("train", "--config", _config(tmp), "--json", str(out), "--quiet")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return _losses(out)


def test_two_agents_match_train_then_finish_on_one_node_when_the_other_is_killed(tmp_path, reference):
    """Fault-free: losses equal `resihp train`'s (1e-6), every process exits 0 and none is left.
    Then, after iteration 3, the members' gloo groups listen on their node's advertised address
    (127.0.0.2, 127.0.0.3) and connect to the peers' (gloo leaves a connection's source address to
    the kernel); `kill -9` of node 1's agent: its
    members go with it, the controller declares the silent node dead (a fail-stop of devices 4-7,
    cause "node"), replica 0 runs on and the run finishes: losses equal the fault-free run's
    (1e-4), iterations 0..11 each once; node 0's agent exits 0 and nothing is left running."""
    cfg, port = _config(tmp_path), _free_port()
    out = tmp_path / "controller.json"
    controller = _resihp("controller", "--config", cfg, "--listen", f"127.0.0.1:{port}", "--json", str(out),
                         "--quiet")  # fmt: skip
    agents = _agents(port)
    procs = [controller, *agents]
    try:
        _, err = controller.communicate(timeout=300)
        assert controller.returncode == 0, err
        for a in agents:
            a.wait(timeout=30)
            assert a.returncode == 0 and a.stderr.read() == "", a.stderr.read()
        got = _losses(out)
        assert [i for i, _ in got] == list(range(ITERATIONS))
        assert [x for _, x in got] == pytest.approx([x for _, x in reference], rel=1e-6, abs=1e-6)
        assert _none_left(procs) == []

        port = _free_port()
        out = tmp_path / "killed.json"
        controller = _resihp("controller", "--config", cfg, "--listen", f"127.0.0.1:{port}", "--json",
                             str(out))  # fmt: skip
        agents = _agents(port)
        procs = [controller, *agents]
        line = ""
        while not line.startswith("iter 3/"):
            line = controller.stderr.readline()
            assert line, "the controller ended before iteration 3"
        advertised = {"127.0.0.2", "127.0.0.3"}
        for k, agent in enumerate(agents):  # each node's members listen on its --advertise address
            sockets = [s for s in _tcp(_session(agent.pid)) if s[2] != port]  # (not the store's)
            assert {s[0] for s in sockets if s[3] == "LISTEN"} == {f"127.0.0.{k + 2}"}, sockets
            # connections: accepted on that address, or made to a peer's (the kernel picks the source)
            links = [s for s in sockets if s[3] != "LISTEN"]
            assert links and all(s[0] == f"127.0.0.{k + 2}" or s[1] in advertised for s in links), links
        os.kill(agents[1].pid, signal.SIGKILL)
        _, err = controller.communicate(timeout=300)
        assert controller.returncode == 0, err
        agents[0].wait(timeout=30)
        assert agents[0].returncode == 0
        run = json.loads(out.read_text())
        stops = [(e["devices"], e["cause"]) for e in run["events"] if e["kind"] == "fail-stop"]
        assert sorted(d for ds, c in stops for d in ds) == [4, 5, 6, 7] and {c for _, c in stops} == {"node"}
        got = _losses(out)
        assert [i for i, _ in got] == list(range(ITERATIONS)), "committed history with a gap or a repeat"
        assert [x for _, x in got] == pytest.approx([x for _, x in reference], rel=1e-4)
        assert _none_left(procs) == []
    finally:
        _kill_all(procs)


def test_a_killed_controller_fences_both_agents_and_one_restarted_at_its_address_readmits_them(
    tmp_path, reference
):
    """A checkpoint every 4 iterations; `kill -9` of the controller after iteration 6: both agents
    kill their members within run.controller_timeout_s (2 s) + 2 s and say so in one line, then
    wait (for run.controller_wait_s, 120 s) with nothing of theirs left running but themselves and
    their forkserver. SIGTERM ends node 1's waiting agent (exit 143, nothing left). A new
    controller with `--resume` on the same address re-admits node 0's still-waiting agent (a fresh
    registration: one more line) and a restarted agent of node 1, and finishes the run from the
    last checkpoint (iteration c = 4, or 8 when that one was written before the kill): iterations
    c..11 each once, losses equal an uninterrupted run's (1e-4); both agents exit 0, nothing is
    left running."""
    cfg, port, ckpt = _config(tmp_path), _free_port(), tmp_path / "ckpt"
    address = f"127.0.0.1:{port}"
    controller = _resihp("controller", "--config", cfg, "--listen", address, "--checkpoint-every", "4",
                         "--checkpoint-dir", str(ckpt))  # fmt: skip
    agents = _agents(port)
    procs = [controller, *agents]
    try:
        line = ""
        while not line.startswith("iter 6/"):
            line = controller.stderr.readline()
            assert line, "the controller ended before iteration 6"
        assert all(len(_members(a)) == 4 for a in agents)
        os.kill(controller.pid, signal.SIGKILL)
        t0 = time.monotonic()
        lines = [_line(a, 10.0).strip() for a in agents]
        while any(_members(a) for a in agents) and time.monotonic() - t0 < 10.0:
            time.sleep(0.05)
        took = time.monotonic() - t0
        assert not any(_members(a) for a in agents) and took < 2.0 + 2.0, took
        assert lines == [
            f"resihp agent: node {k}: controller at {address} unreachable for 2 s; killed 4 member(s), "
            f"waiting up to 120 s for a new controller at {address}"
            for k in range(2)
        ], lines
        assert [a.poll() for a in agents] == [None, None], "an agent stopped waiting"
        agents[1].send_signal(signal.SIGTERM)
        assert agents[1].wait(timeout=30) == 143
        assert agents[1].stderr.read() == "resihp: terminated\n"
        assert _none_left([agents[1]]) == []
        start = newest_usable(str(ckpt))[1]["iteration"]  # 4, or 8 if it was written before the kill
        assert start in (4, 8)

        out = tmp_path / "resumed.json"
        controller = _resihp("controller", "--config", cfg, "--listen", address, "--resume", str(ckpt),
                             "--json", str(out), "--quiet")  # fmt: skip
        agents = [agents[0], _agent(port, 1)]
        procs = [controller, *agents]
        _, err = controller.communicate(timeout=300)
        assert controller.returncode == 0, err
        got = _losses(out)
        assert [i for i, _ in got] == list(range(start, ITERATIONS)), (
            "committed history with a gap or a repeat"
        )
        assert [x for _, x in got] == pytest.approx([x for _, x in reference[start:]], rel=1e-4)
        for a in agents:
            a.wait(timeout=30)
        errs = [a.stderr.read() for a in agents]
        assert [a.returncode for a in agents] == [0, 0], errs
        assert errs == [f"resihp agent: node 0: a new controller at {address}; registering with it\n", ""]
        assert _none_left(procs) == []
    finally:
        _kill_all(procs)
