"""The Python examples of the README and of docs/python.md run as written (on a temporary
store) and print what they show."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", (ROOT / path).read_text(), re.S)


@pytest.mark.parametrize("path, index, printed", [
    ("README.md", 0, "(4, 8) [ 0  1  3  6 10] 4"),
    ("docs/python.md", 0, "array([7, 8, 9], dtype=int32)"),
    ("docs/python.md", 1, "q1 4 1"),
])
def test_documented_examples_run(path, index, printed, tmp_path, capsys):
    code = python_blocks(path)[index].replace("file:///tmp/rb-demo", f"file://{tmp_path}")
    code = code.replace("/tmp/rb-replay", str(tmp_path / "replay"))
    exec(compile(code, path, "exec"), {"__name__": "__main__"})
    assert printed in capsys.readouterr().out
