"""The CLI process itself: help on every command, version, lazy imports, error lines."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, Client, error_in, errors_in

from vmrun import __version__
from vmrun.config import tomllib

COMMANDS = [
    "up",
    "down",
    "setup",
    "train",
    "submit",
    "logs",
    "status",
    "stop",
    "stacks",
    "push",
    "fetch",
    "report",
    "diff",
    "plot",
    "sweep",
    "watch-gpus",
    "dashboard",
    "tensorboard",
    "forward",
    "notify",
    "autostop",
    "cloud",
    "doctor",
    "exec",
    "hosts",
    "config",
    "supervise",
]
HIDDEN = {"supervise"}  # vmrun starts it on a host (train --recover); it runs, unlisted
HEAVY = (
    "paramiko",
    "fabric",
    "torch",
    "rich",
    "pydantic",
    "matplotlib",
    "tensorboard",
    "boto3",
    "botocore",
    "apprise",
    "requests",
    "aiohttp",
)


def _imports_after(args: list[str]) -> set[str]:
    probe = (
        "import sys\nfrom vmrun.cli.main import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        f"print('LOADED:' + ' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    line = [x for x in out.splitlines() if x.startswith("LOADED:")][-1]
    return set(line.removeprefix("LOADED:").split())


@pytest.mark.parametrize("args", [["--help"], ["--version"], *[[c, "--help"] for c in COMMANDS]])
def test_help_and_version_import_nothing_heavy(args: list[str]) -> None:
    assert _imports_after(args) == set()


def test_version(client: Client) -> None:
    for flag in ("--version", "-V"):
        done = client.vmrun(flag)
        assert done.returncode == 0
        assert done.stdout.strip() == f"vmrun {__version__}"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(client: Client, command: str) -> None:
    done = client.vmrun(command, "--help")
    assert done.returncode == 0, done.stderr
    assert f"Usage: vmrun {command}" in done.stdout


def test_usage_errors_are_one_line_exit_2(client: Client) -> None:
    for args, code, needle in (
        (["exec", "--bogus", "--", "true"], "usage", "--bogus"),
        (["exec"], "usage", "Missing argument"),
        (["nope"], "usage", "'nope'"),
        (["exec", "-H", "user@host:0", "--", "true"], "bad-host-spec", "1-65535"),
        (["exec", "-H", "a@b", "--env", "1BAD=x", "--", "true"], "usage", "1BAD"),
        (
            ["exec", "-H", "a@b", "--env", "NOT_SET_ANYWHERE_X", "--", "true"],
            "env-value-missing",
            "NOT_SET_ANYWHERE_X",
        ),
        (["exec", "--", "true"], "no-hosts", "-H"),
    ):
        done = client.vmrun(*args)
        assert done.returncode == 2, (args, done.stderr)
        [(said, line)] = errors_in(done.stderr)
        assert said == code and needle in line, (args, done.stderr)
        assert done.stderr.count("\n") == 1, (args, done.stderr)


def test_debug_keeps_usage_errors_exit_2(client: Client) -> None:
    """--debug adds a traceback to bad input but not a different exit code; it is a root
    flag, so after the command word it is the command's unknown option, not a crash."""
    done = client.vmrun("--debug", "exec", "--bogus", "--", "true")
    assert done.returncode == 2, done.stderr
    assert "Traceback" in done.stderr
    assert error_in(done.stderr)[0] == "usage", done.stderr
    done = client.vmrun("exec", "--debug", "-H", "a@b", "--", "true")
    assert done.returncode == 2, done.stderr
    [(code, said)] = errors_in(done.stderr)
    assert code == "usage" and said.startswith("No such option: --debug"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_bare_vmrun_shows_its_commands(client: Client) -> None:
    done = client.vmrun()
    assert done.returncode == 0, done.stderr
    for command in COMMANDS:
        assert (f"\n  {command} " in done.stdout) is (command not in HIDDEN)


def test_supervise_is_left_out_of_the_help_and_still_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vmrun.cli.app import HIDDEN as UNLISTED
    from vmrun.cli.main import run

    assert UNLISTED == HIDDEN
    assert run(["--help"]) == 0
    listing = capsys.readouterr().out
    assert "\n  train " in listing and "supervise" not in listing
    assert run(["supervise", "--help"]) == 0
    assert "Usage: vmrun supervise " in capsys.readouterr().out


def test_each_command_builds_alone() -> None:
    """A run builds only the command it names (start-up cost), and the root's listing
    names exactly the commands the modules register, in order."""
    from vmrun.cli.app import COMMANDS as TABLE
    from vmrun.cli.app import build

    assert [name for name, _, _ in TABLE] == COMMANDS
    full = build(None)
    assert list(full.commands) == COMMANDS
    for name in COMMANDS:
        assert list(build([name, "--help"]).commands) == [name]
        assert full.commands[name].short_help == build([name]).commands[name].short_help
    listing = build(["--help"])
    assert list(listing.commands) == COMMANDS
    assert all(len(cmd.short_help) <= 64 for cmd in listing.commands.values())


def test_bad_project_file_is_a_usage_error(client: Client) -> None:
    (client.cwd / "vmrun.toml").write_text("connect_timeout = 'soon'\n")
    done = client.vmrun("exec", "-H", "a@b", "--", "true")
    assert done.returncode == 2
    assert "connect_timeout" in done.stderr and "vmrun.toml" in done.stderr


def test_config_shows_each_layer(client: Client) -> None:
    (client.cwd / "vmrun.toml").write_text('known_hosts = "~/kh"\n')
    done = client.vmrun("config", env={"VMRUN_CONNECT_TIMEOUT": "4"})
    assert done.returncode == 0, done.stderr
    lines = {ln.split(" = ")[0]: ln for ln in done.stdout.splitlines() if " = " in ln}
    assert lines["connect_timeout"].startswith("connect_timeout = 4.0    # environment")
    assert lines["known_hosts"].startswith(f'known_hosts = "{client.home}/kh"    # ')
    assert "vmrun.toml" in lines["known_hosts"]
    assert lines["accept_new_host_key"].startswith("accept_new_host_key = false    # default")


def test_config_output_pastes_into_a_config_file(client: Client) -> None:
    """Every line is TOML (values as TOML writes them: false, not Python's False; paths
    quoted), so the whole output read as a config file gives the same settings."""
    odd = 'dir "with" quotes \\ and ü'
    env = {"VMRUN_ACCEPT_NEW_HOST_KEY": "yes", "VMRUN_SSH_CONFIG": f"/tmp/{odd}/config"}
    done = client.vmrun("config", env=env)
    assert done.returncode == 0, done.stderr
    pasted = tomllib.loads(done.stdout)
    assert pasted["accept_new_host_key"] is True and pasted["keepalive_count_max"] == 3
    assert pasted["ssh_config"] == f"/tmp/{odd}/config"
    (client.cwd / "vmrun.toml").write_text(done.stdout)
    again = client.vmrun("config")
    assert again.returncode == 0, again.stderr
    values = {ln.split("    # ")[0] for ln in again.stdout.splitlines() if " = " in ln}
    assert values == {ln.split("    # ")[0] for ln in done.stdout.splitlines() if " = " in ln}


def test_debug_shows_the_traceback(client: Client) -> None:
    # offline: the made-up name fails to resolve in an empty network namespace, not via DNS
    plain = client.vmrun("exec", "-H", "u@no-such-host.invalid", "--", "true", offline=True)
    debug = client.vmrun(
        "--debug", "exec", "-H", "u@no-such-host.invalid", "--", "true", offline=True
    )
    assert plain.returncode == debug.returncode == 12
    assert "Traceback" not in plain.stderr
    assert plain.stderr.count("\n") == 1
    code, said = error_in(plain.stderr)
    assert code == "host-unreachable" and "no-such-host.invalid" in said
    assert "Traceback" in debug.stderr and error_in(debug.stderr)[0] == code


def test_python_dash_m_matches_the_script(client: Client) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vmrun", "--version"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.stdout.strip() == f"vmrun {__version__}"


def test_a_misplaced_setting_exits_2_before_connecting(client: Client) -> None:
    """`connect_timeout` inside a host was silently ignored; now it stops every command with
    the file, line and key, before any connection (192.0.2.1 would time out, exit 12)."""
    toml = client.cwd / "vmrun.toml"
    toml.write_text('[[hosts]]\naddress = "u@192.0.2.1"\nconnect_timeout = "ten"\n')
    done = client.vmrun("exec", "--connect-timeout", "30", "--", "true", timeout=20)
    assert done.returncode == 2, done.stderr
    [(code, said)] = errors_in(done.stderr)
    assert code == "bad-config" and said.startswith(f"{toml} line 3: "), done.stderr
    assert "'connect_timeout'" in said and "host #1" in said, said
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_cluster_without_a_shared_folder_refuses_submit_and_a_shared_false_alone(
    client: Client,
) -> None:
    """`submit` on a cluster made without a shared folder is refused before connecting (a
    batch script writes where it says, on whichever node); `shared = false` without the
    nodes it means is refused as a setting."""
    toml = client.cwd / "vmrun.toml"
    toml.write_text(
        '[[clusters]]\nname = "lab"\nlogin = "u@192.0.2.1"\nshared = false\n'
        'nodes = ["u@192.0.2.1", "u@192.0.2.2"]\n'
    )
    (client.cwd / "job.sh").write_text("#!/bin/bash\n#SBATCH -N 1\necho hi\n")
    done = client.vmrun("submit", "job.sh", "-C", "lab", timeout=20)
    assert done.returncode == 2 and errors_in(done.stderr)[0][0] == "no-shared-folder", done.stderr
    toml.write_text('[[clusters]]\nname = "lab"\nlogin = "u@192.0.2.1"\nshared = false\n')
    alone = client.vmrun("status", "-C", "lab", timeout=20)
    assert alone.returncode == 2 and "shared = false needs nodes" in alone.stderr, alone.stderr


def test_train_help_shows_what_most_runs_need_under_headings_and_help_all_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`train --help`: at most 30 options, under headings; `--help-all`: every option of the
    command once, under its heading (none lost to the short form)."""
    import re

    from vmrun.cli.app import build
    from vmrun.cli.main import run

    def options(text: str) -> list[str]:
        return re.findall(r"^  (?:-\w, )?(--[\w-]+)", text, re.MULTILINE)

    assert run(["train", "--help"]) == 0
    short = capsys.readouterr().out
    assert len(options(short)) <= 30
    for heading in ("Run:", "The template trainer:", "Reliability:", "Slurm (-C):"):
        assert f"\n{heading}\n" in short, heading
    assert "--help-all" in short and "--connect-timeout" not in short
    assert run(["train", "--help-all"]) == 0
    every = options(capsys.readouterr().out)
    declared = [
        p.opts[-1] if p.opts[-1].startswith("--") else p.opts[0]
        for p in build(["train"]).commands["train"].params
        if p.param_type_name == "option"
    ]
    assert sorted(every) == sorted({*declared, "--help", "--help-all"}) and len(every) > 50


def test_an_old_spelling_still_runs_with_one_notice_of_the_new_one(client: Client) -> None:
    """`vmrun clusters` is `vmrun cloud` (-C takes Slurm clusters); `up --image` is
    `up --os-image` (`--image` is a container in train): both still work, named once."""
    done = client.vmrun("clusters", "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage: vmrun cloud " in done.stdout
    assert done.stderr.count("`vmrun cloud`") == 1


def test_old_spellings_are_rewritten_only_where_they_mean_the_old_thing() -> None:
    from vmrun.cli.app import current_spelling

    assert current_spelling(["--debug", "clusters", "-r", "x"]) == ["--debug", "cloud", "-r", "x"]
    assert current_spelling(["up", "w", "--image=ubuntu"]) == ["up", "w", "--os-image=ubuntu"]
    assert current_spelling(["up", "w", "--image", "ami-1"])[2] == "--os-image"
    assert current_spelling(["train", "--image", "x"]) == ["train", "--image", "x"]
    assert current_spelling(["up", "w", "--", "--image"])[-1] == "--image"
