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
    hbm_bandwidth_bytes_per_s: float  # device memory bandwidth (GDDR6 on L40S/A10G/L4, GDDR7 on RTX PRO)
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
                "(vLLM start-up logs print 79.18-79.19 GiB; vLLM PR #10511 shows 79.22 GiB); torch device-property "
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
        GPU(
            name="L4",
            marketing_memory_gb=24,
            # ASSUMPTION: 22,587 MiB (22.06 GiB), no published torch figure found. EC2 reports
            # 22,888 MiB for both L4 and A10G (24 GB GDDR6 parts); the A10G's torch total is 301 MiB
            # below that, and the same reserve is taken here.
            visible_memory_bytes=22_587 * MiB,
            hbm_bandwidth_bytes_per_s=300 * GB,
            bf16_dense_tflops=121.0,
            fp8_dense_tflops=242.5,
            fp4_dense_tflops=None,
            nvlink_bandwidth_bytes_per_s=None,
            supports_fp8=True,
            supports_fp4=False,
            compute_capability="8.9",
            source=(
                "visible memory: ASSUMPTION, EC2 GpuInfo 22888 MiB less the 301 MiB the A10G's torch "
                "total (22587MB) sits below the same EC2 figure. NVIDIA L4 Tensor Core GPU datasheet: "
                "24 GB GDDR6, 300 GB/s, BF16 242 and FP8 485 TFLOPS with sparsity (halved for dense), "
                "PCIe Gen4 x16 only (no NVLink); compute capability 8.9 (Ada)."
            ),
        ),
        GPU(
            name="RTX-PRO-6000-Server",
            # RTX PRO 6000 Blackwell Server Edition (EC2 GpuInfo name "RTX PRO Server 6000").
            marketing_memory_gb=96,
            visible_memory_bytes=97_250 * MiB,  # 94.97 GiB
            # 512-bit GDDR7 at 28 Gbps.
            hbm_bandwidth_bytes_per_s=1.792 * TB,
            bf16_dense_tflops=500.0,
            fp8_dense_tflops=1000.0,
            fp4_dense_tflops=2000.0,
            nvlink_bandwidth_bytes_per_s=None,
            supports_fp8=True,
            supports_fp4=True,
            compute_capability="12.0",
            source=(
                "visible memory: torch 2.7.1 dump \"_CudaDeviceProperties(name='NVIDIA RTX PRO 6000 "
                "Blackwell Server Edition', major=12, minor=0, total_memory=97250MB)\" (public repo "
                "notes); a vLLM 0.20 benchmark reports 95.0 GiB each; nvidia-smi shows 97887 MiB, EC2 "
                "98304 MiB. NVIDIA RTX PRO 6000 Blackwell: 96 GB GDDR7 (512-bit, 28 Gbps: 1,792 GB/s), "
                "4,000 AI TOPS (FP4 with sparsity), PCIe Gen5 x16 only (no NVLink). Dense compute: "
                "ASSUMPTION, FP4 2,000 from the sparse peak, FP8 and BF16 (FP32 accumulate, full rate "
                "on RTX PRO parts) each half the next: 1,000 and 500 TFLOPS; NVIDIA's aiconfigurator "
                "system file for the Server Edition uses 1,871 / 936 / 468 TFLOPS, scaled to the "
                "2,430 MHz clock it observed."
            ),
        ),
        GPU(
            name="B300",
            # NVIDIA's 288 GB is decimal: EC2's 275040 MiB is 288.4e9 bytes (268.6 GiB).
            marketing_memory_gb=288,
            # ASSUMPTION: 274,312 MiB (267.88 GiB), no published torch figure found: EC2's 275040 MiB
            # (what nvidia-smi shows too) less the 728 MiB the B200's torch total sits below its
            # EC2 figure (183359 -> 182631 MiB).
            visible_memory_bytes=274_312 * MiB,
            hbm_bandwidth_bytes_per_s=8.0 * TB,
            bf16_dense_tflops=2250.0,
            fp8_dense_tflops=4500.0,
            fp4_dense_tflops=13500.0,
            nvlink_bandwidth_bytes_per_s=1800 * GB,
            supports_fp8=True,
            supports_fp4=True,
            compute_capability="10.3",
            source=(
                "visible memory: ASSUMPTION, EC2 GpuInfo 275040 MiB (nvidia-smi on p6-b300 shows "
                "275040MiB too) less the B200's 728 MiB EC2-to-torch gap. Device 'NVIDIA B300 SXM6 "
                "AC', compute capability 10.3 (sm_103, torch and vLLM logs on B300). NVIDIA HGX B300 "
                "specification, per 8 GPUs: FP4 144 | 108 PFLOPS (sparse | dense), FP8 72 and BF16 36 "
                "PFLOPS with sparsity, i.e. dense per GPU FP4 13.5, FP8 4.5, BF16 2.25 PFLOPS; 288 GB "
                "HBM3e at up to 8 TB/s per GPU; NVLink 5 1.8 TB/s per GPU. Other published dense FP4 "
                "figures range 13.1-15 PFLOPS; NVIDIA's aiconfigurator (a fork's b300_sxm.yaml) uses "
                "7.75 TB/s and BF16 2,250 / FP8 4,500 / FP4 14,000 TFLOPS."
            ),
        ),
    ]
}


def get_gpu(name: str) -> GPU:
    try:
        return GPUS[name]
    except KeyError:
        raise unknown_name("GPU", name, GPUS) from None
