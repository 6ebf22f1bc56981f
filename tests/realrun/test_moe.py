"""Mixture-of-experts layers and expert parallelism in realrun train (realrun.train.moe)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from perfmodel.workload import ModelSpec, load_model
from topologies.errors import InputError

torch = pytest.importorskip("torch")

from realrun.train.config import TrainConfig  # noqa: E402
from realrun.train.model import GPT  # noqa: E402
from realrun.train.moe import MoE, capacity  # noqa: E402

MOE_TOML = ("hidden_size = 64\nnum_layers = 2\nnum_heads = 4\nnum_kv_heads = 4\nffn_hidden_size = 256\n"
            "vocab_size = 256\nseq_len = 64\nactivation = \"gelu\"\nnorm = \"layernorm\"\ntied_embeddings = true\n"
            "num_experts = 4\nmoe_top_k = 2\nmoe_ffn_hidden_size = 64\nmoe_pad_to_capacity = true\n")


def moe_spec(**kw):
    base = dict(name="m", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, ffn_hidden_size=256,
                vocab_size=256, seq_len=64, activation="gelu", norm="layernorm", tied_embeddings=True,
                num_experts=4, moe_top_k=2, moe_ffn_hidden_size=64, moe_pad_to_capacity=True)
    return ModelSpec(**{**base, **kw})


@pytest.mark.parametrize("kw", [{}, dict(activation="swiglu", norm="rmsnorm", tied_embeddings=False),
                                dict(num_layers=4, moe_layer_freq=2, moe_first_dense=1, moe_shared_experts=1),
                                dict(num_experts=8, moe_top_k=1, num_kv_heads=2)])
def test_moe_parameter_count_equals_perfmodels(kw):
    s = moe_spec(**kw)
    model = GPT(s)
    assert model.num_params() == s.params
    assert sum(p.numel() for p in model.expert_parameters()) == s.num_moe_layers * s.moe_routed_params()
    tiny = load_model("gpt-tiny-moe")
    assert GPT(tiny).num_params() == tiny.params and tiny.is_moe and tiny.num_moe_layers == tiny.num_layers


def test_perfmodel_predicts_the_tiny_moe_model_with_its_all_to_alls():
    from perfmodel import predict

    r = predict("gpt-tiny-moe", "dgx-a100", gpus=2, tp=1, pp=1, ep=2, mbs=4, gbs=8, seq=64, compute_dtype="bf16")
    assert r.step_time_s > 0 and r.breakdown["ep_comm_s"] > 0


def test_capacity_is_the_ceiling_of_the_fair_share_times_the_factor():
    assert capacity(1.25, 512, 2, 4) == 320
    assert capacity(1.25, 7, 2, 4) == 5          # ceil(4.375)
    assert capacity(0.0, 10, 2, 4) == 10         # dropless
    assert capacity(100.0, 10, 2, 4) == 10       # never more than the tokens


def _reference(layer: MoE, x: torch.Tensor, cap: int) -> tuple[torch.Tensor, int]:
    """Token by token: softmax over the top-k logits, expert queues filled first choices first."""
    logits = x @ layer.router.weight.T
    top, chosen = logits.topk(layer.spec.moe_top_k, dim=-1)
    weights = top.softmax(dim=-1)
    out, load, dropped = torch.zeros_like(x), [0] * layer.spec.num_experts, 0
    for slot in range(layer.spec.moe_top_k):
        for t in range(x.shape[0]):
            e = int(chosen[t, slot])
            if load[e] == cap:
                dropped += 1
                continue
            load[e] += 1
            hidden = torch.nn.functional.gelu(layer.w_up[e] @ x[t])
            out[t] += weights[t, slot] * (layer.w_down[e] @ hidden)
    return out, dropped


@pytest.mark.parametrize("factor", [0.0, 0.75])
def test_routing_matches_a_token_by_token_reference_and_counts_drops(factor):
    s = moe_spec(moe_capacity_factor=factor, norm="rmsnorm")
    layer = GPT(s, seed=3).blocks[0].moe
    x = torch.randn(2, 24, s.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = layer(x)
        want, dropped = _reference(layer, x.reshape(-1, s.hidden_size), capacity(factor, 48, 2, 4))
    assert torch.allclose(y.reshape(-1, s.hidden_size), want, atol=1e-5)
    assert layer.ep.routed == 96 and layer.ep.dropped == dropped
    assert (dropped == 0) == (factor == 0.0)


def test_the_balance_loss_reaches_the_router_and_leaves_the_loss_alone():
    s = moe_spec()
    model, tokens = GPT(s), torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    loss = model(tokens, tokens)
    loss.backward()
    router = model.blocks[0].moe.router.weight.grad.clone()
    model.zero_grad()
    for block in model.blocks:
        block.moe.ep.aux_scale = 0.0   # no balance gradient
    assert float(model(tokens, tokens).detach()) == pytest.approx(float(loss.detach()), rel=1e-6)
    model(tokens, tokens).backward()
    assert not torch.allclose(router, model.blocks[0].moe.router.weight.grad)


@pytest.mark.parametrize("kw, field", [(dict(ep=2, dp=1), "ep"), (dict(ep=2, dp=2, model="gpt-tiny"), "ep"),
                                       (dict(ep=3, dp=3), "ep"), (dict(ep=0), "ep")])
def test_bad_expert_parallel_configs_name_the_field(kw, field):
    with pytest.raises(InputError, match=field):
        TrainConfig.of(**{"model": "gpt-tiny-moe", **kw})


def test_train_bad_ep_is_one_line(cli):
    for args in (("--model", "gpt-tiny-moe", "--ep", "2"), ("--model", "gpt-tiny", "--dp", "2", "--ep", "2"),
                 ("--model", "gpt-tiny-moe", "--dp", "3", "--ep", "3")):
        proc = cli("realrun", "train", *args)
        assert proc.returncode == 2 and "ep" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def _train(tmp_path, name, *args, model="gpt-tiny-moe"):
    exe = shutil.which("realrun", path=os.path.dirname(sys.executable)) or "realrun"
    out = tmp_path / f"{name}.jsonl"
    proc = subprocess.run([exe, "train", "--model", model, "--seq", "64", "--metrics", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()], proc


def test_dropless_capacity_drops_nothing_and_the_catalog_capacity_reports_its_drops(tmp_path):
    toml = tmp_path / "m.toml"
    toml.write_text(MOE_TOML + "moe_capacity_factor = 0.0\n")
    dropless, proc = _train(tmp_path, "dropless", "--mbs", "2", "--steps", "3", "--eval-every", "0",
                            model=str(toml))
    assert all(r["moe_dropped"] == 0.0 for r in dropless) and "MoE tokens dropped" in proc.stdout
    tight, _ = _train(tmp_path, "tight", "--mbs", "2", "--steps", "3", "--eval-every", "0")
    assert all(0.0 < r["moe_dropped"] < 1.0 for r in tight)   # capacity 1.25 on bytes: some drops
    dense, _ = _train(tmp_path, "dense", "--mbs", "2", "--steps", "1", "--eval-every", "0", model="gpt-tiny")
    assert "moe_dropped" not in dense[0]


def dispatch_bytes(model: str, ep: int, seq: int, mbs: int, microbatches: int = 1) -> int:
    """A rank's dispatch (or combine) bytes on the wire per step as perfmodel.events counts them:
    per MoE layer and microbatch, forward and backward, an fp32 buffer of the model's
    ``dispatched_rows`` (padded to capacity), (ep - 1) / ep of it to the other ranks."""
    spec = load_model(model)
    buffer = spec.dispatched_rows(mbs * seq) * spec.hidden_size * 4
    return 2 * spec.num_moe_layers * microbatches * buffer * (ep - 1) // ep


@pytest.mark.distributed
def test_expert_parallel_reproduces_one_rank(tmp_path, same_losses, declared_phases):
    """dp=2 ep=2 (each rank holds 2 of the 4 experts, one microbatch each) against one rank with
    both microbatches: the same global batch, capacity on the same token sets, so the same drops
    and, with policy none, the same losses."""
    args = ("--mbs", "4", "--gbs", "8", "--steps", "10", "--eval-every", "5")
    two, proc = _train(tmp_path, "ep2", "--dp", "2", "--ep", "2", *args)
    one, _ = _train(tmp_path, "ep1", *args)
    assert len(one) == 10
    same_losses(two, one, rel=1e-4)
    assert [a["moe_dropped"] for a in two] == [b["moe_dropped"] for b in one]
    assert sum(r["val_loss"] is not None for r in two) >= 2   # evaluated at steps 0, 5 and 9
    assert "ep_wire_bytes" not in one[0]
    for axis in ("ep", "ep_combine"):   # perfmodel's padded rows (dispatched_rows), half to the other rank
        assert all(r[f"{axis}_wire_bytes"] == dispatch_bytes("gpt-tiny-moe", 2, 64, 4) for r in two)
    assert two[0]["ep_rel_error"] == 0.0 and "ep=2" in proc.stdout
    declared_phases(two[0], "gpt-tiny-moe", dp=2, ep=2)
    declared_phases(one[0], "gpt-tiny-moe")
    assert two[0]["ep_comm_s"] > 0 and "ep_comm_s" not in one[0]


@pytest.mark.distributed
def test_expert_parallel_with_zero1_reproduces_one_rank(tmp_path, same_losses):
    """dp=2 ep=2 zero=1: the dense parameters' Adam state sharded over dp, the experts (reduced over
    their expert-data-parallel group) stepped whole beside them: the one-rank losses."""
    args = ("--mbs", "4", "--gbs", "8", "--steps", "4", "--eval-every", "0")
    zero, _ = _train(tmp_path, "zero", "--dp", "2", "--ep", "2", "--zero", "1", *args)
    one, _ = _train(tmp_path, "one", *args)
    same_losses(zero, one, rel=1e-4)
    assert all(r["zero_wire_bytes"] > 0 for r in zero)


@pytest.mark.distributed
def test_resume_with_expert_parallelism_and_zero1_continues_the_same_loss_curve(tmp_path, resume_continues):
    """The sharded dense state and the experts' whole AdamW state both come back from the checkpoint."""
    resume_continues(_train, tmp_path, ("--dp", "2", "--ep", "2", "--zero", "1", "--mbs", "2", "--eval-every", "0"))


@pytest.mark.distributed
def test_expert_gradients_reduce_over_the_expert_data_parallel_group(tmp_path, same_losses):
    """dp=4 ep=2: two replicas of each expert half, their gradients summed over edp (2 ranks)."""
    args = ("--mbs", "2", "--gbs", "8", "--steps", "3", "--eval-every", "0")
    four, _ = _train(tmp_path, "edp", "--dp", "4", "--ep", "2", *args)
    one, _ = _train(tmp_path, "one", *args)
    same_losses(four, one, rel=1e-4)


@pytest.mark.distributed
def test_compressed_dispatch_still_learns_and_combine_follows_ep(tmp_path):
    from perfmodel.axes import AXES

    args = ("--dp", "2", "--ep", "2", "--mbs", "4", "--steps", "12", "--eval-every", "0", "--error-every", "4")
    int8, _ = _train(tmp_path, "int8", "--policy", "ep=int8", *args)
    exact, _ = _train(tmp_path, "none", "--steps", "1", *args[:-6])
    assert int8[-1]["loss"] < int8[0]["loss"] - 0.5
    for axis in ("ep", "ep_combine"):   # ep_combine follows ep: both int8, about a quarter of fp32
        assert int8[-1][f"{axis}_wire_bytes"] < 0.3 * exact[0][f"{axis}_wire_bytes"]
        assert 0 < int8[0][f"{axis}_rel_error"] < AXES[axis].max_error


@pytest.mark.distributed
def test_resume_with_expert_parallelism_continues_the_same_loss_curve(tmp_path, resume_continues):
    """Each rank's file holds its own experts; resuming with another ep is refused in one line."""
    args = ("--dp", "2", "--ep", "2", "--mbs", "2", "--eval-every", "0")
    ck = resume_continues(_train, tmp_path, args)
    exe = shutil.which("realrun", path=os.path.dirname(sys.executable)) or "realrun"
    proc = subprocess.run([exe, "train", "--model", "gpt-tiny-moe", "--seq", "64", "--dp", "2", "--mbs", "2",
                           "--steps", "6", "--checkpoint", str(ck), "--resume"], capture_output=True, text=True)
    assert proc.returncode == 2 and "ep" in proc.stderr and "Traceback" not in proc.stderr


def test_an_unpadded_moe_model_is_accepted(tmp_path):
    """Unpadded (dropless, or token drop without padding): the layer sends each expert its kept
    rows only, as perfmodel prices the model file (tests/realrun/test_dropless.py)."""
    toml = tmp_path / "m.toml"
    toml.write_text(MOE_TOML.replace("moe_pad_to_capacity = true\n", ""))
    assert TrainConfig.of(model=str(toml), steps=1, dp=2, ep=2).ep == 2
