"""The stack config: one pydantic model per area, loaded from Pulumi or a stack file.

A stack file `Pulumi.<stack>.yaml` holds one object per area under the project's
namespace, plus the AWS region:

    config:
      aws:region: us-east-1
      gpu-serving:model:   {name: deepseek-v4-pro}
      gpu-serving:gpu:     {instanceType: p5.48xlarge, nodes: 4}
      gpu-serving:serving: {maxModelLen: 131072, gpuMemoryUtilization: 0.90}
      gpu-serving:cost:    {apiPriceUsdPerMillionTokens: 2.50}

Keys are camelCase in YAML and snake_case in Python. Every key has a default and
an allowed range; an unknown key, a value out of range or a missing required key
is a `UserError` that names the stack file, the full key path (for example
`gpu-serving:serving.gpuMemoryUtilization`) and what is allowed.

The Pulumi program reads the config through the engine (`from_pulumi_config`);
offline tools read the stack file directly (`load_stack_file`). Nothing here
imports Pulumi at module level, so the package works without the engine.

Modules:
- `areas`: the model of each area (`gpu-serving:gpu`, `gpu-serving:serving`, ...)
  and the checks within one area;
- `stack`: `StackConfig`, the checks across areas and the planner's request;
- `loading`: stack files, the engine's config, secrets;
- `messages`: pydantic's errors as one message per key;
- `fields`, `reference`: what each key takes, in words; the reference in docs/configuration.md.
"""

from infra.config.areas import AREAS, PROJECT, SECRET_KEYS
from infra.config.loading import (
    REPO_ROOT,
    engine_config,
    from_mapping,
    from_pulumi_config,
    load_stack_file,
    read_stack_file,
    secret,
    stack_file_name,
)
from infra.config.reference import reference_markdown
from infra.config.stack import StackConfig

__all__ = [
    "AREAS",
    "PROJECT",
    "REPO_ROOT",
    "SECRET_KEYS",
    "StackConfig",
    "engine_config",
    "from_mapping",
    "from_pulumi_config",
    "load_stack_file",
    "read_stack_file",
    "reference_markdown",
    "secret",
    "stack_file_name",
]
