"""The demo writer's plan: seeded, every kind of change, orders most often."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from stack.demo_writer import STATEMENTS, WEIGHTS, Action, DemoWriter, parameters, plan_step


def test_a_seed_repeats_the_same_plan() -> None:
    first = [plan_step(random.Random(7), n) for n in range(50)]
    again = [plan_step(random.Random(7), n) for n in range(50)]
    assert first == again


def test_every_action_happens_and_orders_dominate() -> None:
    rng = random.Random(1)
    counts = Counter(plan_step(rng, n).action for n in range(2000))
    assert set(counts) == set(Action)
    assert counts.most_common(1)[0][0] is Action.NEW_ORDER


def test_every_action_has_a_statement_whose_parameters_are_given() -> None:
    assert set(STATEMENTS) == set(WEIGHTS) == set(Action)
    step = plan_step(random.Random(3), 42)
    params = parameters(step)
    for statement in STATEMENTS.values():
        for name in [part.split(")s")[0] for part in statement.split("%(")[1:]]:
            assert name in params, (name, statement)
    assert params["email"] == "demo42@example.com"
    assert 0.9 <= float(step.price_factor) <= 1.1


def test_the_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rate"):
        DemoWriter("postgresql://unused", rate=0)
