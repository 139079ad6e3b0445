"""The committed serving benchmarks and docs/serving.md made from them: each file says where and when it was
measured, measured what was asked of it, and the page's tables show its numbers, not typed ones."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from distrinews_course.bench.serving_tables import int8_table, model_name, race_findings, race_rows, race_table

ROOT = Path(__file__).resolve().parent.parent
RACES = sorted((ROOT / "benchmarks").glob("serving_vs_litserve_*.json"))
INT8 = sorted((ROOT / "benchmarks").glob("serving_int8_*.json"))


def provenance_is_complete(report: dict) -> None:
    p = report["provenance"]
    assert p["machine"] and p["started"] and p["command"].startswith("python scripts/bench_serving.py"), p
    assert p["git_commit"] and p["versions"]["torch"] and len(p["load_average_at_start"]) == 3, p
    assert report["quick"] is False, "a --quick run is a smoke test, not a measurement"


def test_both_benchmarks_are_committed():
    assert RACES and INT8, "benchmarks/serving_vs_litserve_<machine>.json and serving_int8_<machine>.json"


@pytest.mark.parametrize("path", RACES, ids=lambda p: p.name)
def test_the_race_measured_what_the_issue_asks(path):
    report = json.loads(path.read_text())
    provenance_is_complete(report)
    assert [row["concurrency"] for row in report["levels"]] == [1, 16, 64, 256]
    assert report["settings"]["rounds"] >= 2, "alternating rounds"
    ours, lit = report["competitors"]["ours"]["settings"], report["competitors"]["litserve"]["settings"]
    assert lit["max_batch_size"] == ours["max_batch_size"] and lit["batch_timeout_s"] == ours["batch_window_ms"] / 1000
    assert lit["workers_per_device"] == 1
    for row in report["levels"]:
        for name in ("ours", "litserve"):
            r = row[name]
            assert r["answered"] > 0 and {"p50", "p99"} <= set(r["latency_answered_ms"]) and "failed" in r, r
    table = race_table(report, path.name)
    assert report["provenance"]["machine"] in table and report["provenance"]["started"][:10] in table
    for row in report["levels"]:
        assert f"| {row['concurrency']} | {row['ours']['answered_per_s']:,.0f} |" in table


@pytest.mark.parametrize("path", INT8, ids=lambda p: p.name)
def test_int8_measured_what_the_issue_asks(path):
    report = json.loads(path.read_text())
    provenance_is_complete(report)
    assert report["data"]["test_texts"] == 7600, "AG News' whole test set"
    table = int8_table(report, path.name)
    for r in report["checkpoints"]:
        assert r["texts"] == 7600 and 16 in [x["concurrency"] for x in r["serving"]]
        assert "throughput_at_16" in r["targets"] and "accuracy" in r["targets"]
        assert f"{r['accuracy']['delta_points']:+.2f} points" in table
    assert "/work/" not in table and "site-packages" not in table, "no machine's path on the page"


def level(concurrency, ours, lit, shed=0):
    def side(per_s, p99, failed, shed=0):
        return {
            "answered_per_s": per_s,
            "answered": int(per_s * 4),
            "failed": failed,
            "shed": shed,
            "latency_answered_ms": {"p50": p99 / 3, "p99": p99},
            "cpu_ms_per_answer": 1.0,
        }

    return {"concurrency": concurrency, "ours": side(*ours, shed=shed), "litserve": side(*lit)}


def test_findings_name_each_measure_where_litserve_did_better():
    report = {
        "competitors": {"ours": {"settings": {"max_queue": 128}}},
        "levels": [level(16, (1000, 20, 0), (500, 40, 0)), level(256, (900, 450, 100), (950, 300, 0), shed=100)],
    }
    found = race_findings(report)
    assert "16 clients" not in found, found
    assert "256 clients" in found and "throughput 900 against 950" in found and "p99 450 against 300" in found
    assert "100 shed by design" in found and "128 requests were waiting" in found, found
    assert race_findings({"levels": report["levels"][:1]}) == ""
    assert "**0.95x**" in race_rows(report["levels"])


def test_model_names_leave_the_machine_out():
    assert model_name({"metadata_model": "tiny"}) == "tiny"
    local = "/home/me/.venv/lib/site-packages/all_minilm_l6_v2/model"
    assert model_name({"metadata_model": local}) == "all_minilm_l6_v2"
    assert model_name({"metadata_model": "sentence-transformers/all-MiniLM-L6-v2"}) == "all-MiniLM-L6-v2"


def test_the_serving_page_is_generated_from_the_records():
    """docs/serving.md is what the generator makes of benchmarks/serving*.json and the server's settings: a figure
    typed into the page by hand, or a record changed without regenerating it, fails here."""
    from distrinews_course.bench.serving_tables import GENERATOR, PAGE, serving_page

    page = (ROOT / PAGE).read_text()
    assert page == serving_page(ROOT), f"{PAGE} is out of date: run `{GENERATOR}`"
    for figure in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page):
        assert (ROOT / "docs" / figure).is_file(), f"{PAGE} shows {figure}, which `{GENERATOR}` did not write"
    assert "/work/" not in page and "site-packages" not in page, "no machine's path on the page"


def test_the_serving_page_tables_carry_each_records_numbers():
    """A changed figure in a record changes the page: the tables read the records, they do not copy them."""
    from distrinews_course.bench.serving_tables import batching_table, overload_tables

    report = json.loads((ROOT / "benchmarks" / "serving.json").read_text())
    before = batching_table(report, "serving.json")
    report["configs"][0]["levels"][-1]["requests_per_s"] = 12345.0
    after = batching_table(report, "serving.json")
    assert "12,345" in after and "12,345" not in before
    overload = json.loads((ROOT / "benchmarks" / "serving_overload.json").read_text())
    row = overload["levels"][0]["after"]
    assert f"| {row['answered_per_s']:,.0f} | {row['shed']:,} of {row['sent']:,}" in overload_tables(overload, "x")
