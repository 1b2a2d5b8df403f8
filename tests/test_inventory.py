from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vmrun.config import load_settings
from vmrun.errors import ConfigError, UsageError
from vmrun.ssh.hosts import parse_host
from vmrun.ssh.inventory import (
    HostEntry,
    Recorded,
    find_entry,
    project_hosts,
    record_hosts,
    select_hosts,
)

PROJECT = """\
# my cluster
connect_timeout = 5

[[hosts]]
address = "ubuntu@10.0.0.1"
name = "gpu1"
groups = ["a100"]
python = "/home/ubuntu/venvs/vmrun/bin/python"
ifname = "ens5"
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
        "ifname": "ens5",
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
    with pytest.raises(UsageError) as unknown:
        select_hosts(["@nope"], s, environ={})
    assert unknown.value.code == "group-not-found" and "'nope'" in unknown.value.message
    with pytest.raises(UsageError) as bad:
        select_hosts(["bad@host:99999"], s, environ={})
    assert bad.value.code == "bad-host-spec" and "99999" in bad.value.message


def test_no_hosts_anywhere_says_what_to_do(tmp_path: Path) -> None:
    s = load_settings(cwd=tmp_path, environ={})
    with pytest.raises(UsageError) as none:
        select_hosts(None, s, environ={})
    assert none.value.code == "no-hosts" and "pass -H user@host" in none.value.message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[[hosts]]\nname = "x"\n', "needs address"),
        ('[[hosts]]\naddress = "bad host"\n', "host #1"),
        ('[[hosts]]\naddress = "a@b"\ngroups = "g"\n', "groups of host #1"),
        (
            '[[hosts]]\naddress = "a@b"\nname = "x"\n[[hosts]]\naddress = "a@c"\nname = "x"\n',
            "appears twice",
        ),
        ('hosts = "a@b"\n', "line 1: hosts"),
    ],
)
def test_bad_hosts_are_reported_by_entry(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "vmrun.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        project_hosts(load_settings(cwd=tmp_path, environ={}))
    assert info.value.code == "bad-config" and needle in info.value.message


def test_record_hosts_appends_and_keeps_comments(project: Path) -> None:
    new = HostEntry(
        parse_host("ucloud@10.0.0.3"),
        name="gpu3",
        vars={"python": "/opt/py/bin/python", "nvidia_smi": '/quote " and ü'},
    )
    again = HostEntry(parse_host("ubuntu@10.0.0.1"))
    done = record_hosts(project, [new, again])
    assert done.added == [new] and done.updated == []
    text = (project / "vmrun.toml").read_text()
    assert text.startswith(PROJECT)  # the user's text, comments included, is untouched
    hosts = project_hosts(load_settings(cwd=project, environ={}))
    assert hosts[-1].name == "gpu3" and hosts[-1].vars["nvidia_smi"] == '/quote " and ü'
    assert record_hosts(project, [new]) == Recorded()
    assert not list(project.glob(".vmrun.toml.*"))  # no temporary file left


def test_record_hosts_updates_a_listed_host_in_place(project: Path) -> None:
    path = project / "vmrun.toml"
    path.write_text(
        PROJECT.replace(
            'python = "/home/ubuntu/venvs/vmrun/bin/python"',
            'python = "/home/ubuntu/venvs/vmrun/bin/python"  # mine',
        )
    )
    path.chmod(0o644)
    gpu1, spare = project_hosts(load_settings(cwd=project, environ={}))
    moved = HostEntry(gpu1.spec, gpu1.name, gpu1.groups, {**gpu1.vars, "python": "/opt/new/python"})
    first = HostEntry(spare.spec, vars={"python": "/usr/bin/python3"})  # had no python line
    done = record_hosts(project, [moved, first])
    assert done.added == [] and done.updated == [moved, first]
    expected = (
        PROJECT.replace(
            'python = "/home/ubuntu/venvs/vmrun/bin/python"', 'python = "/opt/new/python"  # mine'
        )
        + 'python = "/usr/bin/python3"\n'
    )
    assert path.read_text() == expected  # only those two lines differ
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600
    hosts = project_hosts(load_settings(cwd=project, environ={}))
    assert [h.vars.get("python") for h in hosts] == ["/opt/new/python", "/usr/bin/python3"]
    assert record_hosts(project, [moved, first]) == Recorded()  # nothing left to change


def test_record_hosts_creates_the_file_with_the_umask_applied_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new file gets 0666 less the umask, from the kernel: vmrun never sets the umask
    (process-wide, so not safe while other threads create files)."""
    old = os.umask(0o027)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(os, "umask", lambda *a: pytest.fail("os.umask was called"))
            record_hosts(tmp_path, [HostEntry(parse_host("u@h:2200"), groups=("g",))])
    finally:
        os.umask(old)
    (entry,) = project_hosts(load_settings(cwd=tmp_path, environ={}))
    assert entry.spec == parse_host("u@h:2200") and entry.groups == ("g",)
    assert stat.S_IMODE((tmp_path / "vmrun.toml").stat().st_mode) == 0o640
    assert (tmp_path / "vmrun.toml").read_text() == (
        '[[hosts]]\naddress = "u@h:2200"\ngroups = ["g"]\n'
    )


# Each layout: the text before, then after setting python on a@b and adding n@ew (named,
# with a python) and bare@x (nothing else to say).
LAYOUTS = {
    "tables": (
        '# c\nconnect_timeout = 1\n\n[[hosts]]\naddress = "a@b"  # me\npython = "/old" # old\n\n'
        '[setup]\nenv = "uv"\n',
        '# c\nconnect_timeout = 1\n\n[[hosts]]\naddress = "a@b"  # me\npython = "/new" # old\n\n'
        '[[hosts]]\naddress = "n@ew"\nname = "n1"\npython = "/p"\n\n'
        '[[hosts]]\naddress = "bare@x"\n\n[setup]\nenv = "uv"\n',
    ),
    "tables, no final newline": (
        '[[hosts]]\naddress = "a@b"\ngroups = ["g"]',
        '[[hosts]]\naddress = "a@b"\ngroups = ["g"]\npython = "/new"\n\n'
        '[[hosts]]\naddress = "n@ew"\nname = "n1"\npython = "/p"\n\n'
        '[[hosts]]\naddress = "bare@x"\n',
    ),
    "tables with a sub-table": (
        '[[hosts]]\naddress = "a@b"\n\n[hosts.env]\nX = "1"\n',
        '[[hosts]]\naddress = "a@b"\npython = "/new"\n\n[hosts.env]\nX = "1"\n\n'
        '[[hosts]]\naddress = "n@ew"\nname = "n1"\npython = "/p"\n\n'
        '[[hosts]]\naddress = "bare@x"\n',
    ),
    "inline tables": (
        'hosts = [\n  { address = "a@b", name = "x" },  # first\n]\n',
        'hosts = [\n  { address = "a@b", name = "x", python = "/new"},  # first\n'
        '  {address = "n@ew", name = "n1", python = "/p"},\n  "bare@x",\n]\n',
    ),
    "bare addresses": (
        'hosts = ["a@b", "c@d"]  # the two\nconnect_timeout = 3\n',
        'hosts = [{address = "a@b", python = "/new"}, "c@d", {address = "n@ew", name = "n1",'
        ' python = "/p"}, "bare@x"]  # the two\nconnect_timeout = 3\n',
    ),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_record_hosts_edits_every_layout_in_place(tmp_path: Path, layout: str) -> None:
    before, after = LAYOUTS[layout]
    path = tmp_path / "vmrun.toml"
    path.write_text(before)
    moved = HostEntry(parse_host("a@b"), vars={"python": "/new"})
    named = HostEntry(parse_host("n@ew"), name="n1", vars={"python": "/p"})
    bare = HostEntry(parse_host("bare@x"))
    done = record_hosts(tmp_path, [moved, named, bare])
    assert done == Recorded(added=[named, bare], updated=[moved])
    assert path.read_text() == after
    hosts = {h.spec.label: h for h in project_hosts(load_settings(cwd=tmp_path, environ={}))}
    assert hosts["a@b"].vars["python"] == "/new"
    assert hosts["n@ew"].vars == {"python": "/p"} and hosts["n@ew"].name == "n1"
    assert hosts["bare@x"].vars == {}
    assert record_hosts(tmp_path, [moved, named, bare]) == Recorded()  # all there now


def test_a_host_given_as_a_bare_address(tmp_path: Path) -> None:
    (tmp_path / "vmrun.toml").write_text('hosts = ["u@h:2200", { address = "v@w", name = "w" }]\n')
    hosts = project_hosts(load_settings(cwd=tmp_path, environ={}))
    assert [(h.label, h.spec) for h in hosts] == [
        ("u@h:2200", parse_host("u@h:2200")),
        ("w", parse_host("v@w")),
    ]


def test_a_change_that_cannot_be_written_is_reported_not_dropped(project: Path) -> None:
    path = project / "vmrun.toml"
    gpu1 = HostEntry(parse_host("ubuntu@10.0.0.1"), vars={"python": None})  # no TOML null
    done = record_hosts(project, [gpu1])
    assert done.updated == [] and path.read_text() == PROJECT
    assert done.not_applied == [f"{path}: could not set python = None for gpu1"]


def test_find_entry_matches_a_host_as_dash_h_does(tmp_path: Path) -> None:
    (tmp_path / "vmrun.toml").write_text(
        '[[hosts]]\naddress = "ubuntu@10.0.0.1"\nname = "gpu1"\n\n'
        '[[hosts]]\naddress = "ubuntu@10.0.0.2:2222"\n\n'
        '[[hosts]]\naddress = "lab-box"\n\n'  # an ~/.ssh/config alias
        '[[hosts]]\naddress = "root@[fd00::5]:22"\nname = "v6"\n'
    )
    settings = load_settings(cwd=tmp_path, environ={})
    entries = project_hosts(settings)
    gpu1, spare, alias, v6 = entries
    cases = {
        "gpu1": gpu1,  # its name
        "ubuntu@10.0.0.1": gpu1,  # its address, though it has a name
        "ubuntu@10.0.0.2:2222": spare,  # label = address
        " ubuntu@10.0.0.2:2222 ": spare,
        "lab-box": alias,
        "v6": v6,
        "root@[fd00::5]:22": v6,
        "10.0.0.1": None,  # no user: another spec, as for -H
        "ubuntu@10.0.0.2": None,  # no port: another spec
        "gpu9": None,
    }
    for name, expected in cases.items():
        assert find_entry(entries, name) == expected, name
        if expected is not None:  # the very entry -H picks
            assert select_hosts([name.strip()], settings, environ={}) == [expected]
    with pytest.raises(UsageError) as bad:
        find_entry(entries, "not a host!")
    assert bad.value.code == "bad-host-spec"


def test_find_entry_among_hosts_given_on_the_command_line(tmp_path: Path) -> None:
    """Hosts from -H that vmrun.toml does not list (no file at all here) match by spec."""
    settings = load_settings(cwd=tmp_path, environ={})
    chosen = select_hosts(["a@x:2200", "b@y"], settings, environ={})
    assert find_entry(chosen, "b@y") == chosen[1]
    assert find_entry(chosen, "a@x:2200") == chosen[0]
    assert find_entry(chosen, "a@x") is None
    assert find_entry([], "a@x") is None
