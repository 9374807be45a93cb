"""Mutation testing one scope at a time (docs/mutation-testing.md).

mutmut reads one ``[tool.mutmut]`` section; each scope here is a set of modules and the tests that
should catch a change to them. The tracked tree is copied to a scratch folder, the copy's section is
pointed at the scope, and mutmut runs there (its ``mutants/`` stays in the scratch folder, so the
working tree is never touched). Subprocesses the tests start (``dllm serve``) import the mutated copy
too: ``PYTHONPATH`` points at it.

    python scripts/mutation.py queue            # run, then print the survivors as diffs
    python scripts/mutation.py worker --children 2
    python scripts/mutation.py worker --resume  # go on from the last run (see ``--help``)
    python scripts/mutation.py gateway --against tests/serving/test_batches.py --mutants NAME ...
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
logger = logging.getLogger("mutation")
PER_TEST_TIMEOUT_S = 20


@dataclass(frozen=True)
class Scope:
    mutate: list[str]  # globs of the modules whose functions are mutated
    tests: list[str]  # pytest arguments that select the tests run against each mutant


SCOPES = {
    "scheduler": Scope(["engine_pod/scheduler/*"], ["tests/engine_pod/test_scheduler.py"]),
    # the Lua scripts are not Python (mutmut leaves them alone); the single-node half of the protocol
    # tests runs every script, the cluster half repeats it on three masters at ten times the cost
    "queue": Scope(
        [
            "dllm_contracts/queue/ops.py",
            "dllm_contracts/queue/messages.py",
            "dllm_contracts/queue/sync_client.py",
        ],
        ["tests/serving/test_queue_protocol.py", "tests/serving/test_queue_replies.py", "-k", "not cluster"],
    ),
    "worker": Scope(
        [
            "engine_pod/worker/worker.py",
            "engine_pod/worker/claims.py",
            "engine_pod/worker/served.py",
            "engine_pod/worker/wakeups.py",
        ],
        ["tests/serving/test_worker.py", "tests/serving/test_worker_baselines.py"],
    ),
    "gateway": Scope(
        ["gateway/submission.py", "gateway/streaming.py", "gateway/logprobs.py"],
        ["tests/serving/test_gateway_answers.py", "tests/serving/test_gateway_e2e.py"],
    ),
}


def mutmut_section(scope: Scope) -> str:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(f'"{item}"' for item in items) + "]"

    return (
        "[tool.mutmut]\n"
        'source_paths = ["dllm_contracts/", "engine_pod/", "gateway/"]\n'
        f"only_mutate = {toml_list(scope.mutate)}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(scope.tests)}\n"
        # a mutant that hangs the worker's loop or a wait fails its test at this bound instead of
        # mutmut's default (30 times the tests' clean run, minutes per mutant here)
        # and in one process: mutmut counts which tests reach a mutated function in the process it runs
        # pytest in, which the project's default -n (xdist's workers) would leave empty ("no test case
        # for any mutant")
        f'pytest_add_cli_args = ["--timeout", "{PER_TEST_TIMEOUT_S}", "-n", "0"]\n'
        "timeout_multiplier = 2.0\n"
        'also_copy = ["operator/", "crds/", "charts/"]\n\n'
    )


def prepare(scratch: Path, scope: Scope, resume: bool = False) -> None:
    """A copy of the tree (tracked and untracked files git does not ignore, as they are on disk) whose
    mutmut section names ``scope``; with ``resume`` the files are copied over the last run's copy, whose
    results mutmut keeps for every function that did not change."""
    if scratch.exists() and not resume:
        shutil.rmtree(scratch)
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for name in filter(None, tracked):
        source = ROOT / name
        if source.is_file():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, scratch / name)
    pyproject = scratch / "pyproject.toml"
    text = pyproject.read_text()
    replaced, count = re.subn(r"\[tool\.mutmut\]\n(?:[^\[].*\n|\n)*", mutmut_section(scope), text)
    if count != 1:
        raise SystemExit("pyproject.toml has no [tool.mutmut] section to replace")
    pyproject.write_text(replaced)


def survivors(scratch: Path, env: dict[str, str], *, untested: bool = False) -> list[str]:
    """The mutants that survived (and, with ``untested``, those no test reached) in the last run."""
    results = subprocess.run(
        [sys.executable, "-m", "mutmut", "results"], cwd=scratch, env=env, capture_output=True, text=True
    ).stdout
    endings = ("survived", "no tests") if untested else ("survived",)
    return [line.split(":")[0].strip() for line in results.splitlines() if line.strip().endswith(endings)]


def log_line_mutants(scratch: Path, env: dict[str, str], names: list[str]) -> set[str]:
    """Those of ``names`` that change only a log call (its text or arguments): no test reads them."""
    found = set()
    for name in names:
        diff = subprocess.run(
            [sys.executable, "-m", "mutmut", "show", name],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        removed = [line[1:].strip() for line in diff if line.startswith("-") and not line.startswith("---")]
        if removed and all(line.startswith("logger.") for line in removed):
            found.add(name)
    return found


def run(scratch: Path, children: int, resume: bool = False, skip_log_lines: bool = False) -> int:
    # on the path before Python starts, or its import cache skips it
    (scratch / "mutants").mkdir(exist_ok=resume)
    env = os.environ | {"PYTHONPATH": str(scratch / "mutants")}
    mutmut = [sys.executable, "-m", "mutmut"]
    run_mutants = [*mutmut, "run", "--max-children", str(children)]
    earlier = survivors(scratch, env, untested=True) if resume else []
    if skip_log_lines:
        logs = log_line_mutants(scratch, env, earlier)
        logger.info("not testing again %d survivors that change a log line only", len(logs))
        earlier = [name for name in earlier if name not in logs]
    code = subprocess.run(run_mutants, cwd=scratch, env=env).returncode
    if earlier:  # tests added since may reach or kill them; mutmut keeps a result unless its function changed
        logger.info("testing the %d survivors (and unreached) of the last run again", len(earlier))
        code = subprocess.run([*run_mutants, *earlier], cwd=scratch, env=env).returncode or code
    left = survivors(scratch, env)
    for name in left:
        subprocess.run([*mutmut, "show", name], cwd=scratch, env=env)
    logger.info("%d survivors; results kept in %s", len(left), scratch / "mutants")
    return code


def check_against(scratch: Path, pytest_args: list[str], names: list[str]) -> int:
    """Each named mutant of the last run against tests outside the scope's selection (tests that reach
    its function only through a subprocess, or too slow to run for every mutant), with the tests as they
    are now: a mutant is killed when they fail. The tests must pass with no mutant first."""
    mutants = scratch / "mutants"
    if not mutants.is_dir():
        raise SystemExit(f"no mutants in {scratch}: run the scope first")
    shutil.copytree(ROOT / "tests", mutants / "tests", dirs_exist_ok=True)
    env = os.environ | {"PYTHONPATH": str(mutants)}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *pytest_args]
    clean = subprocess.run(command, cwd=mutants, env=env | {"MUTANT_UNDER_TEST": ""}, capture_output=True)
    if clean.returncode != 0:
        raise SystemExit(f"the tests fail with no mutant:\n{clean.stdout.decode()[-3000:]}")
    alive = 0
    for name in names:
        code = subprocess.run(
            command, cwd=mutants, env=env | {"MUTANT_UNDER_TEST": name}, capture_output=True
        ).returncode
        verdict = {0: "survived", 1: "killed"}.get(code, f"killed (pytest exit {code})")
        alive += code == 0
        logger.info("%s: %s", name, verdict)
    logger.info("%d of %d survived %s", alive, len(names), " ".join(pytest_args))
    return 1 if alive else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scope", choices=sorted(SCOPES), help="which modules to mutate")
    parser.add_argument("--children", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--scratch", type=Path, help="where the copy goes (default /tmp/dllm-mutation-SCOPE)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on from the last run in the scratch folder: mutants not run yet and those of changed "
        "functions, then the last run's survivors and unreached mutants again (tests added since may "
        "reach and kill them)",
    )
    parser.add_argument(
        "--skip-log-lines",
        action="store_true",
        help="with --resume: leave out the last run's survivors that change only a log call",
    )
    parser.add_argument(
        "--against",
        metavar="PYTEST_ARGS",
        help="instead of a run: test the mutants named by --mutants (of the last run) against these "
        "pytest arguments (one string), each killed or survived",
    )
    parser.add_argument("--mutants", nargs="+", default=[], help="mutant names for --against")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    scratch = args.scratch or Path(f"/tmp/dllm-mutation-{args.scope}")
    if args.against:
        return check_against(scratch, shlex.split(args.against), args.mutants)
    prepare(scratch, SCOPES[args.scope], args.resume)
    return run(scratch, args.children, args.resume, args.skip_log_lines)


if __name__ == "__main__":
    raise SystemExit(main())
