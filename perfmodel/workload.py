"""ModelSpec -> workload: parameters, FLOPs and activation bytes of a decoder transformer.

A model file has exactly the keys of ``MODEL_KEYS``. Layernorm models (GPT-2/3, NeoX, BERT)
carry biases on every linear layer; rmsnorm models (LLaMA) none. Conventions:

* ``params``: every weight, embeddings included (tied embeddings counted once).
* Model FLOPs per token (Narayanan et al., SC21, and PaLM's MFU): ``6 N`` for the
  weights plus ``12 L h s`` for attention scores (QK^T and AV, forward 4 L h s, the full
  s x s matrix as Megatron counts it), N = ``params``.
* Activation bytes per layer (Korthikanti et al., MLSys 2023, Eq. 1-6, 2-byte activations):
  ``s b h (34 + 5 a s / h)`` without parallelism; tensor parallelism divides the 24 sbh of
  TP-split tensors (and with sequence parallelism the other 10 sbh too), selective recompute
  drops the ``5 a s / h`` attention term, full recompute keeps only the 2 sbh layer input.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache, cache
from pathlib import Path

from perfmodel.catalogs import read_catalog
from topologies import bounds
from topologies.errors import InputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

MODEL_KEYS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size",
              "vocab_size", "seq_len", "activation", "norm", "tied_embeddings")
CHOICES = {"activation": ("gelu", "swiglu"), "norm": ("layernorm", "rmsnorm")}


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    activation: str
    norm: str
    tied_embeddings: bool

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def biased(self) -> bool:
        return self.norm == "layernorm"

    @property
    def mlp_up_width(self) -> int:
        """Output width of the MLP's first GEMM: f (gelu) or 2f (swiglu gate and up)."""
        return self.ffn_hidden_size * (2 if self.activation == "swiglu" else 1)

    def layer_params(self) -> int:
        h, f = self.hidden_size, self.ffn_hidden_size
        attn = h * (h + 2 * self.kv_dim) + h * h
        mlp = h * self.mlp_up_width + f * h
        norms = (2 if self.biased else 1) * h * 2
        bias = (h + 2 * self.kv_dim + h + self.mlp_up_width + h) if self.biased else 0
        return attn + mlp + norms + bias

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self) -> int:
        """The LM head: shares the embedding when tied."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        final_norm = (2 if self.biased else 1) * self.hidden_size
        return (self.num_layers * self.layer_params() + self.embedding_params() + self.head_params()
                + final_norm)

    def model_flops_per_token(self, seq: int | None = None) -> float:
        s = seq or self.seq_len
        return 6.0 * self.params + 12.0 * self.num_layers * self.hidden_size * s

    def activation_bytes_per_layer(self, mbs: int, seq: int, tp: int, sp: bool, recompute: str) -> float:
        """Bytes one layer keeps for backward, per GPU (Korthikanti et al. 2023)."""
        s, b, h, a = seq, mbs, self.hidden_size, self.num_heads
        if recompute == "full":
            return 2.0 * s * b * h / (tp if sp else 1)
        attention = 0.0 if recompute == "selective" else 5.0 * a * s / h / tp
        replicated = 10.0 / tp if sp else 10.0
        return s * b * h * (replicated + 24.0 / tp + attention)


def _validate(raw: dict, name: str) -> ModelSpec:
    for key in raw:
        if key not in MODEL_KEYS:
            raise InputError(f"model.{key}", raw[key], "not a model key; allowed: " + ", ".join(MODEL_KEYS))
    for key in MODEL_KEYS:
        if key not in raw:
            raise InputError(f"model.{key}", None, "required in a model file")
    for key in MODEL_KEYS[:7]:   # declared bounds (topologies.bounds): no model sizes an absurd step
        if not isinstance(raw[key], int):
            raise InputError(f"model.{key}", raw[key], "a positive integer")
        bounds.check(f"model.{key}", raw[key], key)
    for key, allowed in CHOICES.items():
        if raw[key] not in allowed:
            raise InputError(f"model.{key}", raw[key], " or ".join(allowed))
    if not isinstance(raw["tied_embeddings"], bool):
        raise InputError("model.tied_embeddings", raw["tied_embeddings"], "true or false")
    if raw["hidden_size"] % raw["num_heads"]:
        raise InputError("model.num_heads", raw["num_heads"], f"a divisor of hidden_size {raw['hidden_size']}")
    if raw["num_heads"] % raw["num_kv_heads"]:
        raise InputError("model.num_kv_heads", raw["num_kv_heads"], f"a divisor of num_heads {raw['num_heads']}")
    return ModelSpec(name=name, **{k: raw[k] for k in MODEL_KEYS})


@cache
def model_catalog() -> dict[str, ModelSpec]:
    return {name: _validate({k: v for k, v in body.items() if k != "source"}, name)
            for name, body in read_catalog("models").items()}


@lru_cache(maxsize=64)
def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a user's model TOML file."""
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or path.exists():
        if not path.is_file():
            raise InputError("model", name_or_path, "a catalog name or an existing TOML file")
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise InputError("model", name_or_path, f"valid TOML ({err})") from None
        return _validate(raw, path.stem)
    catalog = model_catalog()
    if name_or_path not in catalog:
        raise InputError("model", name_or_path, "one of " + ", ".join(catalog) + ", or a TOML file path")
    return catalog[name_or_path]


MODEL_FIELDS = tuple(f.name for f in fields(ModelSpec))
