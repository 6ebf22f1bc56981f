"""Degrees: every parallel degree of a plan, and the mesh order, in one record.

A degree is how many ranks a parallel dimension spans (docs/design.md, Vocabulary). One frozen
record holds them all, with the placement order, and owns what follows from them: validation
(each an integer >= 1, ep dividing dp), the GPUs they take, the label of a plan, the arguments
of both CLIs, the dict form records and checkpoints store (older records without a newer degree
read its default) and the mesh. ``ParallelPlan``, ``PlanRequest``, realrun's ``TrainConfig`` and
its validation cases hold one; search rows, checkpoint identity and reports read its fields.

The degrees, in Megatron-Core's order (``tp-cp-ep-dp-pp`` innermost first, with pp here before dp
as labels write it): ``tp`` tensor parallel (splits every layer's GEMMs), ``cp`` context parallel
(splits every sequence), ``ep`` expert parallel (shards a MoE model's routed experts; carved from
dp as Megatron-Core does, so it adds no GPUs and must divide dp), ``pp`` pipeline stages, ``dp``
data-parallel replicas. Adding a degree is one field here, with its help text and whether it
takes GPUs of its own (``adds_gpus``), plus its axis declaration (``perfmodel.axes``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from functools import cache

from perfmodel.plan.mesh import mesh_of
from topologies.errors import InputError

DEFAULT_ORDER = ("tp", "pp", "dp")   # the mesh's placement, innermost first: TP inside a node, then PP, DP


def _degree(help_text: str, adds_gpus: bool = True, placed_after: str = "", carved_from: str = ""):
    """A degree's field: default 1, its help text (both CLIs), whether it multiplies the GPUs,
    where the mesh places it when ``order`` does not name it (right outside ``placed_after``;
    empty: ``order`` must name it) and the degree it is carved from (``carved_from``: its ranks
    are some of that degree's, as ep's are dp's)."""
    return field(default=1, metadata={"help": help_text, "adds_gpus": adds_gpus, "placed_after": placed_after,
                                      "carved_from": carved_from})


@dataclass(frozen=True, kw_only=True)
class Degrees:
    """The parallel degrees of one plan and its placement order (module doc). ``dp`` may be
    ``"auto"`` until ``resolved(gpus)`` fills it in."""

    tp: int = _degree("tensor-parallel size (divides the heads)")
    cp: int = _degree("context parallel: each sequence split over cp GPUs (ring attention)", placed_after="tp")
    ep: int = _degree("expert parallel (MoE models): routed experts sharded over ep ranks carved from dp "
                      "(ep divides dp and the experts)", adds_gpus=False, placed_after="cp", carved_from="dp")
    pp: int = _degree("pipeline stages")
    dp: int | str = _degree("data-parallel replicas")
    order: tuple = DEFAULT_ORDER

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The degrees' names, in label order (tp, cp, ep, pp, dp)."""
        return tuple(_declared(cls))

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
        values = {n: get(n, defaults.get(n, 1)) for n in cls.names()}
        values = {n: (defaults.get(n, 1) if v is None else v) for n, v in values.items()}
        order = get("order", None)
        if order is not None:
            values["order"] = tuple(a.strip() for a in order.split(",")) if isinstance(order, str) else tuple(order)
        return cls(**values)

    @classmethod
    def display_order(cls) -> tuple[str, ...]:
        """The order tables and labels list degrees in: the three every mesh places
        (``DEFAULT_ORDER``), then the others, the most deeply placed first (ep, then cp), as the
        columns of every stream and table written since those degrees exist."""
        after = cls.placed_after()

        def depth(name: str) -> int:
            return 1 + depth(after[name]) if name in after else 0

        rest = [n for n in cls.names() if n not in DEFAULT_ORDER]
        return (*DEFAULT_ORDER, *sorted(rest, key=lambda n: (-depth(n), cls.names().index(n))))

    def as_dict(self) -> dict:
        """{degree: n} in label order (what records and checkpoints store; ``order`` apart)."""
        return {n: getattr(self, n) for n in self.names()}

    def check(self) -> Degrees:
        """Each degree an integer >= 1 (dp possibly ``auto``) and ep dividing dp; returns self."""
        for name in self.names():
            value = getattr(self, name)
            if name == "dp" and value == "auto":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(name, value, "an integer >= 1" + (" or auto" if name == "dp" else ""))
        if isinstance(self.dp, int) and self.dp % self.ep:
            raise InputError("ep", self.ep, f"a divisor of dp {self.dp} (ep is carved from dp)")
        return self

    @property
    def fixed_gpus(self) -> int:
        """GPUs of one data-parallel replica: the product of the degrees that add GPUs, but dp."""
        return math.prod(getattr(self, n) for n in self.names() if n != "dp" and self._adds(n))

    @property
    def gpus(self) -> int:
        """GPUs the degrees take (tp x cp x pp x dp: ep is carved from dp)."""
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
        parts = [form.format(n, getattr(self, n)) for n in names if n in always or getattr(self, n) != 1]
        return sep.join(parts or [form.format("dp", 1)])

    def describe(self, sep: str = " ", form: str = "{}={}") -> str:
        """The degrees as tables and reports print a plan: the three every mesh places always,
        the others where above 1, in ``display_order`` (``tp=2 pp=4 dp=8 ep=8``)."""
        return self.label(sep, always=DEFAULT_ORDER, order=self.display_order(), form=form)

    def mesh(self):
        """The (cached) mesh of these degrees: rank <-> coordinates, the groups of each axis."""
        return mesh_of(self)

    def placement(self) -> dict:
        """{dimension: ranks along it} of the mesh: each degree, a carved one's parent divided by it."""
        sizes = self.as_dict()
        for name, parent in self.carved().items():
            sizes[parent] //= sizes[name]
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
    return {**rest, "degrees": Degrees.of({**base.as_dict(), "order": base.order, **chosen})}


def add_arguments(parser, *, names: tuple | None = None, helps: dict | None = None, dp_auto: bool = True,
                  int_type=int) -> None:
    """The degrees' flags (``--tp N`` ...) on an argparse parser, each with its help text and
    default 1 (``dp``: ``auto`` where ``dp_auto``); ``helps`` adds a CLI's own words to a
    degree's help, ``names`` picks the degrees a command takes."""
    for name in names or Degrees.names():
        text = Degrees.help(name) + (f"; {helps[name]}" if helps and name in helps else "")
        if name == "dp" and dp_auto:
            parser.add_argument("--dp", default="auto", help=text + " (default auto: the GPUs left)")
        else:
            parser.add_argument(f"--{name}", type=int_type, default=1, help=text + " (default 1)")


__all__ = ["DEFAULT_ORDER", "Degrees", "add_arguments", "read_through", "split_degrees"]
