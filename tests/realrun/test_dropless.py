"""Dropless expert parallelism (uneven all-to-all splits) and the measured routing histogram of
``realrun train`` (realrun.train.moe; perfmodel.plan.routing reads the histogram)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from realrun.train.model import GPT  # noqa: E402


def _sibling(name: str):
    """A test module beside this one (pytest imports by path here: --import-mode=importlib)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(f"realrun_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_moe = _sibling("test_moe")
MOE_TOML, _train, moe_spec = _moe.MOE_TOML, _moe._train, _moe.moe_spec

DROPLESS_TOML = MOE_TOML.replace("moe_pad_to_capacity = true\n", "")   # no capacity factor, not padded


def dropless_model(tmp_path, extra: str = "") -> str:
    path = tmp_path / "dropless.toml"
    path.write_text(DROPLESS_TOML + extra)
    return str(path)


@pytest.mark.parametrize("factor", [0.0, 0.75])
def test_uneven_dispatch_equals_the_padded_layer_on_one_rank(factor):
    """Without padding the layer computes each expert's kept rows only: the same loss and
    gradients as padded to capacity, the same drops."""
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    grads = []
    for pad in (True, False):
        model = GPT(moe_spec(moe_capacity_factor=factor, moe_pad_to_capacity=pad), seed=3)
        model(tokens, tokens).backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def test_training_passes_count_the_routers_assignments_per_expert():
    model = GPT(moe_spec(moe_pad_to_capacity=False), seed=3)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(tokens, tokens)
    assert all(b.moe.load is None for b in model.blocks)   # evaluation routes nothing into the histogram
    model(tokens, tokens)
    for block in model.blocks:
        assert float(block.moe.load.sum()) == 2 * 32 * 2   # every token's top-2 assignments


@pytest.mark.distributed
def test_dropless_expert_parallel_reproduces_one_rank(tmp_path, same_losses):
    """dp=2 ep=2 of a dropless model (each rank sends each expert its tokens only, uneven splits)
    against one rank with both microbatches: the same losses, nothing dropped."""
    model = dropless_model(tmp_path)
    args = ("--mbs", "4", "--gbs", "8", "--steps", "6", "--eval-every", "5")
    two, _ = _train(tmp_path, "ep2", "--dp", "2", "--ep", "2", *args, model=model)
    one, _ = _train(tmp_path, "ep1", *args, model=model)
    same_losses(two, one, rel=1e-4)
    assert all(r["moe_dropped"] == 0.0 for r in two + one)
    # perfmodel's rows (dispatched_rows: a row per token copy, unpadded) half to the other rank
    nominal = _moe.dispatch_bytes(model, ep=2, seq=64, mbs=4)
    for r in two:   # the rows this rank's router sent the other rank's experts, there and back
        assert 0 < r["ep_wire_bytes"] == r["ep_combine_wire_bytes"] <= 2 * nominal
    assert abs(sum(r["ep_wire_bytes"] for r in two) / len(two) / nominal - 1) < 0.25
