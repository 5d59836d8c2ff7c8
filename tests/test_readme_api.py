"""The README's Python API example runs as written, and its numbers are a real run's: the
iteration time positive, the bubble fraction in [0, 1), a peak memory for each of its
pp = 4 pipeline ranks."""
import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next(b for b in blocks if "clustersim.simulate(" in b)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(example, "README.md", "exec"), {})
    time, bubble, peaks = re.fullmatch(r"(\S+) (\S+) (\{.*\})\n", out.getvalue()).groups()
    assert float(time) > 0 and 0 <= float(bubble) < 1
    assert len(eval(peaks)) == 4
