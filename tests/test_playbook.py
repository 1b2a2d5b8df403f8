"""playbook: parsing, validation, conditions and fingerprints (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmrun.errors import ConfigError, RemoteError
from vmrun.setup.environment import TORCH_INDEX, cuda_index
from vmrun.setup.facts import parse as parse_facts
from vmrun.setup.playbook import applies, builtin_dir, fingerprint, load, parse, parse_steps


def test_the_default_playbook_loads_and_ships() -> None:
    book = load()
    assert book.name == "default"
    assert [s.name for s in book.steps] == [
        "python-venv-package",
        "nvidia-driver",
        "python-env",
        "torch",
        "extra-packages",
        "verify",
        "container-engine",  # these four only with --container (tests/test_setup_container*)
        "nvidia-container-toolkit",
        "docker-group",
        "container-check",
    ]
    assert book.params["env"] == "venv" and book.params["torch_index"] == "auto"
    assert (builtin_dir() / "default.yaml").is_file()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("steps: []", "non-empty list"),
        ("steps:\n  - apply: x", "needs a name"),
        ("steps:\n  - name: Bad Name\n    apply: x", "needs a name"),
        ("steps:\n  - name: a", "nothing to do"),
        ("steps:\n  - name: a\n    apply: x\n    aply: y", "unknown field(s) aply"),
        ("steps:\n  - name: a\n    apply: x\n    inputs: [nope]", "inputs nope are not params"),
        (
            "steps:\n  - name: a\n    apply: x\n    needs: [b]\n  - name: b\n    apply: y",
            "comes after it",
        ),
        ("steps:\n  - name: a\n    apply: x\n  - name: a\n    apply: y", "appears twice"),
        ("steps:\n  - name: a\n    apply: x\n    when: {cpu: true}", "when may hold"),
        ("params: [a]\nsteps:\n  - name: a\n    apply: x", "params must be a mapping"),
    ],
)
def test_bad_playbooks_are_one_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert info.value.code == "bad-config"
    assert needle in info.value.one_line() and str(path) in info.value.one_line()


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("steps: [unclosed")
    for name in ("bad.yaml", "missing.yaml"):
        with pytest.raises(ConfigError) as info:
            load(tmp_path / name)
        assert info.value.code == "bad-config" and name in info.value.message


def test_conditions() -> None:
    book = load()
    driver, venv_pkg, extra = (
        book.step(n) for n in ("nvidia-driver", "python-venv-package", "extra-packages")
    )
    params = dict(book.params)
    assert (
        applies(driver, gpu=False, env="venv", os_release="22.04", params=params) == "no NVIDIA GPU"
    )
    assert applies(driver, gpu=True, env="venv", os_release="22.04", params=params) is None
    assert (
        applies(
            driver, gpu=True, env="venv", os_release="22.04", params={**params, "driver": "none"}
        )
        == "driver=none"
    )
    assert (
        applies(venv_pkg, gpu=False, env="uv", os_release="", params=params) == "env manager is uv"
    )
    assert applies(extra, gpu=False, env="venv", os_release="", params=params) == "pip not set"
    assert (
        applies(extra, gpu=False, env="venv", os_release="", params={**params, "pip": "numpy"})
        is None
    )
    (only_jammy,) = parse_steps([{"name": "x", "apply": "true", "when": {"os": ["22.04"]}}], "t")
    assert (
        applies(only_jammy, gpu=False, env="venv", os_release="24.04", params={})
        == "OS release 24.04"
    )


def test_fingerprints_follow_inputs_and_needs() -> None:
    book = parse(
        {
            "params": {"a": "1", "b": "2"},
            "steps": [
                {"name": "one", "apply": "x", "inputs": ["a"]},
                {"name": "two", "apply": "y", "needs": ["one"]},
            ],
        },
        "t",
    )
    one, two = book.steps
    base = fingerprint(one, {"a": "1", "b": "2"}, {})
    assert fingerprint(one, {"a": "1", "b": "changed"}, {}) == base  # b is not its input
    assert fingerprint(one, {"a": "changed", "b": "2"}, {}) != base
    assert fingerprint(two, {}, {"one": "stamp-1"}) != fingerprint(two, {}, {"one": "stamp-2"})
    edited = parse({"steps": [{"name": "one", "apply": "x --more", "inputs": []}]}, "t").steps[0]
    assert fingerprint(edited, {}, {}) != fingerprint(one, {}, {})


@pytest.mark.parametrize(
    ("cuda", "compute_cap", "index"),
    [
        # any 12.x driver runs every 12.x runtime (minor-version compatibility): newest 12.x build
        ("12.0", "", TORCH_INDEX + "cu128"),
        ("12.2", "7.5", TORCH_INDEX + "cu128"),
        ("12.9", "9.0", TORCH_INDEX + "cu128"),
        # Volta and older: cu126 is the last build with their kernels, on 12.x and 13.x drivers
        ("12.4", "7.0", TORCH_INDEX + "cu126"),
        ("13.0", "6.1", TORCH_INDEX + "cu126"),
        # CUDA 13 with a current GPU: PyPI's default build
        ("13.0", "8.0", None),
        ("13.1", "", None),
        ("11.4", "", TORCH_INDEX + "cu118"),
        ("", "", None),
    ],
)
def test_cuda_wheel_index_matches_the_driver(
    cuda: str, compute_cap: str, index: str | None
) -> None:
    assert cuda_index(cuda, compute_cap) == index


def test_too_old_a_driver_says_so() -> None:
    with pytest.raises(RemoteError) as info:
        cuda_index("10.2")
    assert info.value.code == "driver-too-old" and "10.2" in info.value.message


def test_facts_keep_only_real_versions_and_say_why_sudo_cannot_run() -> None:
    text = "home=/home/u\nsudo=password\nsudo_says=sudo: a password is required\ncompute_cap=7.5\n"
    facts = parse_facts(text, "h")
    assert facts.compute_cap == "7.5" and not facts.can_sudo
    assert facts.sudo_problem == "sudo needs a password (sudo: a password is required)"
    # a stand-in or an old nvidia-smi that does not know the field prints something else
    odd = parse_facts('home=/h\nsudo=none\ncompute_cap=Field "compute_cap" is not valid\n', "h")
    assert odd.compute_cap == "" and odd.sudo_problem == "there is no sudo"
    assert parse_facts("home=/h\nsudo=root\n", "h").sudo_problem == ""


@pytest.mark.parametrize(
    ("requirements", "passes"),
    [
        (["pytest"], True),
        (["PyYAML>=5"], True),  # the distribution's name, any case
        (["pytest>=999"], False),  # installed, but not at a version the spec allows
        (["vmrun-not-a-package"], False),
        (["pytest", "vmrun-not-a-package"], False),
        (["vmrun-not-a-package; python_version < '3'", "pytest"], True),  # not for this python
        (["-r", "requirements.txt"], False),  # not a requirement: pip decides
        (["pkg @ https://example.invalid/pkg.whl"], False),
    ],
)
def test_a_pip_steps_check_asks_the_env(requirements: list[str], passes: bool) -> None:
    """The check a `pip:` step gets, run by this interpreter as the env's would be."""
    import subprocess
    import sys

    from vmrun.hostside import source

    check = source("setup_pip_check.py")
    done = subprocess.run(
        [sys.executable, "-", *requirements],
        input=check,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert (done.returncode == 0) is passes, done.stderr


# -- the schema, strictly: each field its one type, named in a one-line error ------------
# Before, fields went through bool() and iteration: `when: {os: "22.04"}` compared the OS with
# each character, `when: {gpu: "false"}` meant true, and `sudo: "no"` was true.


@pytest.mark.parametrize(
    ("step", "needle"),
    [
        ("when: {os: 22.04}", ("when.os", "quote versions")),  # the hint is the point
        ('when: {gpu: "false"}', ("when.gpu", "'false'")),
        ("when: {gpu: 1}", ("when.gpu", "number")),
        ('sudo: "no"', ("sudo", "'no'")),
        ('reboot: "yes"', ("reboot", "'yes'")),
        ("record: 1", ("record", "number")),
        ("when: {env: [venv, 3]}", ("when.env",)),
        ("when: {param: [a]}", ("when.param", "list")),
        ("when: {param: nope}", ("when.param", "'nope'")),
        ("when: {param_not: driver}", ("when.param_not",)),
        ("when: {param_not: {a: [x]}}", ("when.param_not.a", "list")),
        ("when: {cpu: true}", ("when.cpu",)),
        ("when: [gpu]", ("when", "list")),
        ("check: [a, b]", ("check", "list")),
        ("description: {a: 1}", ("description", "mapping")),
        ("apt: {a: 1}", ("apt", "mapping")),
    ],
)
def test_each_field_has_its_type(tmp_path: Path, step: str, needle: tuple[str, ...]) -> None:
    """One line, `bad-config`, naming the file, the step, the field and what it got."""
    path = tmp_path / "book.yaml"
    path.write_text(f"params: {{a: x}}\nsteps:\n  - name: s1\n    apply: x\n    {step}\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    line = info.value.one_line()
    assert "\n" not in line and info.value.code == "bad-config"
    assert line.startswith(f"{path}: step 's1': "), line
    assert all(fact in line for fact in needle), line


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nmae: x\nsteps:\n  - name: a\n    apply: x", "nmae"),
        ("params: {a: [1]}\nsteps:\n  - name: a\n    apply: x", "param a"),
        ("params: {a: true}\nsteps:\n  - name: a\n    apply: x", "param a"),
        ("name: [x]\nsteps:\n  - name: a\n    apply: x", "name"),
    ],
)
def test_the_playbook_level_fields_have_their_types(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "book.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert info.value.code == "bad-config" and f"{path}: " in info.value.message
    assert needle in info.value.message.removeprefix(f"{path}: ")


def test_a_single_os_or_env_string_is_one_value_not_its_characters() -> None:
    (jammy,) = parse_steps([{"name": "x", "apply": "true", "when": {"os": "22.04"}}], "t")
    assert applies(jammy, gpu=False, env="venv", os_release="22.04", params={}) is None
    assert applies(jammy, gpu=False, env="venv", os_release="2", params={}) == "OS release 2"
    (uv_only,) = parse_steps([{"name": "x", "apply": "true", "when": {"env": "uv"}}], "t")
    assert applies(uv_only, gpu=False, env="uv", os_release="", params={}) is None
    assert applies(uv_only, gpu=False, env="u", os_release="", params={}) == "env manager is u"


def test_gpu_false_means_hosts_without_a_gpu() -> None:
    (cpu_only,) = parse_steps([{"name": "x", "apply": "true", "when": {"gpu": False}}], "t")
    assert applies(cpu_only, gpu=False, env="venv", os_release="", params={}) is None
    assert applies(cpu_only, gpu=True, env="venv", os_release="", params={}) == "host has a GPU"


def test_the_default_playbooks_fingerprints_are_unchanged_by_strict_parsing() -> None:
    """Hosts set up before keep their state: valid input parses to what it parsed to before."""
    book = load()
    driver = book.step("nvidia-driver")
    assert driver.when == {"gpu": True, "param_not": {"driver": "none"}}
    assert driver.sudo is True and driver.reboot is True
    assert book.step("python-venv-package").when == {"env": ["venv"]}


def test_on_a_cluster_root_steps_do_not_apply_unless_when_cluster_says() -> None:
    book = load()
    params = dict(book.params)

    def why(name: str, cluster: bool) -> str | None:
        step = book.step(name).resolved(params)
        return applies(
            step, gpu=True, env="venv", os_release="22.04", params=params, cluster=cluster
        )

    for name in ("nvidia-driver", "python-venv-package"):
        assert why(name, cluster=True) == "needs root: a cluster's nodes are the admins'"
        assert why(name, cluster=False) is None
    assert why("python-env", cluster=True) is None and why("torch", cluster=True) is None
    steps = parse_steps(
        [
            {"name": "site", "when": {"cluster": True}, "sudo": True, "apply": "true"},
            {"name": "hosts", "when": {"cluster": False}, "apply": "true"},
        ],
        "t",
    )

    def on(step_index: int, cluster: bool) -> str | None:
        return applies(
            steps[step_index], gpu=False, env="venv", os_release="", params={}, cluster=cluster
        )

    assert on(0, cluster=True) is None and on(0, cluster=False) == "not a cluster"
    assert on(1, cluster=True) == "a cluster's login node" and on(1, cluster=False) is None
    with pytest.raises(ConfigError) as info:
        parse_steps([{"name": "x", "when": {"cluster": "yes"}, "apply": "true"}], "t")
    assert info.value.code == "bad-config" and "when.cluster" in info.value.message
