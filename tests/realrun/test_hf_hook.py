"""Issue 37: unmodified Hugging Face GPT-2 and Llama models in fp32 and bf16 under DDP on two
gloo ranks with realrun's compression hook, against plain DDP from the same weights and batches;
every all-reduce algorithm serves the dtype (marker: distributed). No thread variable is set:
realrun's defaults apply. All cases run in one pair of ranks (``hf_ddp_worker.py``)."""
import pytest

pytest.importorskip("torch", reason="torch is not installed (the real extra)")
pytest.importorskip("transformers", reason="transformers is not installed (the dev extra)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (the real extra)")
pytestmark = [pytest.mark.distributed]

STEPS = 3
LOSSY = [("gpt2", "bf16", "int8"), ("llama", "fp32", "ef(topk(0.01))+int8"), ("llama", "bf16", "ef(topk(0.01))+int8")]
LOSSLESS = [("gpt2", "fp32", "lossless(codec=zstd)"), ("llama", "bf16", "lossless(codec=zstd)")]


@pytest.fixture(scope="module")
def runs(hf_cases, launch_ranks, tmp_path_factory) -> dict:
    cases = LOSSY + LOSSLESS
    out = tmp_path_factory.mktemp("hf_ddp") / "out.json"
    return dict(zip(cases, hf_cases("hf_ddp_worker.py", [list(c) for c in cases], STEPS, out, launch_ranks)))


def _common(run: dict, dtype: str) -> None:
    torch_dtype = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}[dtype]
    assert run["param_dtype"] == torch_dtype and run["grad_dtypes"] == [torch_dtype]
    assert run["ranks_agree"]                                   # every rank applied the same averaged gradients
    assert run["buckets"] > 3
    for alg, res in run["allreduce"].items():
        assert res == {"dtype": torch_dtype, "agree": True}, alg


@pytest.mark.parametrize("case", LOSSY, ids="-".join)
def test_hf_models_train_under_ddp_with_a_lossy_hook_close_to_plain(case, runs):
    run = runs[case]
    _common(run, case[1])
    assert 0 < run["bytes_out"] < run["bytes_in"]
    assert run["losses"][0] == run["plain"][0]                 # the first forward precedes any exchange
    assert run["losses"] != run["plain"] and max(abs(a - b) for a, b in zip(run["losses"], run["plain"])) < 0.1


@pytest.mark.parametrize("case", LOSSLESS, ids="-".join)
def test_a_lossless_hook_trains_exactly_as_plain_ddp(case, runs):
    run = runs[case]
    _common(run, case[1])
    assert run["losses"] == run["plain"]                       # bit-equal, step by step
