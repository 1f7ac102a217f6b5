"""Resource options for what holds data worth keeping (audit logs, the model weights, and the key that decrypts them).

In production such a resource is protected (`pulumi destroy` refuses until it is
unprotected) and retained on delete (a delete, or a replacement, leaves the cloud
resource in place): its data outlives the stack for as long as its own retention
says. Elsewhere it goes with the stack. Tested directly, as the mocks never see
resource options (only the recording engine does).
"""

from __future__ import annotations

import pulumi


def kept(production: bool) -> pulumi.ResourceOptions:
    """Protected and retained on delete in production; neither otherwise."""
    return pulumi.ResourceOptions(protect=production, retain_on_delete=production)
