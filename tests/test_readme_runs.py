"""README.md's own commands, run as a user runs them: `dllm serve`, the curl request and the Python example
against it, `dllm generate` on the shipped model's prompts, `dllm bench` and `dllm eval` (these two on a few
requests: as written they take minutes; their command lines as written are parsed in
``tests/test_doc_commands.py``, as is `dllm profile`, a child process per grid shape)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys

import pytest

from engine_pod.cli.main import main
from tests.doc_commands import ROOT, Command, fenced_commands, table_commands
from tests.serving.serve_process import running

README = ROOT / "README.md"
TIMEOUT_S = 600


def _dllm(argv: list[str]) -> list[str]:
    """``dllm`` as installed (the console script), else the same entry point through this Python."""
    found = shutil.which("dllm")
    return [found, *argv] if found else [sys.executable, "-m", "engine_pod.cli.main", *argv]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr[-2000:]}"
    return done


def _table(command: str) -> Command:
    return next(c for c in table_commands(README) if " ".join(c.argv).startswith(command))


def _shipped_model_table() -> list[tuple[str, str]]:
    """README's `| family | chat prompt | answer |` rows: (the first prompt, the answer)."""
    rows = re.findall(r"^\| \w+ \| `([^`]+)`[^|]*\| `([^`]+)` \|$", README.read_text(), re.MULTILINE)
    assert len(rows) == 4, rows
    return rows


def _in_this_process(argv: list[str]) -> str:
    """What ``dllm`` with ``argv`` prints, run in this process (its torch already loaded)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


@pytest.mark.parametrize(
    ("row", "prompt", "answer"), [(i, *row) for i, row in enumerate(_shipped_model_table())]
)
def test_dllm_generate_answers_as_the_readme_says(row, prompt, answer):
    """README's command as written for the first row (`count to 12 .`), run as a user runs it; the same
    command with each other row's prompt, in this process (the same entry point, one torch import fewer)."""
    command = _table("dllm generate")
    assert command.argv[1:] == ("generate", "--prompt", "count to 12 .", "--chat")
    argv = list(command.argv[1:])
    argv[argv.index("--prompt") + 1] = prompt
    printed = _run(_dllm(argv)).stdout if row == 0 else _in_this_process(argv)
    assert printed.strip() == answer


def test_dllm_bench_prints_its_table_without_json():
    argv = [*_table("dllm bench").argv[1:], "--limit", "4", "--no-isolate", "--no-margins"]
    out = _in_this_process(argv)  # a few requests, so not as written: run here (the console script: above)
    for policy in ("sequential", "static", "blockserve"):
        assert re.search(rf"^{policy}\s+\d", out, re.MULTILINE), out
    assert "outputs identical across policies: True" in out


def test_dllm_eval_reports_exact_match():
    out = _in_this_process([*_table("dllm eval").argv[1:], "--n", "4"])  # as bench, above
    assert "exact" in out.lower(), out


def _serve_commands() -> dict[str, Command]:
    commands = [c for c in fenced_commands(README) if c.program in {"dllm", "curl"} and not c.env]
    first: dict[str, Command] = {}
    for command in commands:  # README's first serve and curl lines (later ones serve other models)
        first.setdefault(command.argv[1] if command.program == "dllm" else "curl", command)
    return first


def _python_example() -> tuple[str, str]:
    """README's Python block and the output its last line's comment promises."""
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL).group(1)
    expected = block.strip().splitlines()[-1].split("#", 1)[1].strip()
    return block, expected


def test_serve_then_ask_with_curl_and_the_openai_client(tmp_path):
    commands = _serve_commands()
    serve = commands["serve"]
    assert serve.argv == ("dllm", "serve")
    with running(tmp_path) as server:
        printed = server.log.read_text()
        promised = serve.comment.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}")
        assert promised in printed, printed
        curl = [arg.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}") for arg in commands["curl"].argv]
        reply = json.loads(_run(curl).stdout)
        assert reply["choices"][0]["message"]["content"] == "t u v w x y z"
        block, expected = _python_example()
        script = block.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}")
        assert _run([sys.executable, "-c", script]).stdout.strip() == expected
