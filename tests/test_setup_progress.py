"""Download progress parsed from what pip, uv and curl print when their output is not a terminal
(vmrun.setup.progress), over lines recorded from the real tools: torch 2.13.0's CPU wheel
(191,794,682 bytes) fetched from tests/paced_http.py at 40 MiB/s with pip 26.3 (`--progress-bar
raw`), pip 23.0.1 (Debian 12's venv pip: no raw bars), uv 0.13.9 and curl 7.88.1 through
vmrun_fetch (vmrun/hostside/setup_download.sh), which turns curl's carriage returns into newlines.
"""

from __future__ import annotations

import pytest

from vmrun.setup.progress import DownloadWatch, package_name

PIP26_RAW = """\
Looking in links: /opt/wheels, http://127.0.0.1:45751/wheelhouse-torch-2.13.0/
Collecting torch==2.13.0
  Downloading torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl (191.8 MB)
Progress 0 of 191794682
Progress 262144 of 191794682
Progress 11010048 of 191794682
Progress 21757952 of 191794682
Progress 32505856 of 191794682
Progress 43253760 of 191794682
Progress 53739520 of 191794682
Progress 64487424 of 191794682
Progress 75235328 of 191794682
Progress 85721088 of 191794682
Progress 96206848 of 191794682
Progress 106954752 of 191794682
Progress 117702656 of 191794682
Progress 128188416 of 191794682
Progress 138936320 of 191794682
Progress 149422080 of 191794682
Progress 160169984 of 191794682
Progress 170917888 of 191794682
Progress 181403648 of 191794682
Progress 191794682 of 191794682
Saved ./d5/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
Successfully downloaded torch
"""

PIP23 = """\
Collecting torch==2.13.0
  Downloading http://127.0.0.1:45751/wheelhouse-torch-2.13.0/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl (191.8 MB)
     ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 191.8/191.8 MB 41.9 MB/s eta 0:00:00
Saved ./d6/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
"""  # noqa: E501

UV = """\
Using Python 3.11.2 environment at: vuv
Resolved 1 package in 3ms
Downloading torch (182.9MiB)
 Downloaded torch
Prepared 1 package in 4.59s
 + torch==2.13.0+cpu
"""

CURL = """\
Downloading torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl
  % Total    % Received % Xferd  Average Speed   Time    Time     Time  Current
                                 Dload  Upload   Total   Spent    Left  Speed

  0     0    0     0    0     0      0      0 --:--:-- --:--:-- --:--:--     0
  2  182M    2 3968k    0     0  39.6M      0  0:00:04 --:--:--  0:00:04 39.5M
 45  182M   45 83.8M    0     0  39.9M      0  0:00:04  0:00:02  0:00:02 39.9M
100  182M  100  182M    0     0  39.9M      0  0:00:04  0:00:04 --:--:-- 39.9M
"""


def _texts(output: str, step: float = 0.25) -> list[str | None]:
    """Each line's progress text (None: not about a download), a line every `step` seconds."""
    now = [0.0]

    def clock() -> float:
        now[0] += step
        return now[0]

    watch = DownloadWatch(clock)
    out = []
    for line in output.splitlines():
        progress = watch.feed(line)
        out.append(None if progress is None else progress.text())
    return out


def test_pip_raw_progress_gives_bytes_and_the_rate_of_the_last_seconds() -> None:
    texts = _texts(PIP26_RAW)
    assert texts[:3] == [None, None, "torch: downloading 182.9 MiB"]
    assert texts[3] == "torch: 0.0/182.9 MiB"  # no rate before a second line
    assert texts[13] == "torch: 91.8/182.9 MiB 36.7 MiB/s"  # since the start (2.5 s)
    assert texts[21] == "torch: 173.0/182.9 MiB 40.6 MiB/s"  # over the last 3 s only
    assert texts[22] == "torch: 182.9 MiB downloaded at 40.5 MiB/s"
    assert texts[23:] == [None, None]


def test_old_pip_says_the_size_first_and_the_rate_at_the_end() -> None:
    assert _texts(PIP23) == [
        None,
        "torch: downloading 182.9 MiB",  # 191.8 MB, decimal
        "torch: 182.9 MiB downloaded at 40.0 MiB/s",  # 41.9 MB/s
        None,
    ]


def test_uv_says_the_size_and_when_it_is_done() -> None:
    assert _texts(UV) == [
        None,
        None,
        "torch: downloading 182.9 MiB",
        "torch: 182.9 MiB downloaded",
        None,
        None,
    ]


def test_curls_meter_rows_in_binary_units() -> None:
    assert _texts(CURL) == [
        "torch: downloading",
        None,
        None,
        None,
        "torch: 0.0 MiB 0.0 MiB/s",  # no total known yet
        "torch: 3.9/182.0 MiB 39.5 MiB/s",
        "torch: 83.8/182.0 MiB 39.9 MiB/s",
        "torch: 182.0 MiB downloaded at 39.9 MiB/s",
    ]


def test_meter_rows_are_marked_so_the_log_and_an_error_skip_them() -> None:
    watch = DownloadWatch(lambda: 0.0)
    meters = []
    for line in (PIP26_RAW + CURL).splitlines():
        progress = watch.feed(line)
        if progress is not None:
            meters.append((line.split()[0], progress.meter))
    assert {word for word, meter in meters if meter} == {"Progress", "0", "2", "45", "100"}
    assert {word for word, meter in meters if not meter} == {"Downloading"}


@pytest.mark.parametrize(
    "line",
    [
        "curl: (6) Could not resolve host: repo.anaconda.com",
        "  0     0    0     0    0     0      0      0 --:--:-- --:--:-- --:--:--     0curl: (6)"
        " Could not resolve host: repo.anaconda.com",
        "Downloading cpython-3.12.12-linux-x86_64-gnu (download) (32.5MiB)x",
        "Requirement already satisfied: torch in ./env/lib/python3.11/site-packages (2.13.0)",
        "Installing collected packages: mpmath, typing-extensions, sympy, torch",
        "",
    ],
)
def test_other_lines_are_not_progress(line: str) -> None:
    assert DownloadWatch().feed(line) is None


def test_package_names_from_what_the_tools_show() -> None:
    assert package_name("http://h/w/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl") == "torch"
    assert package_name("typing_extensions-4.16.0-py3-none-any.whl") == "typing_extensions"
    assert package_name("numpy-2.3.3.tar.gz") == "numpy"
    assert package_name("Miniconda3-latest-Linux-x86_64.sh") == "Miniconda3-latest-Linux-x86_64.sh"
    assert package_name("scipy") == "scipy"
