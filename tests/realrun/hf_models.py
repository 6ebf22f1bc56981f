"""The Hugging Face causal LMs the realrun client tests train: small random configs, no download.
``build(arch, seed)`` gives a fresh model; ``batch`` the token batches (labels are the inputs);
``train`` a few SGD steps of a (wrapped) model, its losses."""
import torch

VOCAB = 512
ARCHS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=VOCAB, n_positions=32, n_embd=64, n_layer=2, n_head=2,
                                                   bos_token_id=0, eos_token_id=0)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                                      num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, max_position_embeddings=32)),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(arch: str, seed: int = 0) -> torch.nn.Module:
    import transformers

    config_cls, model_cls, config = ARCHS[arch]
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config))


def blocks(model: torch.nn.Module) -> list:
    """The transformer blocks (what FSDP2 shards one by one)."""
    return [m for m in model.modules() if type(m).__name__.endswith(("Block", "DecoderLayer"))]


def batch(gen: torch.Generator, rows: int = 4) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, 16), generator=gen)


def train(model: torch.nn.Module, rank: int, steps: int, lr: float) -> list:
    """``steps`` SGD steps on this rank's batches (the same in every run of a rank), their losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    torch.manual_seed(2)   # dropout's masks: the same in both runs
    gen, losses = torch.Generator().manual_seed(1 + rank), []
    for _ in range(steps):
        ids = batch(gen)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().float()))
    return losses
