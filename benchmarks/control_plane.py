"""The control plane's commit round trip over the c10d store, with fake members and no model.

For each member count n (default 8, 64, 256, 1024) this process plays the controller: it hosts
the `TCPStore`, reads its inbox (`transport.Channel` + `liveness.Inbox`, as the controller does)
and, once all n members reported `Reached` for iteration k, writes `decision/0/k`
(`board.Board.decide`). The members are threads in `--procs` worker processes; each thread, as a
real member does, sends `Reached` on the controller's channel and blocks on the decision, which
its node's agent reads once from the store and relays to it (`relay.DecisionRelay`, a real one
per node, over real pipes; `--relay off`: each member reads it with its own store client,
`Board.decision`, as members did before the relay), and beats every 0.25 s on its node's heartbeat
channel (8 devices per node; `liveness.HeartbeatThread`, quiet while the member reports); one fake
agent thread per node drains those beats and sends an `AgentBeat` every 0.25 s — the wire's whole
steady load, without a model, a gloo group or trace records.

Measured, per n, over `--iterations` commits:

* commit round trip: from writing the decision of k - 1 to writing that of k (every member read
  it, reported k, and the controller took all n reports) — median and 95th percentile;
* controller CPU per iteration: this process's CPU time (the controller loop *and* the store's
  server thread, which runs in the controller's process) divided by the iterations; and the
  loop's share alone (`loop_cpu_ms_per_iter`: this thread's CPU time), the rest being the server's;
  and the members' (`members_cpu_ms_per_iter`: the worker processes' CPU time from their members'
  start, with their connections, heartbeat threads and fake agents; on one machine they share its
  cores with the controller);
* controller memory: resident set after the members connected and after the last iteration, and
  the store's key count (one decision key per iteration: the growth that stays);
* store requests (`requests`): every call on a store client, counted per sender role and op, per
  iteration (`controller`: its inbox reads and decisions; `member`: the `Reached` append and, with
  `--relay off`, the decision read; `relay`: the agents' decision reads; `heartbeat`: its heartbeat
  thread; `agent`: its pops and `AgentBeat`s) — a blocking
  `get` is two requests on the wire (the c10d client sends a wait, then the get);
  `requests_per_iter` sums them, `get` counted twice.

With `--records stream` (or `keep`) each member also sends, after each decision, a trace record of
realistic size (`--microbatches`, default 64: its F/B/W/SEND/RECV rows and received blocks, about
14 KB as JSON), as a real member does; the controller files every one as `launch_elastic` does,
in a `records.RecordStore` streaming to a temporary trace file (`stream`), or in a dict of every
record of the run (`keep`: what the controller did before the store, for the contrast). The
resident set is then sampled at every tenth of the run (`rss_mb_curve`): flat or growing.

    .venv/bin/python benchmarks/control_plane.py [--members 8 64 256 1024] [--iterations 1000]
        [--procs 8] [--relay on|off] [--records off|stream|keep] [--microbatches 64] [--json OUT]

The issue's target: <= 20 ms per commit at 256 members on this machine; the growth with members
is reported. What this does not measure: the rest of a real controller's per-iteration work (the
slow watch, events, the liveness table).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from resihp.core.trace_format import InstrRow, LinkRow  # noqa: E402
from resihp.runtime.control import transport as transport_mod  # noqa: E402
from resihp.runtime.control.liveness import HEARTBEAT_S, HeartbeatThread, Inbox, Liveness  # noqa: E402
from resihp.runtime.control.protocol import (  # noqa: E402
    PG_TIMEOUT_S,
    AgentBeat,
    Decision,
    Kind,
    Reached,
    Record,
    Verdict,
)
from resihp.runtime.control.records import RecordStore, TraceFile, decode, trace_line  # noqa: E402
from resihp.runtime.control.relay import DecisionRelay, Relayed  # noqa: E402
from resihp.runtime.control.transport import Transport, Unreachable  # noqa: E402

PER_NODE = 8


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


WIRE = {"get": 2}  # a blocking get: the c10d client's wait request, then the get


class Counted:
    """A store client whose every call counts under (this thread's role, op) in `counts` (the
    role: the thread's name up to its first '-')."""

    def __init__(self, store, counts: Counter) -> None:
        self.store, self.counts = store, counts

    def __getattr__(self, op: str):
        call = getattr(self.store, op)

        def counted(*args):
            self.counts[threading.current_thread().name.split("-")[0], op] += 1
            return call(*args)

        return counted


_STORE_OP = transport_mod._store_op


def count_transport(counts: Counter) -> None:
    """Count every call of this process's transport channels on their store client (`Counted`),
    in `counts` alone (a later call replaces an earlier one)."""
    op = _STORE_OP

    def counted(host, port, name, *args):
        counts[threading.current_thread().name.split("-")[0], name] += 1
        return op(host, port, name, *args)

    transport_mod._store_op = counted


def per_iteration(counts: Counter, iterations: int) -> tuple[dict, float]:
    """(`role.op` -> calls per iteration, wire requests per iteration)."""
    calls = {f"{r}.{op}": round(c / iterations, 2) for (r, op), c in sorted(counts.items())}
    return calls, sum(c * WIRE.get(op, 1) for (_, op), c in counts.items()) / iterations


def fake_record(microbatches: int) -> dict:
    """A trace record of a middle pipeline stage at `microbatches` micro-batches (timings made up,
    sizes as a worker's: docs/trace-format.md)."""
    rows = []
    for mb in range(microbatches):
        rows += [
            InstrRow("RECV", 0, mb, 1.2e-06, 0.0213114),
            InstrRow("F", 0, mb, 0.0041153, 0.0009071),
            InstrRow("SEND", 0, mb, 3.1e-05, 2.2e-05),
            InstrRow("B", 0, mb, 0.0082117, 0.0011043),
            InstrRow("W", 0, mb, 0.0040321, 0.0),
        ]
    rows += [InstrRow("ALLREDUCE", -1, -1, 0.0012, 0.0101), InstrRow("STEP", -1, -1, 0.0021, 0.0)]
    links = [LinkRow(4, 5, "act", 0, mb, 32768, 0.0331017) for mb in range(microbatches)]
    return {
        "iter": 0, "generation": 0, "device": 0, "replica": 0, "stage": 1, "tp_rank": 0, "wall_s": 0.184,
        "cpu_s": 0.170, "compute_s": 0.121, "comm_s": 0.052, "instrs": rows, "links": links, "losses": [],
        "allreduce_bytes": 1204224, "grad_norm": None,
    }  # fmt: skip


class CountedRelay(DecisionRelay):
    """A real relay whose store reads count in `counts` (role `relay`: its fetch threads' names)."""

    def __init__(self, counts: Counter, *args) -> None:
        self.counts = counts
        super().__init__(*args)

    def client(self):
        return Counted(super().client(), self.counts)


def _members(
    port: int, devices: list[int], iterations: int, ready, record: dict | None, relay: bool
) -> None:  # fmt: skip
    """One worker process: a thread per fake member, and a fake agent (and, with `relay`, a
    decision relay) per node it hosts."""
    import torch.distributed as dist

    from resihp.runtime.control.board import Board

    transport, counts = Transport("127.0.0.1", port), Counter()
    count_transport(counts)
    stop = threading.Event()
    nodes = {d // PER_NODE for d in devices} if relay else set()
    relays = {n: CountedRelay(counts, "127.0.0.1", port, PG_TIMEOUT_S) for n in nodes}
    pipes = {d: relays[d // PER_NODE].connect() for d in devices if relay}

    def member(dev: int) -> None:
        if relay:
            decisions = Relayed(pipes[dev])
        else:
            store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
            decisions = Board(Counted(store, counts))
        beats, results = transport.beats(dev // PER_NODE), transport.inbox()
        heart = HeartbeatThread(dev, beats, reports=results)  # (a member's: quiet while it reports)
        ready.put(dev)
        for k in range(iterations):
            results.send(Reached(dev, 0, k, (), 0.0))
            decisions.decision(0, k)
            if record is not None:  # (a real member sends it once its step is done, encoded once)
                line = trace_line({**record, "iter": k, "device": dev}).encode()
                results.send(Record(dev, 0, k, line))
        heart.stop()

    def agent(node: int) -> None:
        beats, results, last = transport.beats(node), transport.inbox(), {}
        while not stop.is_set():
            try:
                msg = beats.recv()
                while msg is not None:
                    last[msg.device] = time.monotonic()
                    msg = beats.recv()
                results.send(AgentBeat(node, time.monotonic(), dict(last)))
            except Unreachable:
                return
            stop.wait(HEARTBEAT_S)

    nodes = sorted({d // PER_NODE for d in devices if d % PER_NODE == 0})
    for node in nodes:
        threading.Thread(target=agent, args=(node,), name=f"agent-{node}", daemon=True).start()
    threads = [threading.Thread(target=member, args=(d,), name=f"member-{d}") for d in devices]
    cpu0 = time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    for r in relays.values():
        r.close()
    ready.put((dict(counts), time.process_time() - cpu0))
    ready.close()
    ready.join_thread()
    os._exit(0)


def measure(
    n: int, iterations: int, procs: int, records: str = "off", microbatches: int = 64, relay: bool = True
) -> dict:  # fmt: skip
    import torch.distributed as dist

    from resihp.runtime.control.board import Board

    counts: Counter = Counter()
    count_transport(counts)
    threading.current_thread().name = "controller"
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    board, transport = Board(Counted(store, counts)), Transport("127.0.0.1", store.port)
    beats_seen = []
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    devices = list(range(n))
    nodes = sorted({d // PER_NODE for d in devices})  # a node's devices share a process (its agent)
    live = Liveness()  # (the controller's: each member message is a beat of its device)
    for d in devices:
        live.spawn(d, time.monotonic())
    heard = lambda msg: live.beat(msg.device, time.monotonic())  # noqa: E731
    inbox = Inbox(transport.inbox(), lambda msg: beats_seen.append(msg.node), heard)
    k = min(procs, len(nodes))
    parts = [[d for d in devices if d // PER_NODE in nodes[i::k]] for i in range(k)]
    record = None if records == "off" else fake_record(microbatches)
    args = (store.port, iterations, ready, record, relay)
    workers = [ctx.Process(target=_members, args=(args[0], p, *args[1:])) for p in parts if p]
    for w in workers:
        w.start()
    for _ in range(n):
        ready.get(timeout=600)
    trace = TraceFile.nameless()  # (as a run without `run.trace`: nothing left behind)
    kept: dict[int, dict[int, dict]] = {}  # `keep`: every record of the run, as before the store
    filed = RecordStore(trace.path) if records == "stream" else None
    seen = [0]

    def on_record(msg) -> None:
        seen[0] += 1
        if filed is not None:
            filed.add(msg.device, msg.iter, msg.line, n)
        else:  # (decoded, as the controller held them before: the dicts and rows are the memory)
            kept.setdefault(msg.iter, {})[msg.device] = decode(msg.line)

    counts.clear()  # (the start-up's; the workers count theirs too: a few per member, in the noise)
    rss0, cpu0, loop0 = _rss_mb(), time.process_time(), time.thread_time()
    curve = [round(rss0, 1)]
    gaps, t_prev = [], time.perf_counter()
    for k in range(iterations):
        got = set()
        while len(got) < n:
            msg = inbox.get(1.0)
            if msg is not None and msg.kind is Kind.RECORD:
                on_record(msg)
            elif msg is not None:
                assert msg.kind is Kind.REACHED and msg.iter == k, msg
                got.add(msg.device)
        board.decide(0, k, Decision(Verdict.COMMIT))
        if filed is not None:
            filed.settle(k)  # as the controller's commit does
        now = time.perf_counter()
        gaps.append(now - t_prev)
        t_prev = now
        if (k + 1) % max(1, iterations // 10) == 0:
            curve.append(round(_rss_mb(), 1))
    while record is not None and seen[0] < n * iterations:  # the last iteration's records
        msg = inbox.get(5.0)
        assert msg is not None and msg.kind is Kind.RECORD, msg
        on_record(msg)
    cpu, loop = time.process_time() - cpu0, time.thread_time() - loop0
    rss1, keys = _rss_mb(), store.num_keys()
    if filed is not None:
        filed.close()
    trace_mb = os.path.getsize(trace.path) / 2**20
    trace.discard()
    members_cpu = 0.0
    for _ in workers:
        calls, cpu_s = ready.get(timeout=60)
        counts.update(calls)
        members_cpu += cpu_s
    for w in workers:
        w.join(60)
    transport.close()
    calls, requests = per_iteration(counts, iterations)
    steady = sorted(gaps[1:])  # (the first one includes the members' first sends)
    return {
        "members": n,
        "iterations": iterations,
        "relay": relay,
        "commit_ms_median": 1e3 * statistics.median(steady),
        "commit_ms_p95": 1e3 * steady[int(0.95 * (len(steady) - 1))],
        "controller_cpu_ms_per_iter": 1e3 * cpu / iterations,
        "loop_cpu_ms_per_iter": 1e3 * loop / iterations,  # the controller's own thread, no store server
        "members_cpu_ms_per_iter": 1e3 * members_cpu / iterations,  # the worker processes, all of them
        "rss_mb_start": rss0,
        "rss_mb_end": rss1,
        "records": records,
        "record_kb": 0.0 if record is None else len(trace_line(record)) / 1024,
        "rss_mb_curve": curve if record is not None else [],
        "trace_file_mb": trace_mb,
        "store_keys": keys,
        "agent_beats": len(beats_seen),
        "requests_per_iter": requests,
        "requests": calls,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=8, help="worker processes hosting the fake members")
    ap.add_argument(
        "--relay", choices=("on", "off"), default="on",
        help="members take decisions from their node's relay (on, as the runtime does) or the store (off)",
    )  # fmt: skip
    ap.add_argument(
        "--records", choices=("off", "stream", "keep"), default="off",
        help="members also send trace records: filed by a RecordStore (stream) or all kept (keep)",
    )  # fmt: skip
    ap.add_argument("--microbatches", type=int, default=64, help="the fake records' micro-batches")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    out = {"load_avg_before": os.getloadavg()[0], "cpus": os.cpu_count(), "runs": []}
    for n in args.members:
        row = measure(n, args.iterations, args.procs, args.records, args.microbatches, args.relay == "on")
        out["runs"].append(row)
        print(
            "  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
            flush=True,
        )
    out["load_avg_after"] = os.getloadavg()[0]
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
