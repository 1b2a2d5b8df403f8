"""`vmrun exec` end to end: the real CLI process against real sshd test hosts."""

from __future__ import annotations

import re
import signal
import time

import pytest
from conftest import Client, errors_in, user_commands, wait_for
from testbed import NetnsBed

HOSTS = ["h1", "h2", "h3"]


def _lines(text: str) -> list[str]:
    """Output lines with the alignment padding after `[host]` squeezed to one space."""
    return [re.sub(r"^(\[[^\]]*\])\s+", r"\1 ", line) for line in text.splitlines()]


def _host_args(names: list[str]) -> list[str]:
    return [arg for name in names for arg in ("-H", name)]


def test_exec_runs_on_three_hosts_at_once(bed: NetnsBed, bed_client: Client) -> None:
    """Each host's command waits until all three have started: only a parallel run ends."""
    hosts = [bed[n] for n in HOSTS]
    for h in hosts:
        for name in ("started", "go"):
            (h.home / name).unlink(missing_ok=True)
    script = (
        "touch started; i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.05;"
        " i=$((i+1)); done; [ -e go ] && hostname"
    )
    proc = bed_client.popen("exec", *_host_args(HOSTS), "--", "sh", "-c", script)
    try:
        wait_for(
            lambda: all((h.home / "started").exists() for h in hosts),
            20,
            "all three hosts to start the command",
        )
        for h in hosts:
            (h.home / "go").touch()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    lines = sorted(_lines(out))
    assert lines == sorted(f"[{n}] {bed[n].hostname}" for n in HOSTS)


def test_output_is_streamed_live(bed: NetnsBed, bed_client: Client) -> None:
    h1 = bed["h1"]
    (h1.home / "go").unlink(missing_ok=True)
    script = (
        "echo first; i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.05;"
        " i=$((i+1)); done; echo second"
    )
    proc = bed_client.popen("exec", "-H", "h1", "--", "sh", "-c", script)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # must arrive while the command still runs
        assert first == "first\n"
        assert proc.poll() is None
        (h1.home / "go").touch()
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rest == "second\n"


def test_exit_code_is_the_worst_hosts_and_failures_are_summarised(
    bed: NetnsBed, bed_client: Client
) -> None:
    script = 'case "$(hostname)" in *h2) echo bad >&2; exit 3;; *h3) exit 1;; esac; echo fine'
    done = bed_client.vmrun("exec", *_host_args(HOSTS), "--", "sh", "-c", script)
    assert done.returncode == 3
    assert "[h1] fine" in _lines(done.stdout)
    assert "[h2] bad" in _lines(done.stderr)
    assert "h2: exited with 3" in done.stderr and "h3: exited with 1" in done.stderr
    assert "2 of 3 hosts failed" in done.stderr


def test_one_unreachable_host_never_hides_the_others(bed: NetnsBed, bed_client: Client) -> None:
    dead = bed["h1"].addr.rsplit(".", 1)[0] + ".251"
    done = bed_client.vmrun(
        "exec",
        "--connect-timeout",
        "2",
        "-H",
        "h1",
        "-H",
        f"x@{dead}",
        "-H",
        "h2",
        "--",
        "hostname",
    )
    assert done.returncode == 12
    assert f"[h1] {bed['h1'].hostname}" in _lines(done.stdout)
    assert f"[h2] {bed['h2'].hostname}" in _lines(done.stdout)
    assert f"x@{dead}: no answer" in done.stderr or f"x@{dead}: no route" in done.stderr
    assert "1 of 3 hosts failed" in done.stderr


def test_hostile_arguments_via_the_cli(bed_client: Client) -> None:
    words = ["a b", "$HOME", "`id`", "x;y", "-n", "ünï", "'q'", ""]
    script = 'for a in "$@"; do printf "<%s>" "$a"; done'
    done = bed_client.vmrun("exec", "-H", "h2", "--", "sh", "-c", script, "argv0", *words)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "".join(f"<{w}>" for w in words) + "\n"


def test_env_flag_sends_a_local_secret_without_a_command_line(
    bed: NetnsBed, bed_client: Client
) -> None:
    done = bed_client.vmrun(
        "exec",
        "-H",
        "h3",
        "--env",
        "MY_TOKEN",
        "-e",
        "MODE=fast",
        "--",
        "sh",
        "-c",
        'ps -eo args | grep -c "tok[-]123"; echo "$MY_TOKEN $MODE"',
        env={"MY_TOKEN": "tok-123"},
    )
    assert done.returncode == 0, done.stderr
    count, value = done.stdout.splitlines()
    assert count == "0"  # not in any process's command line on the host
    assert value == "tok-123 fast"


def test_unknown_host_key_via_cli_then_accept_new(bed: NetnsBed, bed_client: Client) -> None:
    (bed_client.ssh_dir / "known_hosts").write_text("")
    refused = bed_client.vmrun("exec", "-H", "h1", "--", "true")
    assert refused.returncode == 10
    [(code, said)] = errors_in(refused.stderr)
    assert code == "host-key-unknown" and "SHA256:" in said, refused.stderr
    assert refused.stderr.count("\n") == 1
    accepted = bed_client.vmrun("exec", "-H", "h1", "--accept-new-host-key", "--", "hostname")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip() == bed["h1"].hostname
    again = bed_client.vmrun("exec", "-H", "h1", "--", "true")
    assert again.returncode == 0, again.stderr


def test_changed_host_key_via_cli_exits_10(bed: NetnsBed, bed_client: Client) -> None:
    """h3 is rebuilt with new host keys; known_hosts still has the old ones: refused, and
    --accept-new-host-key does not change that (it trusts new hosts, never changed keys)."""
    host = bed["h3"]
    host.replace_host_keys()  # bed_client wrote known_hosts before: the old keys
    for flags in ([], ["--accept-new-host-key"]):
        done = bed_client.vmrun("exec", "-H", "h3", *flags, "--", "true")
        assert done.returncode == 10, done.stderr
        [(code, said)] = errors_in(done.stderr)
        assert code == "host-key-changed" and said.startswith("h3: "), done.stderr
        assert "ssh-keygen -R" in said and done.stderr.count("\n") == 1
    assert not bed_client.settings().known_hosts.exists()  # nothing was trusted


def test_connect_timeout_via_cli_exits_12_in_time(bed: NetnsBed, bed_client: Client) -> None:
    """sshd's port silently dropped (a firewall, a security group): no answer, so the connect
    timeout decides, and the message says which it was."""
    host = bed["h2"]
    host.block_port(22)
    try:
        started = time.monotonic()
        done = bed_client.vmrun("exec", "-H", "h2", "--connect-timeout", "2", "--", "true")
        elapsed = time.monotonic() - started
    finally:
        host.unblock_port(22)
    assert done.returncode == 12, done.stderr
    [(code, said)] = errors_in(done.stderr)
    assert code == "host-unreachable" and said.startswith("h2: "), done.stderr
    assert "within 2 s" in said and done.stderr.count("\n") == 1  # the timeout that decided
    # The message names the 2 s that decided. The bounds only rule out giving up early and
    # hanging (the kernel retries a dropped SYN for ~130 s); the 20 s of margin is for the
    # CLI's start-up on a loaded 2-core machine.
    assert 2 <= elapsed < 2 + 20
    assert bed_client.vmrun("exec", "-H", "h2", "--", "true").returncode == 0  # port back


def test_no_key_at_all_via_cli_exits_11(bed: NetnsBed, bed_client: Client) -> None:
    h1 = bed["h1"]
    (bed_client.ssh_dir / "config").write_text(f"Host h1\n  HostName {h1.addr}\n  User {h1.user}\n")
    done = bed_client.vmrun("exec", "-H", "h1", "--", "true")
    assert done.returncode == 11, done.stderr
    [(code, said)] = errors_in(done.stderr)
    assert code == "auth-failed" and said.startswith(f"h1: no SSH key to log in as {h1.user!r}")
    assert "authorized_keys" in said and done.stderr.count("\n") == 1


def test_ctrl_c_stops_the_remote_commands(bed: NetnsBed, bed_client: Client) -> None:
    proc = bed_client.popen(
        "exec", *_host_args(["h1", "h2"]), "--", "sh", "-c", "echo up; exec sleep 421"
    )
    try:
        assert proc.stdout is not None
        seen = [proc.stdout.readline(), proc.stdout.readline()]
        assert all("up" in line for line in seen), seen
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert "interrupted" in err
    for name in ("h1", "h2"):
        wait_for(
            lambda n=name: not any("sleep 421" in c for c in user_commands(bed[n])),
            20,
            f"the remote sleep on {name} to stop",
        )


def test_cut_link_via_cli_exits_13_promptly(bed: NetnsBed, bed_client: Client) -> None:
    host = bed["h2"]
    proc = bed_client.popen("exec", "-H", "h2", "--", "sh", "-c", "echo up; exec sleep 422")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "up\n"
        host.cut_link()
        started = time.monotonic()
        _, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - started
    finally:
        host.heal_link()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 13, err
    assert "connection lost" in err and err.count("\n") == 1
    assert "while running \"sh -c 'echo up; exec sleep 422'\"" in err, err  # not 'sh'
    # keepalive 1 s x 3 (the tests' settings) notices in ~4 s; without it the dead link
    # would go unnoticed for TCP's ~15 min of retransmissions. 20 s: room for a loaded machine
    assert elapsed < 20
    wait_for(
        lambda: not any("sleep 422" in c for c in user_commands(host)),
        60,
        "the remote sleep to stop after the link healed",
    )


def test_hosts_from_vmrun_toml_and_env(bed: NetnsBed, bed_client: Client) -> None:
    h1, h3 = bed["h1"], bed["h3"]
    (bed_client.cwd / "vmrun.toml").write_text(
        f'[[hosts]]\naddress = "h1"\nname = "first"\n\n'
        f'[[hosts]]\naddress = "{h3.user}@{h3.addr}"\ngroups = ["g"]\n'
    )
    key = bed.client_keys.private
    with open(bed_client.ssh_dir / "config", "a") as fh:
        fh.write(f"\nHost {h3.addr}\n  IdentityFile {key}\n")
    every = bed_client.vmrun("exec", "--", "hostname")
    assert every.returncode == 0, every.stderr
    assert sorted(_lines(every.stdout)) == sorted(
        [f"[first] {h1.hostname}", f"[{h3.user}@{h3.addr}] {h3.hostname}"]
    )
    group = bed_client.vmrun("exec", "-H", "@g", "--", "hostname")
    assert group.stdout.strip() == h3.hostname
    from_env = bed_client.vmrun("exec", "--", "hostname", env={"VMRUN_HOSTS": "h2"})
    assert from_env.stdout.strip() == bed["h2"].hostname


@pytest.mark.parametrize("check", [False, True])
def test_hosts_command(bed: NetnsBed, bed_client: Client, check: bool) -> None:
    args = ["hosts", "-H", "h1", "-H", "hidden"] + (["--check"] if check else [])
    done = bed_client.vmrun(*args)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines()]
    if check:  # each as it answers
        assert sorted(listed) == ["h1", "hidden"]
        assert all(" ok " in line for line in done.stdout.splitlines())
    else:  # in the order given
        assert listed == ["h1", "hidden"]


def test_many_parallel_hosts_interleave_whole_lines(bed: NetnsBed, bed_client: Client) -> None:
    """Lines from several hosts never tear into each other."""
    script = 'i=0; while [ $i -lt 200 ]; do echo "line-$i-$(hostname)-end"; i=$((i+1)); done'
    done = bed_client.vmrun("exec", *_host_args(HOSTS), "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    lines = _lines(done.stdout)
    assert len(lines) == 600
    for line in lines:
        tag, text = line.split(" ", 1)
        assert text.startswith("line-") and text.endswith("-end") and tag[1:-1] in text
