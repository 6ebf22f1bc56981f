"""The compressor grammar of docs/design.md, Compressor grammar and contract, parsed into an immutable tree.

    spec   := term ("+" term)*
    term   := "ef" "(" spec ("," key "=" value)* ")" | name [ "(" arg ("," arg)* ")" ]
    arg    := [key "="] value          value: number, true/false, or a word

``parse_spec`` returns a ``Call`` (one family with its arguments), a ``Chain`` of
terms applied in order, or an ``ErrorFeedback`` around a spec, with the keyword options of its
residual (``ef(int4,beta=0.8,state=int8,reset=1024)``: LoCo's, checked in ``codec.py``). Arguments are checked
against the family (``contract.py``, the catalogue in ``families.py``); this module knows only the syntax.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from topologies.errors import InputError

_TOKEN = re.compile(r"\s*(?:(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
                    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<sym>[()+,=]))")


@dataclass(frozen=True, kw_only=True)
class Call:
    name: str
    args: tuple = ()          # positional values
    kwargs: tuple = ()        # ((key, value), ...)

    def __str__(self) -> str:
        parts = [_fmt(v) for v in self.args] + [f"{k}={_fmt(v)}" for k, v in self.kwargs]
        return self.name + (f"({','.join(parts)})" if parts else "")


@dataclass(frozen=True, kw_only=True)
class Chain:
    parts: tuple

    def __str__(self) -> str:
        return "+".join(str(p) for p in self.parts)


@dataclass(frozen=True, kw_only=True)
class ErrorFeedback:
    inner: object
    kwargs: tuple = ()        # ((key, value), ...): the residual's options

    def __str__(self) -> str:
        return f"ef({','.join([str(self.inner)] + [f'{k}={_fmt(v)}' for k, v in self.kwargs])})"


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _tokens(text: str) -> list[tuple[str, object]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise InputError("compressor", text, f"unexpected character {text[pos]!r} at {pos}")
        pos = m.end()
        if m.group("num") is not None:
            raw = m.group("num")
            out.append(("val", int(raw) if re.fullmatch(r"[-+]?\d+", raw) else float(raw)))
        elif m.group("word") is not None:
            out.append(("word", m.group("word")))
        else:
            out.append(("sym", m.group("sym")))
    return out


MAX_SPEC_CHARS = 1000   # a spec is a handful of transforms; longer text is refused before tokenizing
MAX_DEPTH = 1           # ef(...) levels: error feedback of error feedback has no residual left to feed back
MAX_TRANSFORMS = 16         # transforms in one chain


class _Parser:
    def __init__(self, text: str):
        self.text, self.toks, self.i, self.depth = text, _tokens(text), 0, 0

    def fail(self, what: str):
        raise InputError("compressor", self.text, what)

    def peek(self, kind=None, value=None) -> bool:
        if self.i >= len(self.toks):
            return False
        k, v = self.toks[self.i]
        return (kind is None or k == kind) and (value is None or v == value)

    def take(self, kind, value=None):
        if not self.peek(kind, value):
            self.fail(f"expected {value or kind} at token {self.i + 1}")
        self.i += 1
        return self.toks[self.i - 1][1]

    def spec(self):
        parts = [self.term()]
        while self.peek("sym", "+"):
            self.i += 1
            parts.append(self.term())
            if len(parts) > MAX_TRANSFORMS:
                self.fail(f"at most {MAX_TRANSFORMS} transforms in a chain")
        return parts[0] if len(parts) == 1 else Chain(parts=tuple(parts))

    def term(self):
        name = self.take("word").lower()
        if name == "ef":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                self.fail(f"ef(...) not nested (at most {MAX_DEPTH} level): error feedback inside error "
                          "feedback has no residual left to feed back")
            self.take("sym", "(")
            inner = self.spec()
            kwargs: list = []
            while self.peek("sym", ","):
                self.i += 1
                before = len(kwargs)
                self.arg([], kwargs)
                if len(kwargs) == before:
                    self.fail("ef(SPEC, key=value, ...): options after the spec are keywords")
            self.take("sym", ")")
            self.depth -= 1
            return ErrorFeedback(inner=inner, kwargs=tuple(kwargs))
        args, kwargs = [], []
        if self.peek("sym", "("):
            self.i += 1
            while not self.peek("sym", ")"):
                self.arg(args, kwargs)
                if not self.peek("sym", ")"):
                    self.take("sym", ",")
            self.take("sym", ")")
        return Call(name=name, args=tuple(args), kwargs=tuple(kwargs))

    def arg(self, args, kwargs):
        if self.peek("word") and self.i + 1 < len(self.toks) and self.toks[self.i + 1] == ("sym", "="):
            key = self.take("word")
            self.i += 1
            kwargs.append((key, self.value()))
        elif kwargs:
            self.fail("positional argument after a keyword argument")
        else:
            args.append(self.value())

    def value(self):
        if self.peek("val"):
            return self.take("val")
        word = self.take("word")
        return {"true": True, "false": False}.get(word.lower(), word)


def parse_spec(text: str):
    """Parse one compressor spec string into a Call / Chain / ErrorFeedback tree."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("compressor", text, "a spec such as none, int8, topk(0.01), ef(topk(0.01))+int8")
    if len(text) > MAX_SPEC_CHARS:
        raise InputError("compressor", text[:40] + "...", f"a spec of at most {MAX_SPEC_CHARS} characters")
    parser = _Parser(text)
    tree = parser.spec()
    if parser.i != len(parser.toks):
        parser.fail(f"unexpected text after token {parser.i}")
    return tree


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split ``text`` on ``sep`` outside parentheses: 'none,topk(0.01,x=1)' -> 2 items."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == sep and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    return [s for s in items if s]
