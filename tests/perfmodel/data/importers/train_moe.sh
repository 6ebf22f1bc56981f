#!/bin/bash
# A Megatron-LM launch script written for commpress's tests, in the style of Megatron-LM's
# examples/ (arrays of flags, ${VAR:-default}, an if on a variable, line continuations).
GPUS_PER_NODE=8
NUM_NODES=${NUM_NODES:-4}
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
TP=2
PRECISION=${PRECISION:-"fp8"}
CHECKPOINT_PATH=$1

MODEL_ARGS=(
    --num-layers 16
    --hidden-size 2048
    --ffn-hidden-size 6144
    --num-attention-heads 16
    --group-query-attention
    --num-query-groups 4
    --seq-length 4096
    --max-position-embeddings 4096
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --vocab-size 50000          # padded to 50176 (128 x tp 2 = 256)
    --num-experts 32
    --moe-router-topk 4
    --moe-ffn-hidden-size 1024
    --moe-shared-expert-intermediate-size 1024
    --moe-layer-freq "[0]*2+[1]*14"
    --moe-token-dispatcher-type flex
    --moe-flex-dispatcher-backend deepep
    --moe-router-load-balancing-type aux_loss
)

PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size 2
    --expert-model-parallel-size 4
    --sequence-parallel
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)

TRAIN_ARGS=(
    --micro-batch-size 1
    --global-batch-size 256
    --bf16
    --lr 3e-4
    --min-lr 3e-5
    --recompute-granularity selective
    --recompute-modules moe_act layernorm
)

if [[ "$PRECISION" == "fp8" ]]; then
    TRAIN_ARGS+=("--fp8-format hybrid" "--fp8-recipe tensorwise")
fi

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${PARALLEL_ARGS[@]} \
    ${TRAIN_ARGS[@]} \
    --save $CHECKPOINT_PATH \
    --log-interval 10
