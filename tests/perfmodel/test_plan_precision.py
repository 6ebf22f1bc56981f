"""A plan's precision and framework fields: resolved, refused in one line, carried into the record."""
import pytest

from perfmodel.plan.parallel import PlanRequest, make_plan
from perfmodel.plan.precision import resolve
from perfmodel.workload import load_model
from topologies.errors import InputError


def test_an_open_precision_is_the_compute_dtypes():
    assert resolve(None, None) == ("bf16", None)
    assert resolve(None, "fp16") == ("fp16", "fp16")


def test_a_high_precision_sets_the_compute_dtype_and_a_low_one_keeps_bf16_activations():
    assert resolve("fp16", None) == ("fp16", "fp16")
    assert resolve("mxfp8", None) == ("mxfp8", "bf16")
    assert resolve("fp8-tensorwise", "bf16") == ("fp8-tensorwise", "bf16")


@pytest.mark.parametrize("precision, dtype", [("fp4", None), ("fp16", "bf16"), ("nvfp4", "fp32")])
def test_a_precision_that_cannot_be_is_refused_naming_the_field(precision, dtype):
    with pytest.raises(InputError) as err:
        resolve(precision, dtype)
    assert err.value.field == "precision"


def test_the_plan_carries_precision_and_framework():
    model = load_model("llama3-8b")
    plan = make_plan(model, 8, PlanRequest.of(tp=8, precision="fp8-delayed", framework="torchtitan"))
    assert (plan.precision, plan.compute_dtype, plan.framework) == ("fp8-delayed", "bf16", "torchtitan")
    assert make_plan(model, 8, tp=8).precision == "bf16"
    assert PlanRequest.of(precision="fp16").build(model, 8, "bf16").compute_dtype == "fp16"
    with pytest.raises(InputError) as err:
        make_plan(model, 8, tp=8, framework="jax")
    assert err.value.field == "framework"
