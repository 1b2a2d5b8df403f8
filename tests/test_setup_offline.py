"""A host with no way to the package index: setup says so in one line, with what to do.

The test hosts really have no route out, so pip's failure here is the real one. Before,
setup showed five pip retry warnings and pip's "Could not find a version" as the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, errors_in
from test_cli_setup import _wipe
from testbed import NetnsBed, TestHost


@pytest.fixture
def h3(bed: NetnsBed) -> Iterator[TestHost]:
    host = bed["h3"]
    _wipe(host)
    yield host
    _wipe(host)


def test_no_route_to_the_index_is_one_line_naming_the_ways_forward(
    bed_client: Client, h3: TestHost, host_python: Path
) -> None:
    done = bed_client.vmrun(
        "setup",
        "h3",
        "--python",
        str(host_python),
        "--only",
        "extra-packages",
        "--pip",
        "vmrun-offline-probe",
        "--no-record",
        timeout=180,
    )
    assert done.returncode == 1, done.stderr + done.stdout
    code, first = errors_in(done.stderr)[0]
    assert code == "setup-step-failed" and first.startswith("h3: step extra-packages"), first
    # the test hosts have no resolver and no route: which one pip meets first is the host's
    assert re.search(
        r"cannot reach the package index \((names do not resolve|no route out)\)", first
    ), done.stderr
    assert "--installer FILE" in first and "--python PATH" in first
    log = (bed_client.cwd / ".vmrun" / "logs" / "setup-h3.log").read_text()
    assert log.count("Retrying (Retry(") == 1, log  # one retry, not five


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (
            "Failed to establish a new connection: [Errno 101] Network is unreachable",
            "no route out",
        ),
        ("curl: (6) Could not resolve host: repo.anaconda.com", "names do not resolve"),
        (
            "ConnectTimeoutError(<...>, 'Connection to pypi.org timed out.')",
            "the index does not answer",
        ),
        ("ERROR: No matching distribution found for torch==9.9", ""),
    ],
)
def test_what_the_tools_print_is_told_apart(line: str, reason: str) -> None:
    from vmrun.setup.offline import offline_reason

    assert offline_reason(line) == reason
