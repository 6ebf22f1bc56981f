"""Real compressed training of a small GPT: the model perfmodel describes, trained on
torch.distributed with every tensor-parallel activation reduction, pipeline transfer,
data-parallel gradient reduction and ZeRO parameter gather going through realrun.comm under a
compression policy (``realrun train``).

    from realrun.train import TrainConfig, run_training
    records = run_training(TrainConfig.of(model="gpt-tiny", pp=2, gbs=16, policy="pp=int8", steps=20))

* ``model``: a decoder-only transformer built from a perfmodel ``ModelSpec`` (same parameter
  count, tested);
* ``data``: the Python standard library's own source, at byte level (no download);
* ``tensor_parallel``: Megatron's column/row-parallel split and its f/g operators;
* ``pipeline``: stages, GPipe and 1F1B schedules, transfers between stages;
* ``data_parallel``: the gradient reductions and the optimizer step; ``zero``: ZeRO-1, the
  optimizer state sharded over data parallelism;
* ``context_parallel``: ring attention; ``moe``: mixture-of-experts layers and expert parallelism;
* ``runtime``: the one interface of every parallel runtime; ``phases``: the step phases a run
  measures, under perfmodel's names;
* ``accuracy``: the measured relative error per axis; ``checkpoint``: save and resume;
* ``trainer``: the training loop and its measurements per step;
* ``launch``: local ranks or a launcher's (torchrun, ``realrun cluster run``).
"""
from realrun.train.config import TrainConfig
from realrun.train.launch import run_training

__all__ = ["TrainConfig", "run_training"]
