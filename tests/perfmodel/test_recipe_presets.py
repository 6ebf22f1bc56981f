"""The recipe presets of issue 40 (powersgd, loco, onebit-adam, zero-one-adam): their specs and
sources, their mechanisms beyond the specs (perfmodel.compression.recipes), the time to target with
their warm-up, and the search trying them."""
import math

import pytest

from perfmodel.compression import compile_spec
from perfmodel.compression.policy import PRESET_SOURCES, PRESETS, parse_policy, split_policies
from perfmodel.compression.recipes import RECIPES, Recipe, sync_steps, variance_steps
from perfmodel.explore.convergence import axis_inflation, recipe_cost, recipe_error
from perfmodel.explore.families import plan_policies
from perfmodel.explore.search import DEFAULT_CANDIDATES, _admitted, add_accuracy_cost, parse_candidates
from perfmodel.explore.convergence import Regime
from perfmodel.workload import load_model
from topologies.errors import InputError

RECIPE_PRESETS = ("powersgd", "loco", "onebit-adam", "zero-one-adam")


def test_each_preset_compresses_dp_as_its_reference_and_nothing_else():
    assert PRESETS["powersgd"] == {"dp": ("ef(powersgd(rank=1))", 0)}          # PowerSGDState's rank 1
    assert PRESETS["loco"] == {"dp": ("ef(int4,beta=0.8,state=int8,reset=1024)", 0)}
    assert PRESETS["onebit-adam"] == PRESETS["zero-one-adam"] == {"dp": ("ef(sign(block=2048))", 0)}
    for name in RECIPE_PRESETS:
        pol = parse_policy(name)
        assert [a for a in pol.axes if not pol.axis(a).codec.is_none] == ["dp"]
        assert pol.axis("dp").codec.error_feedback and pol.recipe is RECIPES[name]


@pytest.mark.parametrize("name,needles", [
    ("powersgd", ("Vogels", "powerSGD_hook.py", "start_powerSGD_iter")),
    ("loco", ("2407.04480", "all_to_all_loco_quant_reduce")),
    ("onebit-adam", ("2102.02888", "onebit/adam.py", "compressed_allreduce")),
    ("zero-one-adam", ("2202.06009", "zoadam.py", "local_step_scaler"))])
def test_each_preset_names_its_paper_and_reference_file(name, needles):
    assert all(n in PRESET_SOURCES[name] for n in needles)
    assert RECIPES[name].source


def test_the_recipes_keep_their_references_defaults():
    assert RECIPES["powersgd"].warmup == 0.10 and RECIPES["powersgd"].compresses == "gradient"
    assert RECIPES["loco"].warmup == 0.0
    one, zo = RECIPES["onebit-adam"], RECIPES["zero-one-adam"]
    assert one.warmup == 0.15 and one.compresses == "momentum" and one.variance_freeze and one.server_feedback
    assert (zo.warmup, zo.var_update_scaler, zo.local_step_scaler, zo.local_step_clipper) == (0.0, 16, 32678, 16)
    assert zo.var_freeze == 1.0 and zo.compresses == "momentum"
    assert one.zero_stages == zo.zero_stages == RECIPES["powersgd"].zero_stages == (0,)
    assert RECIPES["loco"].zero_stages == (0, 1, 2, 3)
    # error state per parameter on one GPU of dp 8: the worker's whole, the server's for its 1/8 chunk
    assert RECIPES["loco"].state_bytes(8) == pytest.approx((1 + 4 / 256) * (1 + 1 / 8))     # int8 errors
    assert one.state_bytes(8) == 4 + 4 / 8 and zo.state_bytes(8) == 8 + 4 / 8        # fp32; 0/1: + accumulator
    assert RECIPES["powersgd"].state_bytes(8) == 4.0


def test_recipe_items_tune_a_recipe_and_are_refused_without_one():
    pol = parse_policy("onebit-adam,warmup=0.25,dp=ef(int8)")
    assert pol.recipe.warmup == 0.25 and pol.axis("dp").spec == "ef(int8)"
    assert parse_policy("zero-one-adam,var_freeze=0.5,local_step_clipper=4").recipe.local_step_clipper == 4
    assert split_policies("none,powersgd,warmup=0.3,loco") == ["none", "powersgd,warmup=0.3", "loco"]
    for text, field in (("none,warmup=0.1", "policy"), ("hybrid,warmup=0.1", "policy"),
                        ("onebit-adam,warmup=1", "policy.warmup"), ("zero-one-adam,var_freeze=0", "policy.var_freeze"),
                        ("loco,local_step_scaler=x", "policy.local_step_scaler")):
        with pytest.raises(InputError) as err:
            parse_policy(text)
        assert err.value.field == field


def test_a_recipe_refuses_a_zero_stage_its_reference_does_not_run():
    with pytest.raises(InputError, match="not compatible with ZeRO") as err:
        RECIPES["onebit-adam"].check_zero(1)
    assert err.value.field == "zero"
    RECIPES["loco"].check_zero(3)


def test_loco_error_feedback_options_round_trip_and_are_checked():
    codec = compile_spec("ef(int4,beta=0.8,state=int8,reset=1024)")
    assert codec.text == "ef(int4(block=256),beta=0.8,state=int8,reset=1024)"
    assert codec.error == compile_spec("ef(int4)").error and codec.error_feedback
    assert codec.wire_bytes(4096, 4) == compile_spec("int4").wire_bytes(4096, 4)
    for text, field in (("ef(int4,beta=1)", "ef.beta"), ("ef(int4,state=fp8)", "ef.state"),
                        ("ef(int4,reset=-1)", "ef.reset"), ("ef(int4,when=1)", "ef.when"),
                        ("ef(int4,3)", "compressor")):
        with pytest.raises(InputError) as err:
            compile_spec(text)
        assert err.value.field == field


def test_warmup_share_of_the_time_to_target():
    recipe = Recipe(name="x", warmup=0.2)
    steps, seconds = recipe_cost(recipe, 1.5, 1.0, 3.0)      # compressed 1 s at k=1.5, uncompressed 3 s
    assert steps == pytest.approx(0.2 + 0.8 * 1.5)
    assert seconds == pytest.approx(0.2 * 3.0 + 0.8 * 1.5 * 1.0)
    assert recipe_cost(None, 1.5, 1.0, 3.0) == (1.5, 1.5)
    assert recipe.warmup_steps(20) == 4 and recipe.warmup_steps(21) == 5 and Recipe(name="y").warmup_steps(9) == 0


def test_server_feedback_makes_the_reduction_one_contraction():
    e = compile_spec("ef(sign(block=2048))").error
    two_hops = e * math.sqrt(2)                  # the step model's error of the two-phase all-reduce
    combined = recipe_error(RECIPES["onebit-adam"], "dp", "ef(sign(block=2048))", two_hops)
    assert combined == pytest.approx(math.sqrt(1 - (1 - e * e) ** 2)) and combined < two_hops
    assert recipe_error(RECIPES["powersgd"], "dp", "ef(powersgd(rank=1))", 0.9) == 0.9   # no server side
    assert recipe_error(None, "dp", "ef(sign)", two_hops) == two_hops


def test_variance_and_synchronisation_schedules_follow_zoadam():
    updates = [t for t, on in enumerate(variance_steps(50, 2), 1) if on]
    assert updates == [1, 2, 4, 6, 8, 12, 16, 24, 32, 48]
    syncs = [t for t, on in enumerate(sync_steps(12, 3, 4), 1) if on]
    assert syncs == [1, 2, 3, 4, 6, 8, 12]
    assert all(variance_steps(5, 0)) and all(sync_steps(5, 0, 16))


def test_the_search_tries_the_presets_where_their_zero_stage_allows():
    cands = parse_candidates(DEFAULT_CANDIDATES)
    assert cands["presets"] == [*RECIPE_PRESETS, "sdp4bit"]
    admitted, _ = _admitted(DEFAULT_CANDIDATES, {a: 0.01 for a in ("dp", "tp", "pp", "zero", "ep", "ep_combine", "cp")})
    assert admitted["presets"] == [*RECIPE_PRESETS, "sdp4bit"]
    spec = load_model("gpt3-1.3b")
    plan = dict(tp=1, pp=1, dp=8, zero=0)
    assert plan_policies(plan, {"dp": ["none"], "presets": list(RECIPE_PRESETS)}, spec)[1:] == list(RECIPE_PRESETS)
    assert plan_policies({**plan, "zero": 1}, {"dp": ["none"], "presets": list(RECIPE_PRESETS)}, spec)[1:] == ["loco"]
    assert plan_policies({**plan, "dp": 1}, {"dp": ["none"], "presets": list(RECIPE_PRESETS)}, spec) == ["none"]
    with pytest.raises(InputError):
        parse_candidates("presets=nosuch")


def test_a_recipe_row_runs_its_warmup_at_the_uncompressed_step_time():
    row = {"policy": "onebit-adam", "step_time_s": 1.0, "speedup_vs_same_plan_uncompressed": 3.0,
           **{f"error_{a}": 0.0 for a in ("dp", "tp", "pp", "zero", "ep", "ep_combine", "cp")}}
    row["error_dp"] = compile_spec("ef(sign(block=2048))").error * math.sqrt(2)
    regime = Regime(1e6, "test")
    add_accuracy_cost([row], regime, 1e6)
    k = axis_inflation(recipe_error(RECIPES["onebit-adam"], "dp", "ef(sign(block=2048))", row["error_dp"]), True, 0.5)
    assert row["steps_inflation"] == pytest.approx(0.15 + 0.85 * k)
    assert row["effective_step_time_s"] == pytest.approx(0.15 * 3.0 + 0.85 * k * 1.0)


def test_predict_and_compare_run_every_preset():
    from perfmodel.explore.convergence import record_cost
    from perfmodel.prediction import compare

    records = compare("bert-large", "commodity-25g", ["none", *RECIPE_PRESETS], gpus=64, mbs=16, gbs=1024)
    none = records[0]
    for r in records[1:]:
        assert r.step_time_s < none.step_time_s and r.error_estimate["dp"] > 0   # 25 GbE: dp-bound
        cost = record_cost(r)
        assert cost["warmup"] == RECIPES[r.policy].warmup
        assert cost["steps_inflation"] == pytest.approx(RECIPES[r.policy].steps_inflation(cost["compressed_inflation"]))
    onebit, zero_one = records[3], records[4]
    assert onebit.step_time_s == zero_one.step_time_s                         # the same 1-bit wire
    assert record_cost(onebit)["effective_step_time_s"] > record_cost(zero_one)["effective_step_time_s"]  # warm-up


def test_catalog_lists_the_presets_with_their_sources(cli):
    out = cli("perfmodel", "catalog", "policies", check_rc=0).stdout
    for name in RECIPE_PRESETS:
        assert name in out
    assert "powerSGD_hook.py" in out and "zoadam.py" in out


def test_a_bad_recipe_item_is_one_line_on_the_cli(cli):
    proc = cli("perfmodel", "predict", "--model", "bert-large", "--cluster", "commodity-25g", "--gpus", "64",
               "--policy", "onebit-adam,warmup=2", check_rc=2)
    assert "policy.warmup=" in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_modes_say_what_each_step_does():
    assert RECIPES["onebit-adam"].modes(20) == ["exact"] * 3 + ["momentum"] * 17
    assert RECIPES["powersgd"].modes(10) == ["exact"] + ["gradient"] * 9
    assert RECIPES["loco"].modes(3) == ["gradient"] * 3
    zo = parse_policy("zero-one-adam,var_update_scaler=2,var_freeze=0.5,local_step_scaler=2,local_step_clipper=4")
    assert zo.recipe.modes(12) == ["exact", "exact", "gradient", "exact", "gradient", "exact",
                                   "sync", "sync", "local", "sync", "local", "local"]


def test_a_recipe_run_priced_step_by_step():
    from perfmodel.explore.convergence import local_step_s, record_cost
    from perfmodel.prediction import predict

    policy = "zero-one-adam,var_freeze=0.5,local_step_scaler=50"
    rec = predict("bert-large", "commodity-25g", gpus=64, mbs=8, gbs=512, policy=policy)   # its state: 17.4 GiB at mbs 16
    modes = parse_policy(policy).recipe.modes(1000)
    exact, local = modes.count("exact"), modes.count("local")
    assert 16 < exact < 200 and local > 300                                    # variance steps; local steps
    local_s = local_step_s(rec)
    assert 0 < local_s < rec.step_time_s
    cost = record_cost(rec, steps=1000)
    k, t, t0 = cost["compressed_inflation"], rec.step_time_s, rec.step_time_s * rec.speedup_vs_uncompressed
    assert cost["warmup"] == exact / 1000
    assert cost["effective_step_time_s"] == pytest.approx((exact * t0 + k * ((1000 - exact - local) * t
                                                                             + local * local_s)) / 1000)
    with pytest.raises(InputError) as err:
        record_cost(rec, steps=0)
    assert err.value.field == "steps"


def test_with_a_token_budget_the_search_prices_a_recipe_step_by_step():
    from perfmodel.explore.convergence import run_cost

    base = {"step_time_s": 1.0, "speedup_vs_same_plan_uncompressed": 3.0,
            **{f"error_{a}": 0.0 for a in ("dp", "tp", "pp", "zero", "ep", "ep_combine", "cp")}}
    rows = [{**base, "policy": p} for p in ("onebit-adam", "zero-one-adam")]
    add_accuracy_cost(rows, Regime(1e6, "test"), 1e6, steps=100)
    onebit, zero_one = rows
    assert onebit["steps_inflation"] == pytest.approx(1.0) and zero_one["steps_inflation"] == pytest.approx(1.0)
    assert onebit["effective_step_time_s"] == pytest.approx((15 * 3.0 + 85 * 1.0) / 100)    # 15 warm-up steps
    exact = RECIPES["zero-one-adam"].modes(100).count("exact")   # steps 1-16, 18-48 by 2, 52-100 by 4
    assert exact == 16 + 16 + 13
    assert zero_one["effective_step_time_s"] == pytest.approx(run_cost(["exact"] * 45 + ["gradient"] * 55,
                                                                       1.0, 1.0, 3.0, 1.0)[1])


def test_a_recipes_training_cost_counts_its_warmup_at_the_uncompressed_step_time():
    import perfmodel

    got = perfmodel.search("bert-large", "commodity-25g", gpus=64, gbs=1024, tokens=1e9, max_mbs=8, zero=(0,),
                           schedules=("1f1b",), sequence_parallel=(False,), hpz=(False,),
                           candidates="dp=none;presets=powersgd|onebit-adam")
    steps = 1e9 / (1024 * load_model("bert-large").seq_len)
    rows = [r for r in got.rows if r["tp"] == 1 and r["pp"] == 1 and r["mbs"] == 8]
    assert {r["policy"] for r in rows} == {"none", "powersgd", "onebit-adam"}
    for r in rows:
        assert r["steps"] == math.ceil(steps * r["steps_inflation"])
        assert r["time_to_train_s"] == pytest.approx(r["steps"] * r["effective_step_time_s"] / r["steps_inflation"])
        if r["policy"] != "none":    # the warm-up steps are slower than the compressed ones
            assert r["time_to_train_s"] > r["steps"] * r["step_time_s"]


@pytest.mark.parametrize("name,per_param", [
    ("powersgd", 4.0),                                   # PowerSGDState's fp32 error dict, whole gradient
    ("loco", (1 + 4 / 256) * (1 + 1 / 64)),              # int8 worker error + the server's 1/dp chunk
    ("onebit-adam", 4.0 + 4.0 / 64)])                    # DeepSpeed's fp32 worker_error and server_error
def test_a_recipes_state_is_charged_to_memory(name, per_param):
    from perfmodel.prediction import compare

    none, rec = compare("bert-large", "commodity-25g", ["none", name], gpus=64, mbs=16, gbs=1024)
    assert none.memory_breakdown["error_feedback"] == 0.0
    params = rec.memory_breakdown["error_feedback"] / per_param
    assert params == pytest.approx(load_model("bert-large").params, rel=0.02)
    assert rec.memory_per_gpu_bytes - none.memory_per_gpu_bytes == pytest.approx(params * per_param)


def test_predict_refuses_a_recipe_under_a_zero_stage_it_does_not_run(cli):
    from perfmodel.prediction import predict

    with pytest.raises(InputError, match="ZeRO"):
        predict("bert-large", "commodity-25g", gpus=64, mbs=16, gbs=1024, zero=1, policy="onebit-adam")
    assert predict("bert-large", "commodity-25g", gpus=64, mbs=16, gbs=1024, zero=1, policy="loco").fits
    proc = cli("perfmodel", "predict", "--model", "bert-large", "--cluster", "commodity-25g", "--gpus", "64",
               "--zero", "2", "--policy", "powersgd", check_rc=2)
    assert "zero=2" in proc.stderr and "DDP communication hook" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_predict_text_gives_a_recipes_time_to_target(cli):
    from perfmodel.explore.convergence import record_cost
    from perfmodel.prediction import predict

    args = ("--model", "bert-large", "--cluster", "commodity-25g", "--gpus", "64", "--mbs", "8", "--gbs", "512")
    out = cli("perfmodel", "predict", *args, "--policy", "onebit-adam", check_rc=0).stdout
    line = next(x for x in out.splitlines() if x.startswith("to target"))
    cost = record_cost(predict("bert-large", "commodity-25g", gpus=64, mbs=8, gbs=512, policy="onebit-adam"))
    assert f"{cost['effective_step_time_s']:.3f} s" in line and "15% of the steps uncompressed warm-up" in line
    assert "to target" not in cli("perfmodel", "predict", *args, check_rc=0).stdout     # lossless: no line
