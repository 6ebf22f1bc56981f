"""Degrees: every parallel degree of a plan, and the mesh order, in one record.

A degree is how many ranks a parallel dimension spans (docs/design.md, Vocabulary). One frozen
record holds them all, with the placement order, and owns what follows from them: validation
(each an integer >= 1, ep x etp dividing tp x cp x dp), the GPUs they take, the label of a plan, the
arguments of both CLIs, the dict form records and checkpoints store (older records without a newer
degree read its default) and the mesh. ``ParallelPlan``, ``PlanRequest``, realrun's ``TrainConfig`` and
its validation cases hold one; search rows, checkpoint identity and reports read its fields.

The degrees, in Megatron-Core's order (``tp-cp-ep-dp-pp`` innermost first, with pp here before dp
as labels write it): ``tp`` tensor parallel (splits every layer's GEMMs), ``cp`` context parallel
(splits every sequence), ``ep`` expert parallel (shards a MoE model's routed experts), ``etp``
expert tensor parallel (splits each routed expert's GEMMs), ``pp`` pipeline stages, ``dp``
data-parallel replicas. ep and etp add no GPUs: Megatron-Core's MoE parallel folding (Liu et al.
2025, arXiv 2504.14960) lays the expert layers' ``etp x ep x edp`` over the same ``tp x cp x dp``
ranks of a pipeline stage as the attention layers' (Megatron-LM ``megatron/core/parallel_state.py``,
``initialize_model_parallel``: the expert ``RankGenerator`` of tp=etp, ep, dp=edp, cp=1 beside the
decoder one of tp, cp, dp), so ep x etp must divide tp x cp x dp (ep no longer divides dp) and the
expert data-parallel degree ``edp`` = tp x cp x dp / (etp x ep) follows. etp defaults to tp, as
Megatron-Core's does (``expert_tensor_parallel_size`` None means ``tensor_model_parallel_size``:
``parallel_state.py`` ``initialize_model_parallel``, ``model_parallel_config.py`` ``__post_init__``);
a record keeps an etp equal to tp as following tp (``with_``: a new tp carries it along). Adding a
degree is one field here, with its help text and whether it takes GPUs of its own (``adds_gpus``),
plus its axis declaration (``perfmodel.axes``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from functools import cache

from perfmodel.plan.mesh import mesh_of
from topologies.errors import InputError

DEFAULT_ORDER = ("tp", "pp", "dp")   # the mesh's placement, innermost first: TP inside a node, then PP, DP


def _degree(help_text: str, adds_gpus: bool = True, placed_after: str = "", carved_from: str = "",
            follows: str = ""):
    """A degree's field: default 1 (``follows``: the value of that degree, as etp follows tp), its
    help text (both CLIs), whether it multiplies the GPUs, where the mesh places it when ``order``
    does not name it (right outside ``placed_after``; empty: ``order`` must name it, or it has no
    placement dimension of its own) and the degree its placement dimension is carved from
    (``carved_from``: its ranks are some of that degree's, as ep's block is dp's)."""
    return field(default=None if follows else 1,
                 metadata={"help": help_text, "adds_gpus": adds_gpus, "placed_after": placed_after,
                           "carved_from": carved_from, "follows": follows})


@dataclass(frozen=True, kw_only=True)
class Degrees:
    """The parallel degrees of one plan and its placement order (module doc). ``dp`` may be
    ``"auto"`` until ``resolved(gpus)`` fills it in."""

    tp: int = _degree("tensor-parallel size (divides the heads)")
    cp: int = _degree("context parallel: each sequence split over cp GPUs (ring attention)", placed_after="tp")
    ep: int = _degree("expert parallel (MoE models): routed experts sharded over ep ranks folded over the "
                      "tp x cp x dp ranks of a stage as Megatron-Core's MoE parallel folding (ep x etp divides "
                      "tp x cp x dp; ep divides the experts)", adds_gpus=False, placed_after="cp", carved_from="dp")
    etp: int = _degree("expert tensor parallel (MoE models): each routed expert's GEMMs split over etp ranks, "
                       "its own degree beside the attention's tp (Megatron-Core --expert-tensor-parallel-size)",
                       adds_gpus=False, follows="tp")
    pp: int = _degree("pipeline stages")
    dp: int | str = _degree("data-parallel replicas")
    order: tuple = DEFAULT_ORDER

    def __post_init__(self):
        """A degree that follows another and is not given takes its value (etp: tp's)."""
        for name, leader in self.followers().items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(self, leader))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The degrees' names, in label order (tp, cp, ep, etp, pp, dp)."""
        return tuple(_declared(cls))

    @classmethod
    def followers(cls) -> dict:
        """{degree: the degree whose value it takes by default} (etp: tp)."""
        return _followers(cls)

    def default(self, name: str):
        """The value ``name`` takes when not given: its leader's (etp: tp), else 1."""
        leader = self.followers().get(name)
        return getattr(self, leader) if leader else 1

    def with_(self, **chosen) -> Degrees:
        """These degrees with ``chosen`` replaced (``order`` among them); a follower equal to its
        leader follows a new leader (etp = tp stays equal to a new tp)."""
        values = {**self.as_dict(), "order": self.order}
        for name, leader in self.followers().items():
            if name not in chosen and leader in chosen and values[name] == values[leader]:
                values[name] = None
        return Degrees.of({**values, **chosen})

    @classmethod
    def help(cls, name: str) -> str:
        return cls._meta(name)["help"]

    @classmethod
    def placed_after(cls) -> dict:
        """{degree: the degree it sits right outside of}: those ``order`` may leave out."""
        return {n: cls._meta(n)["placed_after"] for n in cls.names() if cls._meta(n)["placed_after"]}

    @classmethod
    def carved(cls) -> dict:
        """{degree: the degree whose ranks it is carved from} (ep: dp)."""
        return {n: cls._meta(n)["carved_from"] for n in cls.names() if cls._meta(n)["carved_from"]}

    @classmethod
    def of(cls, mapping, **defaults) -> Degrees:
        """The degrees named in ``mapping`` (a dict, or any object with them as attributes: a
        record, an argparse namespace); a degree it lacks reads ``defaults`` or 1 (records
        written before that degree existed had none of it)."""
        get = mapping.get if isinstance(mapping, dict) else lambda k, d=None: getattr(mapping, k, d)
        unset = {n: defaults.get(n, None if n in cls.followers() else 1) for n in cls.names()}
        values = {n: get(n, unset[n]) for n in cls.names()}
        values = {n: (unset[n] if v is None else v) for n, v in values.items()}
        order = get("order", None)
        if order is not None:
            values["order"] = tuple(a.strip() for a in order.split(",")) if isinstance(order, str) else tuple(order)
        return cls(**values)

    @classmethod
    def display_order(cls) -> tuple[str, ...]:
        """The order tables and labels list degrees in: the three every mesh places
        (``DEFAULT_ORDER``), then the others, the most deeply placed first (ep, then cp), as the
        columns of every stream and table written since those degrees exist; degrees without a
        placement of their own (etp) last."""
        after = cls.placed_after()

        def depth(name: str) -> int:
            return 1 + depth(after[name]) if name in after else 0

        rest = [n for n in cls.names() if n not in DEFAULT_ORDER]
        return (*DEFAULT_ORDER, *sorted(rest, key=lambda n: (n not in after, -depth(n), cls.names().index(n))))

    def as_dict(self) -> dict:
        """{degree: n} in label order (what records and checkpoints store; ``order`` apart)."""
        return {n: getattr(self, n) for n in self.names()}

    def check(self) -> Degrees:
        """Each degree an integer >= 1 (dp possibly ``auto``) and ep x etp dividing tp x cp x dp
        (the ranks of a stage the expert layers fold over); returns self."""
        for name in self.names():
            value = getattr(self, name)
            if name == "dp" and value == "auto":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(name, value, "an integer >= 1" + (" or auto" if name == "dp" else ""))
        if isinstance(self.dp, int) and self.stage_ranks % (self.ep * self.etp):
            raise InputError("ep", self.ep, f"ep x etp ({self.ep} x {self.etp}) dividing tp x cp x dp = "
                             f"{self.stage_ranks} (the ranks of a stage the expert layers fold over)")
        return self

    @property
    def stage_ranks(self) -> int:
        """Ranks of one pipeline stage: tp x cp x dp (the attention's and the experts' layouts of it)."""
        return self.tp * self.cp * self.dp

    @property
    def edp(self) -> int:
        """Expert data parallel: the ranks that hold the same experts, tp x cp x dp / (etp x ep)."""
        return self.stage_ranks // (self.ep * self.etp)

    @property
    def fixed_gpus(self) -> int:
        """GPUs of one data-parallel replica: the product of the degrees that add GPUs, but dp."""
        return math.prod(getattr(self, n) for n in self.names() if n != "dp" and self._adds(n))

    @property
    def gpus(self) -> int:
        """GPUs the degrees take (tp x cp x pp x dp: ep and etp fold over them)."""
        return self.fixed_gpus * self.dp

    def resolved(self, gpus: int) -> Degrees:
        """These degrees on ``gpus`` GPUs: dp ``auto`` filled in, the product checked."""
        self.check()
        fixed = self.fixed_gpus
        # the degrees that take GPUs beside dp, as errors name them (cp only where it is used)
        named = [n for n in self.names()
                 if n != "dp" and self._adds(n) and (n in DEFAULT_ORDER or getattr(self, n) > 1)]
        if gpus % fixed:
            raise InputError("*".join(named), fixed, f"a divisor of the {gpus} GPUs")
        dp = gpus // fixed if self.dp in ("auto", None) else self.dp
        if dp * fixed != gpus:
            raise InputError("dp", dp, " x ".join(["dp", *named]) + f" = {gpus} GPUs (auto: {gpus // fixed})")
        return replace(self, dp=dp).check()

    def label(self, sep: str = "x", always: tuple = (), order: tuple | None = None, form: str = "{}{}") -> str:
        """The plan as users write it: each degree above 1 as ``tp2`` (``form`` from name and
        value; ``always``: shown even at 1), joined by ``sep``, in ``order`` (default the degrees'
        order); ``dp1`` if none shows."""
        names = order or self.names()
        parts = [form.format(n, getattr(self, n)) for n in names if n in always or self.shown(n)]
        return sep.join(parts or [form.format("dp", 1)])

    def shown(self, name: str) -> bool:
        """Whether a label names ``name``: its value is not its default (1; etp: tp)."""
        return getattr(self, name) != self.default(name)

    def describe(self, sep: str = " ", form: str = "{}={}") -> str:
        """The degrees as tables and reports print a plan: the three every mesh places always,
        the others where not their default, in ``display_order`` (``tp=2 pp=4 dp=8 ep=8 etp=1``)."""
        return self.label(sep, always=DEFAULT_ORDER, order=self.display_order(), form=form)

    def mesh(self):
        """The (cached) mesh of these degrees: rank <-> coordinates, the groups of each axis."""
        return mesh_of(self)

    def placement(self) -> dict:
        """{dimension: ranks along it} of the mesh's placement (``perfmodel.plan.mesh``): tp, cp, pp,
        and dp split in two, the block ``ep`` placed where ``order`` puts ep (right outside cp by
        default) and the rest ``dp``. The block is the fewest dp ranks that, with tp x cp, hold
        whole expert model-parallel groups (etp x ep): lcm(tp x cp, etp x ep) / (tp x cp); with etp
        = tp and cp = 1 that is ep, the ep ranks carved from dp as the mesh always placed them."""
        inner = self.tp * self.cp
        block = math.lcm(inner, self.ep * self.etp) // inner
        sizes = {n: getattr(self, n) for n in self.names() if self._adds(n) or n in self.carved()}
        for name, parent in self.carved().items():
            sizes[name] = block
            sizes[parent] //= block
        return sizes

    @classmethod
    def _adds(cls, name: str) -> bool:
        return cls._meta(name)["adds_gpus"]

    @classmethod
    def _meta(cls, name: str) -> dict:
        return _declared(cls)[name]


@cache
def _declared(cls) -> dict:
    """{degree: its field's metadata}, read once: ``plan.tp`` asks for the names on every read."""
    return {f.name: f.metadata for f in fields(cls) if "adds_gpus" in f.metadata}


@cache
def _followers(cls) -> dict:
    """``Degrees.followers``, read once (every record made asks)."""
    return {n: meta["follows"] for n, meta in _declared(cls).items() if meta["follows"]}


def read_through(record, name: str):
    """A degree (or ``order``) of a record that holds ``degrees``, read as its own attribute
    (``plan.tp`` is ``plan.degrees.tp``): the records' ``__getattr__``."""
    if name in Degrees.names() or name == "order":
        return getattr(record.degrees, name)
    raise AttributeError(f"{type(record).__name__!r} object has no attribute {name!r}")


def split_degrees(base: Degrees, fields: dict) -> dict:
    """``fields`` (a record's keywords) with the degrees and ``order`` among them taken into
    ``degrees`` (``base`` with those replaced); unchanged where it names none."""
    chosen = {k: fields[k] for k in (*Degrees.names(), "order") if k in fields}
    if not chosen:
        return fields
    if not isinstance(base, Degrees):
        raise InputError("degrees", base, "a perfmodel.plan.degrees.Degrees")
    rest = {k: v for k, v in fields.items() if k not in chosen}
    return {**rest, "degrees": base.with_(**chosen)}


def add_arguments(parser, *, names: tuple | None = None, helps: dict | None = None, dp_auto: bool = True,
                  int_type=int) -> None:
    """The degrees' flags (``--tp N`` ...) on an argparse parser, each with its help text and
    default 1 (``dp``: ``auto`` where ``dp_auto``); ``helps`` adds a CLI's own words to a
    degree's help, ``names`` picks the degrees a command takes (one that follows another, etp,
    defaults to None: its leader's value)."""
    for name in names or Degrees.names():
        text = Degrees.help(name) + (f"; {helps[name]}" if helps and name in helps else "")
        leader = Degrees.followers().get(name)
        if name == "dp" and dp_auto:
            parser.add_argument("--dp", default="auto", help=text + " (default auto: the GPUs left)")
        elif leader:
            parser.add_argument(f"--{name}", type=int_type, default=None,
                                help=text + f" (default: {leader}, as Megatron-Core's)")
        else:
            parser.add_argument(f"--{name}", type=int_type, default=1, help=text + " (default 1)")


__all__ = ["DEFAULT_ORDER", "Degrees", "add_arguments", "read_through", "split_degrees"]
