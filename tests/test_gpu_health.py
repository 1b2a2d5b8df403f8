"""vmrun.gpus.health on outputs recorded from real GPUs (tests/fixtures/gpu_health, each
file's source in its SOURCES.md: STAND-IN for the GPUs the test bed does not have)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmrun.gpus.health import ERROR, INFO, WARN, GpuHealth, parse_query, parse_xids

HERE = Path(__file__).parent / "fixtures" / "gpu_health"


def gpus(name: str) -> list[GpuHealth]:
    return parse_query((HERE / name).read_text())


def levels(gpu: GpuHealth, *, at_least: str = WARN) -> list[tuple[str, str]]:
    keep = {ERROR} if at_least == ERROR else {ERROR, WARN}
    return [(p.level, p.what) for p in gpu.problems() if p.level in keep]


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("nvsmi_q_v100x4_460.32.03_azure.txt", 4),  # Volta, "Clocks Throttle Reasons"
        ("nvsmi_q_a100x8_460.32.03_azure.txt", 8),  # Ampere, the old names
        ("nvsmi_q_h100x8_565.57.01.txt", 8),  # the newest format seen
        ("nvsmi_q_titanv_560.35.03.txt", 1),  # no ECC (N/A everywhere)
    ],
)
def test_healthy_gpus_of_every_format_have_no_problem(name: str, count: int) -> None:
    found = gpus(name)
    assert len(found) == count
    for gpu in found:
        assert levels(gpu) == [], (gpu.bus, gpu.problems())
        assert gpu.pcie_width is not None and gpu.pcie_width[0] == gpu.pcie_width[1]


def test_a_pending_row_remap_is_an_error_on_that_gpu_alone() -> None:
    a100 = {g.bus: g for g in gpus("nvsmi_q_a100x4_555.42.02_remap_pending_dram_ce.txt")}
    assert levels(a100["0000:9e:00"]) == [(ERROR, "remapped-rows")]
    assert a100["0000:9e:00"].correctable_volatile == 353  # corrected: no problem
    assert all(levels(g) == [] for bus, g in a100.items() if bus != "0000:9e:00")
    (a10,) = gpus("nvsmi_q_a10_535.129.03_remap_pending.txt")  # 535.129: SRAM not yet split
    assert levels(a10) == [(ERROR, "remapped-rows"), (WARN, "remapped-rows")]
    assert a10.uncorrectable_volatile == 0 and a10.remapped_uncorrectable == 4
    (excerpt,) = gpus("nvsmi_q_a100_510.73.08_EXCERPT_remap_pending.txt")
    assert excerpt.remap_pending is True


def test_uncorrectable_ecc_counts_since_load_and_over_the_lifetime() -> None:
    (gh200,) = gpus("nvsmi_q_gh200_550.127.05_dram_ue_remap.txt")
    assert (gh200.uncorrectable_volatile, gh200.uncorrectable_aggregate) == (0, 1)
    assert (WARN, "ecc") in levels(gh200)
    text = (
        "GPU 00000000:00:00.0\n" + (HERE / "nvsmi_q_EXCERPT_ecc_sram_uncorrectable.txt").read_text()
    )
    (sram,) = parse_query(text)
    assert (sram.uncorrectable_volatile, sram.uncorrectable_aggregate) == (1, 5)
    assert levels(sram, at_least=ERROR) == [(ERROR, "ecc")]


def test_retired_pages_of_volta() -> None:
    (v100,) = gpus("nvsmi_q_v100_470.129.06_retired_page_sbe.txt")
    assert (v100.retired_sbe, v100.retired_dbe, v100.retired_pending) == (1, 0, False)
    assert [p.level for p in v100.problems() if p.what == "retired-pages"] == [INFO]
    eight = {g.bus: g for g in gpus("nvsmi_q_v100x8_550.127.05_retired_page_sbe.txt")}
    assert eight["0000:00:08"].retired_sbe == 1 and eight["0000:00:04"].retired_sbe == 0


def test_clocks_held_down_by_hardware_or_heat_but_not_by_the_power_cap() -> None:
    for gpu in gpus("nvsmi_q_h100x8_535.161.08_hw_slowdown.txt"):
        assert gpu.clocks_held == ("HW Slowdown", "HW Power Brake Slowdown")
    held = {g.bus: g.clocks_held for g in gpus("nvsmi_q_h100x8_535.183.01_sw_thermal.txt")}
    assert held.pop("0000:75:00") == ("HW Power Brake Slowdown", "SW Thermal Slowdown")
    assert set(held.values()) == {()}
    (a10,) = gpus("nvsmi_q_a10_550.90.12_sw_power_cap.txt")
    assert a10.power_capped and levels(a10) == []


def test_a_narrow_pcie_link_is_a_warning_an_idle_low_generation_a_note() -> None:
    (l4,) = gpus("nvsmi_q_l4_550.90.07_pcie_gen1_x8.txt")
    assert (l4.pcie_gen, l4.pcie_width) == ((1, 4), (8, 16))
    assert levels(l4) == [(WARN, "pcie")]
    assert any(p.level == INFO and "gen 1 of 4" in p.text for p in l4.problems())
    (gh200,) = gpus("nvsmi_q_gh200_550.127.05_dram_ue_remap.txt")
    assert gh200.pcie_width == (1, 1)  # C2C-attached: x1 is its own width


def test_persistence_mode() -> None:
    v100 = gpus("nvsmi_q_v100x4_460.32.03_azure.txt")[0]
    h100 = gpus("nvsmi_q_h100x8_565.57.01.txt")[0]
    assert (v100.persistence, h100.persistence) == (False, True)
    assert [p.what for p in v100.problems()] == ["persistence"]


def test_xid_lines_of_every_time_format_are_counted_per_gpu_with_their_weight() -> None:
    found = parse_xids((HERE / "xid_lines.txt").read_text())
    by = {(x.bus, x.code): x for x in found}
    assert by[("0000:19:00", 94)].count == 3  # one per line, with or without a pid
    assert by[("0000:19:00", 48)].level == ERROR and by[("0000:38:00", 13)].level == INFO
    assert by[("0000:91:00", 79)].text == "GPU has fallen off the bus."
    assert by[("0000:02:00", 79)].count == 2  # the old format, without pid=
    assert ("0000:b3:00", 79) in by  # said over three lines, with no Xid
    assert by[("0009:01:00", 149)].text.startswith("NETIR_LINK_EVT Fatal XC0")
    assert by[("0000:dc:00", 45)].text == "Ch 00000001 caused by previous Xid 149"
    assert by[("0000:01:00", 31)].count == 2 and by[("0000:01:00", 31)].level == INFO
    assert by[("0000:9b:00", 119)].level == ERROR and "GSP" in by[("0000:9b:00", 119)].meaning
    assert not any("SXid" in x.text for x in found)  # NVSwitch lines are not a GPU's


def test_an_xid_names_the_gpu_as_nvidia_smi_does() -> None:
    (gpu,) = gpus("nvsmi_q_a100_510.73.08_EXCERPT_remap_pending.txt")
    xid_buses = {x.bus for x in parse_xids((HERE / "xid_lines.txt").read_text())}
    assert gpu.bus == "0000:10:1c" and gpu.bus in xid_buses
    assert parse_query("") == [] and parse_xids("") == []


def test_a_hosts_health_joins_its_gpus_and_xids_worst_first() -> None:
    from vmrun.doctor import Verdict, gpu_health_check
    from vmrun.gpus.health import ERROR, parse_host

    query = (HERE / "nvsmi_q_h100x8_535.161.08_hw_slowdown.txt").read_text()
    xid = "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
    health = parse_host(
        f"== nvidia-smi -q\n{query}\n== kernel dmesg\n{xid}\n{xid}\n== rdma\nmlx5_0\nmlx5_1\n"
    )
    assert len(health.gpus) == 8 and health.rdma == ("mlx5_0", "mlx5_1")
    assert health.worst == ERROR
    said = health.lines()
    assert said[0] == "GPU 0000:02:00: Xid 79 x2 in the kernel log: the GPU has fallen off the bus"
    assert any("clocks held down: HW Slowdown" in line for line in said)
    check = gpu_health_check("h", health)
    assert check.verdict == Verdict.FAIL and check.detail.startswith("GPU 0000:02:00: Xid 79")
    quiet = parse_host(f"== nvidia-smi -q\n{query}\n== kernel unreadable\n== rdma\n")
    assert gpu_health_check("h", quiet).verdict == Verdict.WARN
    assert "Xids not checked" in gpu_health_check("h", quiet).detail
    none = parse_host("== nvidia-smi none\n== kernel dmesg\n== rdma\n")
    assert none.gpus == () and none.worst == ""
    broken = parse_host(
        "== nvidia-smi failed 9\nNVIDIA-SMI has failed because it couldn't"
        " communicate with the NVIDIA driver.\n== kernel unreadable\n== rdma\n"
    )
    assert broken.worst == ERROR and broken.lines()[0].startswith("nvidia-smi: failed 9: NVIDIA")
