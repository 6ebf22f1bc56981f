"""MoE routing as a distribution (perfmodel.plan.routing): balanced, capacity:F and a measured histogram
file; the busiest expert-parallel rank's expert compute, the uneven all-to-all, grouped GEMMs, the CLI
and the Python API."""
import json
import math
import os

import pytest

from perfmodel import predict
from perfmodel.collectives.alltoall import uneven_factor
from perfmodel.devices import device
from perfmodel.events import dispatch_events
from perfmodel.plan import routing
from perfmodel.plan.mesh import mesh_for
from perfmodel.plan.parallel import make_plan
from perfmodel.stage import StageContext
from perfmodel.step.compute import grouped_gemm_s, quantized_elements, stage_compute
from perfmodel.workload import load_model
from topologies.errors import InputError

MIXTRAL = dict(model="mixtral-8x7b", cluster="dgx-h100", gpus=64, gbs=256, ep=8, pp=2, allow_oom=True)


def _histogram(tmp_path, counts, name="h.json", **extra):
    path = tmp_path / name
    path.write_text(json.dumps({"tokens_per_expert": counts, **extra}))
    return str(path)


def _hot(experts: int, hot: float, block: int = 0, per_block: int = 1) -> list:
    """Counts of ``experts`` experts, 100 each, those of block ``block`` (``per_block`` experts) at ``hot``."""
    return [hot if block * per_block <= e < (block + 1) * per_block else 100.0 for e in range(experts)]


def test_uneven_factor_is_set_by_the_busiest_receiver_or_the_least_loaded_sender():
    assert uneven_factor([0.25] * 4) == pytest.approx(1.0)
    assert uneven_factor([1.0]) == 1.0
    assert uneven_factor([0.7, 0.1, 0.1, 0.1]) == pytest.approx(4 * 0.7)              # receives 2.8x
    assert uneven_factor([0.0, 0.5, 0.5]) == pytest.approx(1.5)                       # 3 x 0.5
    assert uneven_factor([0.0, 0.25, 0.25, 0.25, 0.25]) == pytest.approx(1.25)        # sends all: 5/4
    assert uneven_factor([0.1, 0.3, 0.3, 0.3]) == pytest.approx(1.2)                  # receiver 1.2 = sender 1.2


def test_text_forms_parse_and_bad_ones_are_refused_in_one_line():
    assert routing.parse("balanced") == routing.Routing("balanced")
    assert routing.parse("capacity:1.25") == routing.Routing("capacity", factor=1.25)
    for bad in ("", "capacity:", "capacity:0.5", "capacity:x", "capacity:nan", "capacity:inf", "capacity:1e9",
                "/no/such/histogram.json", "dropless", None, 3):
        with pytest.raises(InputError) as err:
            routing.parse(bad)
        assert err.value.field.startswith("routing") and "\n" not in str(err.value)


def test_json_and_csv_histograms_are_read_one_list_or_one_per_layer(tmp_path):
    one = routing.parse(_histogram(tmp_path, [1, 2, 3, 4]))
    assert one.kind == "histogram" and one.counts == ((1.0, 2.0, 3.0, 4.0),)
    layers = routing.parse(_histogram(tmp_path, [[1, 2], [3, 4]], "l.json", model="x", note="measured"))
    assert layers.counts == ((1.0, 2.0), (3.0, 4.0))
    csv = tmp_path / "h.csv"
    csv.write_text("# tokens per expert, a line per MoE layer\n1,2,3\n\n4, 5, 6\n")
    assert routing.parse(str(csv)).counts == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))
    assert "2 layers x 3 experts" in routing.parse(str(csv)).describe()


@pytest.mark.parametrize("body, field", [
    ('{"tokens_per_expert": [1, -2, 3]}', "layer 0 expert 1"),
    ('{"tokens_per_expert": [1, NaN, 3]}', "layer 0 expert 1"),
    ('{"tokens_per_expert": [1, "2", 3]}', "layer 0 expert 1"),
    ('{"tokens_per_expert": [1, true]}', "layer 0 expert 1"),
    ('{"tokens_per_expert": [1, 1e300]}', "layer 0 expert 1"),
    ('{"tokens_per_expert": [[1, 2], [1, 2, 3]]}', "layer 1 experts"),
    ('{"tokens_per_expert": [[1, 2], 3]}', "layer 1"),
    ('{"tokens_per_expert": [0, 0, 0]}', "layer 0"),
    ('{"tokens_per_expert": []}', "tokens_per_expert"),
    ('{"tokens_per_expert": [[]]}', "layer 0"),
    ('{"tokens": [1, 2]}', "routing"),
    ('{"tokens_per_expert": [1, 2], "extra": 1}', "extra"),
    ("[1, 2, 3]", "routing"),
    ("{not json", "routing"),
])
def test_a_malformed_json_histogram_is_one_line_naming_file_field_and_value(tmp_path, body, field):
    path = tmp_path / "bad.json"
    path.write_text(body)
    with pytest.raises(InputError) as err:
        routing.parse(str(path))
    text = str(err.value)
    assert field in err.value.field and "\n" not in text and ("bad.json" in text)


def test_a_malformed_csv_or_oversized_file_is_refused(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2,x\n")
    with pytest.raises(InputError, match="layer 0 expert 2='x'"):
        routing.parse(str(bad))
    empty = tmp_path / "empty.csv"
    empty.write_text("# nothing\n\n")
    with pytest.raises(InputError, match="a CSV histogram"):
        routing.parse(str(empty))
    huge = tmp_path / "huge.csv"
    with open(huge, "wb") as handle:
        handle.truncate(2**26 + 1)              # sparse: refused by its size before it is read
    with pytest.raises(InputError, match="size"):
        routing.parse(str(huge))
    undecodable = tmp_path / "u.json"
    undecodable.write_bytes(b"\xff\xfe{")
    with pytest.raises(InputError, match="UTF-8"):
        routing.parse(str(undecodable))


def test_a_plan_checks_the_histogram_against_the_model(tmp_path):
    mixtral, llama = load_model("mixtral-8x7b"), load_model("llama3-8b")
    with pytest.raises(InputError, match="experts=4: 8, num_experts"):
        make_plan(mixtral, 64, ep=8, routing=_histogram(tmp_path, [1, 2, 3, 4]))
    with pytest.raises(InputError, match="layers=3: 1 .every MoE layer. or 32"):
        make_plan(mixtral, 64, ep=8, routing=_histogram(tmp_path, [[1] * 8] * 3, "three.json"))
    with pytest.raises(InputError, match="balanced for the dense model"):
        make_plan(llama, 8, routing="capacity:1.5")
    assert make_plan(llama, 8, routing="balanced").routing == "balanced"
    path = _histogram(tmp_path, [[1] * 8] * 32, "per_layer.json")
    assert make_plan(mixtral, 64, ep=8, routing=path).routing == path
    assert make_plan(mixtral, 64, ep=8).routing is None


def test_the_busiest_rank_holds_a_contiguous_block_of_experts(tmp_path):
    """Experts [r E / ep, (r + 1) E / ep) on rank r; the rank whose block takes most sets the rows."""
    v3 = load_model("deepseek-v3")          # 256 experts, top 8
    counts = _hot(256, 300.0, block=3, per_block=32)          # rank 3 of ep 8: 32 experts at 3x
    plan = make_plan(v3, 256, pp=4, ep=8, gbs=256, routing=_histogram(tmp_path, counts))
    fair = plan.local_seq * plan.mbs * v3.moe_top_k / 32       # rows per expert, balanced
    (rows,) = routing.expert_rows(v3, plan)
    share = 32 * 300 / (32 * 300 + 224 * 100)
    assert len(rows) == 32 and rows[0] == pytest.approx(8 * share * fair)
    assert routing.rank_load(v3, plan) == pytest.approx(8 * share)
    assert routing.dispatch_rows(v3, plan) == pytest.approx(plan.routed_tokens * 8 * 8 * share)
    # one hot expert in every block: the ranks are even, the rows of one expert are not
    spread = [300.0 if e % 32 == 0 else 100.0 for e in range(256)]
    even = make_plan(v3, 256, pp=4, ep=8, gbs=256, routing=_histogram(tmp_path, spread, "spread.json"))
    assert routing.rank_load(v3, even) == pytest.approx(1.0)
    assert routing.dispatch_rows(v3, even) == pytest.approx(plan.routed_tokens * 8)
    assert max(routing.expert_rows(v3, even)[0]) == pytest.approx(3 * min(routing.expert_rows(v3, even)[0]))


def test_balanced_and_capacity_rows():
    mixtral = load_model("mixtral-8x7b")      # 8 experts, top 2
    plan = make_plan(mixtral, 64, ep=8, mbs=1, gbs=256, routing="balanced")
    tokens = plan.local_seq * plan.mbs
    assert routing.expert_rows(mixtral, plan) == ((tokens * 2,),)        # ep x T x k / E, one expert a rank
    padded = make_plan(mixtral, 64, ep=8, mbs=1, gbs=256, routing="capacity:1.3")
    cap = math.ceil(1.3 * tokens * 2 / 8)
    assert routing.expert_rows(mixtral, padded)[0] == pytest.approx((8 * cap,))
    assert routing.dispatch_rows(mixtral, padded) == 8 * cap
    everything = make_plan(mixtral, 64, ep=8, mbs=1, gbs=256, routing="capacity:100")
    assert routing.dispatch_rows(mixtral, everything) == 8 * tokens          # at most every token per expert


def test_no_routing_is_the_model_files():
    tiny = load_model("gpt-tiny-moe")         # padded to capacity 1.25
    assert routing.of_model(tiny) == routing.Routing("capacity", factor=1.25)
    assert routing.of_model(load_model("mixtral-8x7b")) == routing.Routing("balanced")
    plan = make_plan(tiny, 2, ep=2, mbs=4, gbs=8, seq=128)
    assert routing.dispatch_rows(tiny, plan) == tiny.dispatched_rows(plan.routed_tokens)
    assert routing.loaded(tiny, plan) is tiny
    for model, text in ((tiny, "capacity:1.25"), (load_model("mixtral-8x7b"), "balanced")):
        base = dict(model=model.name, cluster="dgx-h100", gpus=16, ep=2, gbs=64, allow_oom=True)
        assert predict(**base).step_time_s == predict(**base, routing=text).step_time_s


def test_imbalance_slows_the_expert_compute_and_not_the_flops(tmp_path):
    mixtral = load_model("mixtral-8x7b")
    dev = device("h100-sxm")
    hot = _histogram(tmp_path, _hot(8, 300.0))                            # rank 0's expert at 3x
    times = {}
    for name, text in (("balanced", "balanced"), ("hot", hot), ("capacity", "capacity:2")):
        plan = make_plan(mixtral, 64, ep=8, pp=2, gbs=256, routing=text)
        times[name] = stage_compute(mixtral, plan, dev, 16, True, False, 16)
    assert times["hot"].gemm_s > 1.8 * times["balanced"].gemm_s
    assert times["capacity"].gemm_s > 1.5 * times["balanced"].gemm_s
    assert times["hot"].memory_bound_s > times["balanced"].memory_bound_s   # the experts' activations
    assert times["hot"].hardware_flops == times["balanced"].hardware_flops  # FLOPs counted balanced


def test_a_per_layer_histogram_enters_as_the_mean_over_its_layers(tmp_path):
    mixtral = load_model("mixtral-8x7b")
    dev = device("h100-sxm")
    even, hot = [100.0] * 8, _hot(8, 300.0)
    half = _histogram(tmp_path, [hot if i % 2 else even for i in range(32)], "half.json")
    fwd = {}
    for name, text in (("even", _histogram(tmp_path, even, "e.json")), ("hot", _histogram(tmp_path, hot, "o.json")),
                       ("half", half)):
        plan = make_plan(mixtral, 64, ep=8, pp=2, gbs=256, routing=text)
        fwd[name] = stage_compute(mixtral, plan, dev, 16, True, False, 16).gemm_s
    assert fwd["half"] == pytest.approx((fwd["even"] + fwd["hot"]) / 2, rel=1e-9)


def test_a_grouped_gemm_is_a_gemm_per_expert_each_at_its_shape():
    """Transformer Engine's GroupedLinear: a cuBLAS GEMM per expert, each at its own shape's efficiency,
    never faster than reading its weights; no rows, no GEMM."""
    h100, a100 = device("h100-sxm"), device("a100-sxm-80gb")
    assert grouped_gemm_s(h100, [1024] * 32, 4096, 7168, "bf16") == \
        pytest.approx(32 * h100.gemm_time_s(1024, 4096, 7168, "bf16"))
    uneven = grouped_gemm_s(h100, [512, 1536], 4096, 7168, "bf16")
    assert uneven == pytest.approx(h100.gemm_time_s(512, 4096, 7168, "bf16") + h100.gemm_time_s(1536, 4096, 7168,
                                                                                                   "bf16"))
    assert grouped_gemm_s(a100, [129], 4096, 4096, "bf16") == pytest.approx(a100.gemm_time_s(129, 4096, 4096,
                                                                                            "bf16"))
    weights = 4096 * 4096 * 2 / h100.stream_Bps
    assert grouped_gemm_s(h100, [1] * 64, 4096, 4096, "bf16") == pytest.approx(64 * weights)
    assert grouped_gemm_s(h100, [0, 0], 4096, 4096, "bf16") == 0.0


def test_a_grouped_gemms_input_is_quantized_as_one_tensor():
    """One input and one output gradient per grouped projection (GroupedLinear's split_quantize), a
    weight per expert; the input holds the busiest rank's rows."""
    mixtral = load_model("mixtral-8x7b")      # no shared experts
    plan = make_plan(mixtral, 16, ep=2, gbs=64, precision="fp8-tensorwise")
    dense, moe = quantized_elements(mixtral, plan), quantized_elements(mixtral, plan, moe=True)
    local = 8 // 2
    attention = len(dense["activation"]) - 2                  # the dense layer's but its MLP's two
    assert len(moe["activation"]) == len(moe["gradient"]) == attention + 2
    assert len(moe["weight"]) == attention + 2 * local
    rows = plan.local_seq * plan.mbs * mixtral.moe_top_k
    assert moe["activation"][-2] == pytest.approx(rows * mixtral.hidden_size)


def test_the_event_engine_reads_the_same_compute(tmp_path):
    hot = _histogram(tmp_path, _hot(8, 300.0))
    fast = predict(**MIXTRAL, routing=hot)
    sim = predict(**MIXTRAL, routing=hot, engine="des")
    assert sim.breakdown["compute_s"] == pytest.approx(fast.breakdown["compute_s"])
    assert fast.breakdown["compute_s"] > 1.3 * predict(**MIXTRAL).breakdown["compute_s"]


def test_imbalance_lengthens_the_dispatch_and_combine(tmp_path):
    mixtral = load_model("mixtral-8x7b")
    hot = _histogram(tmp_path, _hot(8, 300.0))
    sizes = {}
    for name, text in (("balanced", None), ("hot", hot)):
        plan = make_plan(mixtral, 64, ep=8, pp=2, gbs=256, routing=text)
        ctx = StageContext(model=mixtral, plan=plan, mesh=mesh_for(plan), stage=0, layers=16, gpus_per_host=8)
        sizes[name] = dispatch_events(ctx)[0].nbytes
    assert sizes["hot"] == pytest.approx(sizes["balanced"] * uneven_factor([3 / 10] + [1 / 10] * 7), rel=1e-3)


def test_imbalance_raises_the_busiest_ranks_memory(tmp_path):
    hot = _histogram(tmp_path, _hot(8, 300.0))
    assert predict(**MIXTRAL, routing=hot).memory_per_gpu_bytes > predict(**MIXTRAL).memory_per_gpu_bytes


def test_the_cli_takes_a_histogram_and_refuses_a_bad_one_in_one_line(cli, tmp_path):
    base = ("perfmodel", "predict", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64",
            "--ep", "8", "--pp", "2", "--gbs", "256", "--allow-oom", "--json")
    good = cli(*base, "--routing", _histogram(tmp_path, _hot(8, 300.0)), check_rc=0)
    plain = cli(*base, check_rc=0)
    assert json.loads(good.stdout)["step_time_s"] > json.loads(plain.stdout)["step_time_s"]
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2,3\n")
    proc = cli(*base, "--routing", str(bad))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "experts=3" in proc.stderr and "bad.csv" in proc.stderr
    assert "capacity:F" in cli("perfmodel", "predict", "--help", check_rc=0).stdout


def test_a_changed_file_is_read_again(tmp_path):
    path = _histogram(tmp_path, [1, 1, 1, 1, 1, 1, 1, 1])
    mixtral = load_model("mixtral-8x7b")
    first = routing.rank_load(mixtral, make_plan(mixtral, 64, ep=8, gbs=256, routing=path))
    with open(path, "w") as handle:
        json.dump({"tokens_per_expert": [3, 1, 1, 1, 1, 1, 1, 1, 1, 1]}, handle)   # 10 experts: refused
    os.utime(path, ns=(1, 1))
    with pytest.raises(InputError, match="experts=10"):
        make_plan(mixtral, 64, ep=8, gbs=256, routing=path)
    assert first == pytest.approx(1.0)


def test_folded_experts_take_the_expert_tokens_over_etp():
    """MoE parallel folding: an expert's rows are gathered over etp (ParallelPlan.expert_tokens) and its
    widths split over etp; the router runs on the sequence shard it routes."""
    from perfmodel.step.compute import moe_gemms
    v3 = load_model("deepseek-v3")
    base = dict(pp=4, tp=2, sequence_parallel=True, gbs=256)
    same = make_plan(v3, 256, ep=8, **base)                 # etp = tp = 2
    apart = make_plan(v3, 256, ep=8, etp=1, **base)                # rows over ep x etp = 8 ranks, not 16
    (router, *_, up_same, _), (_, *_, up_apart, _) = moe_gemms(v3, same), moe_gemms(v3, apart)
    assert router[0] == same.routed_tokens == same.local_seq * same.mbs / 2
    assert up_same[1] == v3.expert_up_width / 2 and up_apart[1] == v3.expert_up_width
    rows = same.local_seq * same.mbs * v3.moe_top_k / (256 / 8)         # ep x (T / tp) x etp x k / E
    assert up_same[0] == pytest.approx(rows) and up_apart[0] == pytest.approx(rows / 2)
    assert routing.expert_rows(v3, apart)[0][0] == pytest.approx(rows / 2)
    assert routing.rank_load(v3, apart) == pytest.approx(1.0)


def test_the_plan_line_names_a_routing_the_plan_sets(cli):
    args = ("perfmodel", "predict", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--ep", "8",
            "--pp", "2", "--gbs", "256", "--allow-oom")
    assert "routing=capacity:1.25;" in cli(*args, "--routing", "capacity:1.25", check_rc=0).stdout
    assert "routing=" not in cli(*args, check_rc=0).stdout
