"""``dllm census`` in a terminal: a line per scenario that names each figure, and the table of worst cases
printed at the end (the one --markdown writes)."""

from __future__ import annotations

import logging

from engine_pod.cli.main import main

ARGV = ["census", "--model", "random:llada-tiny", "--policy", "static", "--rows", "4", "--distinct", "1"]
ARGV += ["--requests", "sampled"]


def test_census_prints_its_table_and_lines_that_explain_themselves(capsys, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="engine_pod.bench.census_run")
    assert main([*ARGV, "--cycles", "2", "--markdown", str(tmp_path / "census.md")]) == 0
    table = capsys.readouterr().out
    assert table == (tmp_path / "census.md").read_text()
    assert table.startswith("| model | policy | requests | attention calls per layer |")
    assert "\n| random:llada-tiny | static | sampled | " in table
    (line,) = [r.getMessage() for r in caplog.records if r.name == "engine_pod.bench.census_run"]
    assert line.startswith(
        "scenario 1: random:llada-tiny threshold static sampled, 4 rows of 1 prompt length: "
    )
    for words in ("attention calls per layer", "per forward", "per step", "per cycle", "host-to-device"):
        assert words in line, words
    assert "no MoE" in line and "[]" not in line
