"""TP-level adaptation: eq. 3 candidate degrees, eq. 4 selection, uneven TP."""

from __future__ import annotations

import pytest

from resihp.core import model_preset
from resihp.sched.model import group_speed
from resihp.sched.tp import candidate_degrees, select_tp_subgroup, uneven_stage

# (live devices, speeds of devices 0..3, k_min, prefer_larger, kept, standby)
EQ4_TABLE = [
    ([0, 1, 2, 3], [1, 1, 1, 1], 1, True, (0, 1, 2, 3), ()),
    ([0, 1, 2, 3], [1, 1, 1, 0.4], 1, True, (0, 1), (2, 3)),  # 4·0.4 = 1.6 < 2: exclude
    ([0, 1, 2, 3], [1, 1, 1, 0.6], 1, True, (0, 1, 2, 3), ()),  # 4·0.6 = 2.4 > 2: keep
    ([0, 1, 2, 3], [1, 1, 1, 0.5], 1, True, (0, 1, 2, 3), ()),  # tie at 2: larger k
    ([0, 1, 2, 3], [1, 1, 1, 0.5], 1, False, (0, 1), (2, 3)),  # tie at 2: smaller k
    ([0, 1, 3], [1, 1, 1, 1], 1, True, (0, 1), (3,)),  # one fail-stop in TP4: k = 2 + 1 standby
    ([0, 1, 3], [1, 1, 1, 1], 4, True, (), (0, 1, 3)),  # memory needs 4: nothing fits
    ([0, 1, 2, 3], [1, 0.9, 0.3, 0.3], 1, True, (0, 1), (2, 3)),  # 1.2 < 1.8
    ([0, 1, 2, 3], [0.7, 1, 0.7, 1], 1, True, (0, 1, 2, 3), ()),  # 2.8 > 2
    ([0, 1, 2, 3], [1, 0.2, 0.2, 0.2], 1, True, (0,), (1, 2, 3)),  # 1 > 0.8 and 0.4
    ([2, 3], [1, 1, 0.3, 0.3], 1, True, (2, 3), ()),  # 0.6 > 0.3
]


@pytest.mark.parametrize("live,speeds,k_min,larger,kept,standby", EQ4_TABLE)
def test_eq4_table(live, speeds, k_min, larger, kept, standby):
    """Eq. 4 keeps the top-k survivors maximising k·min p, the rest become standbys."""
    assert select_tp_subgroup(live, speeds, k_min, prefer_larger=larger) == (kept, standby)


def test_candidate_degrees_are_powers_of_two_between_kmin_and_survivors():
    """Eq. 3 lists powers of two from k_min up to the survivor count."""
    assert candidate_degrees(1, 3) == [1, 2]
    assert candidate_degrees(2, 8) == [2, 4, 8]
    assert candidate_degrees(2, 3, power_of_two=False) == [2, 3]


def test_uneven_tp_keeps_three_of_four_and_splits_by_speed():
    """A TP-4 group with one half-speed device keeps all four, the slow one with fewer heads."""
    model = model_preset("llama2-7b")
    speeds = [1.0, 1.0, 1.0, 0.5]
    st, standby = uneven_stage(model, [0, 1, 2, 3], (0, 16), speeds)
    assert st.devices == (0, 1, 2, 3) and standby == ()
    assert st.tp_split[3] < st.tp_split[0]
    assert group_speed(model, st, speeds) > 3.3  # even split would give 4·0.5 = 2
    st3, _ = uneven_stage(model, [0, 1, 3], (0, 16), [1.0] * 4)
    assert st3.tp == 3  # not cut to a power of two
