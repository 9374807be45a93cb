"""Every shell command README.md and docs/*.md show is checked against what it calls, so the documents
cannot drift from the CLI: ``dllm`` command lines are parsed by the real ``dllm`` parser, scripts' command
lines by the scripts' own parsers (or, for shell scripts, the options they handle), ``helm`` commands
rendered with the real chart, ``kubectl`` files read, request bodies parsed. Commands that need a network,
a cluster, docker or a GPU are checked this way only; README's own commands also run for real
(``tests/test_readme_runs.py``)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest
import yaml

from engine_pod.cli.main import build_parser
from tests.doc_commands import ROOT, Command, all_commands, all_fragments
from tests.helm_tool import helm_binary

SOURCES = (
    "engine_pod",
    "gateway",
    "operator",
    "scripts",
    "tests",
)  # tests: the knobs docs/development.md names
KUBECTL_VERBS = {"get", "apply", "create", "delete", "patch", "port-forward", "rollout", "logs", "describe"}
HELM_UNCHECKED = {"uninstall", "repo", "list", "status"}  # need a cluster; nothing to render
HELM_UPGRADE_ONLY = {"--reuse-values", "--reset-values", "--install"}  # helm template has no such flags
ENVIRONMENT = {"cd", ".", "source", "git"}  # set up the user's shell or clone; nothing of ours to check
# the parse stops after checking the arguments: the script itself never runs
PARSE_ONLY = """
import argparse, runpy, sys
parse = argparse.ArgumentParser.parse_args
def checked(self, args=None, namespace=None):
    parse(self, args, namespace)
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = checked
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _parse_dllm(argv: list[str]) -> None:
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"dllm {' '.join(argv)}: {errors.getvalue().strip().splitlines()[-1]}")
    except argparse.ArgumentError as exc:  # a subcommand's parser that raises instead of exiting
        pytest.fail(f"dllm {' '.join(argv)}: {exc}")


def check_dllm(command: Command) -> None:
    _parse_dllm(list(command.argv[1:]))


def _check_python_script(command: Command, script: str, args: list[str]) -> None:
    assert (ROOT / script).is_file(), f"{command.label}: {script} does not exist"
    env = os.environ | {
        name: str(ROOT / value) for name, value in command.env.items() if name == "PYTHONPATH"
    }
    done = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY, script, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{command.label}: {done.stderr.strip()[-1000:]}"


def _check_pytest(command: Command, args: list[str]) -> None:
    for arg in args:
        if arg.startswith("tests/"):
            assert (ROOT / arg.split("::")[0]).exists(), f"{command.label}: {arg} does not exist"
    options = [arg for arg in args if arg.startswith("-")]
    known = {"-m", "-n", "-q", "-x", "-k", "-v", "-s", "--durations"}
    assert set(options) <= known, f"{command.label}: options {set(options) - known} unchecked"


def check_python(command: Command) -> None:
    args = list(command.argv[1:])
    if args[:2] == ["-m", "venv"]:
        return  # the user's environment
    if args[:2] == ["-m", "pytest"]:
        return _check_pytest(command, args[2:])
    if args[:2] == ["-m", "gateway"]:
        assert len(args) == 2, f"{command.label}: python -m gateway takes its settings from DLLM_* variables"
        return None
    assert args and args[0].endswith(".py"), f"{command.label}: no checker for this python command"
    return _check_python_script(command, args[0], args[1:])


def check_pip(command: Command) -> None:
    """Needs a package index: the files and extras it names must exist."""
    args = list(command.argv[1:])
    assert args[0] == "install", command.label
    section = (
        (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
    )
    extras = re.findall(r"^([\w-]+) = \[", section, re.MULTILINE)
    for flag, value in zip(args, args[1:]):
        if flag == "-c":
            assert (ROOT / value).is_file(), f"{command.label}: {value} does not exist"
    for arg in args:
        match = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
        if match:
            unknown = set(match.group(1).split(",")) - set(extras)
            assert not unknown, f"{command.label}: no extra {unknown} in pyproject.toml"


def check_bash(command: Command) -> None:
    """A script of ours: it exists, bash can parse it, and it handles every option the command passes."""
    script, *args = command.argv[1:]
    path = ROOT / script
    assert path.is_file(), f"{command.label}: {script} does not exist"
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, f"{command.label}: {syntax.stderr}"
    text = path.read_text()
    for option in (arg.split("=")[0] for arg in args if arg.startswith("-")):
        assert re.search(rf"(^|[\s|(]){re.escape(option)}[)|\s]", text, re.MULTILINE), (
            f"{command.label}: {script} does not handle {option}"
        )


def check_helm(command: Command) -> None:
    """Needs a cluster: the chart is rendered with the command's own values instead."""
    action, *args = command.argv[1:]
    if action in HELM_UNCHECKED:
        return
    assert action in {"install", "upgrade", "template"}, f"{command.label}: no checker for helm {action}"
    args = [arg for arg in args if arg not in HELM_UPGRADE_ONLY]
    rendered = subprocess.run(
        [helm_binary(), "template", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert rendered.returncode == 0, f"{command.label}: {rendered.stderr.strip()}"
    assert "kind: Deployment" in rendered.stdout, command.label


def check_kubectl(command: Command) -> None:
    """Needs a cluster: the verb is one kubectl has, every file it applies is a Kubernetes object and a
    patch is JSON."""
    args = list(command.argv[1:])
    verb = next(arg for index, arg in enumerate(args) if not arg.startswith("-") and args[index - 1] != "-n")
    assert verb in KUBECTL_VERBS, f"{command.label}: no checker for kubectl {verb}"
    for flag, value in zip(args, args[1:]):
        if flag == "-f":
            documents = [doc for doc in yaml.safe_load_all((ROOT / value).read_text()) if doc]
            assert documents and all("apiVersion" in doc and "kind" in doc for doc in documents), (
                command.label
            )
        if flag == "-p":
            json.loads(value)


def check_curl(command: Command) -> None:
    """Needs a server (README's own runs in tests/test_readme_runs.py): the URL is ours and the body JSON."""
    args = list(command.argv[1:])
    urls = [arg for arg in args if arg.startswith("http")]
    assert len(urls) == 1 and "/v1/" in urls[0], command.label
    for flag, value in zip(args, args[1:]):
        if flag == "-d":
            json.loads(value)


def check_ruff(command: Command) -> None:
    assert command.argv[1] in {"check", "format"}, command.label
    assert shutil.which("ruff"), "ruff is not installed ([dev] brings it)"


def check_docker(command: Command) -> None:
    """Needs docker and a registry: only a login to a named registry is documented."""
    assert command.argv[1:2] == ("login",) and len(command.argv) == 3, command.label


def check_kind(command: Command) -> None:
    """Needs docker: a cluster of kind is created or deleted by name."""
    args = list(command.argv[1:])
    assert args[:2] in (["create", "cluster"], ["delete", "cluster"]), command.label
    assert "--name" in args, f"{command.label}: name the cluster, as the scripts do"


def check_environment(command: Command) -> None:
    """The user's own shell (cd, activate, git): nothing of ours to check."""


CHECKS: dict[str, Callable[[Command], None]] = {
    "dllm": check_dllm,
    "python": check_python,
    "pip": check_pip,
    "bash": check_bash,
    "helm": check_helm,
    "kubectl": check_kubectl,
    "curl": check_curl,
    "ruff": check_ruff,
    "docker": check_docker,
    "kind": check_kind,
} | dict.fromkeys(ENVIRONMENT, check_environment)

COMMANDS = all_commands()
# why a command is checked here rather than run: what it needs that CI has not (or minutes it has not)
NEEDS = {
    "pip": "a package index",
    "git": "a network",
    "kubectl": "a Kubernetes cluster",
    "helm": "a Kubernetes cluster",
    "curl": "a running service (README's own runs in tests/test_readme_runs.py)",
    "ruff": "nothing (CI's style check runs it)",
    "docker": "docker and a registry",
    "kind": "docker",
}
SCRIPT_NEEDS = {
    "scripts/build-images.sh": "docker and a registry",
    "scripts/k8s-e2e.sh": "docker and kind",
    "scripts/gpu-bench.sh": "a GPU",
    "scripts/upgrade-pins.sh": "a package index",
    "scripts/mutation.py": "hours",
}
DLLM_NEEDS = {
    "train": "hours",
    "worker": "a Redis and a queue",
    "serve": "a free port (tests/test_readme_runs.py)",
}


def needs(command: Command) -> str | None:
    """What running ``command`` for real needs (None: nothing of ours to run, or it runs elsewhere)."""
    words = command.argv
    if command.program in NEEDS:
        return NEEDS[command.program]
    if command.program in ENVIRONMENT or words[1:3] in (("-m", "venv"), ("-m", "pytest")):
        return "the user's shell (or the suite itself)"
    script = next((w for w in words[1:] if w.startswith("scripts/")), None)
    if script:
        return SCRIPT_NEEDS.get(script, "minutes of CPU (a benchmark)")
    if command.program == "dllm":
        model = words[words.index("--model") + 1] if "--model" in words else ""
        if "cuda" in words or ("/" in model and not model.startswith(("builtin:", "random:", "."))):
            return "a GPU or the Hugging Face Hub"
        return DLLM_NEEDS.get(words[1], "minutes of CPU (README's own run in tests/test_readme_runs.py)")
    return "a gateway's environment" if words[1:3] == ("-m", "gateway") else None


def _ours(name: str) -> bool:
    """A DLLM_* variable some component reads (its name appears as a string in the source)."""
    quoted = re.compile(rf"[\"']{name}[\"']")
    return any(
        quoted.search(path.read_text()) for top in SOURCES for path in (ROOT / top).rglob("*.py")
    ) or any(name in path.read_text() for path in (ROOT / "scripts").glob("*.sh"))


def test_the_documents_show_commands():
    documents = {command.document for command in COMMANDS}
    assert {"README.md", "docs/benchmarks.md", "docs/api.md", "docs/kubernetes.md"} <= documents
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.label[:100])
def test_every_documented_command_is_what_its_program_accepts(command):
    assert command.program in CHECKS, f"{command.label}: no checker for {command.program!r}; add one"
    assert needs(command), f"{command.label}: say why it is not run (NEEDS), or run it in a test"
    for name in command.env:
        if name.startswith("DLLM_"):
            assert _ours(name), f"{command.label}: nothing reads {name}"
    CHECKS[command.program](command)


@pytest.mark.parametrize("fragment", all_fragments(), ids=lambda c: c.label[:100])
def test_every_dllm_fragment_in_the_text_names_real_options(fragment):
    """``dllm serve --gateway-processes N`` in a sentence: the subcommand and each option exist, and a
    value that is not a placeholder (N, FILE) is one the option takes."""
    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    name, *rest = fragment.argv[1:] or [""]
    if not name:
        return
    assert name in subcommands, f"{fragment.label}: no subcommand {name}"
    actions = subcommands[name]._option_string_actions
    for index, word in enumerate(rest):
        if not word.startswith("-"):
            continue
        option = word.split("=")[0]
        assert option in actions, f"{fragment.label}: dllm {name} has no {option}"
        value = rest[index + 1] if index + 1 < len(rest) else None
        action = actions[option]
        if value is not None and action.nargs != 0 and not value.isupper():
            converted = action.type(value) if action.type else value
            assert not action.choices or converted in action.choices, f"{fragment.label}: {value}"
