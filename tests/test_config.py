"""config: defaults < user config < project vmrun.toml < VMRUN_* < flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmrun.config import find_project_dir, load_settings
from vmrun.errors import ConfigError


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    home = tmp_path / "home"
    (home / ".config" / "vmrun").mkdir(parents=True)
    project = tmp_path / "proj"
    (project / "sub" / "deeper").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("VMRUN_CONFIG", raising=False)
    return {"home": home, "project": project, "user": home / ".config" / "vmrun" / "config.toml"}


def test_defaults(layout: dict[str, Path]) -> None:
    s = load_settings(cwd=layout["project"], environ={})
    assert s.connect_timeout == 10.0
    assert s.accept_new_host_key is False
    assert s.ssh_config == layout["home"] / ".ssh" / "config"
    assert s.known_hosts == layout["home"] / ".config" / "vmrun" / "known_hosts"
    assert set(s.sources.values()) == {"default"}
    assert s.project_dir is None


def test_each_layer_overrides_the_one_before(layout: dict[str, Path]) -> None:
    layout["user"].write_text(
        "connect_timeout = 3\nkeepalive_interval = 7\nkeepalive_count_max = 9\n"
    )
    (layout["project"] / "vmrun.toml").write_text(
        'connect_timeout = 4\nkeepalive_interval = 8\n\n[[hosts]]\naddress = "u@h"\n'
    )
    cwd = layout["project"] / "sub" / "deeper"
    env = {"VMRUN_CONNECT_TIMEOUT": "5"}
    s = load_settings({"connect_timeout": 6}, cwd=cwd, environ=env)
    assert s.connect_timeout == 6 and s.sources["connect_timeout"] == "command line"
    s = load_settings({}, cwd=cwd, environ=env)
    assert s.connect_timeout == 5 and s.sources["connect_timeout"] == "environment"
    assert s.keepalive_interval == 8 and s.sources["keepalive_interval"].endswith("vmrun.toml")
    assert s.keepalive_count_max == 9
    assert s.sources["keepalive_count_max"] == str(layout["user"])
    assert s.project_dir == layout["project"].resolve()
    assert find_project_dir(cwd) == layout["project"].resolve()


def test_set_is_a_layer_over_the_environment_and_under_the_flags(
    layout: dict[str, Path],
) -> None:
    """`--set KEY=VALUE` (git's -c): any setting by its vmrun.toml key, parsed as VMRUN_KEY
    is; a command's own flag still wins; a word that names no setting is one clear line."""
    from vmrun.config import parse_sets

    env = {"VMRUN_CONNECT_TIMEOUT": "5", "VMRUN_HANG_TIMEOUT": "30m"}
    sets = parse_sets(["connect_timeout=7", "hang-timeout=1h", "keepalive_interval=2"])
    s = load_settings({}, cwd=layout["project"], environ=env, sets=sets)
    assert (s.connect_timeout, s.sources["connect_timeout"]) == (7.0, "--set")
    assert s.hang_timeout == "1h" and s.keepalive_interval == 2.0
    s = load_settings({"connect_timeout": 6}, cwd=layout["project"], environ=env, sets=sets)
    assert s.connect_timeout == 6  # the command's own flag
    for word, fact in (("colour=red", "'colour' is no setting"), ("store", "no =")):
        with pytest.raises(ConfigError) as info:
            parse_sets([word])
        assert info.value.code == "bad-config" and fact in info.value.message
        assert "hang_timeout" in (info.value.hint or "")
    with pytest.raises(ConfigError) as info:
        load_settings({}, cwd=layout["project"], environ={}, sets={"hang_timeout": "soon"})
    assert "hang_timeout (from --set)" in info.value.message


def test_vmrun_config_env_points_at_another_user_file(
    layout: dict[str, Path], tmp_path: Path
) -> None:
    other = tmp_path / "other.toml"
    other.write_text("accept_new_host_key = true\n")
    s = load_settings(cwd=layout["project"], environ={"VMRUN_CONFIG": str(other)})
    assert s.accept_new_host_key is True


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("connect_timeout = 'soon'\n", "connect_timeout"),
        ("connect_timeout = -1\n", "connect_timeout"),
        ("keepalive_count_max = 0\n", "keepalive_count_max"),
        ("conect_timeout = 3\n", "'conect_timeout'"),
        ("connect_timeout = \n", "TOML"),
        ("accept_new_host_key = 'maybe'\n", "accept_new_host_key"),
    ],
)
def test_bad_project_file_is_one_clear_error(
    layout: dict[str, Path], text: str, needle: str
) -> None:
    (layout["project"] / "vmrun.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cwd=layout["project"], environ={})
    assert info.value.code == "bad-config" and needle in info.value.one_line()
    assert "\n" not in info.value.one_line()


def test_bad_env_value_names_the_variable(layout: dict[str, Path]) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(cwd=layout["project"], environ={"VMRUN_CONNECT_TIMEOUT": "abc"})
    assert info.value.code == "bad-config" and "connect_timeout" in info.value.message
    assert "environment" in info.value.message  # where the bad value came from


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("# hi\n\nconnect_timeout = 'ten'\n", 3, "connect_timeout must be a number of seconds"),
        ('connect_timeout = "10"\n', 1, 'got "10"'),
        ("keepalive_count_max = 2.5\n", 1, "keepalive_count_max must be a whole number"),
        ("accept_new_host_key = 1\n", 1, "accept_new_host_key must be true or false"),
        ("known_hosts = 3\n", 1, "known_hosts must be a path in quotes"),
        ("colour = true\n", 1, "unknown setting 'colour'"),
        ("connect_timeout = 3\n\n[train]\nepochs = 3\n", 3, "unknown setting 'train'"),
        ("setup = 3\n", 1, "setup must be a table"),
        (
            '[[hosts]]\naddress = "a@b"\n\n[[hosts]]\naddress = "c@d"\nconnect_timeout = "ten"\n',
            6,
            "unknown key 'connect_timeout' in host #2; settings go at the top of the file",
        ),
        ('[[hosts]]\naddress = "a@b"\npyhton = "/x"\n', 3, "unknown key 'pyhton' in host #1"),
        (
            'hosts = [\n  { address = "a@b" },\n  { address = "c@d", gpus = 8 },\n]\n',
            3,
            "unknown key 'gpus' in host #2",
        ),
        ('[[hosts]]\naddress = "a@b"\nprivate_addr = 10\n', 3, "private_addr of host #1 must be"),
        ('[[hosts]]\naddress = "a@b"\n[hosts.env]\nX = [1]\n', 3, "env of host #1 must be"),
        ('[[hosts]]\naddress = "a@b"\ngroups = ["a", 1]\n', 3, "groups of host #1 must be"),
        ("[[hosts]]\naddress = 7\n", 2, "address of host #1 must be"),
        ('hosts = "a@b"\n', 1, "hosts must be [[hosts]] tables or a list"),
    ],
)
def test_unknown_or_mistyped_keys_in_vmrun_toml_name_file_line_and_key(
    layout: dict[str, Path], text: str, line: int, needle: str
) -> None:
    path = layout["project"] / "vmrun.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cwd=layout["project"], environ={})
    message = info.value.one_line()
    assert message.startswith(f"{path} line {line}: "), message
    assert needle in message


def test_every_host_key_with_its_type_is_accepted(layout: dict[str, Path]) -> None:
    (layout["project"] / "vmrun.toml").write_text(
        '[[hosts]]\naddress = "a@b"\nname = "n"\ngroups = ["g"]\npython = "/p"\n'
        'private_addr = "10.0.0.5"\nifname = "ens5"\nnvidia_smi = "~/bin/nvidia-smi"\n'
        'env = { NCCL_IB_DISABLE = "1", N = 2, ON = true }\n\n[setup]\nenv = "uv"\n'
    )
    s = load_settings(cwd=layout["project"], environ={})
    assert s.project_data["hosts"][0]["env"] == {"NCCL_IB_DISABLE": "1", "N": 2, "ON": True}


def test_the_user_config_is_checked_too_and_has_no_hosts(layout: dict[str, Path]) -> None:
    layout["user"].write_text('connect_timeout = 3\n\n[[hosts]]\naddress = "a@b"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(cwd=layout["project"], environ={})
    assert info.value.one_line().startswith(f"{layout['user']} line 3: unknown setting 'hosts'")
    layout["user"].write_text("[setup]\nenv = 'uv'\n\n[setup.x]\n")  # [setup] is the setup's
    assert load_settings(cwd=layout["project"], environ={}).section("setup")["env"] == "uv"
