"""Pre-flight checks 5 and 6 (infra/ops/preflight.py's module doc): the EKS version and the pinned add-on versions.

EKS DescribeClusterVersions (or, where it cannot be called, the calendar of
infra/catalog/eks_versions.py) and DescribeAddonVersions at the cluster's
Kubernetes version. Built on preflight.py's Target and Check.
"""

from __future__ import annotations

import datetime as dt
from typing import Optional

from infra.catalog import eks_versions
from infra.ops import aws
from infra.ops.preflight import Check, Target, _error_text, _fmt_time

# The calendar used when EKS DescribeClusterVersions cannot be called (infra/catalog/eks_versions.py).
EKS_CALENDAR_SOURCE = eks_versions.CALENDAR_SOURCE
STANDARD_SUPPORT_WARNING = eks_versions.STANDARD_SUPPORT_WARNING


def _standard_support_warning(version: str, std_end: Optional[dt.date], today: dt.date) -> tuple[str, str]:
    """(warning, fix) when standard support of `version` ends within STANDARD_SUPPORT_WARNING of `today`."""
    if std_end is None or not (today <= std_end <= today + STANDARD_SUPPORT_WARNING):
        return "", ""
    newer = [v for v in eks_versions.supported_versions() if eks_versions.version_key(v) > eks_versions.version_key(version)]
    return (
        f"standard support of {version} ends {std_end} (in {(std_end - today).days} days); after that EKS bills "
        "extended support per cluster hour",
        f"upgrade gpu-serving:cluster.kubernetesVersion one minor version at a time"
        + (f" (next: {newer[0]})" if newer else "; add the next version to infra/catalog/eks_versions.py first"),
    )


def _calendar_check(name: str, version: str, today: dt.date, why: str) -> Check:
    newest = max(eks_versions.RELEASES, key=eks_versions.version_key)
    entry = eks_versions.release(version)
    src = f"from the built-in calendar, {EKS_CALENDAR_SOURCE}; {why}"
    upgrade = f"set gpu-serving:cluster.kubernetesVersion to a supported version (newest known: {newest})"
    if entry is None:
        if eks_versions.version_key(version) > eks_versions.version_key(newest):
            return Check(name, None, f"{version} is newer than the {src}",
                         "check `aws eks describe-cluster-versions` or the EKS release calendar")  # fmt: skip
        return Check(name, False, f"{version} is no longer offered by EKS ({src})", upgrade)
    std_end, ext_end = entry.end_of_standard, entry.end_of_extended
    if today < std_end:
        warning, fix = _standard_support_warning(version, std_end, today)
        return Check(name, True, f"{version}: standard support until {std_end} ({src})", fix, warning)
    if today < ext_end:
        return Check(
            name, True,
            f"{version}: extended support until {ext_end} (standard support ended {std_end}; extended support "
            f"costs extra per cluster hour) ({src})",
            upgrade, f"standard support of {version} ended {std_end}: extended support costs extra per cluster hour",
        )  # fmt: skip
    return Check(name, False, f"{version}: support ended {ext_end} ({src})", upgrade)


def check_eks_version(eks, t: Target, today: Optional[dt.date] = None) -> Check:
    """The EKS Kubernetes version can be used for a new cluster; a warning within 60 days of its end of standard support."""
    name = "EKS version supported"
    v = t.kubernetes_version
    today = today or dt.datetime.now(dt.timezone.utc).date()
    try:
        found = eks.describe_cluster_versions(clusterVersions=[v], includeAll=True).get("clusterVersions", [])
    except Exception as exc:  # noqa: BLE001 - fall back to the calendar, and say why
        return _calendar_check(name, v, today, f"DescribeClusterVersions failed: {_error_text(exc)}")
    info = next((c for c in found if c.get("clusterVersion") == v), None)
    if info is None:
        return Check(name, False, f"EKS does not offer Kubernetes {v} in {t.region}",
                     "set gpu-serving:cluster.kubernetesVersion to a version `aws eks describe-cluster-versions` lists")  # fmt: skip
    status = str(info.get("versionStatus") or info.get("status") or "").upper().replace("-", "_")
    std_end, ext_end = info.get("endOfStandardSupportDate"), info.get("endOfExtendedSupportDate")
    if status == "STANDARD_SUPPORT":
        std_day = std_end.date() if isinstance(std_end, dt.datetime) else None
        warning, fix = _standard_support_warning(v, std_day, today)
        return Check(name, True, f"{v}: standard support" + (f" until {_fmt_time(std_end)}" if std_end else ""), fix, warning)
    if status == "EXTENDED_SUPPORT":
        return Check(
            name, True,
            f"{v}: extended support" + (f" until {_fmt_time(ext_end)}" if ext_end else "")
            + " (costs extra per cluster hour; consider a newer version)",
            "upgrade gpu-serving:cluster.kubernetesVersion one minor version at a time",
            f"{v} is in extended support: it costs extra per cluster hour",
        )  # fmt: skip
    return Check(name, False, f"{v}: {status.lower() or 'unsupported'}",
                 "set gpu-serving:cluster.kubernetesVersion to a version in standard support")  # fmt: skip


def check_addon_versions(eks, t: Target) -> Check:
    """Every pinned add-on version is one EKS offers for the cluster's Kubernetes version (DescribeAddonVersions)."""
    name = "add-on versions offered"
    if not t.addon_versions:
        return Check(name, True, "no add-ons pinned")
    missing: list[tuple[str, str, list[str]]] = []  # (add-on, pinned version, the versions EKS offers)
    for addon, version in t.addon_versions:
        try:
            pages = eks.get_paginator("describe_addon_versions").paginate(addonName=addon, kubernetesVersion=t.kubernetes_version)
            # botocore's eks model: DescribeAddonVersions returns addons[] (AddonInfo), each with addonVersions[].addonVersion.
            offered = [v["addonVersion"] for page in pages for a in page.get("addons", []) for v in a.get("addonVersions", [])]
        except Exception as exc:  # noqa: BLE001
            fix = "grant eks:DescribeAddonVersions" if aws.is_denied(exc) else "rerun; check the region and credentials"
            return Check(name, None, f"could not list the versions of {addon} for Kubernetes {t.kubernetes_version}: "
                                     f"{_error_text(exc)}", fix)  # fmt: skip
        if version not in offered:
            missing.append((addon, version, offered))
    pins = ", ".join(f"{a} {v}" for a, v in t.addon_versions)
    if missing:
        hints = "; ".join(f"{a}: e.g. {offered[0]}" for a, _, offered in missing if offered)
        not_offered = ", ".join(f"{a} {v}" for a, v, _ in missing)
        return Check(
            name, False, f"EKS does not offer {not_offered} for Kubernetes {t.kubernetes_version} in {t.region}",
            f"pin an offered version in infra/catalog/eks_versions.py ADDON_VERSIONS[{t.kubernetes_version!r}]"
            + (f" ({hints})" if hints else "") + f"; list them with `aws eks describe-addon-versions --kubernetes-version {t.kubernetes_version} --addon-name <name>`",
        )  # fmt: skip
    return Check(name, True, f"every pinned add-on is offered for Kubernetes {t.kubernetes_version}: {pins}")
