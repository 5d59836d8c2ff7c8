"""schedules.output_files: outputs are checked before any work and written atomically
(issue 15). The checks are tried on real files in a temporary folder."""
import os
import stat
import threading

import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.output_files import check_outputs, write_output, write_text_atomic


def test_writable_outputs_pass_and_the_probes_leave_nothing(tmp_path):
    existing = tmp_path / "old.json"
    existing.write_text("keep")
    stamp = existing.stat().st_mtime_ns
    check_outputs({"--a": str(existing), "--b": str(tmp_path / "new.json"), "--c": None,
                   "--d": str(tmp_path / "made" / "deep" / "g.html")})
    assert existing.read_text() == "keep" and existing.stat().st_mtime_ns == stamp
    assert sorted(os.listdir(tmp_path)) == ["old.json"]


@pytest.mark.parametrize("where, rule", [
    ("{tmp}", "is a directory, give a file path"),
    ("{tmp}/old.json/x.json", "{tmp}/old.json is not a directory"),
    ("{tmp}/old.json/a/x.json", "{tmp}/old.json is not a directory"),
    ("/proc/nope/x.json", "directory /proc/nope cannot be created"),
])
def test_unwritable_outputs_name_the_flag_and_the_rule(tmp_path, where, rule):
    (tmp_path / "old.json").write_text("keep")
    path = where.format(tmp=tmp_path)
    with pytest.raises(ConfigError) as info:
        check_outputs({"--out": path})
    assert str(info.value).startswith(f"--out {path}: {rule.format(tmp=tmp_path)}")


def test_an_output_is_never_an_input_nor_another_output(tmp_path):
    source = tmp_path / "in.csv"
    source.write_text("0F0\n")
    os.symlink(source, tmp_path / "link.csv")
    for spelling in (str(source), str(tmp_path / "." / "in.csv"), str(tmp_path / "link.csv")):
        with pytest.raises(ConfigError, match="is the run's input --schedule-csv"):
            check_outputs({"--output": spelling}, {"--schedule-csv": str(source)})
    with pytest.raises(ConfigError, match="--b and --a both write"):
        check_outputs({"--a": str(tmp_path / "x"), "--b": str(tmp_path / "." / "x")})
    with pytest.raises(ConfigError, match="^--a: an empty path$"):
        check_outputs({"--a": ""})
    assert source.read_text() == "0F0\n"


def test_atomic_write_replaces_a_link_without_following_it(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("left alone")
    link = tmp_path / "out.txt"
    os.symlink(target, link)
    line = write_output(link, lambda path: write_text_atomic(path, "new"))
    assert line == f"wrote {link} (replaced the file that was there)"
    assert not link.is_symlink() and link.read_text() == "new"
    assert target.read_text() == "left alone"
    assert write_output(tmp_path / "a" / "b.txt", lambda p: write_text_atomic(p, "x")) == (
        f"wrote {tmp_path / 'a' / 'b.txt'}")
    assert sorted(os.listdir(tmp_path)) == ["a", "out.txt", "target.txt"]


def test_a_fifo_or_device_at_the_target_is_written_into_not_replaced(tmp_path):
    """`-o /dev/null` or a named pipe: the text goes into it, and it stays what it was
    (a rename would replace the device by a file)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    line = write_output(fifo, lambda path: write_text_atomic(path, "hello"))
    reader.join(timeout=10)
    assert received == ["hello"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert line == f"wrote {fifo}"  # nothing was replaced
