"""GPUs the stack can plan for, with where every figure comes from.

`visible_memory_bytes` is what the planner budgets with: the total the CUDA
runtime reports (`torch.cuda.mem_get_info()[1]`, the `total_gpu_memory` of vLLM's
memory-profiling log), which is a little below both the marketing figure and
what EC2 or nvidia-smi report. Figures quoted in MiB come from
`torch.cuda.get_device_properties()` dumps (torch rounds down to whole MiB);
figures quoted in GiB come from vLLM logs (two decimals).

Compute figures are dense (no 2:4 sparsity) tensor-core peaks from NVIDIA's
datasheets; NVLink figures are bidirectional per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.errors import unknown_name

GiB = 2**30
MiB = 2**20
TB = 10**12
GB = 10**9


@dataclass(frozen=True)
class GPU:
    name: str
    marketing_memory_gb: int  # NVIDIA's "GB"; for HBM parts this is really GiB (80 GB = 81920 MiB)
    visible_memory_bytes: int
    hbm_bandwidth_bytes_per_s: float  # device memory bandwidth (GDDR6 on L40S/A10G)
    bf16_dense_tflops: float
    fp8_dense_tflops: float | None
    fp4_dense_tflops: float | None
    nvlink_bandwidth_bytes_per_s: float | None  # None: PCIe-only card
    supports_fp8: bool  # hardware FP8 tensor cores (compute capability >= 8.9)
    supports_fp4: bool  # native FP4 tensor cores (Blackwell)
    compute_capability: str
    source: str


_H100_H200_DATASHEET = (
    "NVIDIA H100 / H200 Tensor Core GPU datasheets, SXM column: BF16 1,979 and FP8 3,958 "
    "TFLOPS with sparsity (halved for dense), NVLink 900 GB/s"
)

GPUS: dict[str, GPU] = {
    g.name: g
    for g in [
        GPU(
            name="H100-SXM-80GB",
            marketing_memory_gb=80,
            # 79.19 GiB; nvidia-smi shows 81559 MiB, EC2 81920 MiB.
            visible_memory_bytes=85_031_714_816,
            hbm_bandwidth_bytes_per_s=3.35 * TB,
            bf16_dense_tflops=989.5,
            fp8_dense_tflops=1979.0,
            fp4_dense_tflops=None,
            nvlink_bandwidth_bytes_per_s=900 * GB,
            supports_fp8=True,
            supports_fp4=False,
            compute_capability="9.0",
            source=(
                "visible memory: vLLM logs on H100 80GB HBM3 report total memory 79.18-79.19 GiB "
                "(/work/shared/FACTS.md; vLLM PR #10511 shows 79.22 GiB); torch device-property "
                "dumps of 'NVIDIA H100 80GB HBM3' show total_memory=81089-81090MB. "
                "Bandwidth 3.35 TB/s and compute: " + _H100_H200_DATASHEET + "."
            ),
        ),
        GPU(
            name="H200-141GB",
            marketing_memory_gb=141,
            visible_memory_bytes=143_156 * MiB,  # 139.80 GiB
            hbm_bandwidth_bytes_per_s=4.8 * TB,
            bf16_dense_tflops=989.5,
            fp8_dense_tflops=1979.0,
            fp4_dense_tflops=None,
            nvlink_bandwidth_bytes_per_s=900 * GB,
            supports_fp8=True,
            supports_fp4=False,
            compute_capability="9.0",
            source=(
                "visible memory: torch.cuda.get_device_properties dump "
                "\"_CudaDeviceProperties(name='NVIDIA H200', major=9, minor=0, total_memory=143156MB)\" "
                "in a public Modal vLLM example (skywork_r1v.py); a vLLM log shows "
                "total_gpu_memory (139.81GiB). Bandwidth 4.8 TB/s and compute: "
                + _H100_H200_DATASHEET
                + "."
            ),
        ),
        GPU(
            name="B200",
            # AWS (p6-b200) and the HGX B200 spec say 180 GB per GPU; NVIDIA's B200 marketing
            # says 192 GB (decimal: EC2's 183359 MiB is 192.3e9 bytes).
            marketing_memory_gb=180,
            visible_memory_bytes=182_631 * MiB,  # 178.35 GiB
            # Driver-reported 7680-bit bus x 3996 MHz x 2; NVIDIA's datasheet says 8 TB/s.
            hbm_bandwidth_bytes_per_s=7.672 * TB,
            bf16_dense_tflops=2250.0,
            fp8_dense_tflops=4500.0,
            fp4_dense_tflops=9000.0,
            nvlink_bandwidth_bytes_per_s=1800 * GB,
            supports_fp8=True,
            supports_fp4=True,
            compute_capability="10.0",
            source=(
                "visible memory: torch device-property dumps of 'NVIDIA B200' show "
                "total_memory=182631MB and 182642MB (public repos; the lower is kept); pytorch/ao "
                "PR #4002 reports Total Global Memory 178.35 GB (GiB) and sglang issue #25225 "
                "shows mem_get_info total 178.4 GiB. Bandwidth: pytorch/ao PR #4002 (7680-bit bus, "
                "3996 MHz: 7.67 TB/s; NVIDIA DGX B200 datasheet says 64 TB/s per 8 GPUs). Compute: "
                "NVIDIA HGX B200 (1,000 W) dense figures BF16 2.25, FP8 4.5, FP4 9 PFLOPS per GPU "
                "(also torchao roofline_utils.py). NVLink 5: 1.8 TB/s per GPU."
            ),
        ),
        GPU(
            name="A100-40GB",
            marketing_memory_gb=40,
            visible_memory_bytes=round(39.39 * GiB),
            hbm_bandwidth_bytes_per_s=1.555 * TB,
            bf16_dense_tflops=312.0,
            fp8_dense_tflops=None,
            fp4_dense_tflops=None,
            nvlink_bandwidth_bytes_per_s=600 * GB,
            supports_fp8=False,
            supports_fp4=False,
            compute_capability="8.0",
            source=(
                "visible memory: vLLM 0.7.1 log on SageMaker ml.p4d.24xlarge (AWS SA tutorial "
                "'Deploy DeepSeek-Coder-V2 with vLLM on SageMaker Endpoint using LMI container "
                "from DJL'): total_gpu_memory (39.39GiB); other A100-SXM4-40GB logs show "
                "39.49-39.56 GiB, Paddle's docs show total_memory=40536MB; the lowest, seen on "
                "p4d, is kept. Bandwidth 1,555 GB/s, BF16 312 TFLOPS dense, NVLink 600 GB/s: "
                "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB)."
            ),
        ),
        GPU(
            name="A100-80GB",
            marketing_memory_gb=80,
            visible_memory_bytes=round(79.15 * GiB),
            hbm_bandwidth_bytes_per_s=2.039 * TB,
            bf16_dense_tflops=312.0,
            fp8_dense_tflops=None,
            fp4_dense_tflops=None,
            nvlink_bandwidth_bytes_per_s=600 * GB,
            supports_fp8=False,
            supports_fp4=False,
            compute_capability="8.0",
            source=(
                "visible memory: vLLM 0.8.2 log on NVIDIA A100-SXM4-80GB in a public Unsloth GRPO "
                "tutorial: total_gpu_memory (79.15GiB), Unsloth 'Max memory: 79.151 GB'. "
                "Bandwidth 2,039 GB/s, BF16 312 TFLOPS dense, NVLink 600 GB/s: NVIDIA A100 "
                "Tensor Core GPU datasheet (SXM4 80GB)."
            ),
        ),
        GPU(
            name="L40S",
            marketing_memory_gb=48,
            visible_memory_bytes=45_589 * MiB,  # 44.52 GiB
            hbm_bandwidth_bytes_per_s=864 * GB,
            bf16_dense_tflops=362.05,
            fp8_dense_tflops=733.0,
            fp4_dense_tflops=None,
            nvlink_bandwidth_bytes_per_s=None,
            supports_fp8=True,
            supports_fp4=False,
            compute_capability="8.9",
            source=(
                "visible memory: torch dump \"_CudaDeviceProperties(name='NVIDIA L40S', major=8, "
                "minor=9, total_memory=45589MB)\" (public repo docs). NVIDIA L40S datasheet: 48 GB "
                "GDDR6, 864 GB/s, BF16 362.05 | 733 (sparse), FP8 733 | 1,466 (sparse) TFLOPS, "
                "PCIe Gen4 x16 only (no NVLink)."
            ),
        ),
        GPU(
            name="A10G",
            marketing_memory_gb=24,
            visible_memory_bytes=22_587 * MiB,  # 22.06 GiB
            hbm_bandwidth_bytes_per_s=600 * GB,
            bf16_dense_tflops=70.0,
            fp8_dense_tflops=None,
            fp4_dense_tflops=None,
            nvlink_bandwidth_bytes_per_s=None,
            supports_fp8=False,
            supports_fp4=False,
            compute_capability="8.6",
            source=(
                "visible memory: torch dump \"_CudaDeviceProperties(name='NVIDIA A10G', major=8, "
                "minor=6, total_memory=22587MB)\" (public repo, a 2026 torch nightly, cu130). "
                "24 GB GDDR6 at 600 GB/s: Baseten 'NVIDIA A10 vs A10G for ML model inference'. "
                "ASSUMPTION: BF16 70 TFLOPS dense; NVIDIA publishes no A10G datasheet (the A10's is "
                "125 TFLOPS; the AWS variant's tensor rate is lower). PCIe only."
            ),
        ),
    ]
}


def get_gpu(name: str) -> GPU:
    try:
        return GPUS[name]
    except KeyError:
        raise unknown_name("GPU", name, GPUS) from None
