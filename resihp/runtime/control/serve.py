"""A node agent started on its own machine (`resihp agent --controller HOST:PORT --node-rank K`).

`serve` waits for the controller's store (up to `wait_s`: the controller may start later, or be
restarting), reads what the controller published (`hosting.run_info`: its fencing timeout, the
devices per node, the device kind), checks that this node can serve the run (`check_node`: its
`--devices` against the devices per node; on CUDA, this machine's GPUs), has the members bind their gloo
groups to the `--advertise` address (`bind.py`; unless the user set `GLOO_SOCKET_IFNAME`: gloo
then binds to that interface), then runs the agent
(`agent.agent_main`, which registers by beating). The agent is never forked by the controller; a
cluster manager (Slurm's `srun`, a Kubernetes pod) starts one per node (docs/deploy.md).

Exit codes: 0 after the controller's `Shutdown`; 2 with one line when no controller came or the
node does not fit the run; `agent.FENCED_EXIT` when the agent fenced itself; 130 / 143 on SIGINT
/ SIGTERM (its members killed first).

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
from .agent import agent_main
from .hosting import RUN_KEY, run_info
from .transport import Transport, Unreachable, load_quietly

WAIT_S = 60.0  # default `--wait-s`: how long an agent waits for its controller to come up


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


def serve(host: str, port: int, node: int, devices: int | None, advertise: str | None, wait_s: float) -> int:
    """Run node `node`'s agent for the controller at (`host`, `port`); the exit status."""
    load_quietly("TORCH_CPP_LOG_LEVEL" in os.environ)  # waiting for a controller says nothing per try
    if advertise is not None and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface_of(advertise)  # an address of this host (else exit 2 naming it)
        bind.advertise(socket.gethostbyname(advertise))  # the members' gloo binds to it (bind.py)
    transport = Transport(host, port)
    deadline, data = time.monotonic() + wait_s, None
    while data is None:
        try:
            data = transport.value(RUN_KEY)
        except Unreachable:
            pass
        if data is None:
            if time.monotonic() >= deadline:
                return _fail(node, f"no controller at {host}:{port} within {wait_s:g} s (--wait-s)")
            time.sleep(0.2)
    info = run_info(data)
    why = check_node(info, devices)
    if why is not None:
        return _fail(node, why)
    return agent_main(node, transport, info["controller_timeout_s"], say=True)


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
            check_cuda(list(range(per or devices or 1)), None, available)
        except ValueError as e:
            return str(e)
    return None


def _fail(node: int, why: str) -> int:
    print(f"resihp agent: node {node}: {why}", file=sys.stderr, flush=True)
    return 2
