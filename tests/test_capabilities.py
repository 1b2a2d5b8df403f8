"""What each target can do is declared by its backend (and each cloud by its provider), and
the refusals are derived from it: a flag the target lacks the capability of is refused with
a stable code, naming the capability."""

from __future__ import annotations

import pytest

from vmrun.backends.api import Capabilities
from vmrun.backends.select import Target, capabilities_of
from vmrun.errors import UsageError
from vmrun.operations import refusals

_PLACE = {"local": {"--local": True}, "hosts": {"-H": ["a@h1"]}, "cluster": {"-C": "hpc"}}
_CASES = [
    (command, kind, flag, cap)
    for command, needs in refusals.NEEDS.items()
    for flag, cap in needs
    for kind in ("local", "hosts", "cluster")
    if capabilities_of(kind).lacks(cap)
]


def test_every_backend_declares_its_capabilities() -> None:
    for kind in ("local", "hosts", "cluster"):
        assert isinstance(Target(kind).capabilities, Capabilities)
    assert capabilities_of("hosts").spares and not capabilities_of("cluster").spares
    assert capabilities_of("cluster").self_requeue and not capabilities_of("hosts").self_requeue
    assert all(capabilities_of(kind).dry_run for kind in ("local", "hosts", "cluster"))


def test_the_target_is_read_once_from_the_flags() -> None:
    assert Target.of(local=True) == Target("local")
    assert Target.of(hosts=["a@h"]) == Target("hosts", hosts=("a@h",))
    assert Target.of(cluster="hpc") == Target("cluster", cluster="hpc")
    assert Target.of().host_list is None


@pytest.mark.parametrize(("command", "kind", "flag", "cap"), _CASES)
def test_a_flag_the_target_lacks_is_refused_by_its_capability(
    command: str, kind: str, flag: str, cap: str
) -> None:
    flags = {**_PLACE[kind], flag: 5 if flag == "--fetch-every" else True}
    if flag in ("--spare", "--supervisor"):
        flags["--recover"] = True
    with pytest.raises(UsageError) as caught:
        refusals.check(command, flags)
    code = "needs-cluster" if cap in ("scheduler", "self_requeue") else caught.value.code
    assert caught.value.code == code
    if flag != "--resume" or kind != "local":  # a --local --resume: resume's own refusal
        assert f"{cap}" in caught.value.message and flag in caught.value.message
        assert f"which {capabilities_of(kind).what} lacks" in caught.value.message


@pytest.mark.parametrize("kind", ["local", "hosts", "cluster"])
def test_what_a_target_has_is_not_refused(kind: str) -> None:
    caps = capabilities_of(kind)
    for flag, cap in refusals.NEEDS["train"]:
        if not caps.lacks(cap) and cap not in ("recovery", "spares", "supervisor", "resume"):
            flags = {**_PLACE[kind], flag: 5 if flag == "--fetch-every" else True}
            if flag == "--down-after-run":
                flags["--fetch-every"] = 5
            assert refusals.first_broken("train", flags) is None, flag


def test_a_cloud_refuses_what_its_provider_lacks() -> None:
    from vmrun.operations.cloud import _refuse_lacking
    from vmrun.providers.api import capabilities_of as cloud_caps

    class Done:
        cloud, spot, store, zone, max_cost, autostop = "ucloud", True, "", "", 0.0, ""

    assert cloud_caps("aws").spot and cloud_caps("ucloud").lacks("spot")
    with pytest.raises(UsageError) as caught:
        _refuse_lacking(Done())
    assert caught.value.code == "flags-conflict"
    assert "capability: spot, which UCloud lacks" in caught.value.message
    Done.spot, Done.autostop = False, "30m"
    with pytest.raises(UsageError) as caught:
        _refuse_lacking(Done())
    assert "capability: power_off" in caught.value.message
    Done.cloud = "aws"
    _refuse_lacking(Done())


# The operations' branches on the target's kind, counted by one rule: an `if` (statement or
# expression) in vmrun/operations/*.py whose test names the kind: the names `local` or
# `cluster` (a variable or an attribute), a kind's word as a string ("local", "cluster",
# "hosts", "slurm", "ucloud", "aws"), or isinstance of a *Backend or *Provider class. What a
# target can do is asked of its capabilities instead.
KIND_NAMES = {"local", "cluster", "is_local", "is_cluster", "is_hosts"}
KIND_WORDS = {"local", "cluster", "hosts", "slurm", "ucloud", "aws"}
# A name that is a flag of its own command, not a target: `vmrun tensorboard --local` says
# where the viewer serves (from here, the files fetched round after round), while the run
# it shows is wherever it ran; a branch on it does not ask where a run is.
NOT_A_KIND = {("tensorboard.py", "local")}
MOST_BRANCHES = 5


def _names_a_kind(test: object, module: str = "") -> bool:
    import ast

    assert isinstance(test, ast.AST)
    for node in ast.walk(test):
        if isinstance(node, ast.Name) and (module, node.id) in NOT_A_KIND:
            continue
        if isinstance(node, ast.Name) and node.id in KIND_NAMES:
            return True
        if isinstance(node, ast.Attribute) and node.attr in KIND_NAMES:
            return True
        if isinstance(node, ast.Constant) and node.value in KIND_WORDS:
            return True
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
            for name in ast.walk(node.args[1]) if len(node.args) > 1 else ():
                if isinstance(name, ast.Name) and name.id.endswith(("Backend", "Provider")):
                    return True
    return False


def kind_branches() -> list[str]:
    """Each `if` of the operations that names a target's kind, as FILE:LINE."""
    import ast

    from conftest import ROOT

    found = []
    for path in sorted((ROOT / "vmrun" / "operations").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.If, ast.IfExp)) and _names_a_kind(node.test, path.name):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_rule_sees_a_branch_on_the_kind() -> None:
    import ast

    for code in ("if local: pass", "if job.cluster: pass", 'if cloud == "ucloud": pass'):
        assert _names_a_kind(ast.parse(code).body[0].test)  # type: ignore[attr-defined]
    assert _names_a_kind(ast.parse("x if isinstance(b, HostsBackend) else y").body[0].value.test)  # type: ignore[attr-defined]
    assert not _names_a_kind(ast.parse("if caps.lacks('spares'): pass").body[0].test)  # type: ignore[attr-defined]
    serve_here = ast.parse("if local: pass").body[0].test  # type: ignore[attr-defined]
    assert not _names_a_kind(serve_here, "tensorboard.py") and _names_a_kind(serve_here, "fetch.py")


def test_the_operations_branch_on_the_target_kind_no_more_than_they_do_now() -> None:
    """A branch on the kind belongs in a backend's capabilities or verbs instead (the places
    a command works in are chosen in vmrun.backends.select)."""
    found = kind_branches()
    assert len(found) <= MOST_BRANCHES, found
