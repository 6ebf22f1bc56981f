import pytest

from perfmodel import compile_spec, parse_spec
from perfmodel.compression.grammar import Call, Chain, ErrorFeedback, split_top_level
from topologies.errors import InputError

ISSUE_SPECS = ["none", "fp16", "bf16", "fp8", "int8", "int4", "qsgd(bits=4)", "sign", "topk(0.01)",
               "randk(0.01)", "powersgd(rank=4)", "zfp(rate=8)", "zfp(tolerance=1e-4)", "sz3(abs=1e-4)",
               "lossless(codec=zstd)", "ef(topk(0.01))+int8", "ef(int8)", "int8+lossless(codec=lz4)"]


@pytest.mark.parametrize("text", ISSUE_SPECS)
def test_every_spec_of_the_grammar_compiles(text):
    codec = compile_spec(text)
    assert codec.wire_bytes(1 << 20, 4) > 0


def test_parse_tree_shapes():
    assert parse_spec("topk(0.01)") == Call(name="topk", args=(0.01,))
    tree = parse_spec("ef(topk(density=0.01))+int8")
    assert isinstance(tree, Chain) and isinstance(tree.parts[0], ErrorFeedback)
    assert tree.parts[0].inner == Call(name="topk", kwargs=(("density", 0.01),))


def test_canonical_text_round_trips():
    codec = compile_spec("ef(topk(0.01))+int8")
    assert codec.text == "ef(topk(density=0.01))+int8(block=256)"
    assert compile_spec(codec.text).text == codec.text


@pytest.mark.parametrize("text, field", [
    ("foo", "compressor"), ("topk(2)", "topk.density"), ("topk(0)", "topk.density"), ("topk", "topk.density"),
    ("randk(-1)", "randk.density"), ("zfp(rate=2)", "zfp.rate"), ("zfp(rate=40)", "zfp.rate"),
    ("zfp(rate=8,tolerance=1e-3)", "zfp"), ("zfp", "zfp"), ("sz3", "sz3"),
    ("int8(block=0)", "int8.block"),
    ("qsgd(bits=1)", "qsgd.bits"), ("lossless(codec=gzip)", "lossless.codec"), ("topk(0.1", "compressor"),
    ("topk(density=0.1,x=1)", "topk.x"), ("ef()", "compressor"), ("", "compressor"),
    ("int8 int4", "compressor"),
    ("powersgd(rank=0)", "powersgd.rank"), ("fp8(format=e3m4)", "fp8.format"), ("sz3(abs=0)", "sz3.abs"),
])
def test_bad_specs_name_the_field(text, field):
    with pytest.raises(InputError) as err:
        compile_spec(text)
    assert err.value.field == field


def test_split_top_level_keeps_commas_inside_parentheses():
    items = split_top_level("none, topk(density=0.01, ), ef(int8)")
    assert items == ["none", "topk(density=0.01, )", "ef(int8)"]
