"""adaps.torch_bins: the bin schedule's rule, without a cluster."""
import math

import pytest

from adaps import torch_bins as bins


def _run(rates, delay, start=100):
    """The divisor after each step of `rates`, the residues' delay held at `delay`."""
    s = bins.BinSchedule(start)
    s.delay = delay
    return [s.update(lr, t + 1) for t, lr in enumerate(rates)]


def _cosine(steps):
    return [0.5 * (1 + math.cos(math.pi * t / steps)) for t in range(steps)]


def test_the_divisor_halves_the_bins_at_three_quarters_and_quarters_them_at_three_eighths():
    assert [bins.divisor_for(r) for r in (1.2, 1.0, 0.76, 0.75, 0.5, 0.375, 0.1, 0.0)] == \
        [1, 1, 1, 2, 2, 4, 4, 4]


def test_a_constant_rate_keeps_the_declared_bins_however_long_it_is_held():
    # (The rule this replaces shrank them 8x after 200 steps at a held rate: at 3,000 steps
    # that cost both bytes and accuracy.)
    assert set(_run([1e-3] * 5000, delay=100)) == {1}


def test_a_long_cosine_shrinks_the_bins_only_at_its_end_and_a_short_one_from_its_middle():
    # (A delay of 20 steps: the transformer's residues hold 10-30 through such a decay.)
    long_run, short_run = _run(_cosine(3000), 20), _run(_cosine(300), 20)
    assert sum(d == 1 for d in long_run) > 0.9 * 3000
    assert long_run[-1] == 4
    assert set(short_run[:120]) == {1} and short_run[-1] == 4
    assert sum(d > 1 for d in short_run) > 0.25 * 300


def test_a_step_down_shrinks_the_bins_until_the_delay_has_passed_then_they_come_back():
    rates = [1.0] * 500 + [0.1] * 200
    d = _run(rates, delay=40)
    assert set(d[:500]) == {1}
    assert d[500] == 4 and d[500 + 25] == 4   # the residues still hold steps at 1.0
    assert d[500 + 3 * 40 + 1] == 1           # three delays on: only steps at 0.1


def test_nothing_shrinks_before_the_optimizers_first_steps():
    assert set(_run([1.0] * 50 + [0.01] * 40, delay=10, start=100)) == {1}


def test_the_delay_is_the_unsent_mass_in_steps_of_the_declared_bins_and_smoothed():
    s = bins.BinSchedule(1)
    s.measured(residue_mass=30.0, update_mass=1.0)
    assert s.delay == 30.0
    s.measured(residue_mass=0.0, update_mass=0.0)  # no update: nothing learnt
    assert s.delay == 30.0
    s.divisor = 2   # bins half the declared size deliver twice as soon
    s.measured(residue_mass=15.0, update_mass=1.0)
    assert s.delay == pytest.approx(30.0)
    s.measured(residue_mass=10.0, update_mass=2.0, steps_covered=4)  # 4 local steps
    assert s.delay == pytest.approx(0.7 * 30.0 + 0.3 * 40.0)
    s.measured(residue_mass=1e12, update_mass=1e-12)
    assert s.delay <= bins.HISTORY


def test_its_state_round_trips_and_a_bad_one_is_refused_without_change():
    s = bins.BinSchedule(10)
    s.delay = 12.5
    for lr in (1.0, 0.5, 0.25):
        s.update(lr, 20)
    t = bins.BinSchedule(10)
    t.load_state_dict(s.state_dict())
    assert list(t.rates) == [1.0, 0.5, 0.25] and t.delay == 12.5
    for bad in ({}, {"rates": "x", "delay": 1.0}, {"rates": [1.0], "delay": "soon"}):
        with pytest.raises(ValueError, match="bin schedule"):
            t.load_state_dict(bad)
    assert list(t.rates) == [1.0, 0.5, 0.25] and t.delay == 12.5
