"""The code facts a run records before it starts (vmrun.runs.provenance): git's commit and
uncommitted diff, the hash of what is synced, and the variables (names only for the user's)."""

from __future__ import annotations

import base64
import gzip
import os
from pathlib import Path

import pytest
from conftest import git

from vmrun.runs import provenance


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "proj").mkdir(parents=True)
    (root / "proj" / "train.py").write_text("print('one')\n")
    (root / "other.txt").write_text("outside the project\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-qm", "first")
    git(root, "remote", "add", "origin", "https://alice:ghp_token123@github.com/a/b.git")
    return root


def test_a_clean_tree_has_its_commit_branch_and_remote_without_credentials(repo: Path) -> None:
    code = provenance.code_of(repo / "proj")
    facts = code.facts
    assert facts["commit"] == git(repo, "rev-parse", "HEAD") and facts["branch"] == "main"
    assert (facts["dirty"], facts["patch_bytes"], code.patch) == (False, 0, b"")
    assert facts["remote"] == "https://github.com/a/b.git"  # no user, no token
    assert (facts["path"], facts["files"]) == ("proj", 1)
    assert code.sent() == ""


def test_an_uncommitted_change_is_the_patch_of_the_project_folder_alone(repo: Path) -> None:
    (repo / "proj" / "train.py").write_text("print('two')\n")
    (repo / "other.txt").write_text("changed outside the project\n")  # not synced: not here
    (repo / "proj" / "new.py").write_text("x = 1\n")
    code = provenance.code_of(repo / "proj")
    assert code.facts["dirty"] is True and code.facts["untracked"] == ["new.py"]
    assert b"+print('two')" in code.patch and b"other.txt" not in code.patch
    assert code.facts["patch_bytes"] == len(code.patch) and not code.facts["patch_truncated"]
    sent = code.sent()
    assert gzip.decompress(base64.b64decode(sent)) == code.patch  # what the run's agent unpacks


def test_the_tree_hash_follows_content_not_mtimes(repo: Path) -> None:
    proj = repo / "proj"
    first = provenance.tree_hash(proj, ["train.py"])
    os.utime(proj / "train.py", (1, 1))
    assert provenance.tree_hash(proj, ["train.py"]) == first
    (proj / "train.py").write_text("print('three')\n")
    assert provenance.tree_hash(proj, ["train.py"]) != first
    os.chmod(proj / "train.py", 0o755)
    changed = provenance.tree_hash(proj, ["train.py"])
    os.chmod(proj / "train.py", 0o644)
    assert provenance.tree_hash(proj, ["train.py"]) != changed  # the executable bit counts


def test_outside_git_there_is_no_commit_but_still_a_hash(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    facts = provenance.code_of(tmp_path).facts
    assert (facts["git"], facts["commit"], facts["dirty"]) == (False, None, None)
    assert facts["files"] == 1 and len(facts["tree_sha256"]) == 64


def test_a_large_diff_is_cut_to_fit_the_environment_and_says_so(repo: Path) -> None:
    lines = "".join(f"print({os.urandom(24).hex()!r})\n" for _ in range(20000))
    (repo / "proj" / "train.py").write_text(lines)
    code = provenance.code_of(repo / "proj")
    sent = code.sent()
    assert len(sent) <= provenance.PATCH_LIMIT and code.facts["patch_truncated"] is True
    kept = provenance.sent_patch(code.patch)
    assert kept.endswith(b"# vmrun: the diff was cut here (too large)\n")
    assert code.patch.startswith(kept[: -len(provenance.CUT_MARK)])


def test_the_users_variables_are_names_only() -> None:
    given = {"PYTHONUNBUFFERED": "1", "TOKEN": "s3cret", "NCCL_IB_HCA": "mlx5"}
    assert provenance.variables(given, ["TOKEN", "NCCL_IB_HCA"]) == {
        "NCCL_IB_HCA": None,
        "PYTHONUNBUFFERED": "1",
        "TOKEN": None,
    }


def test_versions_json_is_read_leniently() -> None:
    assert provenance.versions_of('{"torch": "2.13.0"}') == {"torch": "2.13.0"}
    assert provenance.versions_of("not json") is None and provenance.versions_of("[1]") is None


def test_only_what_is_synced_is_dirt_or_diff(repo: Path) -> None:
    """A results/ folder a fetch left, or a tracked file .vmrunignore keeps here (a secret
    edited in place), is neither dirty nor in the diff that goes to the host."""
    proj = repo / "proj"
    (proj / "secrets.yaml").write_text("token: none\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "secrets")
    (proj / ".vmrunignore").write_text("secrets.yaml\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "ignore")
    (proj / "results" / "run-1").mkdir(parents=True)
    (proj / "results" / "run-1" / "run.json").write_text("{}")
    (proj / "secrets.yaml").write_text("token: real-token-123\n")
    clean = provenance.code_of(proj)
    assert (clean.facts["dirty"], clean.facts["untracked"], clean.patch) == (False, [], b"")
    git(repo, "mv", "proj/train.py", "proj/main.py")  # a rename: both names are the code's
    (proj / "data").mkdir()
    (proj / "data" / "prep.py").write_text("x = 2\n")  # an untracked folder that is synced
    moved = provenance.code_of(proj)
    assert moved.facts["dirty"] is True and moved.facts["untracked"] == ["data/"]
    assert b"rename to proj/main.py" in moved.patch and b"real-token-123" not in moved.patch


def test_a_template_run_tells_the_commit_but_nothing_of_the_project_is_synced(repo: Path) -> None:
    from vmrun.trainer import TEMPLATE_PATH

    (repo / "proj" / "train.py").write_text("print('changed')\n")
    code = provenance.code_of(repo / "proj", trainer=TEMPLATE_PATH)
    assert code.facts["commit"] == git(repo, "rev-parse", "HEAD") and code.facts["files"] == 1
    assert (code.facts["dirty"], code.patch) == (None, b"")
    assert code.facts["tree_sha256"] == provenance.tree_hash(TEMPLATE_PATH.parent, ["template.py"])
