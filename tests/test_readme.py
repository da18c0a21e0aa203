"""The README's Python example runs as written."""

import re
from pathlib import Path


def test_readme_python_example_runs(capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    exec(compile(example, "README.md", "exec"), {})
    assert "mean_accepted_length" in capsys.readouterr().out
