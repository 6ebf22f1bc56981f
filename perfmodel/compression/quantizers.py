"""Blockwise quantizers with one fp32 scale per block: int8, int4, QSGD, sign; and SDP4Bit's pieces (Jia et al.
2024): the Hadamard smoother, its two-level gradient quantizer (tlq) and its weight-difference gather (qwd)."""
from __future__ import annotations

import math

from perfmodel.compression.contract import BYTES, Family, Layout, Param, _positive_int, register


SCALE_BYTES = 4            # one float32 scale per block
DEFAULT_BLOCK = 256        # values per quantization block: scale overhead 4/256 B per value


def _expected_absmax(block: int) -> float:
    """E[max |x|] of ``block`` unit Gaussians, ~sqrt(2 ln 2b) (extreme-value approximation)."""
    return math.sqrt(2.0 * math.log(max(2 * block, 2)))


MAX_BLOCK = 1 << 24   # values per block: beyond it a scale per block saves nothing and buffers grow unbounded


class BlockQuant(Family):
    """Blockwise absmax quantization to ``bits`` (sign included) with one fp32 scale per block:
    packed codes (ceil(n bits / 8) bytes), then one scale per block as metadata.

    Compress reads the input twice (absmax, then quantize); error is uniform over half
    a step: step = absmax / (2^(bits-1) - 1), RMS = step / sqrt(12).
    """

    BITS = 8
    PARAMS = (Param(name="block", kind=int, default=DEFAULT_BLOCK, check=lambda v: _positive_int(v) and v <= MAX_BLOCK,
                    allowed=f"an integer from 1 to {MAX_BLOCK}"),)

    @property
    def bits(self) -> int:
        return self.params.get("bits", self.BITS)

    def layout(self, count, dtype):
        blocks = math.ceil(count / self.block) if count else 0
        return Layout(math.ceil(count * self.bits / 8), BYTES, blocks * SCALE_BYTES)

    def compress_traffic(self, stream):
        return 1.0 + super().compress_traffic(stream)

    def decompress_traffic(self, stream):
        return super().compress_traffic(stream)

    def _levels(self):
        return 2 ** (self.bits - 1) - 1

    def error(self):
        return _expected_absmax(self.block) / self._levels() / math.sqrt(12.0)


@register
class Int8(BlockQuant):
    NAME, BITS = "int8", 8
    EXAMPLES = ("int8", "int8(block=100)")


@register
class Int4(BlockQuant):
    NAME, BITS = "int4", 4
    EXAMPLES = ("int4", "int4(block=7)")


@register
class Qsgd(BlockQuant):
    """QSGD (Alistarh et al., NeurIPS 2017) per block: ``bits`` per value including sign,
    stochastic rounding (unbiased, error variance step^2/6 on average) or nearest."""

    NAME = "qsgd"
    EXAMPLES = ("qsgd(bits=4)", "qsgd(bits=3,stochastic=false)")
    PARAMS = (Param(name="bits", kind=int, default=4, check=lambda v: _positive_int(v) and 2 <= v <= 8,
                    allowed="an integer from 2 to 8"),
              Param(name="stochastic", kind=bool, default=True, check=lambda v: isinstance(v, bool),
                    allowed="true or false"),
              BlockQuant.PARAMS[0])

    def error(self):
        spread = math.sqrt(6.0) if self.stochastic else math.sqrt(12.0)
        return _expected_absmax(self.block) / self._levels() / spread


@register
class Sign(BlockQuant):
    """signSGD with a per-block scale (mean |x|, as in EF-signSGD): 1 bit per value.
    Relative error for Gaussian data: sqrt(1 - (E|x|)^2 / E[x^2]) = sqrt(1 - 2/pi)."""

    NAME, BITS = "sign", 1
    EXAMPLES = ("sign", "sign(block=64)")

    def error(self):
        return math.sqrt(1.0 - 2.0 / math.pi)


# SDP4Bit (Jia et al., NeurIPS 2024, arXiv 2410.15526; code: github.com/jindajia/SDP4Bit and its Megatron-LM
# fork, megatron/quantization_helper.py QuantizationHelper): the defaults below are that class's and its README's.
SDP4BIT_HADAMARD = 32        # hadamard_order = 5: a 2^5-point transform per group (QuantizationHelper.__init__)
SDP4BIT_GRAD_BLOCK = 128     # --gq-group-size-inter 128 and --gq-group-size-intra 128 (README's arguments)
SDP4BIT_WEIGHT_BLOCK = 2048  # --wq-group-size 2048 (README, QuantizationHelper default)
# rms(w_t - w_{t-1}) / rms(w) of a whole gathered buffer: an Adam step moves a weight by about lr. Measured
# here on the small GPT (gpt-tiny, AdamW, betas 0.9/0.95, steps 6-40 of a run): 0.012 at realrun's lr 3e-3
# (0.007 over its last 10 steps), 0.004 at lr 6e-4, SDP4Bit's 125M lr (its README); 0.01 is that range's top
# (docs/policies.md, sdp4bit)
DEFAULT_WEIGHT_DELTA = 0.01


def _power_of_two(v) -> bool:
    return _positive_int(v) and v >= 2 and v & (v - 1) == 0 and v <= 1 << 16


@register
class Hadamard(Family):
    """A blockwise Walsh-Hadamard transform, the smoother SDP4Bit puts before its gradient quantizers:
    each ``block`` of values (a power of two) is rotated so that an outlier spreads over its block and
    the block's absmax, hence the quantizer's step, shrinks (realrun scales it by 1/block so that no
    value grows; a block quantizer after it is scale-invariant). Values out are as many, of the same
    type; decode inverts it exactly up to float rounding. ``fused`` (default): the transform
    runs inside the quantizer's kernel, as SDP4Bit's does (its appendix: the transform costs the
    (de)quantization next to no throughput), so it adds no memory traffic; ``fused=false`` charges one
    read and one write of the input each way."""

    NAME = "hadamard"
    EXAMPLES = ("hadamard", "hadamard(block=64)+int8", "hadamard(fused=false)+int4(block=128)")
    PARAMS = (Param(name="block", kind=int, default=SDP4BIT_HADAMARD, check=_power_of_two,
                    allowed="a power of two from 2 to 65536"),
              Param(name="fused", kind=bool, default=True, check=lambda v: isinstance(v, bool),
                    allowed="true or false"))

    def layout(self, count, dtype):
        return Layout(count, dtype, 0)

    def compress_traffic(self, stream):
        return 0.0 if self.fused else 2.0

    def decompress_traffic(self, stream):
        return self.compress_traffic(stream)

    def error(self):
        return 2.0 ** -24   # float32 rounding of the rotation


def _bits_48(v) -> bool:
    return v in (4, 8) and not isinstance(v, bool)


@register
class TwoLevel(BlockQuant):
    """SDP4Bit's TLq-HS gradient reduction: a Hadamard transform (``hadamard`` points per group, 0: none),
    then ``intra``-bit groups of ``block`` values with one fp32 scale each on the all-to-all inside the
    node, and ``inter``-bit groups on the all-to-all across nodes (the hierarchical reduce-scatter,
    ``perfmodel.collectives.compressed.hierarchical_reduce_scatter``, takes each tier from ``tiers``).
    Alone (one node, a flat algorithm) its payload is the intra tier's. Its error is the two tiers'
    in quadrature over their two hops (``sqrt((e_intra^2 + e_inter^2) / 2)`` per hop, so that the
    reduction's sqrt(2) hops give ``sqrt(e_intra^2 + e_inter^2)``); on one node, where only the intra
    tier runs, that overstates it."""

    NAME = "tlq"
    EXAMPLES = ("tlq", "tlq(intra=8,inter=4,block=64,hadamard=0)")
    PARAMS = (Param(name="intra", kind=int, default=8, check=_bits_48, allowed="4 or 8 (bits inside the node)"),
              Param(name="inter", kind=int, default=4, check=_bits_48, allowed="4 or 8 (bits across nodes)"),
              Param(name="block", kind=int, default=SDP4BIT_GRAD_BLOCK,
                    check=lambda v: _positive_int(v) and v <= MAX_BLOCK, allowed=f"an integer from 1 to {MAX_BLOCK}"),
              Param(name="hadamard", kind=int, default=SDP4BIT_HADAMARD, check=lambda v: v == 0 or _power_of_two(v),
                    allowed="0 (no transform) or a power of two from 2 to 65536"))

    @property
    def bits(self) -> int:
        return self.intra

    def tiers(self) -> tuple[str, str]:
        """(intra-node spec, inter-node spec): each tier's quantizer (the Hadamard transform runs fused
        inside it, as ``hadamard``'s default: no traffic, no error of its own on Gaussian data)."""
        return tuple(f"int{bits}(block={self.block})" for bits in (self.intra, self.inter))

    def error(self):
        step = _expected_absmax(self.block) / math.sqrt(12.0)
        return step * math.sqrt((1 / (2 ** (self.intra - 1) - 1) ** 2 + 1 / (2 ** (self.inter - 1) - 1) ** 2) / 2)


@register
class WeightDifference(BlockQuant):
    """SDP4Bit's qWD: the parameter all-gather sends ``bits``-bit groups (``block`` values, one fp32 scale
    each) of the *difference* between the weights the optimizer just produced and those every rank holds
    from the last gather, and each rank adds the decoded difference to its copy (QuantizationHelper's
    ``sub_quantize`` and ``dequantize_add_bf16``). The wire is a plain block quantizer's; the error is
    the difference's, relative to the weights: the quantizer's on unit-Gaussian data times ``delta``,
    rms(w_t - w_{t-1}) / rms(w) (default ``DEFAULT_WEIGHT_DELTA``). The quantization error of one step
    is in the next step's difference (the sender subtracts what the ranks hold), so it does not
    accumulate. ``DIFFERENCE``: the runtime sends differences (realrun's ZeRO-1 gather)."""

    NAME = "qwd"
    DIFFERENCE = True
    EXAMPLES = ("qwd", "qwd(bits=8,block=256,delta=0.001)")
    PARAMS = (Param(name="bits", kind=int, default=4, check=lambda v: _positive_int(v) and 2 <= v <= 8,
                    allowed="an integer from 2 to 8"),
              Param(name="block", kind=int, default=SDP4BIT_WEIGHT_BLOCK,
                    check=lambda v: _positive_int(v) and v <= MAX_BLOCK, allowed=f"an integer from 1 to {MAX_BLOCK}"),
              Param(name="delta", kind=float, default=DEFAULT_WEIGHT_DELTA,
                    check=lambda v: isinstance(v, float) and 0 < v <= 1, allowed="a ratio in (0, 1]"))

    def error(self):
        return super().error() * self.delta


def sends_differences(codec) -> bool:
    """Whether a compiled spec is a weight-difference gather (``qwd``): its runtime sends w_t - w_{t-1}."""
    return any(getattr(f, "DIFFERENCE", False) for f in codec.families)
