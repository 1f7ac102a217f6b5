"""The boto3 clients of one region (or of IAM, which is global), made when first used."""

from __future__ import annotations

from infra.ops import aws
from infra.ops.sweep.records import GLOBAL


class Clients:
    """`clients.ec2`, `clients.eks`, ...: the client of that service for `region` (GLOBAL: IAM's)."""

    def __init__(self, session, region: str):
        self._session, self.region, self._made = session, region, {}
        self.errors: list[str] = []  # per-item read failures met while listing (the listing goes on)

    def unreadable(self, what: str, exc: Exception) -> None:
        self.errors.append(f"{self.region}: could not read {what}: {aws.error_text(exc)}")

    def __getattr__(self, service: str):
        if service.startswith("_"):
            raise AttributeError(service)
        if service not in self._made:
            self._made[service] = self._session.client(service, region_name=None if self.region == GLOBAL else self.region)
        return self._made[service]
