"""perfmodel predict --deepspeed: a DeepSpeed config as plan and policy."""
import json

import pytest

from perfmodel.plan.deepspeed import map_config
from topologies import InputError

ZEROPP = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
          "bf16": {"enabled": True}, "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
          "zero_optimization": {"stage": 3, "overlap_comm": True, "reduce_bucket_size": 5e7,
                                "zero_quantized_weights": True, "zero_quantized_gradients": True,
                                "zero_hpz_partition_size": 8}}


def test_zeropp_config_maps_to_the_published_recipe():
    ds = map_config(ZEROPP, gpus_per_node=8, gpus=16)
    assert ds.plan == {"compute_dtype": "bf16", "zero": 3, "dp_overlap": True, "bucket_bytes": 200_000_000,
                       "hpz": True, "mbs": 2, "gbs": 256}
    assert ds.policy_items == ["zero=int8", "dp=int4"]
    assert "optimizer" in ds.ignored and "gradient_clipping" in ds.ignored
    assert any(line.startswith("zero_optimization.zero_hpz_partition_size=8") for line in ds.mapped)


def test_batch_from_accumulation_and_disagreement():
    ds = map_config({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 8, 32, tp=2)
    assert ds.plan["gbs"] == 4 * 2 * 16
    with pytest.raises(InputError, match="train_batch_size"):
        map_config({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
                   8, 32)


@pytest.mark.parametrize("config,fragment", [
    ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, "cannot honour"),
    ({"zero_optimization": {"stage": 5}}, "zero_optimization.stage"),
    ({"zero_optimization": {"zero_hpz_partition_size": 4}}, "zero_hpz_partition_size"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "at most one"),
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu")])
def test_what_cannot_be_honoured_is_refused(config, fragment):
    with pytest.raises(InputError) as err:
        map_config(config, 8, 16)
    assert err.value.field == "deepspeed"
    assert fragment in str(err.value) + " ".join(getattr(err.value, "refused", []))


def test_cli_prints_the_mapping_and_predicts(cli, tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ZEROPP))
    args = ["perfmodel", "predict", "--model", "gpt2-medium", "--cluster", "dgx-a100", "--gpus", "16",
            "--deepspeed", str(path), "--json"]
    proc = cli(*args, check_rc=0)
    record = json.loads(proc.stdout)
    assert record["plan"]["zero"] == 3 and record["plan"]["hpz"] and record["plan"]["gbs"] == 256
    assert record["policy_axes"]["dp"]["spec"] == "int4" and record["policy_axes"]["zero"]["spec"] == "int8"
    assert "deepspeed: zero_optimization.stage=3 -> --zero 3" in proc.stderr
    path.write_text(json.dumps({"sparse_attention": {"mode": "fixed"},
                                "zero_optimization": {"offload_param": {"device": "cpu"}}}))
    bad = cli(*args, check_rc=2)
    lines = bad.stderr.strip().splitlines()
    assert sum(line.startswith("perfmodel: deepspeed: cannot honour") for line in lines) == 2
    assert lines[-1].startswith("perfmodel: error")
