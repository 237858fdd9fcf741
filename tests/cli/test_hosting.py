"""The multi-host run keys and the one-line refusals of `resihp controller` and `resihp agent`."""

import pytest

from resihp.cli.main import main
from resihp.runtime.config import TrainConfig
from resihp.runtime.control.serve import interface_of, parse_address


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"nodes": 0}, "run.nodes = 0: must be a positive integer"),
        ({"nodes": 2}, "run.nodes = 2: needs run.devices_per_node"),
        (
            {"nodes": 1, "devices_per_node": 4},
            "run.nodes = 1: 1 x run.devices_per_node = 4 devices, fewer than",
        ),
        (
            {"controller_timeout_s": 0.1},
            "run.controller_timeout_s = 0.1: must be a number of seconds in [0.5, 600]",
        ),
        ({"controller_wait_s": -1}, "run.controller_wait_s = -1: must be a number of seconds in [0, 86400]"),
        ({"controller_wait_s": True}, "run.controller_wait_s = True"),
    ],
)
def test_bad_hosting_keys_are_refused_naming_key_value_and_range(changes, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        TrainConfig(workers=8, **changes)


def test_addresses_and_interfaces():
    assert parse_address("10.0.0.1:29400", "--listen") == ("10.0.0.1", 29400)
    assert parse_address("node-1.cluster:0", "--listen") == ("node-1.cluster", 0)
    for bad in ("10.0.0.1", ":80", "h:x", "h:70000"):
        with pytest.raises(ValueError, match="--controller = .*must be HOST:PORT"):
            parse_address(bad, "--controller")
    assert interface_of("127.0.0.2") == interface_of("127.0.0.3") == "lo"
    with pytest.raises(ValueError, match="--advertise = '203.0.113.77': no interface of this host"):
        interface_of("203.0.113.77")


def test_controller_and_agent_refusals_are_one_line_with_exit_2(tmp_path, capsys):
    """Without run.nodes the controller refuses before starting; with it and no agent it waits
    run.controller_wait_s and names the nodes that never came; an agent with no controller gives
    up after --wait-s; each exits 2 with one line on stderr."""
    cfg = tmp_path / "job.toml"
    cfg.write_text(
        "[parallel]\ntp = 1\npp = 2\ndp = 2\nseq_len = 32\n[run]\nworkers = 4\ndevices_per_node = 2\n"
    )
    assert main(["controller", "--config", str(cfg), "--listen", "127.0.0.1:0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "resihp: error: run.nodes is not set: `resihp controller` needs it (with run.devices_per_node)\n"
    )
    cfg.write_text(cfg.read_text() + "nodes = 2\ncontroller_wait_s = 1\n")
    assert main(["controller", "--config", str(cfg), "--listen", "127.0.0.1:0", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("resihp: the agent of nodes 0, 1 never came within 1 s"), err
    assert main(["agent", "--controller", "127.0.0.1:9", "--node-rank", "1", "--wait-s", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err == "resihp agent: node 1: no controller at 127.0.0.1:9 within 0.5 s (--wait-s)\n"
