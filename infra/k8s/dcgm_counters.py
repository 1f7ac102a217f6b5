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

from pathlib import Path

CONFIG_MAP = "gpu-serving-dcgm-metrics"  # the ConfigMap the chart creates in the gpu-operator namespace

NVLINK_ERROR_FIELDS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)

# The file itself, data rather than code, lives beside this module (dcgm-metrics.csv, the name of the
# ConfigMap's key), read once here.
COUNTERS = (Path(__file__).resolve().parent / "dcgm-metrics.csv").read_text()


def exported_lines(text: str = COUNTERS) -> list[str]:
    """The lines of a counters file that export a field (not comments, not blank)."""
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
