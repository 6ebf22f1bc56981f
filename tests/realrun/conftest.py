"""Fixtures of realrun's tests (the repository's own are in tests/conftest.py)."""
import socket

import pytest


def pick_port() -> int:
    """A TCP port free on loopback now: the rendezvous of ranks a test starts (``launch_ranks``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port():
    return pick_port


def assert_declared_phases(record: dict, model: str = "gpt-tiny", **plan) -> None:
    """A step record of realrun train measures perfmodel's declared phases (perfmodel.axes: the
    compute, compression and optimizer phases and the phase of each axis the plan reports, every
    non-optional axis and the optional ones it carries) under their names, and no other phase."""
    from perfmodel.axes import AXES, PHASES
    from perfmodel.phases import COMPRESSION, COMPUTE, OPTIMIZER
    from perfmodel.workload import load_model

    spec, plan = load_model(model), {"zero": 0, **plan}
    axes = [name for name, axis in AXES.items() if not axis.optional or axis.active(plan, spec)]
    expected = {COMPUTE.name, COMPRESSION.name, OPTIMIZER.name} | {AXES[a].phase.name for a in axes}
    assert {k for k in record if k in {p.name for p in PHASES}} == expected
    assert not {"compress_s", "dp_comm_s"} & set(record)
    assert {k.removesuffix("_wire_bytes") for k in record if k.endswith("_wire_bytes")} == set(axes)


@pytest.fixture
def declared_phases():
    return assert_declared_phases
