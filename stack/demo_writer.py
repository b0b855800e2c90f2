"""Live writes to the demo's sample database, so that the pipeline has something to stream.

A small shop at work: new customers, orders (most of the traffic), price changes, cancelled orders
(deletes), a renamed customer, page views on the unkeyed table. Each step is one transaction.
`plan_step` decides what to do (pure, seeded, tested); `DemoWriter` does it.

    python -m stack.demo_writer                      # the stack's bwdemo database, 2 writes/s
    python -m stack.demo_writer --rate 20 --steps 500 -d postgresql://...
"""

from __future__ import annotations

import argparse
import enum
import random
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from types import FrameType

import psycopg2
import psycopg2.extensions

from stack.config import StackConfig
from stack.demo import DEMO_DATABASE

DEFAULT_RATE = 2.0
SKUS = ("BW-1", "BW-2", "CAP-1")
PATHS = ("/", "/bottles", "/bottles/BW-1", "/bottles/BW-2", "/caps")
CENTS = Decimal("0.01")


class Action(enum.StrEnum):
    NEW_CUSTOMER = "new_customer"
    NEW_ORDER = "new_order"
    PRICE_CHANGE = "price_change"
    CANCEL_ORDER = "cancel_order"
    RENAME_CUSTOMER = "rename_customer"
    PAGE_VIEW = "page_view"


# Orders dominate, as in a shop; every kind of change the pipeline handles shows up within a minute.
WEIGHTS = {
    Action.NEW_ORDER: 50,
    Action.PAGE_VIEW: 20,
    Action.NEW_CUSTOMER: 10,
    Action.PRICE_CHANGE: 10,
    Action.CANCEL_ORDER: 6,
    Action.RENAME_CUSTOMER: 4,
}


@dataclass(frozen=True)
class Step:
    action: Action
    number: int
    sku: str
    quantity: int
    price_factor: Decimal
    path: str


def plan_step(rng: random.Random, number: int) -> Step:
    action = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    return Step(
        action=action,
        number=number,
        sku=rng.choice(SKUS),
        quantity=rng.randint(1, 5),
        price_factor=Decimal(rng.randint(90, 110)) / 100,
        path=rng.choice(PATHS),
    )


STATEMENTS = {
    Action.NEW_CUSTOMER: (
        "INSERT INTO public.customers (email, name) VALUES (%(email)s, %(name)s) "
        "ON CONFLICT (email) DO NOTHING"
    ),
    Action.NEW_ORDER: (
        "INSERT INTO public.orders (customer_id, sku, quantity) "
        "SELECT id, %(sku)s, %(quantity)s FROM public.customers ORDER BY random() LIMIT 1"
    ),
    Action.PRICE_CHANGE: (
        "UPDATE inventory.products SET price = round(price * %(factor)s, 2) WHERE sku = %(sku)s"
    ),
    Action.CANCEL_ORDER: (
        "DELETE FROM public.orders WHERE id = (SELECT id FROM public.orders ORDER BY random() LIMIT 1)"
    ),
    Action.RENAME_CUSTOMER: (
        "UPDATE public.customers SET name = name || ' ' || %(suffix)s "
        "WHERE id = (SELECT id FROM public.customers ORDER BY random() LIMIT 1)"
    ),
    Action.PAGE_VIEW: "INSERT INTO public.page_views (path) VALUES (%(path)s)",
}


def parameters(step: Step) -> dict[str, object]:
    return {
        "email": f"demo{step.number}@example.com",
        "name": f"Demo customer {step.number}",
        "sku": step.sku,
        "quantity": step.quantity,
        "factor": step.price_factor,
        "suffix": f"#{step.number}",
        "path": step.path,
    }


class DemoWriter:
    """Runs steps at `rate` per second until `stop` is set or `steps` are done (0: no limit)."""

    def __init__(self, dsn: str, rate: float, seed: int | None = None) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.dsn = dsn
        self.interval = 1.0 / rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.done = 0

    def run(self, steps: int = 0) -> int:
        conn = psycopg2.connect(self.dsn, application_name="bottledwater-demo-writer")
        try:
            while not self.stop.is_set() and (steps == 0 or self.done < steps):
                step = plan_step(self.rng, self.done)
                with conn, conn.cursor() as cur:  # one transaction per step
                    cur.execute(STATEMENTS[step.action], parameters(step))
                self.done += 1
                self.stop.wait(self.interval)
        finally:
            conn.close()
        return self.done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stack.demo_writer", description="Live writes to the demo's sample database."
    )
    parser.add_argument(
        "-d", "--postgres", default=None, help=f"DSN (default: the stack's {DEMO_DATABASE} database)"
    )
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="writes per second (default: 2)")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many writes (default: never)")
    parser.add_argument("--seed", type=int, default=None, help="random seed, for a repeatable run")
    args = parser.parse_args(argv)
    writer = DemoWriter(
        args.postgres or StackConfig.from_env().postgres_url(DEMO_DATABASE), args.rate, args.seed
    )

    def handle(_signum: int, _frame: FrameType | None) -> None:
        writer.stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    done = writer.run(args.steps)
    print(f"demo writer: {done} write(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
