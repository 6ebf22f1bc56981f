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
    check_histograms(tmp_path, model, steps=6, tokens=8 * 64)


@pytest.mark.distributed
def test_dropless_expert_parallel_with_tensor_parallelism_reproduces_one_rank(tmp_path, same_losses):
    """tp=2 dp=2 ep=2: each ep group (the ranks of one tp index, one per replica) dispatches its
    replica's tokens; the experts stay whole on every tp rank. The one-rank losses; the histogram
    counts a tp group's tokens once."""
    model = dropless_model(tmp_path)
    args = ("--mbs", "4", "--gbs", "8", "--steps", "4", "--eval-every", "0")
    four, _ = _train(tmp_path, "ep2", "--tp", "2", "--dp", "2", "--ep", "2", *args, model=model)
    one, _ = _train(tmp_path, "ep1", *args, model=model)
    same_losses(four, one, rel=1e-4)
    check_histograms(tmp_path, model, steps=4, tokens=8 * 64)


def check_histograms(tmp_path, model: str, steps: int, tokens: int) -> None:
    """Train small, predict big: the histogram each run wrote beside its metrics (ep2, ep1) has every
    token's top-k copies of every step per MoE layer, the ep run's the one-rank run's, and it loads
    in perfmodel as the routing of a prediction of the same model."""
    import json

    from perfmodel import predict
    from perfmodel.plan.routing import parse, rank_shares

    spec = _moe.load_model(model)
    got = {name: json.loads((tmp_path / f"{name}.routing.json").read_text()) for name in ("ep2", "ep1")}
    counts = got["ep2"]["tokens_per_expert"]
    assert len(counts) == spec.num_moe_layers and all(len(row) == spec.num_experts for row in counts)
    assert all(sum(row) == steps * tokens * spec.moe_top_k for row in counts)
    for mine, one in zip(counts, got["ep1"]["tokens_per_expert"]):   # the same routing, up to a near tie
        assert all(abs(a - b) <= 0.01 * b for a, b in zip(mine, one))
    path = str(tmp_path / "ep2.routing.json")
    routing = parse(path)
    assert routing.kind == "histogram" and [list(map(int, r)) for r in routing.counts] == counts
    r = predict(model, "dgx-a100", gpus=2, ep=2, mbs=4, gbs=8, seq=64, compute_dtype="bf16", routing=path)
    balanced = predict(model, "dgx-a100", gpus=2, ep=2, mbs=4, gbs=8, seq=64, compute_dtype="bf16",
                       routing="balanced")
    busiest = sum(max(rank_shares(tuple(c / sum(row) for c in row), 2)) for row in counts) / len(counts)
    assert busiest > 0.5 and r.breakdown["ep_comm_s"] > balanced.breakdown["ep_comm_s"] > 0


def test_a_bad_routing_out_is_one_line_and_writes_nothing(cli, tmp_path):
    model = dropless_model(tmp_path)
    for args in (("--model", "gpt-tiny", "--routing-out", str(tmp_path / "h.json")),   # dense: routes nothing
                 ("--model", model, "--routing-out", str(tmp_path / "h.csv")),         # perfmodel reads JSON by name
                 ("--model", model, "--routing-out", str(tmp_path / "missing" / "h.json"))):
        proc = cli("realrun", "train", "--steps", "1", *args)
        assert proc.returncode == 2 and "routing_out" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dropless.toml"]


def test_the_histogram_of_the_last_steps_counts_those_steps_only(tmp_path):
    """--routing-steps 2 of a 3-step run: two steps' copies, the last two's (the note says which)."""
    import json

    model = dropless_model(tmp_path)
    _train(tmp_path, "last", "--mbs", "2", "--steps", "3", "--eval-every", "0", "--routing-steps", "2", model=model)
    body = json.loads((tmp_path / "last.routing.json").read_text())
    assert all(sum(row) == 2 * 2 * 64 * 2 for row in body["tokens_per_expert"]) and "steps 1-2" in body["note"]
    proc = _moe.subprocess.run([_moe.shutil.which("realrun", path=_moe.os.path.dirname(_moe.sys.executable)),
                                "train", "--model", model, "--routing-steps", "-1"], capture_output=True, text=True)
    assert proc.returncode == 2 and "routing_steps" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
