"""The Dagster UI on the stack, in a real browser: the webserver serves the code location, headless
Chromium (Debian's `chromium`) renders the asset graph, and the pipeline's assets are on the page.
The screenshot is kept in docs/ (docs/orchestration.md shows it)."""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from orchestration.policy.links import CDC_WORKER_JOB, UiLinks
from tests.integration.conftest import unique_name
from tests.integration.orchestration_harness import (
    PROJECT_ROOT,
    clean_environ,
    dagster_home,
    dagster_process,
    free_port,
    pipeline_env,
    wait_for,
)

SCREENSHOT = PROJECT_ROOT / "docs" / "dagster-asset-graph.png"
# The text of each asset node in the graph (the last part of its key).
NODE_LABEL = re.compile(r'class="AssetNode_assetName[^"]*"[^>]*>([^<]+)<')
TRUNCATION = "\u2026"
WINDOW = (1600, 1000)
LOAD_TIMEOUT_S = 180
BROWSER_TIMEOUT_S = 120
# Enough virtual time for the app to fetch the graph over GraphQL and lay it out.
VIRTUAL_TIME_BUDGET_MS = 30000
# Root needs --no-sandbox; the rest keep a headless run from reaching out to Google's services.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
    f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}",
]
# The slot's and the tables' names as a user of the demo sees them: nothing in this test creates a
# slot or a topic, and the publication lives in the test's own database.
SLOT = "bottledwater"
SCHEMA = f"""
CREATE SCHEMA inventory;
CREATE TABLE customers (id bigint PRIMARY KEY, email text NOT NULL);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, sku text, quantity int);
CREATE TABLE inventory.products (sku text PRIMARY KEY, title text, price numeric(10, 2));
CREATE PUBLICATION {SLOT} FOR TABLE customers, orders, inventory.products;
"""


def graphql(base: str, query: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body: dict[str, Any] = json.loads(response.read())
    assert "errors" not in body, body
    return body["data"]


def asset_keys(base: str) -> set[str] | None:
    try:
        nodes = graphql(base, "{ assetNodes { assetKey { path } } }")["assetNodes"]
    except (urllib.error.URLError, OSError):
        return None  # not listening yet
    return {"/".join(n["assetKey"]["path"]) for n in nodes} or None


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[bytes]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (make test does)")
    return subprocess.run(
        [executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        timeout=BROWSER_TIMEOUT_S,
        check=True,
    )


def shows(label: str, name: str) -> bool:
    """Whether a node label shows `name`, which the UI shortens to `head…tail` when it is long."""
    if TRUNCATION not in label:
        return label == name
    head, tail = label.split(TRUNCATION, 1)
    return name.startswith(head) and name.endswith(tail) and len(head) + len(tail) < len(name)


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def test_the_asset_graph_shows_the_pipeline_in_a_browser(
    fresh_db: str, pg_dsn: str, kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    with psycopg2.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.execute(SCHEMA)
    conn.close()
    with dagster_home(pg_dsn, tmp_path, unique_name("dagster")) as home:
        env = clean_environ(
            {
                **pipeline_env(fresh_db, SLOT, kafka_bootstrap, registry_url),
                **home.env,
                "BOTTLEDWATER_TOPIC_PREFIX": "",
                "BW_AUTOMATION": "stopped",
            }
        )
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        args = ["dagster-webserver", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
        with dagster_process(args, env, tmp_path / "webserver.log"):
            keys = wait_for(lambda: asset_keys(base), "the webserver to serve the assets", LOAD_TIMEOUT_S)
            expected = {
                "replication_slot",
                "snapshot_export",
                "kafka/customers",
                "kafka/orders",
                "kafka/inventory.products",
                "kafka/bottledwater.control",
                "delta/public/customers",
                "delta/public/orders",
                "delta/inventory/products",
                "delta/changelog",  # the lake's changelog, kept by default
            }
            assert keys == expected
            # dagster.yaml turns off the sign-up dialog Dagster shows a new instance over the graph.
            assert graphql(base, "{ shouldShowNux }")["shouldShowNux"] is False
            graph = f"{base}/asset-groups?expanded=global@global:cdc,global@global:kafka,global@global:delta"

            dom = chromium("--dump-dom", graph, profile=tmp_path / "profile-dom").stdout.decode()
            (tmp_path / "asset-graph.html").write_text(dom)
            labels = sorted(html.unescape(label) for label in NODE_LABEL.findall(dom))
            # One node per asset, labelled with the last part of its key.
            assert len(labels) == len(expected), labels
            for key in expected:
                assert any(shows(label, key.rsplit("/", 1)[-1]) for label in labels), (key, labels)
            for group in ("cdc", "kafka", "delta"):
                assert f">{group}<" in dom, f"group {group} is not on the page"
            assert "Join the Dagster community" not in dom

            shot = tmp_path / "asset-graph.png"
            chromium(f"--screenshot={shot}", graph, profile=tmp_path / "profile-shot")

            # The links the pages carry open the pages they name: the job's page (with its Launchpad,
            # where the runbook's "Launch" is one click) lives under its code location; the bare
            # /jobs/<name> path the pages used to carry does not show it.
            links = UiLinks(base)
            job_dom = chromium("--dump-dom", links.job(CDC_WORKER_JOB), profile=tmp_path / "profile-job")
            job_page = job_dom.stdout.decode()
            (tmp_path / "job.html").write_text(job_page)
            assert CDC_WORKER_JOB in job_page and "Launchpad" in job_page
            assert "could not be found" not in job_page
            bare = chromium("--dump-dom", f"{base}/jobs/{CDC_WORKER_JOB}", profile=tmp_path / "profile-bare")
            assert "Launchpad" not in bare.stdout.decode()
            asset_dom = chromium(
                "--dump-dom", links.asset("replication_slot"), profile=tmp_path / "profile-asset"
            )
            asset_page = asset_dom.stdout.decode()
            (tmp_path / "asset.html").write_text(asset_page)
            assert "replication_slot" in asset_page and "could not be found" not in asset_page
    assert png_size(shot) == WINDOW
    shutil.copyfile(shot, SCREENSHOT)
