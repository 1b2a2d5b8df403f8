"""`vmrun setup --container`: which container steps a host gets, what re-runs them, what they
run, and its bad input (pure, and the CLI before it connects). The steps run for real on a
Docker test host in tests/test_setup_container.py."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import Client, error_in

from vmrun.containers.runtime import RUNTIMES
from vmrun.errors import ConfigError
from vmrun.setup.facts import parse as parse_facts
from vmrun.setup.planning import PlanInputs, make_plan
from vmrun.setup.playbook import Step, applies, load, parse_steps
from vmrun.setup.report import SetupOptions, StepStatus
from vmrun.setup.state import SetupState
from vmrun.setup.stepscripts import apply_script, check_script, dry_run_text

CONTAINER_STEPS = [
    "container-engine",
    "nvidia-container-toolkit",
    "docker-group",
    "container-check",
]
NOWHERE = "203.0.113.9"  # TEST-NET-3: had setup tried to connect, it would not exit 2


def _params(**given: str) -> dict[str, str]:
    return {**load().params, **given}


def _why(name: str, params: dict[str, str], *, gpu: bool, cluster: bool = False) -> str | None:
    step = load().step(name).resolved(params)
    return applies(step, gpu=gpu, env="venv", os_release="24.04", params=params, cluster=cluster)


def test_the_container_steps_come_last_and_do_nothing_unless_asked() -> None:
    book = load()
    assert [s.name for s in book.steps][-4:] == CONTAINER_STEPS
    assert book.params["container"] == "none" and book.choices["container"] == (
        "none",
        "docker",
        "podman",
    )
    for name in CONTAINER_STEPS:
        assert _why(name, _params(), gpu=True) == "container=none"


@pytest.mark.parametrize(
    ("container", "gpu", "skipped"),
    [
        ("docker", True, {}),
        ("docker", False, {"nvidia-container-toolkit": "no NVIDIA GPU"}),
        ("podman", True, {"docker-group": "container=podman"}),
        (
            "podman",
            False,
            {"nvidia-container-toolkit": "no NVIDIA GPU", "docker-group": "container=podman"},
        ),
    ],
)
def test_which_container_steps_a_host_gets(
    container: str, gpu: bool, skipped: dict[str, str]
) -> None:
    params = _params(container=container)
    got = {n: why for n in CONTAINER_STEPS if (why := _why(n, params, gpu=gpu))}
    assert got == skipped


def test_a_clusters_login_node_gets_none_of_them() -> None:
    params = _params(container="docker")
    for name in CONTAINER_STEPS:
        assert _why(name, params, gpu=True, cluster=True) == "a cluster's login node"


def test_the_gpu_checks_hand_the_gpus_over_as_train_image_does() -> None:
    """The check's container gets the GPUs with the flags `train --image` uses."""
    step = load().step("container-check")
    for engine in ("docker", "podman"):
        script = apply_script(step.resolved(_params(container=engine)))
        flags = " ".join(RUNTIMES[engine].gpus)
        assert f'{engine} run --rm {flags} "$VMRUN_CONTAINER_TEST_IMAGE"' in script.replace(
            "\\\n", ""
        ).replace("  ", " ")


def test_docker_configures_the_runtime_and_podman_writes_a_cdi_spec() -> None:
    step = load().step("nvidia-container-toolkit")
    env = {
        "VMRUN_DOCKER_CONFIG": "/etc/docker/daemon.json",
        "VMRUN_CDI_SPEC": "/etc/cdi/nvidia.yaml",
    }
    docker = dry_run_text(step.resolved(_params(container="docker")), env)
    podman = dry_run_text(step.resolved(_params(container="podman")), env)
    assert "nvidia-ctk runtime configure --runtime=docker" in docker
    assert "systemctl restart docker" in docker and "cdi generate" not in docker
    assert "# VMRUN_CDI_SPEC=/etc/cdi/nvidia.yaml" in podman
    assert 'nvidia-ctk cdi generate --output="$VMRUN_CDI_SPEC"' in podman
    assert "runtime configure" not in podman and "restart docker" not in podman


def _plan(params: dict[str, str], state: SetupState, passing: set[str]) -> dict[str, StepStatus]:
    book = load()
    facts = parse_facts("home=/home/u\nuser=u\nsudo=nopasswd\ngpus=1\nos_release=24.04\n", "h")
    opts = SetupOptions(book, params, only=frozenset(CONTAINER_STEPS))
    plan = make_plan(
        opts,
        PlanInputs(facts, params, state.steps, state.stamps),
        lambda steps: {s.name for s in steps} & passing,
    )
    return {s.name: o.status for s, o in plan if s.name in CONTAINER_STEPS}


def _all_done(params: dict[str, str]) -> SetupState:
    state = SetupState({})
    for name in CONTAINER_STEPS:
        state.done(load().step(name).resolved(params), params, {})
    return state


def test_done_steps_skip_and_a_changed_input_reruns_what_follows_it() -> None:
    params = _params(container="docker")
    state = _all_done(params)
    every_check = set(CONTAINER_STEPS)
    assert set(_plan(params, state, every_check).values()) == {StepStatus.SKIPPED}
    # another test image: only the check runs again
    other = {**params, "container_test_image": "nvcr.io/nvidia/pytorch:24.01-py3"}
    assert _plan(other, state, every_check) == {
        "container-engine": StepStatus.SKIPPED,
        "nvidia-container-toolkit": StepStatus.SKIPPED,
        "docker-group": StepStatus.SKIPPED,
        "container-check": StepStatus.WOULD_RUN,
    }
    # the engine gone (its check fails): everything after it runs again
    again = _plan(params, state, every_check - {"container-engine"})
    assert set(again.values()) == {StepStatus.WOULD_RUN}, again
    # Docker's repository instead of the distribution's: the engine's input changed
    repo = _plan({**params, "docker_source": "docker"}, state, every_check)
    assert repo["container-engine"] == StepStatus.WOULD_RUN


def test_relogin_and_param_is_are_checked_and_older_steps_hash_as_before() -> None:
    steps = parse_steps(
        [
            {"name": "g", "relogin": True, "apply": "true", "when": {"param_is": {"p": "x"}}},
        ],
        "t",
        {"p"},
    )
    assert (
        steps[0].relogin
        and applies(steps[0], gpu=False, env="venv", os_release="", params={"p": "y"}) == "p=y"
    )
    for raw, needle in (
        ({"name": "g", "relogin": "yes", "apply": "true"}, "relogin must be true or false"),
        ({"name": "g", "apply": "true", "when": {"param_is": "p"}}, "when.param_is must be"),
        ({"name": "g", "apply": "true", "when": {"param_is": {"q": "x"}}}, "not a param"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_steps([raw], "t", {"p"})
        assert needle in info.value.message, info.value.message
    # steps without relogin hash as they did before it existed: hosts keep their state
    # (the values are what the code before it gave)
    assert Step(name="x", apply="true").definition_hash().startswith("593cbc6dc5e09ec9")
    # the torch step as it was then (its apply since installs numpy too: a changed step,
    # which hosts run again)
    torch = load().step("torch")
    then = (
        "# shellcheck disable=SC2086 # index args and the spec are word lists on purpose\n"
        'vmrun_pip_install "$VMRUN_PYTHON" $VMRUN_PIP_INDEX_ARGS $VMRUN_TORCH\n'
    )
    assert replace(torch, apply=then).definition_hash().startswith("b4df6c2053d5a91a")
    assert not torch.definition_hash().startswith("b4df6c2053d5a91a")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("container", ["docker", "podman"])
def test_the_container_scripts_are_shellcheck_clean(container: str, tmp_path: Path) -> None:
    params = _params(container=container)
    for name in CONTAINER_STEPS:
        step = load().step(name).resolved(params)
        for what, text in (("check", check_script(step)), ("apply", apply_script(step))):
            script = tmp_path / f"{name}-{what}.bash"
            script.write_text("#!/bin/bash\n" + text)
            done = subprocess.run(
                ["shellcheck", "-e", "SC2016,SC1091", str(script)], capture_output=True, text=True
            )
            assert done.returncode == 0, f"{name} {what}:\n{done.stdout}"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--container", "foo"), "--container foo: use docker, podman or none"),
        (("--param", "container=foo"), "container='foo' is not one of"),
        (("-C", "bed", "--container", "docker"), "a cluster's container runtime is its admins'"),
    ],
)
def test_bad_container_input_is_one_line_exit_2(
    client: Client, args: tuple[str, ...], needle: str
) -> None:
    target = () if "-C" in args else (NOWHERE,)
    done = client.vmrun("setup", *target, *args, timeout=60)
    assert done.returncode == 2, done.stderr
    code, said = error_in(done.stderr)
    assert code == "usage" and needle in said, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_setup_container_in_vmrun_toml_asks_for_it_and_the_flag_wins() -> None:
    from vmrun.operations.setup import SetupRequest, resolve_params

    book = load()
    configured = {"container": "podman"}
    assert resolve_params(dict(book.params), configured, {}, {}, [])["container"] == "podman"
    flags = SetupRequest(container="docker").flags()
    assert resolve_params(dict(book.params), configured, {}, flags, [])["container"] == "docker"
