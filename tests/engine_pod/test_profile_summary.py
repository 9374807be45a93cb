"""The profile result's one schema (dllm_contracts/profile_summary.py): what the CLI writes, the operator
reads and stores, and `dllm worker --profile` reads back; malformed results are refused with the field
named, never turned into a budget."""

from __future__ import annotations

import json

import pytest

from dllm_contracts.profile_summary import (
    TERMINATION_LIMIT,
    ProfileFailed,
    ProfileFormatError,
    ProfileSummary,
    failure_message,
    read_termination_message,
)
from engine_pod.cli.budget import read_profile
from engine_pod.cli.common import CliError

FULL_RESULT = {  # the shape `dllm profile --json` writes (points and checks trimmed)
    "model": "GSAI-ML/LLaDA-8B-Instruct",
    "device": "cuda:0",
    "device_name": "NVIDIA H200",
    "torch_version": "2.13.0",
    "dtype": "bfloat16",
    "block_length": 32,
    "total_memory_bytes": 150_000_000_000,
    "free_memory_bytes": 149_000_000_000,
    "memory_limit_bytes": 149_000_000_000,
    "utilization": 0.9,
    "usable_memory_bytes": 134_100_000_000,
    "weights_bytes": 16_031_000_000,
    "fit": {"intercept_bytes": 812_345_678.9, "bytes_per_token": 524_287.6543, "r_squared": 0.9991234},
    "held_out": [{"relative_error": 0.012}, {"relative_error": 0.031}],
    "points": [],
    "budget_checks": [],
    "token_budget": 225_000,
}


def test_a_full_result_and_its_summary_read_as_the_same_profile(tmp_path):
    summary = ProfileSummary.from_result(FULL_RESULT)
    assert summary.token_budget == 225_000 and summary.source == "measured"
    assert summary.bytes_per_token == 524_287.7 and summary.intercept_bytes == 812_345_678
    assert summary.held_out_max_error == 0.031 and summary.r_squared == 0.99912
    full, compact = tmp_path / "full.json", tmp_path / "compact.json"
    full.write_text(json.dumps(FULL_RESULT))
    compact.write_text(summary.to_json())
    assert read_profile(str(full)) == read_profile(str(compact)) == summary
    assert read_termination_message(summary.termination_message()) == summary


def test_the_operators_additions_and_a_spec_budget_round_trip():
    summary = ProfileSummary.from_result(FULL_RESULT).with_gpu_product("NVIDIA-H200")
    assert ProfileSummary.from_json(summary.to_json()).gpu_product == "NVIDIA-H200"
    spec = ProfileSummary.from_spec(4096)
    assert json.loads(spec.to_json()) == {"token_budget": 4096, "source": "spec"}
    assert ProfileSummary.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"token_budget": "225000"}, "token_budget must be int"),
        ({"token_budget": 0}, "positive integer token_budget"),
        ({"token_budget": True}, "token_budget must be int"),
        ({"token_budget": None}, "token_budget must be int"),
        ({"usable_memory_bytes": 1.5e11}, "usable_memory_bytes must be int"),
        ({"device_name": None}, "needs device_name"),
        ({"source": "guess"}, "source must be one of"),
        ({"tokens": 5}, "unknown profile field(s): tokens"),
    ],
)
def test_a_malformed_summary_is_refused_with_the_field_named(change, named):
    data = json.loads(ProfileSummary.from_result(FULL_RESULT).to_json()) | change
    with pytest.raises(ProfileFormatError, match=named.replace("(", r"\(").replace(")", r"\)")):
        ProfileSummary.parse(data)


def test_a_summary_without_a_budget_or_a_measurement_is_refused():
    with pytest.raises(ProfileFormatError, match="positive integer token_budget"):
        ProfileSummary.parse({"source": "spec"})
    with pytest.raises(ProfileFormatError, match="needs device, device_name"):
        ProfileSummary.parse({"token_budget": 5})
    with pytest.raises(ProfileFormatError, match="JSON object"):
        ProfileSummary.parse([5])


def test_termination_messages_say_what_happened():
    with pytest.raises(ProfileFailed, match="profiling failed: CUDA out of memory"):
        read_termination_message(failure_message("CUDA out of memory"))
    with pytest.raises(ProfileFormatError, match="no termination message"):
        read_termination_message("")
    with pytest.raises(ProfileFormatError, match="not JSON"):
        read_termination_message("Traceback (most recent call last):")
    long = failure_message("x" * 10 * TERMINATION_LIMIT)
    assert len(long.encode()) < TERMINATION_LIMIT and json.loads(long)["error"].startswith("xxx")


def test_worker_profile_flag_turns_a_bad_file_into_one_line(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"token_budget": -1, "source": "spec"}))
    with pytest.raises(CliError, match="is not a `dllm profile` result: .*positive integer token_budget"):
        read_profile(str(bad))
    with pytest.raises(CliError, match="does not exist"):
        read_profile(str(tmp_path / "missing.json"))


def test_a_summary_records_the_tensor_parallel_size_it_was_measured_at():
    """A budget is per rank of a group of that size: the size travels with it, 1 when a summary lacks it
    (summaries of before, and every size-1 summary, which leaves it out for readers that predate it)."""
    summary = ProfileSummary.from_result(FULL_RESULT | {"tensor_parallel": 4})
    assert summary.tensor_parallel == 4
    assert read_termination_message(summary.termination_message()).tensor_parallel == 4
    assert ProfileSummary.from_result(FULL_RESULT).tensor_parallel == 1
    assert "tensor_parallel" not in ProfileSummary.from_result(FULL_RESULT).as_dict()
    assert ProfileSummary.from_spec(4096, tensor_parallel=8).as_dict()["tensor_parallel"] == 8
    for bad in (0, "4", True):
        with pytest.raises(ProfileFormatError, match="tensor_parallel"):
            ProfileSummary.parse(json.loads(summary.to_json()) | {"tensor_parallel": bad})


def test_a_summary_carries_the_cpu_and_the_allocator_its_budget_was_measured_under():
    measured = {"device": "cpu", "device_name": "AMD EPYC", "allocator": "glibc 2.36 malloc, mmap from 1 MiB"}
    summary = ProfileSummary.from_result(FULL_RESULT | measured)
    assert (summary.device_name, summary.allocator) == ("AMD EPYC", measured["allocator"])
    assert read_termination_message(summary.termination_message()) == summary  # as the operator stores it
