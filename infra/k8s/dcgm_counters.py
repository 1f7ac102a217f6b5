"""The DCGM exporter's counters file: dcgm-exporter's default counters plus the NVLink error counters.

The GPU operator's DCGM exporter exports the fields of `etc/default-counters.csv` unless the chart
names a ConfigMap of its own (gpu-operator v26.7.0 values.yaml `dcgmExporter.config.name`; with
`create: true` and `data` the chart makes that ConfigMap itself, key `dcgm-metrics.csv`:
deployments/gpu-operator/templates/dcgm_exporter_config.yaml; the operator mounts it at
/etc/dcgm-exporter/dcgm-metrics.csv, controllers/object_controls.go `MetricsConfigMountPath`). The
default file leaves the NVLink error counters commented out, so the GPU dashboard could not draw
NVLink errors (issue 20 item 3). `COUNTERS` is that default file's every exported line, verbatim
and in order (NVIDIA/dcgm-exporter tag 4.5.3-4.8.2, commit 691c92762eb551313c825f6efe4ceeee20982801,
`etc/default-counters.csv`, the same on `main` at d5e5f510a1b6b393f39a43293ccd9dc985defc79; the
GPU operator v26.7.0 runs 4.6.0-4.8.3, a tag newer than that snapshot: ASSUMPTION, its defaults are
the same), with the four NVLink error lines of the same file uncommented (`NVLINK_ERROR_FIELDS`).
tests/test_dashboards.py checks both against the file (tests/fixtures/metrics/).

Cost: four counters a GPU (32 series on a p5.48xlarge), each summed over the GPU's links by DCGM.
"""

from __future__ import annotations

CONFIG_MAP = "gpu-serving-dcgm-metrics"  # the ConfigMap the chart creates in the gpu-operator namespace

NVLINK_ERROR_FIELDS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)

COUNTERS = """\
# Format
# If line starts with a '#' it is considered a comment
# DCGM FIELD, Prometheus metric type, help message
# dcgm-exporter 4.5.3-4.8.2 etc/default-counters.csv, its exported lines, plus its NVLink error lines uncommented.

# Clocks
DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).

# Temperature
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).

# Power
DCGM_FI_DEV_POWER_USAGE,              gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).

# PCIE
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.

# Utilization (the sample period varies depending on the product)
DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).
DCGM_FI_DEV_ENC_UTIL,      gauge, Encoder utilization (in %).
DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).

# Errors and violations
DCGM_FI_DEV_XID_ERRORS,              gauge,   Value of the last XID error encountered.

# Memory usage
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_FB_RESERVED, gauge, Framebuffer memory reserved (in MiB).

# NVLink
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, Total number of NVLink flow-control CRC errors.
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, counter, Total number of NVLink data CRC errors.
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,   counter, Total number of NVLink retries.
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, counter, Total number of NVLink recovery errors.
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,            counter, Total number of NVLink bandwidth counters for all lanes.

# VGPU License status
DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status

# Remapped rows
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,   counter, Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE,           gauge,   Whether remapping of rows has failed

# Static configuration information. These appear as labels on the other metrics
DCGM_FI_DRIVER_VERSION,        label, Driver Version

# Datacenter Profiling (DCP) metrics
# NOTE: supported on Nvidia datacenter Volta GPUs and newer
DCGM_FI_PROF_GR_ENGINE_ACTIVE,   gauge, Ratio of time the graphics engine is active.
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_DRAM_ACTIVE,        gauge, Ratio of cycles the device memory interface is active sending or receiving data.
DCGM_FI_PROF_PCIE_TX_BYTES,      gauge, The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
DCGM_FI_PROF_PCIE_RX_BYTES,      gauge, The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
"""


def exported_lines(text: str = COUNTERS) -> list[str]:
    """The lines of a counters file that export a field (not comments, not blank)."""
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
