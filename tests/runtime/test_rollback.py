"""Which committed state a recovery starts from when snapshots are exchanged off the critical path
(`adapt/rollback.py`): the iteration a failure ended the generation at, when the snapshots of the
lost devices of that tag are complete at their holders (they reached its STEP, or it is the
generation's start), else the one before — a rollback by one iteration — and none before the
generation's start."""

from types import SimpleNamespace

from resihp.core.model_spec import ModelSpec
from resihp.core.plan import Plan
from resihp.core.transfer_plan import cover_gaps
from resihp.runtime.adapt.recovery import lost_layers
from resihp.runtime.adapt.rollback import Snapped, restore_point
from resihp.runtime.state.snapshot import holders

SPEC = ModelSpec("t", 4, 32, 8, 2, 48, 256)
PLAN = Plan.uniform(SPEC, 2, 2, 2, 2)  # stage 1 of both replicas: devices 2, 3 and 6, 7
ALL = set(PLAN.devices())
SURVIVORS = {0, 1, 4, 5}  # both copies of the last stage lost: only the snapshots on 0, 1, 4, 5 cover it


def snapped(start: int, failed_at: int | None = None) -> Snapped:
    got = Snapped({0: SimpleNamespace(start=start)})
    if failed_at is not None:
        got.leave(0, failed_at)
    return got


def point(s: Snapped, it: int, members=SURVIVORS, snapshots=True):
    hold = holders(PLAN) if snapshots else {}
    return restore_point(PLAN, members, hold, s, 0, it, ALL, snapshots)


def test_a_stage_lost_before_its_holders_reached_the_step_rolls_back_one_iteration():
    s = snapped(0, failed_at=3)
    assert point(s, 3) == (2, {2: 0, 3: 1, 6: 4, 7: 5}, [])
    s.certify(0, 0, 3)  # device 0 holds 2's snapshot of 3: TP rank 1 (3's, on 1; 7's, on 5) is missing
    s.certify(0, 4, 3)
    assert point(s, 3)[0] == 2
    s.certify(0, 1, 3)  # replica 0's last stage, both TP ranks, as of 3: a cover
    assert point(s, 3) == (3, {2: 0, 3: 1, 6: 4}, [])


def test_holders_whose_abort_names_the_tag_in_flight_restore_it_without_a_rollback():
    """The exchange of tag 3 completed before the last stage died: its holders' `Abort`s name 3
    (`Abort.snapshot`), so the recovery starts from 3 itself; a holder whose exchange failed
    names 2, and 3 stays out of reach where its copy is needed."""
    s = snapped(0, failed_at=3)
    for d in (0, 1, 4):
        s.certify(0, d, 3)
    s.certify(0, 5, 2)
    assert point(s, 3) == (3, {2: 0, 3: 1, 6: 4}, [])  # 2, 3 from 0, 1 (7's copy on 5 not needed)
    s = snapped(0, failed_at=3)
    for d in (0, 4, 5):
        s.certify(0, d, 3)
    s.certify(0, 1, 2)  # TP rank 1 of stage 1 (3's and 7's copies on 1 and 5): 7's on 5 covers it
    assert point(s, 3) == (3, {2: 0, 6: 4, 7: 5}, [])
    s = snapped(0, failed_at=3)
    s.certify(0, 0, 3)
    s.certify(0, 4, 3)
    s.certify(0, 1, 2)
    s.certify(0, 5, 2)  # no holder of TP rank 1 has 3: rollback to 2
    assert point(s, 3)[0] == 2


def test_the_generation_start_is_complete_and_nothing_before_it_is_kept():
    assert point(snapped(3, failed_at=3), 3) == (3, {2: 0, 3: 1, 6: 4, 7: 5}, [])  # the join waited
    assert point(snapped(3, failed_at=4), 4)[0] == 3  # rollback onto the start
    no, copies, gaps = point(snapped(3, failed_at=3), 3, snapshots=False)  # no snapshots: no point
    assert no is None and copies == {} and lost_layers(PLAN, SURVIVORS) == "layers 2-3"
    assert gaps == cover_gaps(PLAN, SURVIVORS) != []


def test_a_live_cover_needs_no_snapshot_and_no_rollback():
    assert point(snapped(0, failed_at=3), 3, ALL - {2}) == (3, {}, [])
    assert point(snapped(0, failed_at=3), 3, ALL - {2}, snapshots=False) == (3, {}, [])


def test_a_generation_left_for_the_next_one_and_an_earlier_rewind():
    """Left by a replan at 5 (the next generation's start), whose join then failed: the state at 5
    when its holders' snapshots of 5 are complete, else 4; after a rollback to 4 already, only 4."""
    s = Snapped({0: SimpleNamespace(start=0), 1: SimpleNamespace(start=5)})
    assert point(s, 5)[0] == 4
    s.leave(0, 5)
    assert point(s, 4)[0] == 4
    for d in SURVIVORS:
        s.certify(0, d, 5)
    assert point(s, 5)[0] == 5 and point(s, 4)[0] == 4
