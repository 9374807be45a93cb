"""docs/design.md's recipe for adding a model family, followed in a copy of the source tree, and what a
new family must then pass: ``dllm generate``, ``dllm bench`` (static and BlockServe batches give the same
tokens), ``dllm serve`` answering the official openai client, and the regenerated CRD, chart and lists.

The recipe: a module in ``engine_pod/families/`` that builds the family's ``ModelFamily``, its path in
``FAMILY_MODULES``, a CPU-sized random preset in ``dllm_contracts/model_presets.py``, then
``scripts/generate_family_tables.py``. Nothing else of the tree is edited."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import openai
import torch
import yaml

from tests.naive_reference import NaiveModel
from tests.operator.crd_utils import admit
from tests.serving.serve_process import Serve
from tests.serving_utils import write_served_model

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("engine_pod", "dllm_contracts", "gateway", "operator", "scripts", "crds", "charts", "docs")
FILES = ("README.md", "pyproject.toml")
REGISTRY = "engine_pod/families/registry.py"
PRESETS = "dllm_contracts/model_presets.py"


@dataclass(frozen=True)
class NewFamily:
    """What the recipe adds for one family."""

    name: str  # its family name and model_type
    display_name: str
    module: str  # the source of engine_pod/families/<name>.py
    preset: str  # the name of its CPU-sized preset
    preset_fields: str  # a Python expression: the preset's config.json fields

    @property
    def served_name(self) -> str:
        return f"tiny-{self.name.replace('_', '-')}"


def follow_the_recipe(root: Path, family: NewFamily) -> Path:
    """A copy of the tree at ``root`` with ``family`` added as docs/design.md says, tables regenerated."""
    for name in SOURCES:
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in FILES:
        shutil.copyfile(ROOT / name, root / name)
    (root / f"engine_pod/families/{family.name}.py").write_text(family.module)
    registry = root / REGISTRY
    listed = re.compile(r"(FAMILY_MODULES = \((?:\n    \"[\w.]+\",)+)\n\)")
    text, count = listed.subn(rf'\1\n    "engine_pod.families.{family.name}",\n)', registry.read_text())
    assert count == 1, "FAMILY_MODULES is not the tuple the recipe expects"
    registry.write_text(text)
    presets = root / PRESETS
    presets.write_text(presets.read_text() + f"\nPRESETS[{family.preset!r}] = {family.preset_fields}\n")
    run(root, "scripts/generate_family_tables.py")
    return root


def checkpoint_of(directory: Path, family: NewFamily, **fields) -> Path:
    """A small random checkpoint in LLaDA's layout (with the project's tokenizer), labelled ``family``."""
    written = write_served_model(directory)
    raw = json.loads((written / "config.json").read_text())
    raw |= {"model_type": family.name, **fields}
    (written / "config.json").write_text(json.dumps(raw, indent=2))
    return written


LOGITS_PROBE = """
import sys
import torch
from engine_pod.loading.loader import load_model
loaded = load_model(sys.argv[1], dtype="float64")
with torch.no_grad():
    logits = loaded.model(torch.tensor([[int(t) for t in sys.argv[3].split(",")]]))[0]
torch.save({"family": loaded.config.family, "logits": logits}, sys.argv[2])
"""
PROBE_IDS = list(range(5, 29))  # a sequence of the served tokenizer's ids, mask id and EOS not among them


def engine_logits(root: Path, model: str, out: Path) -> tuple[str, torch.Tensor]:
    """(family, float64 logits [T, V] of PROBE_IDS) as the copied tree's engine loads and runs ``model``."""
    run(root, "-c", LOGITS_PROBE, model, str(out), ",".join(map(str, PROBE_IDS)))
    found = torch.load(out)
    return found["family"], found["logits"]


def naive_logits(model_dir: Path, parallel: bool = False) -> torch.Tensor:
    """The same logits from tests/naive_reference.py, which shares no code with the engine."""
    return NaiveModel(model_dir, parallel=parallel).forward(PROBE_IDS, list(range(len(PROBE_IDS))))[0]


def environment(root: Path) -> dict[str, str]:
    return os.environ | {"PYTHONPATH": f"{root}:{root / 'operator'}", "OMP_NUM_THREADS": "1"}


def run(root: Path, *argv: str) -> str:
    """A Python entry point of the copied tree, run from it (``-m`` and scripts put it first on the path)."""
    done = subprocess.run(
        [sys.executable, *argv], cwd=root, env=environment(root), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def dllm(root: Path, *argv: str) -> str:
    return run(root, "-m", "engine_pod.cli.main", *argv)


def generate_and_bench(root: Path, model: str) -> None:
    """``dllm generate`` writes an answer; ``dllm bench`` gives every request the same tokens in static and
    BlockServe batches."""
    argv = [
        "generate",
        "--model",
        model,
        "--prompt",
        "count to 5 .",
        "--gen-length",
        "16",
        "--block-length",
        "8",
    ]
    out = dllm(root, *argv)
    assert out.strip()
    report = root / "bench.json"
    workload = "synthetic:n=6,prompt=4-24,gen=8-16,seed=0"
    dllm(
        root,
        "bench",
        "--model",
        model,
        "--workload",
        workload,
        "--policy",
        "static,blockserve",
        "--no-isolate",  # both policies in one process: the tokens are compared, not peaks
        "--json",
        str(report),
    )
    assert json.loads(report.read_text())["outputs_identical"] is True


def serve_answers(root: Path, model: str, served_name: str, tmp: Path) -> None:
    """``dllm serve`` of the copied tree answers the official openai client."""
    server = Serve(tmp, "--model", model, env=environment(root), cwd=root)
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model=served_name, prompt="count to 5 .", max_tokens=16)
        assert answer.choices[0].finish_reason in ("stop", "length")
        chat = client.chat.completions.create(
            model=served_name, messages=[{"role": "user", "content": "count to 3 ."}], max_tokens=8
        )
        assert chat.choices[0].finish_reason in ("stop", "length")
    finally:
        assert server.stop() == 0


def lists_name_it(root: Path, family: NewFamily) -> None:
    """The regenerated CRD and chart accept the family; README, the package summary, docs/models.md, the
    contracts' table and the op census's grid name it."""
    crd = yaml.safe_load((root / "crds/dllmservices.dllm.dev.yaml").read_text())
    assert admit({"model": {"uri": f"acme/{family.served_name}", "family": family.name}}, crd) == []
    assert admit({"model": {"uri": "acme/x", "family": "gpt2"}}, crd) != []
    chart = root / "charts/dllm-operator"
    assert (chart / "crds/dllmservices.dllm.dev.yaml").read_text() == (
        root / "crds/dllmservices.dllm.dev.yaml"
    ).read_text()
    assert family.name in yaml.safe_load((chart / "values.yaml").read_text())["supportedFamilies"]
    schema = json.loads((chart / "values.schema.json").read_text())
    assert family.name in schema["properties"]["supportedFamilies"]["items"]["enum"]
    readme = (root / "README.md").read_text()
    assert f", {family.display_name})" in readme.split("\n\n")[1]
    assert f"| `{family.name}` |" in readme and f"`random:{family.preset}`" in readme
    assert f"{family.display_name})" in (root / "pyproject.toml").read_text()
    assert f"`{family.name}`, on the same commands" in (root / "docs/models.md").read_text()
    probe = (
        "from dllm_contracts.families import FAMILIES\n"
        "from engine_pod.bench.census_grid import MODELS\n"
        "print(' '.join(FAMILIES)); print(' '.join(MODELS))\n"
    )
    families, census = run(root, "-c", probe).splitlines()
    assert family.name in families.split() and f"random:{family.preset}" in census.split()
    run(root, "scripts/generate_family_tables.py", "--check")
