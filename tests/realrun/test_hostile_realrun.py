"""realrun's runs under hostile input and faults (issue 37, item 6): convergence outputs and
campaigns, damaged checkpoints, stopped and killed ranks, launcher bounds. Each refusal is one
line naming the field and value (exit code 2), before anything is created or trained."""
import pytest

from topologies.clikit import run

pytest.importorskip("torch", reason="the real extra (torch) is not installed")


def realrun(capsys, *argv) -> tuple[int, str]:
    """``realrun ARGV`` in this process: (exit code, its error output)."""
    from realrun.cli import main

    code = run(main, list(argv))
    return code, capsys.readouterr().err.strip()


def assert_one_line(code: int, err: str, *said: str) -> None:
    assert code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    for text in said:
        assert text in err, err


@pytest.mark.parametrize("flag, value", [("--timeout", "nan"), ("--timeout", "inf"), ("--timeout", "0"),
                                         ("--threads", "100000"), ("--threads", "0")])
def test_cluster_run_bounds_its_timeout_and_threads(capsys, flag, value):
    code, err = realrun(capsys, "cluster", "run", "--name", "nosuch", flag, value, "--", "true")
    assert_one_line(code, err, f"{flag[2:]}={float(value) if flag == '--timeout' else int(value)!r}")


class _EmulatedHosts:
    emulated, hosts = True, 4


def test_validate_training_refuses_bad_plans_before_creating_out(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("realrun.measure.runner_for", lambda name: _EmulatedHosts())
    out = tmp_path / "never"
    code, err = realrun(capsys, "validate", "--training", "--plans", "bogus", "--out", str(out))
    assert_one_line(code, err, "plans='bogus'")
    assert not out.exists()
