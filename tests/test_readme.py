"""The README's Python examples run as written."""

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
# what each example prints, in order
EXPECTED_OUTPUT = ["target_forwards", "mean_accepted_length", "acceptance_rate", "frames_discarded", "FD-CLIP"]


def test_readme_has_one_example_per_expected_output():
    assert len(EXAMPLES) == len(EXPECTED_OUTPUT)


@pytest.mark.parametrize(("example", "expected"), zip(EXAMPLES, EXPECTED_OUTPUT, strict=True),
                         ids=["image", "text", "mar", "video", "metrics"])
def test_readme_python_example_runs(example, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may write files
    exec(compile(example, "README.md", "exec"), {})
    assert expected in capsys.readouterr().out
