"""A node's members listen for their gloo peers on their agent's advertised address.

`resihp agent --advertise ADDR` says where the node's members are reached. Gloo, left alone, binds
to the address of an interface (`GLOO_SOCKET_IFNAME`: the interface's first address) or of the
machine's hostname, which need not be ADDR: on a host with several addresses on one interface —
or the tests' two "hosts", 127.0.0.2 and 127.0.0.3, both on `lo`, whose first address is
127.0.0.1 — the members would listen on another address than the one the agent advertised. So
the agent hands ADDR to its members (`advertise`: an environment variable its forkserver and
members inherit) and each member makes its gloo groups with the backend `gloo_backend()` names:
gloo on a device created for ADDR (`ProcessGroupGloo.create_device(hostname=ADDR)`, registered
with `torch.distributed.Backend.register_backend`). Its listening socket is bound to ADDR, so
every peer connects to ADDR; the source address of the connections it makes is left to the
kernel's routing, as gloo does. A user's own `GLOO_SOCKET_IFNAME` is left in charge (no binding).

Torch-free at import.
"""

from __future__ import annotations

import os
from datetime import timedelta

ADVERTISE_ENV = "RESIHP_ADVERTISE"  # the agent's --advertise, as its members see it
GLOO_THREADS = 2  # gloo's own default for one device
BOUND = "resihp_gloo"  # the backend name of gloo on the advertised address (`gloo_backend`)


def advertise(address: str) -> None:
    """In the agent, before its forkserver starts: its members bind to `address`."""
    os.environ[ADVERTISE_ENV] = address


def gloo_backend() -> str:
    """In a member: the backend name its gloo groups are made with — `BOUND`, registered with
    `torch.distributed` on first use (gloo on a device made for the advertised address: it listens
    there), when the agent advertised an address and
    the user set no `GLOO_SOCKET_IFNAME` (which gloo then follows); else plain "gloo"."""
    address = os.environ.get(ADVERTISE_ENV)
    if not address or os.environ.get("GLOO_SOCKET_IFNAME"):
        return "gloo"
    import torch.distributed as dist

    if not hasattr(dist.Backend, BOUND.upper()):  # (registered: a `Backend` attribute)
        gloo = dist.ProcessGroupGloo

        def make(store, rank: int, size: int, timeout: timedelta):
            options = gloo._Options()
            options._timeout = timeout
            options._devices = [gloo.create_device(hostname=address)]
            options._threads = GLOO_THREADS
            return gloo(store, rank, size, options)

        dist.Backend.register_backend(BOUND, make, devices=["cpu"])
    return BOUND
