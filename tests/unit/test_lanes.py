"""`make test`'s lane runner (support.lanes): two real pytest sessions on tiny test files, side by
side and serial; the verdict and the closing line count both lanes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support import lanes

CLOSING = re.compile(r"^suite: (\d+) passed, (\d+) failed, (\d+) skipped$", re.MULTILINE)


def _write(root: Path, name: str, body: str) -> Path:
    path = root / name
    path.write_text(body)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory pytest runs in without the repository's configuration."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    _write(
        tmp_path,
        "test_green.py",
        "import pytest\n"
        "def test_a():\n    pass\n"
        "def test_b():\n    pass\n"
        "@pytest.mark.skip(reason='shown as skipped')\ndef test_c():\n    pass\n",
    )
    _write(tmp_path, "test_red.py", "def test_fails():\n    assert 1 == 2\n")
    # Each waits for the other's mark: both pass only when the two sessions run at once.
    for me, other in (("one", "two"), ("two", "one")):
        _write(
            tmp_path,
            f"test_meet_{me}.py",
            "import pathlib, time\n"
            f"def test_meet_{me}():\n"
            f"    pathlib.Path('{me}.mark').touch()\n"
            "    deadline = time.monotonic() + 60\n"
            f"    while not pathlib.Path('{other}.mark').exists():\n"
            "        assert time.monotonic() < deadline, 'the other lane never ran meanwhile'\n"
            "        time.sleep(0.05)\n",
        )
    return tmp_path


def _lane(name: str, *args: str) -> lanes.Lane:
    return lanes.Lane(name, ("-q", "--durations=3", *args))


def test_two_green_lanes_run_side_by_side(
    project: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path_factory.mktemp("logs")
    selected = (
        _lane("one", "test_green.py", "test_meet_one.py"),
        _lane("two", "test_meet_two.py"),
    )
    code = lanes.run(selected, serial=False, log_dir=logs, cwd=project)
    out = capsys.readouterr().out
    assert code == 0, out
    assert CLOSING.findall(out) == [("4", "0", "1")], out
    assert out.rstrip().splitlines()[-1] == "suite: 4 passed, 0 failed, 1 skipped"
    # Each lane's own lines come prefixed, and its log holds them unprefixed.
    assert "[one] " in out, out
    assert "[two] " in out, out
    assert "passed" in (logs / "two.log").read_text()
    assert "lanes (side by side)" in out


def test_a_red_lane_fails_the_run_and_is_counted(
    project: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    selected = (_lane("green", "test_green.py"), _lane("red", "test_red.py"))
    code = lanes.run(selected, serial=True, log_dir=tmp_path_factory.mktemp("logs"), cwd=project)
    out = capsys.readouterr().out
    assert code == 1, out
    assert CLOSING.findall(out) == [("2", "1", "1")], out
    assert "===== lane red: exit 1" in out
    assert "FAILED test_red.py::test_fails" in out, "the red lane's short summary is repeated"
    # The failure's own report is repeated last, before the count.
    end = out[out.index("===== failures (1)") :]
    assert "--- test_red::test_fails" in end, end
    assert "assert 1 == 2" in end, end
    assert end.rstrip().splitlines()[-1].startswith("suite: 2 passed, 1 failed"), end


def test_a_lane_that_breaks_before_any_report_still_fails(
    project: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    selected = (_lane("green", "test_green.py"), _lane("broken", "no_such_file.py"))
    code = lanes.run(selected, serial=False, log_dir=tmp_path_factory.mktemp("logs"), cwd=project)
    out = capsys.readouterr().out
    assert code == 1, out
    passed, failed, _ = CLOSING.findall(out)[0]
    assert (passed, failed) == ("2", "1"), out


def test_the_default_lanes_split_the_suite_at_the_real_node() -> None:
    real_node, rest = lanes.lanes(durations=25)
    assert {"tests/e2e", "tests/images"} <= set(real_node.args)
    assert "--ignore=tests/e2e" in rest.args
    assert "--ignore=tests/images" in rest.args
    # Both sessions end with the egress check, so the two checked windows cover the whole run.
    assert lanes.EGRESS_CHECK in real_node.args
    assert "tests" in rest.args


def test_the_beside_command_runs_meanwhile_niced_and_prefixed(
    project: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # The lane's test passes only if the beside command writes its mark while the lane runs.
    _write(
        project,
        "test_meet_beside.py",
        "import pathlib, time\n"
        "def test_meet_beside():\n"
        "    pathlib.Path('one.mark').touch()\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not pathlib.Path('two.mark').exists():\n"
        "        assert time.monotonic() < deadline, 'the beside command never ran meanwhile'\n"
        "        time.sleep(0.05)\n",
    )
    beside = "echo niceness=$(nice); while [ ! -e one.mark ]; do sleep 0.05; done; touch two.mark"
    selected = (_lane("one", "test_meet_beside.py"),)
    code = lanes.run(
        selected,
        serial=False,
        beside=beside,
        log_dir=tmp_path_factory.mktemp("logs"),
        cwd=project,
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[beside] niceness=19" in out, out
    assert f"===== beside: `{beside}`: exit 0, " in out, out
    assert CLOSING.findall(out) == [("1", "0", "0")], out


def test_a_failing_beside_command_fails_the_run(
    project: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(project, "test_slow.py", "import time\ndef test_slow():\n    time.sleep(2)\n")
    selected = (_lane("green", "test_green.py", "test_slow.py"),)
    code = lanes.run(
        selected,
        serial=True,
        beside="echo cannot build; exit 3",
        log_dir=tmp_path_factory.mktemp("logs"),
        cwd=project,
    )
    out = capsys.readouterr().out
    assert code == 1, out
    assert "[beside] cannot build" in out, out
    # Its own time (it exits at once), not the time until the lanes were done with.
    assert "===== beside: `echo cannot build; exit 3`: exit 3, 0 s " in out, out
    passed, failed, _ = CLOSING.findall(out)[0]
    assert (passed, failed) == ("3", "1"), "the lane passed; the run still fails"


def test_make_test_builds_only_the_first_prerequisites_before_the_lanes() -> None:
    makefile = (lanes.REPO_ROOT / "Makefile").read_text()
    assert "-j4 test-prereqs-first\n" in makefile
    assert "lanes.py --beside '$(MAKE) --no-print-directory test-prereqs-beside'" in makefile
