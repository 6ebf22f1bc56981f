"""Conventions every command keeps: --version, the environment's python under realrun."""
import sys

import pytest

from realrun.cluster.launch import python_of_this_environment


@pytest.mark.parametrize("argv", [["perfmodel", "--version"], ["perfmodel", "search", "--version"],
                                  ["realrun", "--version"], ["topologies", "--version"]])
def test_every_command_has_a_version(cli, argv):
    out = cli(*argv, check_rc=0).stdout
    assert "commpress" in out and argv[0] in out


def test_python_means_this_environment_s_interpreter():
    assert python_of_this_environment(["python", "-m", "realrun.cli"]) == [sys.executable, "-m", "realrun.cli"]
    assert python_of_this_environment(["python3", "x.py"])[0] == sys.executable
    assert python_of_this_environment(["/usr/bin/env", "python"]) == ["/usr/bin/env", "python"]


@pytest.mark.parametrize("command", ["predict", "compare", "sweep", "search"])
def test_predictions_ask_for_model_and_cluster(cli, command):
    proc = cli("perfmodel", command, check_rc=2)
    assert "--model" in proc.stderr and "--cluster" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
