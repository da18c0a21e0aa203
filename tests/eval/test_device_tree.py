"""`python -m mmspec.eval.device_tree`: a fitted tree leaves the unkept zoo folders out of what travels, within the
limit, and `--restore` gives back the index and the ignore list exactly; a request it refuses changes nothing."""

import subprocess

import pytest

from mmspec.eval import device_tree

FILES = {  # path: bytes
    "README.md": 1000,
    "mmspec/zoo/__init__.py": 100,
    "mmspec/zoo/shapes/model_index.json": 100,
    "mmspec/zoo/shapes/transformer/weights.bin": 300_000,
    "mmspec/zoo/shapes/hydra_head/weights.bin": 500_000,
    "mmspec/zoo/pycode/target/weights.bin": 400_000,
    "mmspec/zoo/pycode/draft/weights.bin": 200_000,
    "mmspec/zoo/shapes_clip/weights.bin": 250_000,
}


def git(root, *args):
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    for path, size in FILES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"x" * size)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "zoo")
    (tmp_path / ".git/info/exclude").write_text("# a line of the user's\n/.whl/\n")
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl/a.whl").write_bytes(b"w" * 100_000)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def travelling(root):
    return sorted(device_tree.travelling_files(root))


def test_a_fitted_tree_leaves_the_unkept_folders_out_until_restored(checkout, capsys):
    before = (checkout / ".git/info/exclude").read_text()
    assert device_tree.main(["--keep", "shapes/transformer", "pycode", "--carry", ".whl", "--limit-mib", "1.5"]) is None
    assert travelling(checkout) == ["README.md", "mmspec/zoo/__init__.py", "mmspec/zoo/pycode/draft/weights.bin",
                                    "mmspec/zoo/pycode/target/weights.bin", "mmspec/zoo/shapes/model_index.json",
                                    "mmspec/zoo/shapes/transformer/weights.bin"]
    assert "1.0 MiB would travel (2 zoo folders left out)" in capsys.readouterr().out  # 1,001,300 + the wheel's 100,000
    assert all((checkout / path).exists() for path in FILES)  # the files never move
    device_tree.main(["--status"])
    status = capsys.readouterr().out
    assert "fitted: 2 zoo folders left out" in status and "shapes/hydra_head  (left out)" in status
    assert device_tree.main(["--keep", "shapes"]) == 2  # fitted already
    assert "--restore first" in capsys.readouterr().err
    device_tree.main(["--restore"])
    assert git(checkout, "status", "--porcelain") == "" and (checkout / ".git/info/exclude").read_text() == before
    assert travelling(checkout) == sorted(FILES)


@pytest.mark.parametrize("argv,message", [
    (["--keep", "shapes", "pycode", "--limit-mib", "1.2"], "1.3 MiB would travel, over --limit-mib 1.2; nothing "
                                                          "changed. Kept model folders (MiB): pycode/draft 0.2"),
    (["--keep", "shapes/vae"], "--keep: no zoo world or model folder 'shapes/vae'; choose from pycode, shapes, "
                               "shapes_clip or their folders (pycode/draft, pycode/target, shapes/hydra_head"),
])
def test_a_refused_request_changes_nothing(checkout, capsys, argv, message):
    assert device_tree.main(argv) == 2
    assert message in capsys.readouterr().err
    assert git(checkout, "status", "--porcelain") == "" and travelling(checkout) == sorted(FILES)
    assert "device_tree" not in (checkout / ".git/info/exclude").read_text()


def test_bad_flags_exit_2_before_any_work(checkout):
    for argv in (["--restore", "--carry", ".whl"], ["--keep", "shapes", "--limit-mib", "65"], []):
        with pytest.raises(SystemExit) as exit_:
            device_tree.main(argv)
        assert exit_.value.code == 2
