"""The same command gives the same bytes whatever else its process holds: nothing the
replay decides (which of two flows ending at the same instant completes first, the order
the max-min solver sums rates in) may follow the memory addresses of its objects, which
is what iterating a set of objects does (sim.flows._component orders parts by when they
were added). Run in a fresh process and inside this one (whose heap pytest has filled):
the Perfetto trace, which lists events of equal times in the order they happened, must
match byte for byte. Before the fix the two orders differed on this job."""
import contextlib
import io
import subprocess
import sys

from clustersim.sim.cli import main

JOB = ("simulate --model llama3-8b --topology dgx-h100-x16-ndr --tp 4 --pp 2 --dp 4 "
       "--global-batch-size 32 --replay all --slow-gpu 3=1.5 --no-html").split()


def test_a_run_does_not_depend_on_the_heap_it_runs_in(tmp_path):
    fresh, here = tmp_path / "fresh.json", tmp_path / "here.json"
    subprocess.run([sys.executable, "-m", "clustersim", *JOB, "--trace-json", str(fresh)],
                   check=True, capture_output=True, cwd=tmp_path)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main([*JOB, "--trace-json", str(here)]) == 0
    assert fresh.read_bytes() == here.read_bytes()
