"""Stateful fuzzing of the resource API against ``dllm serve`` with two API keys (two tenants).

A Hypothesis state machine uploads, lists (page by page), reads, deletes files, creates batches from
them, reads and cancels batches, and sends malformed bodies, as either tenant, on the ids it was given
or on the other tenant's, deleted or never issued ones. A model of what each tenant owns predicts
every status: no step is a 5xx, every refusal is OpenAI's error JSON, another tenant's resource is a 404
like a missing one, a deleted file is gone from reads and listings, and the listings page to exactly
the tenant's files. What it draws never depends on the server's replies (Hypothesis replays it).
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tests.serving.serve_process import running

KEYS = ("stateful-key-a", "stateful-key-b")
NEVER_ISSUED = "file-0000000000000000-00000000000000000000000000000000"
MODEL = "tiny-llada"


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    with running(tmp_path_factory.mktemp("stateful"), "--api-key", KEYS[0], "--api-key", KEYS[1]) as server:
        yield server


def _line(index: int) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count to 3 ."}], "max_tokens": 8}
    return json.dumps(
        {"custom_id": f"l{index}", "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


lines = st.lists(
    st.sampled_from([_line(0), _line(1), "{not json", '{"custom_id": 5}']), min_size=1, max_size=3
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
BODY_FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "n",
    "stream",
    "logprobs",
    "input_file_id",
    "endpoint",
]
bodies = st.dictionaries(st.sampled_from(BODY_FIELDS), json_values, max_size=4)


def _checked(response: httpx.Response, expected: int | tuple[int, ...]) -> httpx.Response:
    where = f"{response.request.method} {response.request.url.path} -> {response.status_code}: {response.text[:300]}"
    assert response.status_code < 500, where
    allowed = expected if isinstance(expected, tuple) else (expected,)
    assert response.status_code in allowed, where
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str), where
    return response


def test_no_sequence_of_calls_breaks_the_api_or_crosses_tenants(serve):
    clients = [
        httpx.Client(base_url=serve.url, headers={"authorization": f"Bearer {key}"}, timeout=60)
        for key in KEYS
    ]

    class Api(RuleBasedStateMachine):
        def __init__(self) -> None:
            """Each run starts from what earlier runs left (a fresh server per run is too slow): their
            files are deleted, their batches (which cannot be) are set aside."""
            super().__init__()
            self.files: list[list[str]] = [[], []]  # per tenant: live files it uploaded in this run
            self.deleted: list[str] = []
            self.batches: list[list[str]] = [[], []]
            self.repeats: set[str] = set()  # files in which two lines share a custom_id (no batch takes them)
            for client in clients:
                for file_id in [f["id"] for f in client.get("/v1/files").json()["data"]]:
                    _checked(client.delete(f"/v1/files/{file_id}"), 200)
            self.earlier_batches = [{b["id"] for b in c.get("/v1/batches").json()["data"]} for c in clients]

        def _pick(self, owned: list[list[str]], whose: int, pick: int) -> str:
            ids = owned[whose] or self.deleted or [NEVER_ISSUED]
            return ids[pick % len(ids)]

        def _owner(self, owned: list[list[str]], identifier: str) -> int | None:
            return next((t for t in (0, 1) if identifier in owned[t]), None)

        @rule(
            tenant=st.sampled_from([0, 1]), content=lines, purpose=st.sampled_from(["batch", "fine-tune", ""])
        )
        def upload(self, tenant, content, purpose):
            reply = clients[tenant].post(
                "/v1/files",
                files={"file": ("in.jsonl", "\n".join(content).encode())},
                data={"purpose": purpose},
            )
            _checked(reply, 200 if purpose == "batch" else (400,))
            if reply.status_code == 200:
                self.files[tenant].append(reply.json()["id"])
                custom_ids = [str(json.loads(line)["custom_id"]) for line in content if "custom_id" in line]
                if len(set(custom_ids)) < len(custom_ids):
                    self.repeats.add(reply.json()["id"])

        @rule(tenant=st.sampled_from([0, 1]), whose=st.sampled_from([0, 1]), pick=st.integers(0, 99))
        def read_file(self, tenant, whose, pick):
            file_id = self._pick(self.files, whose, pick)
            mine = self._owner(self.files, file_id) == tenant
            _checked(clients[tenant].get(f"/v1/files/{file_id}"), 200 if mine else 404)
            _checked(clients[tenant].get(f"/v1/files/{file_id}/content"), 200 if mine else 404)

        @rule(tenant=st.sampled_from([0, 1]), whose=st.sampled_from([0, 1]), pick=st.integers(0, 99))
        def delete_file(self, tenant, whose, pick):
            file_id = self._pick(self.files, whose, pick)
            mine = self._owner(self.files, file_id) == tenant
            reply = _checked(clients[tenant].delete(f"/v1/files/{file_id}"), 200 if mine else 404)
            if mine:
                assert reply.json()["deleted"] is True
                self.files[tenant].remove(file_id)
                self.deleted.append(file_id)

        @rule(
            tenant=st.sampled_from([0, 1]),
            whose=st.sampled_from([0, 1]),
            pick=st.integers(0, 99),
            endpoint=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
        )
        def create_batch(self, tenant, whose, pick, endpoint):
            file_id = self._pick(self.files, whose, pick)
            mine = self._owner(self.files, file_id) == tenant
            body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
            expected = (400 if file_id in self.repeats else 200) if mine else 404
            reply = _checked(clients[tenant].post("/v1/batches", json=body), expected)
            if reply.status_code == 200:
                self.batches[tenant].append(reply.json()["id"])

        @rule(tenant=st.sampled_from([0, 1]), whose=st.sampled_from([0, 1]), pick=st.integers(0, 99))
        def read_and_cancel_batch(self, tenant, whose, pick):
            ids = self.batches[whose] or ["batch_0000000000000000-00000000000000000000000000000000"]
            batch_id = ids[pick % len(ids)]
            mine = whose == tenant and bool(self.batches[whose])
            _checked(clients[tenant].get(f"/v1/batches/{batch_id}"), 200 if mine else 404)
            _checked(clients[tenant].post(f"/v1/batches/{batch_id}/cancel"), (200, 409) if mine else 404)
            _checked(clients[tenant].get(f"/v1/files/{batch_id}-output/content"), (200, 409) if mine else 404)

        @rule(
            tenant=st.sampled_from([0, 1]),
            path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/batches"]),
            body=bodies,
        )
        def malformed_body(self, tenant, path, body):
            """Negative cases: whatever the JSON, a refusal is a 4xx with OpenAI's error object."""
            reply = clients[tenant].post(path, json=body)
            _checked(reply, tuple(range(200, 500)))

        @invariant()
        def listings_page_to_exactly_each_tenants_files(self):
            for tenant in (0, 1):
                listed, after = [], None
                for _ in range(len(self.files[tenant]) + 2):  # pages of 2: a listing that repeats ends
                    params = {"limit": 2, "purpose": "batch"} | ({"after": after} if after else {})
                    page = _checked(clients[tenant].get("/v1/files", params=params), 200).json()
                    listed += [f["id"] for f in page["data"]]
                    if not page["has_more"]:
                        break
                    after = page["data"][-1]["id"] if page["data"] else listed[-1]
                else:
                    raise AssertionError(f"the listing did not end: {listed}")
                assert set(listed) == set(self.files[tenant]) and len(listed) == len(set(listed))
                mine = {b["id"] for b in _checked(clients[tenant].get("/v1/batches"), 200).json()["data"]}
                assert mine - self.earlier_batches[tenant] == set(self.batches[tenant])

    try:
        run_state_machine_as_test(
            Api,
            settings=settings(
                max_examples=20,
                stateful_step_count=10,
                deadline=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        for client in clients:
            client.close()
