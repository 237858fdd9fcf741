"""How a `resihp agent` finds its controller (`control/serve.py`): at the start, and a new one at the
same address after it lost one. Real `TCPStore`s, as the controller makes them (`Hosting.store`)."""

import gc
import socket
import threading
import time

from resihp.runtime.control.hosting import Hosting
from resihp.runtime.control.serve import wait_for_controller
from resihp.runtime.control.transport import Transport


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(fn, *args, **kwargs):
    t0 = time.monotonic()
    return fn(*args, **kwargs), time.monotonic() - t0


def test_an_agent_waits_for_a_controller_and_after_losing_it_only_for_a_new_one():
    """No store at the address: None after the wait (not before, nor much after). A controller's
    store: what it published (its run.controller_wait_s, an incarnation). Told that incarnation is
    the lost one, the same store is no controller to wait for: None after the wait. That store
    killed and a new controller started 0.5 s later on the same port: found as soon as it is up
    (the dead store's client reconnects), a different incarnation."""
    transport = Transport("127.0.0.1", _free_port())
    info, took = _timed(wait_for_controller, transport, 0.5)
    assert info is None and 0.5 <= took < 2.0, took

    hosting = Hosting(listen=("127.0.0.1", 0), wait_s=7.0, controller_timeout_s=1.5, devices_per_node=4)
    store = hosting.store()
    port = store.port
    transport = Transport("127.0.0.1", port)
    info, took = _timed(wait_for_controller, transport, 5.0)
    assert took < 1.0 and info["controller_wait_s"] == 7.0 and info["controller_timeout_s"] == 1.5
    assert info["devices_per_node"] == 4 and isinstance(info["incarnation"], str)
    again, took = _timed(wait_for_controller, transport, 0.5, lost=info["incarnation"])
    assert again is None and 0.5 <= took < 2.0, took

    del store  # the controller is killed ...
    gc.collect()
    stores = []  # ... and restarted at the same address (`resihp controller --resume DIR`)
    restart = threading.Timer(0.5, lambda: stores.append(Hosting(listen=("127.0.0.1", port)).store()))
    restart.start()
    try:
        new, took = _timed(wait_for_controller, transport, 30.0, lost=info["incarnation"])
        assert new is not None and new["incarnation"] != info["incarnation"], new
        assert 0.5 <= took < 5.0, took
    finally:
        restart.join()
        transport.close()
        stores.clear()
