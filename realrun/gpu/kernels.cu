// commpress GPU compression kernels (CuPy RawModule; compiled by nvcc -arch=sm_90 in a test).
// Layouts match the numpy reference in realrun/compressors/transforms.py bit for bit:
//   blockwise absmax: scale = absmax / levels (fp32, at least the smallest subnormal when absmax > 0,
//   NaN if the block holds NaN/Inf),
//   codes = rint(x / scale) clipped to +-levels; int4 packs value i into byte i/2, low nibble first;
//   sign: bit i of byte i/8 (LSB first) is 1 for x >= 0 (or NaN), scale = mean |x| of the block.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#define MAX_THREADS 256

__device__ float block_absmax(const float* x, long start, long end, float* shared) {
    float m = 0.0f;
    bool bad = false;
    for (long i = start + threadIdx.x; i < end; i += blockDim.x) {
        float v = x[i];
        bad |= !isfinite(v);
        m = fmaxf(m, fabsf(v));
    }
    shared[threadIdx.x] = bad ? __int_as_float(0x7fc00000) : m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float a = shared[threadIdx.x], b = shared[threadIdx.x + s];
            shared[threadIdx.x] = (isnan(a) || isnan(b)) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
        }
        __syncthreads();
    }
    return shared[0];
}

// one CUDA block per quantization block; bits = 8 or 4
extern "C" __global__ void quantize_absmax(const float* x, uint8_t* codes, float* scales, long n, int block,
                                           int bits) {
    __shared__ float shared[MAX_THREADS];
    long b = blockIdx.x, start = b * (long)block, end = min(start + block, n);
    int levels = (1 << (bits - 1)) - 1;
    float absmax = block_absmax(x, start, end, shared);
    float scale = isfinite(absmax) ? absmax / (float)levels : __int_as_float(0x7fc00000);
    if (absmax > 0.0f && scale < 1.4e-45f) scale = 1.4e-45f;  // never underflow to 0 (smallest subnormal)
    if ((double)scale * levels < (double)absmax) scale = nextafterf(scale, INFINITY);  // rounded down: one ulp up
    if (threadIdx.x == 0) scales[b] = scale;
    float safe = (scale > 0.0f && isfinite(scale)) ? scale : 1.0f;
    for (long i = start + threadIdx.x; i < end; i += blockDim.x) {
        float v = isfinite(x[i]) ? x[i] : 0.0f;
        int q = (int)rintf(v / safe);
        q = max(-levels, min(levels, q));
        if (bits == 8) {
            codes[i] = (uint8_t)(int8_t)q;
        } else {  // two values per byte: build each byte from its even index only
            if ((i & 1) == 0) {
                int q2 = 0;
                if (i + 1 < end) {
                    float v2 = isfinite(x[i + 1]) ? x[i + 1] : 0.0f;
                    q2 = max(-levels, min(levels, (int)rintf(v2 / safe)));
                }
                codes[i >> 1] = (uint8_t)((q & 0xF) | ((q2 & 0xF) << 4));
            }
        }
    }
}

extern "C" __global__ void dequantize_absmax(const uint8_t* codes, const float* scales, float* y, long n, int block,
                                             int bits) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    int q;
    if (bits == 8) {
        q = (int)(int8_t)codes[i];
    } else {
        int nib = (codes[i >> 1] >> ((i & 1) * 4)) & 0xF;
        q = nib >= 8 ? nib - 16 : nib;
    }
    double v = (double)q * (double)scales[i / block];
    y[i] = (float)fmax(-3.4028234663852886e38, fmin(3.4028234663852886e38, v));
}

extern "C" __global__ void sign_pack(const float* x, uint8_t* bits, float* scales, long n, int block) {
    __shared__ double shared[MAX_THREADS];
    long b = blockIdx.x, start = b * (long)block, end = min(start + block, n);
    // mean |x| in the CPU reference's order: value i to lane i mod 8, each lane in index order,
    // lanes combined ((0+1)+(2+3))+((4+5)+(6+7)), divided in double: the same bits as numpy
    if (threadIdx.x < 8) {
        double s = 0.0;
        for (long i = start + threadIdx.x; i < end; i += 8) s += fabs((double)x[i]);
        shared[threadIdx.x] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        scales[b] = (float)((((shared[0] + shared[1]) + (shared[2] + shared[3])) +
                             ((shared[4] + shared[5]) + (shared[6] + shared[7]))) / (double)(end - start));
    // block is a multiple of 8 here, so every byte belongs to one block
    for (long byte = start / 8 + threadIdx.x; byte * 8 < end; byte += blockDim.x) {
        uint8_t v = 0;
        for (int k = 0; k < 8 && byte * 8 + k < end; ++k) {
            float xv = x[byte * 8 + k];
            v |= (uint8_t)((xv >= 0.0f || isnan(xv)) ? 1 : 0) << k;
        }
        bits[byte] = v;
    }
}

extern "C" __global__ void sign_unpack(const uint8_t* bits, const float* scales, float* y, long n, int block) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = ((bits[i >> 3] >> (i & 7)) & 1) ? 1.0f : -1.0f;
    y[i] = s * scales[i / block];
}

extern "C" __global__ void gather_f32(const float* x, const int32_t* idx, float* out, long k) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < k) out[i] = x[idx[i]];
}

extern "C" __global__ void scatter_f32(const float* values, const int32_t* idx, float* y, long k) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < k) y[idx[i]] = values[i];
}

// fp8: e4m3 saturates finite values to +-448 (no Inf in the format; Inf and NaN become NaN),
// e5m2 overflows to Inf as IEEE formats do.
extern "C" __global__ void to_fp8(const float* x, uint8_t* out, long n, int e5m2) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    if (e5m2) {
        out[i] = (uint8_t)__nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E5M2);
    } else {
        out[i] = isinf(v) ? (uint8_t)0x7F : (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    }
}

extern "C" __global__ void from_fp8(const uint8_t* codes, float* y, long n, int e5m2) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)codes[i], e5m2 ? __NV_E5M2 : __NV_E4M3);
    y[i] = __half2float(*reinterpret_cast<__half*>(&h));
}

// bf16 at the codec boundary (realrun.gpu.kernels.widen / narrow): a bf16 tensor's values widen
// exactly to float32 for the kernels above and the decoded float32 values round back to bf16,
// nearest even (NaN stays NaN), as the host's numba and numpy paths do (realrun.compressors.dtypes).

extern "C" __global__ void bf16_to_f32(const __nv_bfloat16* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = __bfloat162float(x[i]);
}

extern "C" __global__ void f32_to_bf16(const float* x, __nv_bfloat16* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

