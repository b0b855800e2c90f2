"""The view names of a consistent read registered as SQL (`spark_jobs.reading.views`); the views
themselves are queried on the real stack in tests/integration/test_lakehouse_changelog.py."""

from __future__ import annotations

import pytest

from spark_jobs.reading.views import view_names


def test_a_public_table_is_its_name_another_schema_is_prefixed_by_it() -> None:
    names = ["public.accounts", "sales.orders", "transfers"]
    assert view_names(names) == {
        "public.accounts": "accounts",
        "sales.orders": "sales_orders",
        "transfers": "transfers",
    }
    assert view_names(names, prefix="at_") == {
        "public.accounts": "at_accounts",
        "sales.orders": "at_sales_orders",
        "transfers": "at_transfers",
    }


def test_two_tables_that_would_share_a_view_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="public.sales_orders and sales.orders would both be the view"):
        view_names(["public.sales_orders", "sales.orders"])
