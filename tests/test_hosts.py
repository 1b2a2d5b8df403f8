from __future__ import annotations

import pytest

from vmrun.errors import ExitCode, HostSpecError
from vmrun.ssh.hosts import HostSpec, parse_host


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("ubuntu@203.0.113.7", HostSpec("203.0.113.7", "ubuntu", None)),
        ("ubuntu@203.0.113.7:2222", HostSpec("203.0.113.7", "ubuntu", 2222)),
        ("gpu-box", HostSpec("gpu-box", None, None)),
        ("my_alias.lab", HostSpec("my_alias.lab", None, None)),
        ("root@[::1]:22", HostSpec("::1", "root", 22)),
        ("[fe80::1%eth0]", HostSpec("fe80::1%eth0", None, None)),
        ("ucloud@node-1.example.org:65535", HostSpec("node-1.example.org", "ucloud", 65535)),
        (" spaced@host ", HostSpec("host", "spaced", None)),
    ],
)
def test_parse_good_specs(text: str, spec: HostSpec) -> None:
    assert parse_host(text) == spec


@pytest.mark.parametrize(
    "text",
    [
        "",
        "user@",
        "@host",
        "user@host:",
        "user@host:0",
        "user@host:70000",
        "user@host:22x",
        "a@b@c",
        "host name",
        "user@[host]",
        "user@::1",
        "user@-host",
        "user@host;rm -rf /",
        "user@$(id)",
        "user@ho st",
    ],
)
def test_bad_specs_name_the_expected_form(text: str) -> None:
    with pytest.raises(HostSpecError) as info:
        parse_host(text)
    message = info.value.one_line()
    assert "\n" not in message
    assert "user@host" in message or "port" in message
    assert info.value.exit_code == ExitCode.USAGE


def test_label_round_trips() -> None:
    for text in ("ubuntu@1.2.3.4", "ubuntu@1.2.3.4:2222", "alias", "root@[::1]:2200"):
        assert parse_host(parse_host(text).label) == parse_host(text)
        assert parse_host(text).label == text
