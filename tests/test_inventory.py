from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vmrun.config import load_settings
from vmrun.errors import ConfigError, UsageError
from vmrun.ssh.hosts import parse_host
from vmrun.ssh.inventory import HostEntry, Recorded, project_hosts, record_hosts, select_hosts

PROJECT = """\
# my cluster
connect_timeout = 5

[[hosts]]
address = "ubuntu@10.0.0.1"
name = "gpu1"
groups = ["a100"]
python = "/home/ubuntu/venvs/vmrun/bin/python"
gpus = 8
private_addr = "172.16.0.1"

[[hosts]]
address = "ubuntu@10.0.0.2:2222"
groups = ["a100", "spare"]
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "vmrun.toml").write_text(PROJECT)
    return tmp_path


def test_project_hosts_are_parsed_with_their_overrides(project: Path) -> None:
    hosts = project_hosts(load_settings(cwd=project, environ={}))
    assert [h.label for h in hosts] == ["gpu1", "ubuntu@10.0.0.2:2222"]
    assert hosts[0].vars == {
        "python": "/home/ubuntu/venvs/vmrun/bin/python",
        "gpus": 8,
        "private_addr": "172.16.0.1",
    }
    assert hosts[1].spec.port == 2222


def test_selection_order_flags_then_env_then_project(project: Path) -> None:
    s = load_settings(cwd=project, environ={})
    assert [h.label for h in select_hosts(None, s, environ={})] == ["gpu1", "ubuntu@10.0.0.2:2222"]
    env = {"VMRUN_HOSTS": "a@x, b@y"}
    assert [h.label for h in select_hosts(None, s, environ=env)] == ["a@x", "b@y"]
    assert [h.label for h in select_hosts(["gpu1"], s, environ=env)] == ["gpu1"]
    assert [h.label for h in select_hosts(["@spare"], s, environ={})] == ["ubuntu@10.0.0.2:2222"]
    # a spec that matches a project host picks up its name and overrides
    (picked,) = select_hosts(["ubuntu@10.0.0.1"], s, environ={})
    assert picked.name == "gpu1"
    with pytest.raises(UsageError, match="group 'nope'"):
        select_hosts(["@nope"], s, environ={})
    with pytest.raises(UsageError, match="ports are 1-65535"):
        select_hosts(["bad@host:99999"], s, environ={})


def test_no_hosts_anywhere_says_what_to_do(tmp_path: Path) -> None:
    s = load_settings(cwd=tmp_path, environ={})
    with pytest.raises(UsageError, match="pass -H user@host, set VMRUN_HOSTS"):
        select_hosts(None, s, environ={})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[[hosts]]\nname = "x"\n', "needs address"),
        ('[[hosts]]\naddress = "bad host"\n', "host #1"),
        ('[[hosts]]\naddress = "a@b"\ngroups = "g"\n', "groups must be a list"),
        (
            '[[hosts]]\naddress = "a@b"\nname = "x"\n[[hosts]]\naddress = "a@c"\nname = "x"\n',
            "appears twice",
        ),
        ('hosts = "a@b"\n', "unknown setting 'hosts'"),
    ],
)
def test_bad_hosts_are_reported_by_entry(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "vmrun.toml").write_text(text)
    with pytest.raises(ConfigError, match=needle):
        project_hosts(load_settings(cwd=tmp_path, environ={}))


def test_record_hosts_appends_and_keeps_comments(project: Path) -> None:
    new = HostEntry(
        parse_host("ucloud@10.0.0.3"),
        name="gpu3",
        vars={"python": "/opt/py/bin/python", "note": 'quote " and ü'},
    )
    again = HostEntry(parse_host("ubuntu@10.0.0.1"))
    done = record_hosts(project, [new, again])
    assert done.added == [new] and done.updated == []
    text = (project / "vmrun.toml").read_text()
    assert text.startswith(PROJECT)  # the user's text, comments included, is untouched
    hosts = project_hosts(load_settings(cwd=project, environ={}))
    assert hosts[-1].name == "gpu3" and hosts[-1].vars["note"] == 'quote " and ü'
    assert record_hosts(project, [new]) == Recorded()
    assert not list(project.glob(".vmrun.toml.*"))  # no temporary file left


def test_record_hosts_updates_a_listed_host_in_place(project: Path) -> None:
    path = project / "vmrun.toml"
    path.write_text(PROJECT.replace('python = "/home/ubuntu/venvs/vmrun/bin/python"',
                                    'python = "/home/ubuntu/venvs/vmrun/bin/python"  # mine'))
    path.chmod(0o644)
    gpu1, spare = project_hosts(load_settings(cwd=project, environ={}))
    moved = HostEntry(gpu1.spec, gpu1.name, gpu1.groups, {**gpu1.vars, "python": "/opt/new/python"})
    first = HostEntry(spare.spec, vars={"python": "/usr/bin/python3"})  # had no python line
    done = record_hosts(project, [moved, first])
    assert done.added == [] and done.updated == [moved, first]
    expected = (PROJECT
                .replace('python = "/home/ubuntu/venvs/vmrun/bin/python"',
                         'python = "/opt/new/python"  # mine')
                .replace('address = "ubuntu@10.0.0.2:2222"\n',
                         'address = "ubuntu@10.0.0.2:2222"\npython = "/usr/bin/python3"\n'))
    assert path.read_text() == expected  # only those two lines differ
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600
    hosts = project_hosts(load_settings(cwd=project, environ={}))
    assert [h.vars.get("python") for h in hosts] == ["/opt/new/python", "/usr/bin/python3"]
    assert record_hosts(project, [moved, first]) == Recorded()  # nothing left to change


def test_record_hosts_creates_the_file(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        record_hosts(tmp_path, [HostEntry(parse_host("u@h:2200"), groups=("g",))])
    finally:
        os.umask(old)
    (entry,) = project_hosts(load_settings(cwd=tmp_path, environ={}))
    assert entry.spec == parse_host("u@h:2200") and entry.groups == ("g",)
    assert stat.S_IMODE((tmp_path / "vmrun.toml").stat().st_mode) == 0o644
