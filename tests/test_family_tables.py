"""scripts/generate_family_tables.py: the CRD's, the chart's, dllm_contracts', README's, the package
summary's and docs/models.md's family lists are what the engine's family registry gives, a drifted copy is
caught and repaired, and a new family reaches them all (the op census's grid, which reads the contracts'
table, included)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest
import yaml

from dllm_contracts.families import FAMILY_NAMES
from engine_pod.families.registry import family_names
from tests.doc_commands import ROOT
from tests.operator.crd_utils import admit, spec_schema

SCRIPT = ROOT / "scripts" / "generate_family_tables.py"
PLANTED = "not_a_family"


def _load_script():
    spec = importlib.util.spec_from_file_location("generate_family_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


generator = _load_script()


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_repository_is_what_the_registry_gives():
    done = run_script("--check")
    assert done.returncode == 0, done.stderr


def _drift_enum(text: str) -> str:
    return text.replace(f", {family_names()[-1]}]", f", {PLANTED}]", 1)


def _drift_table(text: str) -> str:
    return text.replace(f'"name": "{family_names()[-1]}"', f'"name": "{PLANTED}"', 1)


def _drift_readme_row(text: str) -> str:
    return text.replace(f"| `{family_names()[-1]}` |", f"| `{PLANTED}` |", 1)


def _drift_display_list(text: str) -> str:
    return text.replace(f", {FAMILY_NAMES[family_names()[-1]]})", ")", 1)


def _drift_flag_list(text: str) -> str:
    return text.replace(f" or `{family_names()[-1]}`", "", 1)


def _copy_files(root) -> None:
    for name in generator.FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, root / name)


@pytest.mark.parametrize(
    "path, drift",
    [
        (generator.README, _drift_readme_row),
        (generator.README, _drift_display_list),
        (generator.PYPROJECT, _drift_display_list),
        (generator.MODELS_DOC, _drift_flag_list),
    ],
    ids=["readme-table", "readme-intro", "pyproject", "models-doc"],
)
def test_a_drifted_document_is_found_and_written_back(tmp_path, path, drift):
    """The lists in prose, checked in this process (the script's command line is the test below's)."""
    _copy_files(tmp_path)
    original = (ROOT / path).read_text()
    drifted = drift(original)
    assert drifted != original
    (tmp_path / path).write_text(drifted)
    written = generator.generated(tmp_path, generator.registry_rows())
    assert generator.stale_files(tmp_path, written) == [path]
    assert written[path] == original


@pytest.mark.parametrize(
    "path, drift",
    [(generator.CRDS[0], _drift_enum), (generator.VALUES, _drift_enum), (generator.TABLE, _drift_table)],
    ids=["crd", "values", "table"],
)
def test_a_drifted_file_is_named_by_check_and_repaired(tmp_path, path, drift, caplog):
    """The script's command line (its main, in this process: the repository's own --check above runs it as
    a script): --check names the drifted file alone and writes nothing, a plain run writes it back."""
    _copy_files(tmp_path)
    original = (ROOT / path).read_text()
    drifted = drift(original)
    assert drifted != original
    (tmp_path / path).write_text(drifted)

    assert generator.main(["--check", "--root", str(tmp_path)]) == 1, caplog.text
    named = [name for name in generator.FILES if name in caplog.text]
    assert named == [path], caplog.text
    assert (tmp_path / path).read_text() == drifted  # --check writes nothing

    caplog.clear()
    assert generator.main(["--root", str(tmp_path)]) == 0, caplog.text
    assert (tmp_path / path).read_text() == original
    assert generator.main(["--check", "--root", str(tmp_path)]) == 0, caplog.text


NEW = generator.FamilyRow(
    "tiny_canvas",
    "TinyCanvas",
    "TinyCanvas, a family made up for this test",
    64,
    16,
    "canvas",
    "acme/TinyCanvas-1B",
    "tiny-canvas-tiny",
    True,
    ("tiny_canvas",),
    2048,
)


def _service(**decoding) -> dict:
    return {"model": {"uri": "x", "family": NEW.name}, "decoding": decoding}


def test_a_new_family_reaches_the_crd_and_its_schema_accepts_a_service_of_it():
    written = generator.generated(ROOT, (*generator.registry_rows(), NEW))
    crd = yaml.safe_load(written[generator.CRDS[0]])
    assert written[generator.CRDS[1]] == written[generator.CRDS[0]]
    fields = spec_schema(crd)["properties"]
    assert fields["model"]["properties"]["family"]["enum"] == [*family_names(), NEW.name]
    assert f"{NEW.name} for {NEW.summary}" in fields["model"]["properties"]["family"]["description"]
    assert "tiny_canvas 64" in fields["decoding"]["properties"]["blockLength"]["description"]
    assert "tiny_canvas 16" in fields["decoding"]["properties"]["stepsPerBlock"]["description"]

    assert admit(_service(maxGenerationTokens=128)) != []  # today's CRD knows no such family
    assert admit(_service(maxGenerationTokens=128), crd) == []
    # its defaults, not the default family's 32 and 32, are what the CEL rules hold a service to
    assert any("must divide" in failure for failure in admit(_service(maxGenerationTokens=96), crd))
    assert admit(_service(blockLength=16, maxGenerationTokens=128), crd) == []
    # a family with experts may spread them (parallelism.expert); one without may not
    spread = _service(maxGenerationTokens=128) | {"parallelism": {"expert": 2}}
    assert admit(spread, crd) == []
    dense = spread | {"model": {"uri": "x", "family": "llada"}}
    assert any("needs a mixture-of-experts family" in failure for failure in admit(dense, crd))


def test_a_new_family_reaches_the_chart_and_the_contracts_table():
    written = generator.generated(ROOT, (*generator.registry_rows(), NEW))
    families = [*family_names(), NEW.name]
    assert yaml.safe_load(written[generator.VALUES])["supportedFamilies"] == families
    schema = json.loads(written[generator.VALUES_SCHEMA])["properties"]
    assert schema["supportedFamilies"]["items"]["enum"] == families
    assert schema["example"]["properties"]["family"]["enum"] == families
    table: dict = {}
    exec(written[generator.TABLE], table)
    assert [row["name"] for row in table["FAMILY_TABLE"]] == families
    assert table["FAMILY_TABLE"][-1] == {
        "name": NEW.name,
        "display_name": NEW.display_name,
        "summary": NEW.summary,
        "block_length": 64,
        "steps_per_block": 16,
        "kind": "canvas",
        "tiny_preset": "tiny-canvas-tiny",
        "expert_parallel": True,
        "model_types": ["tiny_canvas"],
        "default_context": 2048,
        "request_settings": (),  # it adds no per-request setting
    }


def test_a_new_family_reaches_the_readme_the_package_summary_and_the_models_doc():
    written = generator.generated(ROOT, (*generator.registry_rows(), NEW))
    readme = written[generator.README]
    assert readme.split("\n\n")[1].count(f", {NEW.display_name})") == 1  # the paragraph under the title
    row = "| `tiny_canvas` | acme/TinyCanvas-1B | causal encoder, bidirectional canvas |"
    assert row in readme and "| `random:tiny-canvas-tiny` |" in readme
    models = readme.split("\n## Models\n", 1)[1].split("\n## ", 1)[0]
    assert [line.split("`")[1] for line in models.splitlines() if line.startswith("| `")] == [
        *family_names(),
        NEW.name,
    ]
    assert f"{NEW.display_name}) with BlockServe" in written[generator.PYPROJECT]
    assert f" or `{NEW.name}`, on the same commands" in written[generator.MODELS_DOC]


def test_the_op_census_runs_every_familys_tiny_preset():
    """The census's grid is the contracts' table's presets: each a preset of its own family."""
    from dllm_contracts.model_presets import PRESETS
    from engine_pod.bench.census_grid import MODELS
    from engine_pod.families.registry import family_for_model_type, registered_families

    assert tuple(f"random:{family.tiny_preset}" for family in registered_families()) == MODELS
    for family in registered_families():
        assert family_for_model_type(PRESETS[family.tiny_preset]["model_type"]) is family


def test_a_family_whose_tiny_preset_is_another_familys_is_refused(monkeypatch):
    from engine_pod.families import registry

    families = registry.registered_families()
    variant = replace(families[0], name="acme", model_types=("acme",))  # the first family's preset
    monkeypatch.setattr(registry, "registered_families", lambda: (*families, variant))
    with pytest.raises(generator.GenerationError, match="acme: its tiny_preset"):
        generator.registry_rows()


def test_a_family_name_the_crd_cannot_hold_is_refused(tmp_path):
    rows = (*generator.registry_rows(), replace(NEW, name="Tiny-Canvas"))
    assert generator.main(["--root", str(tmp_path)], rows=rows) == 2
    assert not any(tmp_path.iterdir())
