"""search over several clusters with a token budget: time, GPU-hours, cost, energy, the (cost, time, error) front."""
import json
import math

import pytest

import perfmodel
from perfmodel.devices import device
from perfmodel.explore.cost import COST_KEYS, dominated, parse_prices, parse_tokens, training_cost
from perfmodel.explore.search import front_keys, parse_clusters
from perfmodel.workload import load_model
from topologies import InputError, load_spec

CLUSTERS = ["dgx-a100", "dgx-h100"]
KW = dict(gpus=8, gbs=32, candidates="dp=none|int8|fp8;tp=none|fp16|int8;pp=none|int8", schedules=("1f1b",),
          max_mbs=2, zero=(0, 1), workers=1)
# a cheap slow network against a dear fast one: compression trades error for cost there
PRICED = ["commodity-25g", "dgx-a100"]
PRICE = {"commodity-25g": 0.3, "dgx-a100": 1.8}


@pytest.fixture(scope="module")
def priced():
    return perfmodel.search("gpt3-1.3b", PRICED, gpus=16, gbs=64, tokens=2e9, gpu_hour_price=PRICE,
                            candidates="dp=none|int8|ef(powersgd(rank=4));tp=none|int8;pp=none|int8",
                            schedules=("1f1b",), max_mbs=1, zero=(0, 1), workers=1)


def test_cost_arithmetic_on_a_tiny_case():
    row = {"step_time_s": 2.0, "gpus": 3}
    got = training_cost(row, tokens=100, tokens_per_step=4 * 8, price=1.5, power_W=400.0)
    assert got["steps"] == 4                                 # ceil(100 / 32): whole steps
    assert got["time_to_train_s"] == 8.0
    assert got["gpu_hours"] == pytest.approx(3 * 8 / 3600)
    assert got["cost_usd"] == pytest.approx(3 * 8 / 3600 * 1.5)
    assert got["energy_kWh"] == pytest.approx(3 * 400 * 8 / 3.6e6)
    unpriced = training_cost(row, tokens=64, tokens_per_step=32, price=None, power_W=None)
    assert unpriced["steps"] == 2 and "cost_usd" not in unpriced and unpriced["energy_kWh"] is None


def test_every_row_names_its_cluster_and_carries_its_cost(priced):
    assert {r["cluster"] for r in priced.rows} == set(PRICED) and priced.clusters == PRICED
    seq = load_model("gpt3-1.3b").seq_len
    steps = 2e9 / (64 * seq)
    for r in priced.rows[::7]:
        power = device(load_spec(r["cluster"])[0]["gpu"]).board_power_W
        assert r["steps"] == math.ceil(steps * r["steps_inflation"])    # the steps to the uncompressed run's loss
        assert r["steps_inflation"] >= 1 and (r["steps_inflation"] == 1) == (r["policy"] == "none")
        assert r["time_to_train_s"] == pytest.approx(r["steps"] * r["step_time_s"])
        assert r["gpu_hours"] == pytest.approx(r["gpus"] * r["time_to_train_s"] / 3600)
        assert r["cost_usd"] == pytest.approx(r["gpu_hours"] * PRICE[r["cluster"]])
        assert r["energy_kWh"] == pytest.approx(r["gpus"] * power * r["time_to_train_s"] / 3.6e6)
    for cluster, best in priced.best_uncompressed_by_cluster.items():   # speedups against the row's own cluster
        mine = [r for r in priced.rows if r["cluster"] == cluster]
        assert best["step_time_s"] == min(r["step_time_s"] for r in mine if r["policy"] == "none")
        assert all(r["speedup_vs_best_uncompressed"] == pytest.approx(best["step_time_s"] / r["step_time_s"])
                   for r in mine)
    assert device("a100-sxm-80gb").board_power_W == 400 and "datasheet" in device("h100-sxm").power_source


def test_without_tokens_the_cost_columns_are_absent():
    plain = perfmodel.search("gpt2-medium", "dgx-a100", **KW)
    assert plain.tokens is None and not set(COST_KEYS) & set(plain.rows[0])
    assert plain.front_keys == front_keys(plain.rows) == ("uncompensated_error", "effective_step_time_s")
    unpriced = perfmodel.search("gpt2-medium", "dgx-a100", tokens=1e9, **KW)
    assert "cost_usd" not in unpriced.rows[0] and unpriced.front_keys[0] == "gpu_hours"


def test_the_front_is_undominated_and_covers_every_row(priced):
    keys = priced.front_keys
    assert keys == ("cost_usd", "time_to_train_s", "uncompensated_error")
    front, ranked = priced.pareto, priced.ranked
    assert 2 < len(front) < len(ranked) and {r["cluster"] for r in front} == set(PRICED)
    assert len({r["total_error"] > 0 for r in front}) == 2          # compression on the front, and none
    for f in front:
        assert not any(dominated(f, r, keys) for r in ranked)
    ids = {id(f) for f in front}
    for r in ranked:
        if id(r) not in ids:       # off the front: some front row is no worse on every key
            assert any(all(f[k] <= r[k] for k in keys) for f in front)
    assert [f["cost_usd"] for f in front] == sorted(f["cost_usd"] for f in front)
    assert all(f["within_budget"] for f in front)


def test_clusters_and_grid_on_the_api():
    assert parse_clusters("dgx-a100, dgx-h100:nic_Gbps=200,oversubscription=2,lassen") == [
        "dgx-a100", "dgx-h100:nic_Gbps=200,oversubscription=2", "lassen"]
    grid = perfmodel.search("gpt2-medium", "dgx-a100", cluster_grid="nic_Gbps=25,200", **KW)
    assert grid.clusters == ["dgx-a100:nic_Gbps=25", "dgx-a100:nic_Gbps=200"]
    best = grid.best_uncompressed_by_cluster
    assert best["dgx-a100:nic_Gbps=25"]["step_time_s"] >= best["dgx-a100:nic_Gbps=200"]["step_time_s"]
    again = perfmodel.search("gpt2-medium", "dgx-a100", cluster_grid="nic_Gbps=25,200", **{**KW, "workers": 2})
    key = lambda r: (r["cluster"], r["policy"], r["tp"], r["pp"], r["dp"], r["mbs"], r["zero"], r["step_time_s"])  # noqa: E731
    assert sorted(map(key, again.rows)) == sorted(map(key, grid.rows))
    with pytest.raises(InputError) as err:
        perfmodel.search("gpt2-medium", "dgx-a100", cluster_grid="flux=1", **KW)
    assert err.value.field == "cluster_grid" and "oversubscription" in err.value.allowed


@pytest.mark.parametrize("value", ["-1", "0", "abc", "inf", "nan", None, True])
def test_bad_tokens_are_refused(value):
    with pytest.raises(InputError) as err:
        parse_tokens(value)
    assert err.value.field == "tokens"


@pytest.mark.parametrize("value", ["x", "-2", "dgx-a100=1.8", "dgx-a100=1.8,lassen=2", "dgx-a100=1,dgx-h100=inf"])
def test_bad_prices_are_refused(value):
    with pytest.raises(InputError) as err:
        parse_prices(value, CLUSTERS)
    assert err.value.field == "gpu_hour_price"


def test_a_base_name_prices_its_variants():
    names = ["dgx-a100:nic_Gbps=100", "dgx-a100:nic_Gbps=400", "dgx-h100"]
    assert parse_prices("dgx-a100=2,dgx-h100=3", names) == dict(zip(names, (2.0, 2.0, 3.0)))
    assert parse_prices(1.5, names) == dict.fromkeys(names, 1.5)


ARGS = ["perfmodel", "search", "--model", "gpt2-medium", "--cluster", "dgx-a100,dgx-h100", "--gpus", "8", "--gbs",
        "32", "--candidates", "dp=none|int8;tp=none|fp16", "--schedules", "1f1b", "--max-mbs", "1", "--workers", "1"]


def test_cli_json_and_table_carry_the_columns(cli, tmp_path):
    priced = ARGS + ["--tokens", "1e9", "--gpu-hour-price", "dgx-a100=1.8,dgx-h100=3.0"]
    data = json.loads(cli(*priced, "--json", check_rc=0).stdout)
    assert data["clusters"] == CLUSTERS and data["tokens"] == 1e9
    for row in data["ranked"] + data["pareto"]:
        assert set(COST_KEYS) | {"cluster", "gpus"} <= set(row)
    only = json.loads(cli(*priced, "--json", "--pareto", check_rc=0).stdout)
    assert only["ranked"] == [] and only["pareto"] == data["pareto"]
    plain = json.loads(cli(*ARGS, "--json", check_rc=0).stdout)
    assert all(not set(COST_KEYS) & set(r) for r in plain["ranked"]) and plain["ranked"][0]["cluster"]
    png = tmp_path / "front.png"
    text = cli(*priced, "--pareto", "--plot", str(png), check_rc=0).stdout
    assert "cheapest within the budget" in text and "fastest within" not in text
    assert all(h in text for h in ("cluster", "days", "GPU-h", "USD", "MWh max"))
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("extra, field", [
    (["--tokens", "-5"], "tokens"),
    (["--tokens", "lots"], "tokens"),
    (["--tokens", "1e9", "--gpu-hour-price", "cheap"], "gpu_hour_price"),
    (["--tokens", "1e9", "--gpu-hour-price", "dgx-a100=1.8"], "gpu_hour_price"),     # dgx-h100 unpriced
    (["--gpu-hour-price", "2"], "gpu_hour_price"),                                   # no token budget
    (["--cluster-grid", "nic_Gbps=100 flux=2"], "cluster_grid"),
])
def test_cli_refuses_bad_inputs_in_one_line(cli, extra, field):
    bad = cli(*ARGS, *extra, check_rc=2)
    assert field in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
