"""What a run and its recoveries cost: the nodes' prices recorded as a run starts
(vmrun.results.cost), read back by `report` with no price service."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vmrun.config import load_settings
from vmrun.errors import ConfigError
from vmrun.results.cost import alike, charge, money, prices, recovery_seconds


def test_prices_are_recorded_only_when_every_node_has_one() -> None:
    assert prices({"h1": 0.5, "h2": 1}) == {
        "prices": {"h1": 0.5, "h2": 1.0},
        "price_per_hour": 1.5,
        "currency": "USD",
    }
    assert prices({"h1": 0.5, "h2": None}) == {}  # a partial sum would mislead
    assert prices({}) == {}
    assert charge(1800, 3.0) == 1.5 and charge(None, 3.0) is None and charge(60, None) is None
    assert recovery_seconds({"downtime_s": 30, "epochs_redone": 3}, 10.0) == 60
    assert recovery_seconds({"downtime_s": None, "epochs_redone": 0}, 10.0) is None


@pytest.mark.parametrize("value", ["0.5", -1, True])
def test_a_price_that_is_not_a_number_is_refused_naming_the_key(
    tmp_path: Path, value: object
) -> None:
    shown = json.dumps(value) if not isinstance(value, bool) else "true"
    (tmp_path / "vmrun.toml").write_text(f'[[hosts]]\naddress = "u@h1"\nprice = {shown}\n')
    with pytest.raises(ConfigError) as caught:
        load_settings({}, cwd=tmp_path, environ={})
    assert "price" in caught.value.message and "an amount per hour" in caught.value.message


def test_prices_in_another_currency_are_kept_in_it_and_never_added_to_dollars() -> None:
    assert alike(3.6, 2, "DKK") == {
        "prices": {"node 0": 3.6, "node 1": 3.6},
        "price_per_hour": 7.2,
        "currency": "DKK",
    }
    assert prices({"h1": 0.5, "h2": 3.6}, {"h2": "DKK"}) == {}  # no rate to trust offline
    assert prices({"h1": 0.5}, {"h1": "USD"})["currency"] == "USD"
    assert (money(2, "USD"), money(1234.5, "DKK"), money(None)) == ("$2.00", "1,234.50 DKK", "-")


@pytest.mark.parametrize("value", ['"dkk"', '"KRONER"', "45"])
def test_a_currency_that_is_not_an_iso_code_is_refused(tmp_path: Path, value: str) -> None:
    (tmp_path / "vmrun.toml").write_text(f'[[hosts]]\naddress = "u@h1"\ncurrency = {value}\n')
    with pytest.raises(ConfigError) as caught:
        load_settings({}, cwd=tmp_path, environ={})
    assert "currency" in caught.value.message and "ISO 4217" in caught.value.message


def test_a_report_gives_the_runs_cost_and_each_recoverys(tmp_path: Path) -> None:
    from vmrun.results.history import load_runs
    from vmrun.results.report import report_rows, rows_json, table

    run = tmp_path / "results" / "r1"
    run.mkdir(parents=True)
    meta = {
        "run_id": "r1",
        "cluster": "bed",
        "nodes": 2,
        "nproc_per_node": 1,
        "prices": {"node 0": 1.0, "node 1": 1.0},
        "price_per_hour": 2.0,
    }
    (run / "run.json").write_text(json.dumps(meta))
    (run / "starts").write_text("1 1000\n2 1530\n")
    (run / "exit").write_text("1 requeue 1500\n2 0 4600\n")
    epochs = [{"epoch": e, "loss": 1 / e, "epoch_time_s": 10.0} for e in range(1, 5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))
    facts = {"downtime_s": 30, "epochs_redone": 3, "lost": ["c1"]}
    (run / "recoveries").write_text(
        f"recovery\t1530\tattempt 1 failed (node(s) c1 lost)\t{json.dumps(facts)}\n"
    )
    (row,) = report_rows(load_runs([run]))
    assert (row.cost, row.currency) == (2.0, "USD")  # an hour, two nodes at $1
    (told,) = row.recoveries or []
    assert (told["cost_s"], told["cost"]) == (60.0, 0.03)
    assert json.loads(rows_json([row]))[0]["cost"] == 2.0
    heads, numeric, (cells,) = table([row])
    assert heads[-2:] == ("COST", "RECOVERIES") and heads.index("COST") in numeric
    assert cells[-2] == "$2.00" and cells[-1] == "1 (30.0 s down, 3 redone, $0.03)"


def test_up_records_each_vms_price_on_its_host() -> None:
    from vmrun.operations.cloud import _entries
    from vmrun.providers.api import Instance

    made = [
        Instance(
            f"i-{n}",
            "c1",
            "running",
            "g4dn.xlarge",
            "us-east-1a",
            "us-east-1",
            f"198.51.100.{n + 1}",
            f"10.0.0.{n + 1}",
            index=n,
        )
        for n in range(2)
    ]
    hosts = _entries("c1", "ubuntu", made, "", price=0.526)
    assert [h.vars["price"] for h in hosts] == [0.526, 0.526]
    assert "price" not in _entries("c1", "ubuntu", made, "")[0].vars


def test_a_sweeps_runs_are_added_up_under_the_report_each_currency_apart(tmp_path: Path) -> None:
    from vmrun.results.history import load_runs
    from vmrun.results.report import notes, report_rows, table

    for name, per_hour, currency in (("r1", 2.0, "USD"), ("r2", 4.0, "USD"), ("r3", 30.0, "DKK")):
        run = tmp_path / name
        run.mkdir()
        meta = {
            "run_id": name,
            "nodes": ["h1"],
            "nproc_per_node": 1,
            "prices": {"h1": per_hour},
            "price_per_hour": per_hour,
            "currency": currency,
        }
        before = {"ran_before_s": 1800} if name == "r1" else {}  # resumed: its first attempt
        (run / "run.json").write_text(json.dumps({**meta, "started": 1000, **before}))
        (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "loss": 0.5}) + "\n")
        (run / "exit_code").write_text("0\n")
        os.utime(run / "exit_code", (2800, 2800))  # half an hour after its start
    rows = report_rows(load_runs(sorted(tmp_path.iterdir())))
    assert [(r.cost, r.currency) for r in rows] == [(2.0, "USD"), (2.0, "USD"), (15.0, "DKK")]
    heads, _, shown = table(rows)
    assert [c[heads.index("COST")] for c in shown] == ["$2.00", "$2.00", "15.00 DKK"]
    assert notes(rows).endswith("cost in all: $4.00 (2 runs), 15.00 DKK (1 runs)")


@pytest.mark.parametrize("value", ["lots", "-5", "inf"])
def test_a_max_cost_that_is_not_an_amount_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"max_cost": value}, cwd=tmp_path, environ={})
    assert "--max-cost" in caught.value.message and "an amount" in caught.value.message
    assert load_settings({"max_cost": "off"}, cwd=tmp_path, environ={}).max_cost == 0.0
    assert load_settings({}, cwd=tmp_path, environ={"VMRUN_MAX_COST": "7.5"}).max_cost == 7.5


@pytest.mark.parametrize("where", [["--local"]])
def test_max_cost_where_no_price_holds_is_refused_before_anything_starts(
    where: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from conftest import error_in

    from vmrun.cli.main import run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "vmrun.toml").write_text('[[clusters]]\nname = "bed"\nlogin = "u@login"\n')
    assert run(["train", *where, "--max-cost", "5", "--epochs", "1"]) == 2
    code, said = error_in(capsys.readouterr().err)
    assert code == "over-budget" and "--max-cost cannot cap" in said, said
    assert not (tmp_path / "results").exists()
