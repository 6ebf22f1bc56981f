"""GPU compressors: the CUDA source compiles for sm_90 here; on a GPU (marker gpu) the
payloads are byte-identical to the numpy reference, chains and error feedback included."""
import re
import shutil
import subprocess

import numpy as np
import pytest

from realrun.compressors import Compressor, fast
from realrun.compressors.payload import checksum
from realrun.gpu import SOURCE, GpuCompressor, gpu_families, kernels
from topologies.errors import InputError

DECLARED_KERNELS = {name for serves in kernels.SERVES.values() for name in serves.kernels} | set(kernels.DTYPE_KERNELS)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_source_compiles_for_sm90(tmp_path):
    """Every kernel, the bf16 ones (``__nv_bfloat16`` in and out) among them."""
    out = tmp_path / "kernels.cubin"
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Werror", "all-warnings", "-o", str(out),
                           str(SOURCE)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0
    declared = set(re.findall(r'extern "C" __global__ void (\w+)', SOURCE.read_text()))
    assert declared == DECLARED_KERNELS
    bf16 = re.findall(r'extern "C" __global__ void (\w+)\([^)]*__nv_bfloat16', SOURCE.read_text())
    assert set(bf16) == set(kernels.DTYPE_KERNELS)


def test_specs_without_a_gpu_path_are_refused():
    for spec, field in (("zfp(rate=8)", "compressor"), ("ef(zfp(rate=8))", "compressor"),
                        ("topk(0.1)+lossless", "compressor"), ("bf16", "compressor"),
                        ("fp16+int8", "compressor"),   # int8 would get float16: the kernels take float32
                        ("sign(block=100)", "sign.block"), ("int4(block=7)", "int4.block"),
                        ("ef(topk(0.1)+int4(block=5))", "int4.block")):
        with pytest.raises(InputError) as err:
            GpuCompressor(spec)
        assert err.value.field == field, spec


def test_chains_and_error_feedback_of_gpu_families_are_built():
    """Chains and error feedback are the host's (written once); on the GPU they need only their
    families' GPU paths. Error feedback keeps a residual per tensor: it needs the tensor's key."""
    for spec in ("ef(int8)", "topk(0.1)+int8", "ef(topk(0.01))+int4", "topk(0.05)+fp16", "fp16+fp16"):
        assert GpuCompressor(spec).root.name == Compressor(spec).root.name
    with pytest.raises(InputError) as err:
        GpuCompressor("ef(int8)").compress(np.zeros(8, np.float32))
    assert err.value.field == "key"


def _cupy_with_gpu():
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cp.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    return cp


GPU_SPECS = ["fp16", "fp8", "fp8(format=e5m2)", "int8", "int8(block=64)", "int4", "sign", "topk(0.01)",
             "topk(0.5)"]


@pytest.mark.gpu
@pytest.mark.parametrize("spec", GPU_SPECS)
@pytest.mark.parametrize("n", [1, 255, 4097, 1 << 20])
def test_gpu_payload_is_byte_identical_to_numpy(spec, n):
    cp = _cupy_with_gpu()
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    x[:: max(1, n // 7)] *= 50
    ref = Compressor(spec).compress(x).data
    gpu = GpuCompressor(spec)
    payload = gpu.compress(cp.asarray(x))
    assert cp.asnumpy(payload).tobytes() == ref
    y = cp.asnumpy(gpu.decompress(payload))
    assert np.array_equal(y, Compressor(spec).decompress(ref), equal_nan=True)


GPU_CHAINS = ["ef(int8)", "ef(topk(0.01))+int8", "topk(0.1)+int4", "topk(0.05)+fp16", "topk(0.5)+sign",
              "topk(0.5)+fp8", "ef(sign)"]


@pytest.mark.gpu
@pytest.mark.parametrize("spec", GPU_CHAINS)
@pytest.mark.parametrize("n", [255, 4097, 1 << 16])
def test_gpu_chains_and_error_feedback_match_numpy_step_by_step(spec, n):
    """The same residuals on both sides: every step's payload is the same bytes (metadata after
    an odd-length bitmap is read from an aligned copy on the device)."""
    cp = _cupy_with_gpu()
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    cpu, gpu = Compressor(spec), GpuCompressor(spec)
    for step in range(3):
        ref = cpu.compress(x * (1 + step), key="t").data
        payload = gpu.compress(cp.asarray(x * (1 + step)), key="t")
        assert cp.asnumpy(payload).tobytes() == ref, step
        assert np.array_equal(cp.asnumpy(gpu.decompress(payload)), Compressor(spec).decompress(ref), equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 1003, 1 << 20, (1 << 20) + 3])
def test_gpu_checksum_is_the_numba_and_numpy_checksum(n, monkeypatch):
    cp = _cupy_with_gpu()
    body = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    on_device = checksum(cp.asarray(body))
    assert on_device == checksum(body)             # numba where installed
    monkeypatch.setattr(fast, "AVAILABLE", False)
    assert on_device == checksum(body)             # the numpy expression


@pytest.mark.gpu
def test_gpu_nonfinite_follows_the_reference():
    cp = _cupy_with_gpu()
    x = np.array([1.0, np.nan, -2.0, np.inf, 0.5, -np.inf, 3.0, 4.0] * 64, np.float32)
    for spec in ("int8", "int4", "sign", "fp8", "fp8(format=e5m2)", "fp16"):
        ref = Compressor(spec).decompress(Compressor(spec).compress(x))
        got = cp.asnumpy(GpuCompressor(spec).decompress(GpuCompressor(spec).compress(cp.asarray(x))))
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(got[~np.isnan(got)],
                                                                                 ref[~np.isnan(ref)]), spec


def test_gpu_family_list_is_documented():
    assert set(gpu_families()) == {"none", "fp16", "fp8", "int8", "int4", "sign", "topk"}


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["none", "int8", "topk(0.01)", "fp16"])
def test_device_collectives_run_on_nccl_with_gpu_payloads(spec, tmp_path):
    """One GPU allows one NCCL rank: every algorithm's device path (CuPy payloads, DLPack
    tensors, NCCL primitives) runs at world size 1 and agrees with the CPU result."""
    cp = _cupy_with_gpu()
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from realrun.comm import collectives as C

    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/rdzv", rank=0, world_size=1)
    try:
        x = np.random.default_rng(3).standard_normal(40_000).astype(np.float32)
        for alg in ("ring", "recursive_doubling", "allgather", "two_phase"):
            comm = C.Comm()
            got = C.IMPLEMENTATIONS[alg](cp.asarray(x), comm.wire(spec, "cuda").bound(), None)
            ref = C.IMPLEMENTATIONS[alg](x, comm.wire(spec, "cpu").bound(), dist.new_group([0], backend="gloo"))
            np.testing.assert_allclose(cp.asnumpy(got), ref, rtol=1e-6, atol=1e-6)
        a2a = C.ALLTOALL_IMPLEMENTATIONS["direct"](cp.asarray(x), C.Comm().wire(spec, "cuda").bound(), None,
                                                    splits=[len(x)], out_splits=None)   # the size round on NCCL
        np.testing.assert_array_equal(cp.asnumpy(a2a), x)                               # the own chunk: exact
        t = torch.from_numpy(x).cuda()
        assert C.allreduce(t, spec, "auto").device.type == "cuda"
        assert C.broadcast(t, spec).device.type == "cuda"
        assert C.alltoall(t.reshape(-1, 8), spec).device.type == "cuda"
    finally:
        dist.destroy_process_group()


def test_cuda_tensors_on_gloo_are_refused(monkeypatch):
    torch = pytest.importorskip("torch")
    from realrun.comm import collectives as C

    class FakeCuda:
        device = torch.device("cuda", 0)

    monkeypatch.setattr(C.dist, "get_backend", lambda group=None: "gloo")
    with pytest.raises(InputError, match="CUDA tensors on nccl"):
        C._device(FakeCuda(), None)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", GPU_SPECS)
def test_gpu_refuses_corrupted_payloads_and_reads_cpu_ones(spec):
    """The device decoder checks the header, the checksum and the body length as the CPU one does,
    and both backends read each other's payloads (the same bytes)."""
    cp = _cupy_with_gpu()
    x = np.random.default_rng(5).standard_normal(5000).astype(np.float32)
    gpu = GpuCompressor(spec)
    good = cp.asnumpy(gpu.compress(cp.asarray(x)))
    assert np.array_equal(cp.asnumpy(gpu.decompress(cp.asarray(Compressor(spec).compress(x).data))),
                          Compressor(spec).decompress(good.tobytes()), equal_nan=True)
    for i in (4, 30, len(good) // 2, len(good) - 1):
        bad = good.copy()
        bad[i] ^= 0x41
        with pytest.raises(InputError):
            gpu.decompress(cp.asarray(bad))
    with pytest.raises(InputError):
        gpu.decompress(cp.asarray(good[:-3]))


@pytest.mark.gpu
def test_gpu_bf16_and_fp16_cross_the_boundary_as_the_host_does(tmp_path):
    """A bf16 CUDA tensor widens to its exact float32 values (bf16_to_f32) and decoded values
    round back to bf16 nearest even (f32_to_bf16), bit for bit as the host's casts; collectives
    on bf16 and fp16 CUDA tensors go through the GPU codecs and return their dtype (one NCCL rank)."""
    cp = _cupy_with_gpu()
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    import torch.distributed as dist

    from realrun.comm import collectives as C
    from realrun.compressors import dtypes
    from realrun.gpu import from_tensor, to_tensor

    x = torch.from_numpy(np.random.default_rng(1).standard_normal(70_001).astype(np.float32) * 100)
    t = x.bfloat16().cuda()
    wide = from_tensor(t)
    assert wide.dtype == cp.float32 and np.array_equal(cp.asnumpy(wide), t.float().cpu().numpy())
    back = to_tensor(cp.asarray(x.numpy()), torch.bfloat16)
    host = dtypes.narrow(x.numpy(), dtypes.BFLOAT16).view(np.uint16)
    assert back.dtype == torch.bfloat16 and np.array_equal(back.cpu().view(torch.int16).numpy().view(np.uint16), host)
    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/rdzv", rank=0, world_size=1)
    try:
        for dtype in (torch.bfloat16, torch.float16):
            for spec, bound in (("int8", 0.02), ("topk(0.1)", 0.99), ("fp16", 0.0)):   # a cast never widens
                t = (x / 100).to(dtype).cuda()
                # the all-gather compresses and decodes even on one rank (an all-reduce of one is a copy)
                y = C.allgather(t, spec)
                assert y.dtype == dtype and y.device.type == "cuda", (dtype, spec)
                error = float((y.float() - t.float()).norm() / t.float().norm())
                assert error <= bound and (error > 0) == (bound > 0), (dtype, spec, error)
    finally:
        dist.destroy_process_group()
