"""Real compressed training of a small GPT: the model perfmodel describes, trained on
torch.distributed with every tensor-parallel activation reduction, data-parallel gradient
reduction and ZeRO parameter gather going through realrun.comm under a compression policy
(``realrun train``).

* ``model``: a decoder-only transformer built from a perfmodel ``ModelSpec`` (same parameter
  count, tested);
* ``data``: the Python standard library's own source, at byte level (no download);
* ``tensor_parallel``: Megatron's column/row-parallel split and its f/g operators;
* ``zero``: ZeRO-1, the optimizer state sharded over data parallelism;
* ``trainer``: the training loop and its measurements per step;
* ``launch``: local ranks or a launcher's (torchrun, ``realrun cluster run``).
"""
