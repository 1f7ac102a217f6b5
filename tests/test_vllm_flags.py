"""The `vllm serve` flag reference of the pinned release, its generator, and the stack's argv against it.

- The checked-in reference (infra/catalog/vllm/vllm-<version>.json) names its
  release and wheel, and holds the flags and registry names the serving layer
  relies on.
- The generator (infra/catalog/vllm/extract.py) run on a small source tree laid
  out like the wheel's applies `_compute_kwargs`' rules (choices vs. values,
  boolean pairs, nargs, kwargs patches) and reads the registries; with
  `VLLM_WHEEL` pointing at the release's wheel it regenerates the checked-in file
  exactly.
- `check_serve_argv` refuses what the release would refuse, and the argv of
  every stack file and of a kimi-k3 variant passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra.catalog import vllm as reference
from infra.catalog.vllm import extract
from infra.config import load_stack_file
from infra.k8s import raycluster
from infra.planning.plan import make_plan

REPO = Path(__file__).resolve().parent.parent
VERSION = load_stack_file("prod", REPO).serving.vllm_version


def test_the_reference_is_the_pinned_release_and_names_its_wheel():
    doc = reference.load_reference(VERSION)
    assert doc["vllm_version"] == VERSION
    assert doc["wheel"]["file"].startswith(f"vllm-{VERSION}-") and doc["wheel"]["file"].endswith(".whl")
    assert len(doc["wheel"]["sha256"]) == 64 and int(doc["wheel"]["sha256"], 16) >= 0
    assert len(doc["flags"]) > 300
    # Every stack file pins a release that has a reference.
    for stack in ("prod", "test"):
        assert load_stack_file(stack, REPO).serving.vllm_version in reference.known_releases()


def test_an_unknown_release_says_how_to_generate_its_reference():
    with pytest.raises(reference.UnknownRelease, match="bin/vllm-flag-reference 0.0.1"):
        reference.check_serve_argv(["--port", "8000"], "0.0.1")


# ---- check_serve_argv -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tensor-parallel-size", "eight"], "takes an integer"),
        (["--kv-cache-dtype", "fp4"], "--kv-cache-dtype 'fp4' is not a value"),
        (["--distributed-executor-backend", "rayy"], "is not a value this release accepts"),
        (["--tokenizer-mode", "deepseek_v4_pro"], "--tokenizer-mode 'deepseek_v4_pro'"),
        (["--reasoning-parser", "kimi-k3"], "--reasoning-parser 'kimi-k3'"),
        (["--tool-call-parser", "deepseekv4", "--enable-auto-tool-choice"], "--tool-call-parser 'deepseekv4'"),
        (["--enable-auto-tool-choice"], "requires --tool-call-parser"),
        (["--safetensors-load-strategy", "mmap"], "is not one of"),
        (["--trust-remote-code=true"], "takes no value"),
        (["--disable-trust-remote-code"], "is not a flag"),  # the pair is --trust-remote-code / --no-trust-remote-code
        (["--enable-expert-paralel"], "is not a flag"),
        (["--tensor-parallel"], "abbreviation of --tensor-parallel-size"),
        (["--max-model-len", "128q"], "such as 131072"),
        (["--max-num-seqs", "8", "--max-num-seqs", "16"], "given twice"),
        (["--compilation-config", "{mode: 0}"], "takes JSON"),
        (["--gpu-memory-utilization"], "needs a value"),
    ],
)
def test_what_the_release_refuses_is_refused(argv, message):
    problems = reference.check_serve_argv(["vllm", "serve", "/models/x", *argv], VERSION)
    assert any(message in p for p in problems), problems


def test_what_the_release_accepts_is_accepted():
    argv = [
        "vllm", "serve", "/models/org/m", "--served-model-name", "org/m",
        "--tensor_parallel_size", "8", "-pp", "4", "--max-model-len", "128K", "--max-num-batched-tokens", "8k",
        "--gpu-memory-utilization=0.90", "--kv-cache-dtype", "fp8_ds_mla", "--no-enable-expert-parallel",
        "--disable-auto-tool-choice", "--moe-backend", "Deep-GEMM", "--compilation-config.mode", "0",
        "--reasoning-parser", "none", "--middleware", "a.b", "--middleware", "c.d",
    ]  # fmt: skip
    assert reference.check_serve_argv(argv, VERSION) == []


STACKS = ["prod", "test"]


def _head_argv(root: Path, stack: str) -> list[str]:
    from tests.test_rayspec import make_spec, plan_for, served

    spec = make_spec(plan_for(root, stack))
    return served(raycluster.raycluster(spec)["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0])


@pytest.mark.parametrize("stack", STACKS)
def test_every_stacks_vllm_serve_argv_passes(stack):
    argv = _head_argv(REPO, stack)
    assert argv[:2] == ["vllm", "serve"]
    assert reference.check_serve_argv(argv, load_stack_file(stack, REPO).serving.vllm_version) == []


@pytest.mark.parametrize("model, instance", [("kimi-k3", "p5e.48xlarge"), ("deepseek-v4-flash", "p5.48xlarge")])
def test_model_variants_argv_passes(tmp_path, model, instance):
    from tests.test_rayspec import modified_config

    argv = _head_argv(modified_config(tmp_path, model, instance), "prod")
    assert reference.check_serve_argv(argv, VERSION) == []


# ---- data parallel over nodes ------------------------------------------------------------------------


def _ray_dp_placement(gpus_per_node: list[int], world_size: int, dp: int, local: int) -> list[int]:
    """DP ranks per node as vLLM 0.34.0 places them with `--data-parallel-backend ray`: a transcription
    of v1/engine/utils.py CoreEngineActorManager.create_dp_placement_groups under its default
    VLLM_RAY_DP_PACK_STRATEGY "strict" (the head, first, must hold `local` ranks of `world_size`
    GPUs; another node takes `local` ranks when they fit and is skipped otherwise; fewer than `dp`
    placement groups in all is an error)."""
    placed = []
    for index, gpus in enumerate(gpus_per_node):
        fit = gpus // world_size
        if fit < local:
            if index == 0:
                raise ValueError(f"Not enough resources to allocate {local} DP ranks on DP master node")
            placed.append(0)
            continue
        placed.append(min(local, dp - sum(placed)))
        if sum(placed) == dp:
            break
    if sum(placed) < dp:
        raise ValueError(f"Not enough resources to allocate {dp} placement groups")
    return placed


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("model, instance, nodes, tp", [("qwen3-30b-a3b", "p5.48xlarge", 2, 4),
                                                         ("gpt-oss-120b", "p5.48xlarge", 2, 8),
                                                         ("qwen3-0.6b", "g6e.12xlarge", 3, 1)])  # fmt: skip
def test_data_parallel_over_nodes_starts_every_rank_where_vllm_places_it(model, instance, nodes, tp):
    from infra.catalog.instances import get_instance_type
    from infra.planning import PlanRequest

    plan = make_plan(PlanRequest(model=model, instance_type=instance, nodes=nodes, tp=tp, pp=1))
    argv = list(plan.serving_args)
    assert reference.check_serve_argv(["vllm", "serve", "/models/x", *argv], VERSION) == []
    dp, gpn = int(_flag(argv, "--data-parallel-size")), get_instance_type(instance).gpu_count
    assert dp == nodes * gpn // tp > 1
    # One command on the head starts them all, through Ray, at the head's address (not 127.0.0.1).
    assert _flag(argv, "--data-parallel-backend") == "ray"
    local = int(_flag(argv, "--data-parallel-size-local"))
    # Every node runs as many ranks as it has room for: all GPUs serve.
    assert _ray_dp_placement([gpn] * nodes, tp, dp, local) == [gpn // tp] * nodes
    # Left to vLLM's default (every rank local), the head could not hold them.
    with pytest.raises(ValueError, match="DP master node"):
        _ray_dp_placement([gpn] * nodes, tp, dp, dp)


def test_data_parallel_on_one_node_keeps_vllms_default_backend():
    from infra.planning import PlanRequest

    plan = make_plan(PlanRequest(model="qwen3-30b-a3b", instance_type="p5.48xlarge", nodes=1, tp=2))
    argv = list(plan.serving_args)
    assert _flag(argv, "--data-parallel-size") == "4"
    # "mp": every rank's engine on the head, where all its GPUs are.
    assert "--data-parallel-backend" not in argv and "--data-parallel-size-local" not in argv


# ---- the generator ------------------------------------------------------------------------------------

MINI = {
    "_version.py": "__version__ = version = '9.9.9'\n",
    "config/__init__.py": "from vllm.config.cache import CacheConfig\nfrom vllm.config.parallel import ParallelConfig\n",
    "config/utils.py": "def config(cls):\n    return cls\n",
    "config/cache.py": textwrap.dedent(
        """\
        from typing import Literal
        from vllm.config.utils import config
        CacheDType = Literal["auto", "fp8", "fp8_ds_mla"]
        Algo = Literal["sha256", "xxhash"]
        @config
        class CacheConfig:
            cache_dtype: CacheDType | str = "auto"
            hash_algo: Algo = "sha256"
            block_size: int | None = None
            enable_prefix_caching: bool | None = None
            gpu_memory_utilization: float = 0.9
        """
    ),
    "config/parallel.py": textwrap.dedent(
        """\
        from typing import Literal
        from vllm.config.utils import config
        from vllm.config.kernel import NONE_BACKEND
        Backend = Literal["naive", "deepep", NONE_BACKEND]
        @config
        class ParallelConfig:
            tensor_parallel_size: int = 1
            all2all_backend: Literal["naive", "deepep", "none"] = "naive"
            sizes: list[int] | None = None
        """
    ),
    "config/kernel.py": 'from typing import Final\nNONE_BACKEND: Final = "none"\n',
    "config/model.py": textwrap.dedent(
        """\
        class ModelConfig:
            def __post_init__(self):
                arch = self.arch
                if self.tokenizer_mode == "auto":
                    if self.model_impl == "x":
                        self.tokenizer_mode = "x"
                    elif arch == "AForCausalLM":
                        self.tokenizer_mode = "a"
                    elif arch in ("BForCausalLM", "B2ForCausalLM"):
                        self.tokenizer_mode = "b"
        """
    ),
    "entrypoints/common/cli_args.py": textwrap.dedent(
        """\
        from vllm.config.utils import config
        @config
        class BaseFrontendArgs:
            enable_auto_tool_choice: bool = False
            tool_call_parser: str | None = None
            default_kwargs: dict | None = None
            @classmethod
            def _customize_cli_kwargs(cls, frontend_kwargs):
                frontend_kwargs["default_kwargs"]["type"] = json.loads
                return frontend_kwargs
        @config
        class FrontendArgs(BaseFrontendArgs):
            port: int = 8000
            middleware: list[str] = field(default_factory=list)
            @classmethod
            def _customize_cli_kwargs(cls, frontend_kwargs):
                frontend_kwargs = super()._customize_cli_kwargs(frontend_kwargs)
                frontend_kwargs["middleware"]["action"] = "append"
                del frontend_kwargs["middleware"]["nargs"]
                return frontend_kwargs
        def make_arg_parser(parser):
            parser.add_argument("model_tag", type=str, nargs="?")
            parser.add_argument("--headless", action="store_true", default=False)
            parser.add_argument("--api-server-count", "-asc", type=int, default=None)
            parser = FrontendArgs.add_cli_args(parser)
            return parser
        """
    ),
    "engine/arg_utils.py": textwrap.dedent(
        """\
        from vllm.config import CacheConfig, ParallelConfig
        from vllm.config.kernel import NONE_BACKEND
        class EngineArgs:
            @staticmethod
            def add_cli_args(parser):
                cache_kwargs = get_kwargs(CacheConfig)
                cache_group.add_argument("--kv-cache-dtype", **cache_kwargs["cache_dtype"])
                cache_group.add_argument("--prefix-caching-hash-algo", **cache_kwargs["hash_algo"])
                cache_group.add_argument("--block-size", **cache_kwargs["block_size"])
                cache_group.add_argument("--enable-prefix-caching", **{**cache_kwargs["enable_prefix_caching"], "default": None})
                cache_group.add_argument("--gpu-memory-utilization", "--device-memory-utilization", **cache_kwargs["gpu_memory_utilization"])
                parallel_kwargs = get_kwargs(ParallelConfig)
                parallel_kwargs["all2all_backend"]["choices"].remove(NONE_BACKEND)
                parallel_group.add_argument("--tensor-parallel-size", "-tp", **parallel_kwargs["tensor_parallel_size"])
                parallel_group.add_argument("--all2all-backend", **parallel_kwargs["all2all_backend"])
                sizes = parallel_kwargs["sizes"]
                parallel_group.add_argument("--sizes", **sizes)
                parser.add_argument("--log-level", choices=["INFO", "DEBUG"], default="INFO")
        class AsyncEngineArgs(EngineArgs):
            @staticmethod
            def add_cli_args(parser, async_args_only=False):
                parser = EngineArgs.add_cli_args(parser)
                parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction, default=False)
                return parser
        """
    ),
    "reasoning/__init__.py": '_REASONING_PARSERS_TO_REGISTER = {"r1": ("m", "C"), "r2": ("m", "C")}\n',
    "tool_parsers/__init__.py": '_TOOL_PARSERS_TO_REGISTER = {"t1": ("m", "C")}\n',
    "tokenizers/registry.py": '_VLLM_TOKENIZERS = {"hf": ("hf", "H"), "a": ("a", "A"), "b": ("hf", "H")}\n',
    "transformers_utils/config.py": '_CONFIG_REGISTRY = LazyConfigDict(a_type="AConfig", **{"b-type": "BConfig"})\n',
    "model_executor/models/registry.py": '_TEXT_GENERATION_MODELS = {"AForCausalLM": ("a", "A")}\n_MULTIMODAL_MODELS = {"BForCausalLM": ("b", "B")}\n',
    "envs.py": 'environment_variables = {"VLLM_HOST_IP": lambda: 1, "VLLM_CACHE_ROOT": lambda: 2}\n',
}


@pytest.fixture()
def mini_tree(tmp_path: Path) -> Path:
    for rel, text in MINI.items():
        path = tmp_path / "vllm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_generator_applies_the_releases_rules(mini_tree):
    doc = extract.reference(extract.Tree.open(mini_tree))
    flags = doc["flags"]
    assert doc["vllm_version"] == "9.9.9" and doc["wheel"] == {"file": None, "sha256": None}
    assert "model_tag" not in flags and set(flags) == {
        "--headless", "--api-server-count", "--enable-auto-tool-choice", "--tool-call-parser", "--default-kwargs",
        "--port", "--middleware", "--kv-cache-dtype", "--prefix-caching-hash-algo", "--block-size",
        "--enable-prefix-caching", "--gpu-memory-utilization", "--tensor-parallel-size", "--all2all-backend",
        "--sizes", "--log-level", "--enable-log-requests",
    }  # fmt: skip
    # Literal | str: advisory values; a bare Literal: enforced choices.
    assert flags["--kv-cache-dtype"]["values"] == ["auto", "fp8", "fp8_ds_mla"] and flags["--kv-cache-dtype"]["choices"] is None
    assert flags["--prefix-caching-hash-algo"]["choices"] == ["sha256", "xxhash"]
    # A value `.remove`d from the choices in add_cli_args (a constant imported from elsewhere) is gone.
    assert flags["--all2all-backend"]["choices"] == ["deepep", "naive"]
    # Booleans: the --no- form, and --enable-/--disable- pairs.
    assert flags["--enable-auto-tool-choice"]["negations"] == ["--disable-auto-tool-choice", "--no-enable-auto-tool-choice"]
    assert flags["--enable-prefix-caching"]["type"] == "bool" and flags["--enable-log-requests"]["type"] == "bool"
    assert flags["--headless"]["type"] == "flag"
    assert flags["--tensor-parallel-size"]["aliases"] == ["-tp"] and flags["--api-server-count"]["aliases"] == ["-asc"]
    assert flags["--gpu-memory-utilization"]["aliases"] == ["--device-memory-utilization"]
    assert (flags["--block-size"]["type"], flags["--block-size"]["optional"]) == ("int", True)
    assert (flags["--sizes"]["type"], flags["--sizes"]["nargs"]) == ("int", "+")
    assert flags["--default-kwargs"]["type"] == "json"
    assert (flags["--middleware"]["nargs"], flags["--middleware"].get("repeatable")) == (None, True)
    assert flags["--log-level"]["choices"] == ["INFO", "DEBUG"]
    # Registry values replace a free string's.
    assert flags["--tool-call-parser"]["values"] == ["t1"]
    reg = doc["registries"]
    assert reg["reasoning_parsers"] == ["r1", "r2"] and reg["tokenizer_modes"] == ["a", "b", "hf"]
    assert reg["config_model_types"] == ["a_type", "b-type"]
    assert reg["architectures"] == ["AForCausalLM", "BForCausalLM"]
    assert reg["auto_tokenizer_modes"] == {"AForCausalLM": "a", "BForCausalLM": "b", "B2ForCausalLM": "b"}
    assert reg["environment_variables"] == ["VLLM_CACHE_ROOT", "VLLM_HOST_IP"]


def test_the_generator_reads_a_wheel_and_records_its_hash(mini_tree, tmp_path):
    import hashlib
    import zipfile

    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path in (mini_tree / "vllm").rglob("*.py"):
            z.write(path, "vllm/" + path.relative_to(mini_tree / "vllm").as_posix())
    out = tmp_path / "ref.json"
    proc = subprocess.run([sys.executable, "-S", str(REPO / "infra/catalog/vllm/extract.py"), str(wheel), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["wheel"] == {"file": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}
    assert doc["flags"] == extract.reference(extract.Tree.open(mini_tree))["flags"]


def test_the_generator_refuses_a_tree_it_does_not_know(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "infra/catalog/vllm/extract.py"), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "engine/arg_utils.py" in proc.stderr


@pytest.mark.parametrize("stack", STACKS)
def test_every_vllm_variable_the_pods_set_is_one_the_release_reads(stack):
    """vLLM warns about (or, with --fail-on-environ-validation, refuses) a VLLM_* variable it does not know."""
    from tests.test_rayspec import make_spec, plan_for

    spec = make_spec(plan_for(REPO, stack))
    names = {e["name"] for t in [raycluster.head_pod_template(spec), raycluster.worker_pod_template(spec)] for e in t["spec"]["containers"][0]["env"]}
    assert {"VLLM_HOST_IP", "VLLM_CACHE_ROOT", "VLLM_ENGINE_READY_TIMEOUT_S", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"} <= names
    assert reference.unknown_environment(names, VERSION) == []
    assert reference.unknown_environment({"VLLM_ENGINE_READY_TIMEOUT"}, VERSION) == ["VLLM_ENGINE_READY_TIMEOUT"]
