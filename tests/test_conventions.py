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
