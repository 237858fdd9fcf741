"""A node agent started on its own machine (`resihp agent --controller HOST:PORT --node-rank K`).

`serve` waits for the controller's store (`wait_for_controller`, up to `--wait-s`, 60 s by
default: the controller may start later), reads what the controller published (`hosting.run_info`:
its fencing timeout, its `run.controller_wait_s`, the devices per node, the device kind), checks
that this node can serve the run (`check_node`: its `--devices` against the devices per node; on
CUDA, this machine's GPUs), has the members bind their gloo groups to the `--advertise` address
(`bind.py`; unless the user set `GLOO_SOCKET_IFNAME`: gloo then binds to that interface), then
runs the agent (`agent.agent_main`, which registers by beating). The agent is never forked by the
controller; a cluster manager (Slurm's `srun`, a Kubernetes pod) starts one per node
(docs/deploy.md).

When the controller is out of reach for its `run.controller_timeout_s`, the agent kills its
members (one line) and waits, at the same address, up to `--wait-s` — by default the
`run.controller_wait_s` the lost controller published — for a controller of another incarnation
(one restarted there, `resihp controller --resume DIR`), and registers with it afresh: new
channels, a new fence baseline, no member of before. It never serves the controller it fenced
itself from again (that one fences the node, and replans without it, once it hears nothing of
it), so a fenced node never rejoins the generation it was fenced from.

Exit codes: 0 after the controller's `Shutdown`; 2 with one line when no controller came at the
start or the node does not fit the run; `agent.FENCED_EXIT` when the controller fenced the node,
or, lost, no new controller came within the wait (one more line); 130 / 143 on SIGINT / SIGTERM
(its members killed first; while waiting: `resihp: interrupted` / `terminated`, as any command).

Torch-free at import.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import sys
import time

from . import bind
from .agent import FENCED_EXIT, agent_main
from .hosting import RUN_KEY, run_info
from .transport import Transport, Unreachable, load_quietly

WAIT_S = 60.0  # default `--wait-s` at the start: how long an agent waits for its controller to come up
POLL_S = 0.2  # a waiting agent looks for a controller this often


def parse_address(text: str, flag: str) -> tuple[str, int]:
    """HOST:PORT -> (host, port); ValueError naming the flag otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{flag} = {text!r}: must be HOST:PORT (a port in 0..65535)")
    return host, int(port)


def interface_of(address: str) -> str:
    """The name of the network interface whose IPv4 network holds `address` (127.0.0.2: `lo`)."""
    try:
        addr = ipaddress.IPv4Address(socket.gethostbyname(address))
    except (OSError, ValueError):
        raise ValueError(f"--advertise = {address!r}: not an IPv4 address or a resolvable host") from None
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            packed = struct.pack("256s", name[:15].encode())
            try:
                ip = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), 0x8915, packed)[20:24])  # SIOCGIFADDR
                mask = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), 0x891B, packed)[20:24])  # SIOCGIFNETMASK
            except OSError:  # no IPv4 address
                continue
            if addr in ipaddress.IPv4Network(f"{ip}/{mask}", strict=False):
                return name
    finally:
        probe.close()
    raise ValueError(f"--advertise = {address!r}: no interface of this host has that address")


def wait_for_controller(transport: Transport, wait_s: float, lost: str | None = None) -> dict | None:
    """What the controller at the transport's address published (`hosting.run_info`), once one
    whose incarnation is not `lost` (the one this agent fenced itself from) is there; looked for
    every `POLL_S` (the store out of reach, or not set up yet, is looked at again), for up to
    `wait_s` (once at least); None when none came."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            data = transport.value(RUN_KEY)
        except Unreachable:
            data = None
        if data is not None:
            info = run_info(data)
            if info["incarnation"] != lost:
                return info
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


def serve(
    host: str, port: int, node: int, devices: int | None, advertise: str | None, wait_s: float | None
) -> int:
    """Run node `node`'s agent for the controller at (`host`, `port`), and for each new controller
    there after it lost one; the exit status. `wait_s`: `--wait-s` (None: 60 s at the start, then
    the lost controller's `run.controller_wait_s`)."""
    load_quietly("TORCH_CPP_LOG_LEVEL" in os.environ)  # waiting for a controller says nothing per try
    if advertise is not None and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface_of(advertise)  # an address of this host (else exit 2 naming it)
        bind.advertise(socket.gethostbyname(advertise))  # the members' gloo binds to it (bind.py)
    transport, where = Transport(host, port), f"controller at {host}:{port}"
    first_s = WAIT_S if wait_s is None else wait_s
    info = wait_for_controller(transport, first_s)
    if info is None:
        return _fail(node, f"no {where} within {first_s:g} s (--wait-s)")
    while True:
        why = check_node(info, devices)
        if why is not None:
            return _fail(node, why)
        key = "--wait-s" if wait_s is not None else "run.controller_wait_s"
        again_s = wait_s if wait_s is not None else info["controller_wait_s"]
        then = f"waiting up to {again_s:g} s for a new {where}"
        code = agent_main(node, transport, info["controller_timeout_s"], say=True, then=then)
        if code != FENCED_EXIT:  # 0: the job ended
            return code
        info = wait_for_controller(transport, again_s, lost=info["incarnation"])
        if info is None:
            _fail(node, f"no new {where} within {again_s:g} s ({key}); exiting")
            return FENCED_EXIT
        _say(node, f"a new {where}; registering with it")


def check_node(info: dict, devices: int | None, available: int | None = None) -> str | None:
    """Why this node cannot serve the run the controller published (`info`: `hosting.run_info`), or
    None: `--devices` (`devices`) other than run.devices_per_node; on run.device = "cuda", fewer GPUs
    on this machine than the node's devices (each member takes the GPU of its local rank:
    `exec.device.check_cuda`, the one rule; torch imported only then). `available`: the GPU count
    (default: torch's)."""
    per = info["devices_per_node"]
    if devices is not None and per is not None and devices != per:
        return f"--devices = {devices}, but the run has run.devices_per_node = {per}"
    if info.get("device", "cpu") == "cuda":
        from ..exec.device import check_cuda

        try:
            check_cuda(list(range(per)), None, available)  # (set: `hosting.check_hosting`)
        except ValueError as e:
            return str(e)
    return None


def _say(node: int, what: str) -> None:
    print(f"resihp agent: node {node}: {what}", file=sys.stderr, flush=True)


def _fail(node: int, why: str) -> int:
    _say(node, why)
    return 2
