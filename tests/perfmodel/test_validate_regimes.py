"""perfmodel validate --by: the published rows' errors grouped by regime (perfmodel.calibration.regimes)."""
from __future__ import annotations

import json

import pytest

from perfmodel.calibration import published as pub
from perfmodel.calibration.regimes import REGIME_KEYS, by_regime, parse_keys, regime_of
from topologies.errors import InputError


def _row(label, error, **regime):
    return pub.RowResult("s", label, 100.0, 100.0 * (1 + error) if error is not None else None, error, "tokens/s",
                         regime=regime)


def test_groups_carry_their_mape_bias_and_worst_row():
    rows = [_row("a", 0.1, model="m", cluster="x"), _row("b", -0.3, model="m", cluster="x"),
            _row("c", 0.2, model="m", cluster="y"), _row("d", None, model="m", cluster="y")]
    groups = by_regime(rows, ("cluster",))
    assert [g["cluster"] for g in groups] == ["x", "y"]
    x, y = groups
    assert x["rows"] == 2 and x["mape"] == pytest.approx(0.2) and x["bias"] == pytest.approx(-0.1)
    assert (x["worst_label"], x["worst_error"]) == ("b", -0.3)
    assert y["rows"] == 1                        # a row not predicted is in no group
    assert by_regime(rows, ("model",))[0]["rows"] == 3


def test_keys_are_checked_in_one_line():
    assert parse_keys("model, cluster") == ("model", "cluster")
    with pytest.raises(InputError, match="among " + ", ".join(REGIME_KEYS)) as e:
        parse_keys("model,sytem")
    assert e.value.field == "by"


def test_rows_know_their_regime():
    (source,) = pub.select_sources("megatron-core-h100-2024")
    for row, result in pub.predicted_rows(source):
        assert result.regime == regime_of(source, row)
        assert result.regime["cluster"] == row["cluster"] and result.regime["gpus"] == int(row["gpus"])
    (bridge,) = pub.select_sources("deepseek-v3-h800")
    ((row, result),) = pub.predicted_rows(bridge)
    assert result.regime["model"] == "deepseek-v3" and result.regime["precision"] == "fp8-blockwise"
    (coll,) = pub.select_sources("mleng-b200-nvlink")
    assert {r.regime["op"] for _, r in pub.predicted_rows(coll)} == {"allreduce"}


def test_cli_groups_and_refuses(cli):
    ok = cli("perfmodel", "validate", "--published", "megatron-core-h100-2024", "--by", "gpus", "--json")
    assert ok.returncode == 0, ok.stderr
    (rep,) = json.loads(ok.stdout)
    assert sum(g["rows"] for g in rep["regimes"]) == rep["predicted"]
    text = cli("perfmodel", "validate", "--published", "megatron-core-h100-2024", "--by", "cluster,gpus")
    assert "by cluster, gpus" in text.stdout and "dgx-h100" in text.stdout
    bad = cli("perfmodel", "validate", "--by", "nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "by='nope'" in bad.stderr
