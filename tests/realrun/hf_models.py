"""The Hugging Face causal LMs the realrun client tests train: small random configs, no download.
``build(arch, seed)`` gives a fresh model; ``batch`` the token batches (labels are the inputs);
``train`` a few SGD steps of a (wrapped) model, its losses; ``run_worker`` a client worker's
main (the ranks, the cases, rank 0's JSON)."""
import json
from datetime import timedelta

import torch
import torch.distributed as dist

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


def run_worker(case, argv: list, setup=lambda world: ()) -> None:
    """A worker's main, from ``argv`` = [script, RANK, WORLD, PORT, CASES, STEPS, OUT]: a gloo group,
    ``case(rank, world, *setup(world), *c, steps)`` for every case ``c`` of the JSON list CASES in
    turn, rank 0 writing the list of summaries to OUT."""
    rank, world, port, cases, steps, out = int(argv[1]), int(argv[2]), int(argv[3]), json.loads(argv[4]), \
        int(argv[5]), argv[6]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=90))
    extra = setup(world)
    summaries = [case(rank, world, *extra, *c, steps) for c in cases]
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(summaries, handle)
    dist.barrier()
    dist.destroy_process_group()
