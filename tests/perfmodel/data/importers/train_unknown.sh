torchrun pretrain_gpt.py --num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 \
    --vocab-size 32000 --cpu-offloading --tensor-model-parallel-size $TP
