"""The head-sparse cache (head_sparse/) under dLLM-Serve's phase multiplexing (phase_stepper.py).

A step's forward packs its stepping rows in the cycle's cache order (packing.py's ``window_inputs``):
a refreshing row's every attended position, a reusing row's block. Here each kind attends as it does in
BlockServe's cycle with the same cache, so a row's tokens are those it gets there:
- a refreshing row attends over its own new keys (every head, as without sparsity); then each layer's heads
  score its keys from its block's queries (the last layer's: its picked ones) and keep their top positions
  in a store of the rows refreshing at that step (head_sparse/store.py's ``CycleStore``);
- a reusing row attends, per head group, over the entries its last refresh kept, its block's entries
  rewritten first (one attention call per group and store).

No dense run is reserved in the pool: a row's cache is what its store keeps, in a run of pages of the
runner's pool as many as the kept entries fill (head_sparse/kept_pages.py), each store's run under an owner
of its own. A store's pages stay held while a row refers to it: across the cycle's steps and, for a row
carried into the next cycle (step-level batching), across cycles (``KeptRows``, by request); the last row
to let go of it (its next refresh, its request's end, a cycle carrying it no further) gives them back.
"""

from __future__ import annotations

from itertools import count

import torch

from engine_pod.kinds.bidirectional.head_sparse.store import CycleStore, HeadSparse
from engine_pod.models.attention_backends import ragged_attention
from engine_pod.models.ragged import RaggedAttention, RowSpans, starts_of


class KeptRows:
    """Each request's kept entries: the store its last refresh filled, and its row there; a store's pages
    are given back when no request refers to it any more."""

    def __init__(self) -> None:
        self.of: dict[str, tuple[CycleStore, int]] = {}
        self._names = count()

    def owner_name(self) -> str:
        """A new store's owner of its run in the pool (one per store)."""
        return f"head-sparse-{next(self._names)}"

    def refer(self, owner: str, store: CycleStore, row: int) -> None:
        """``owner``'s entries are now ``store``'s row ``row`` (its earlier store let go of)."""
        self._let_go({owner: (store, row)}, keep=set(self.of) - {owner})

    def drop(self, owners) -> None:
        """``owners`` refer to no store any more."""
        self._let_go({}, keep=set(self.of) - set(owners))

    def keep_only(self, owners: set[str]) -> None:
        """Drop every request's entries but ``owners``' (the rows carried into a cycle)."""
        self._let_go({}, keep=owners)

    def forget(self) -> None:
        self._let_go({}, keep=set())

    def _let_go(self, added: dict[str, tuple[CycleStore, int]], keep: set[str]) -> None:
        """Keep ``keep``'s entries and add ``added``; the stores no one refers to then give their pages back."""
        before = {id(store): store for store, _ in self.of.values()}
        self.of = {owner: kept for owner, kept in self.of.items() if owner in keep} | added
        referred = {id(store) for store, _ in self.of.values()}
        for key, store in before.items():
            if key not in referred:
                store.release()


def _places(starts: list[int], counts: list[int], device) -> torch.Tensor:
    """The places ``starts[i] .. starts[i] + counts[i]``, one run after another."""
    runs = [torch.arange(s, s + n) for s, n in zip(starts, counts)]
    return torch.cat(runs).to(device) if runs else torch.zeros(0, dtype=torch.long, device=device)


class PhaseHeads:
    """How one step's forward attends (a ``ForwardBatch``'s ``heads``) under the head-sparse cache.

    ``members``: the stepping box rows (row order), ``lengths`` the positions each computes, ``picked``
    its last-layer queries; ``row_start``: each box row's place in the cycle's cache order (the
    forward's packing order); ``pools``: the runner's CycleCachePool, where a refresh's store is kept;
    ``refresh``: the members that refresh; ``block_start``: where each box
    row's block lies among its keys; ``selecting``: the refreshing members that select (None: all; a
    refresh within the selection delay attends as the others and keeps nothing)."""

    def __init__(
        self,
        sparse: HeadSparse,
        pools,
        kept: KeptRows,
        owners: list[str],
        members: list[int],
        lengths: list[int],
        picked: list[int],
        row_start: list[int],
        refresh: set[int],
        block_start: list[int],
        block_length: int,
        layers: int,
        device,
        selecting: set[int] | None = None,
    ) -> None:
        self.sparse, self.pools, self.kept, self.layers, self.device = sparse, pools, kept, layers, device
        self.block_length = block_length
        order = sorted(range(len(members)), key=lambda i: row_start[members[i]])
        q_start = [0] * len(members)
        for i, start in zip(order, starts_of([lengths[i] for i in order])):
            q_start[i] = start
        final_start = starts_of(picked)
        self.store: CycleStore | None = None
        self.own_places: torch.Tensor | None = None  # the refreshing rows' keys, where any refresh
        fresh = [i for i in order if members[i] in refresh]  # the refreshing rows, in packing order
        self.selected_positions = 0  # what the selecting rows' dense caches would hold
        if fresh:
            chosen = refresh if selecting is None else selecting
            self._plan_attention(fresh, lengths, picked, q_start, final_start)
            kept.drop([owners[members[i]] for i in fresh])  # their earlier entries: nothing reads them again
            selects = [i for i in fresh if members[i] in chosen]
            if selects:
                self._plan_store(selects, members, owners, lengths, picked, q_start, final_start, block_start)
        # the reusing rows, by the store that holds their entries
        self.reuse: list[tuple[CycleStore, dict]] = []
        by_store: dict[int, tuple[CycleStore, list[int], list[int]]] = {}
        for i in order:
            if members[i] not in refresh:
                store, row = kept.of[owners[members[i]]]
                _, rows_here, local = by_store.setdefault(id(store), (store, [], []))
                rows_here.append(i)
                local.append(row)
        for store, rows_here, local in by_store.values():
            plans = self._reuse_plans(store, rows_here, local, q_start, final_start, picked)
            self.reuse.append((store, plans))

    def _plan_attention(self, fresh, lengths, picked, q_start, final_start) -> None:
        """The refreshing rows ``fresh`` (indices of ``members``, in packing order) attend over their own
        keys (compacted), as without sparsity."""
        device = self.device
        widths = [lengths[i] for i in fresh]
        own = starts_of(widths)
        self.own_places = _places([q_start[i] for i in fresh], widths, device)  # their keys, compacted
        self.own_plan = RaggedAttention(RowSpans(own, widths, own, widths), device)
        counts = [picked[i] for i in fresh]
        self.own_final = _places([final_start[i] for i in fresh], counts, device)
        self.own_final_plan = RaggedAttention(RowSpans(starts_of(counts), counts, own, widths), device)

    def _plan_store(self, selects, members, owners, lengths, picked, q_start, final_start, block_start):
        """The selecting rows ``selects`` (indices of ``members``, in packing order): their scoring queries,
        and the store their kept entries fill."""
        kept, device, L, sparse = self.kept, self.device, self.block_length, self.sparse
        widths = [lengths[i] for i in selects]
        self.selected_positions = sum(widths)
        own = starts_of(widths)
        self.store_places = _places([q_start[i] for i in selects], widths, device)  # their keys, compacted
        counts = [picked[i] for i in selects]
        starts = [block_start[members[i]] for i in selects]
        names = [owners[members[i]] for i in selects]
        self.store = CycleStore(
            sparse, self.pools, names, own, widths, starts, L, device, pages_owner=kept.owner_name()
        )
        offsets = torch.arange(L, device=device)
        block = torch.tensor([q_start[i] + s for i, s in zip(selects, starts)], device=device)
        self.scoring = (
            block[:, None] + offsets,
            torch.ones(len(selects), L, dtype=torch.bool, device=device),
        )
        widest = max(max(counts), 1)
        real = torch.arange(widest, device=device) < torch.tensor(counts, device=device)[:, None]
        first = torch.tensor([final_start[i] for i in selects], device=device)
        self.final_scoring = (
            torch.where(real, first[:, None] + torch.arange(widest, device=device), 0),
            real,
        )
        self.has_final = real.any(1)
        self.last: torch.Tensor | None = None
        for k, name in enumerate(names):
            kept.refer(name, self.store, k)

    def kept_bytes(self) -> int:
        """What this step's refreshes kept (nothing: no row refreshed)."""
        return 0 if self.store is None else self.store.kept_bytes()

    def _reuse_plans(self, store, rows_here, local, q_start, final_start, picked) -> dict:
        L, device = self.block_length, self.device
        counts = [picked[i] for i in rows_here]
        plans, final_plans = [], []
        for group in store.rows:
            k_start, k_len = [group.start[j] for j in local], [group.kept[j] for j in local]
            n = len(rows_here)
            plans.append(RaggedAttention(RowSpans(starts_of([L] * n), [L] * n, k_start, k_len), device))
            final_plans.append(RaggedAttention(RowSpans(starts_of(counts), counts, k_start, k_len), device))
        return {
            "block": _places([q_start[i] for i in rows_here], [L] * len(rows_here), device),
            "final": _places([final_start[i] for i in rows_here], counts, device),
            "rows": torch.tensor(local, device=device),
            "plans": plans,
            "final_plans": final_plans,
        }

    def attend(self, batch, layer: int, q, k, v, final: bool) -> torch.Tensor:
        rows, heads, tokens, width = q.shape
        queries, own_k, own_v = q.transpose(1, 2).flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
        out = queries.new_zeros(queries.shape[0], heads, own_v.shape[-1])
        if self.own_places is not None:
            scale = batch.layout(layer, final).plan.style.scale or q.shape[-1] ** -0.5
            self._refresh(layer, queries, own_k, own_v, out, final, scale)
        for store, plan in self.reuse:
            self._reuse(store, plan, layer, queries, own_k, own_v, out, final)
        return out.view(rows, tokens, heads, width)

    def _refresh(self, layer: int, queries, own_k, own_v, out, final: bool, scale: float) -> None:
        """The refreshing rows: every head over their own keys, then the selecting rows' scores and kept
        entries."""
        keys, values = own_k[self.own_places], own_v[self.own_places]
        at = self.own_final if final else self.own_places
        out[at] = ragged_attention(queries[at], keys, values, self.own_final_plan if final else self.own_plan)
        store = self.store
        if store is None:
            return
        keys, values = own_k[self.store_places], own_v[self.store_places]
        places, valid = self.final_scoring if final else self.scoring
        scores = store.scores(queries[places], valid, keys[store.key_index], scale)
        if final and self.last is not None:  # a row with no last-layer query ranks as the layer before
            scores = torch.where(self.has_final[:, None, None], scores, self.last)
        self.last = scores
        store.keep(layer, scores, keys, values)
        if layer == self.layers - 1:
            store.finish()

    def _reuse(self, store: CycleStore, plan: dict, layer: int, queries, own_k, own_v, out, final) -> None:
        """Reusing rows of one store: per group, their block's entries rewritten, then attention over the
        group's kept entries."""
        sparse, block = self.sparse, plan["block"]
        offsets = torch.arange(self.block_length, device=block.device)[None, :, None]
        at = plan["final"] if final else block
        for g in range(len(store.rows)):
            kv, qh = sparse.head_index[layer][g], sparse.query_heads[layer][g]
            stored_k, stored_v = store.keys[layer][g], store.values[layer][g]
            slots = (store.block_base[layer][g][plan["rows"]][:, None, :] + offsets).flatten(0, 1)
            lanes = torch.arange(kv.shape[0], device=kv.device)[None, :]
            stored_k[slots, lanes] = own_k[block][:, kv]
            stored_v[slots, lanes] = own_v[block][:, kv]
            group_plan = plan["final_plans"][g] if final else plan["plans"][g]
            out[at[:, None], qh[None, :]] = ragged_attention(
                queries[at][:, qh], stored_k, stored_v, group_plan
            )


def phase_heads(stepper, state, members: list[int], lengths: list[int], picked: list[int]) -> PhaseHeads:
    """A phase step's attention under the stepper's head-sparse cache (``members`` the stepping rows,
    ``lengths`` the positions each computes, ``picked`` its last-layer queries)."""
    box, cache, L = state.box, state.cache, state.box.block_length
    return PhaseHeads(
        stepper.heads,
        stepper.cache_pool,
        stepper.kept,
        state.phases.owners,
        members,
        lengths,
        picked,
        cache.row_start,
        set(state.phases.refresh),
        [n - L for n in box.host.context_lengths],
        L,
        stepper.loaded.config.num_layers,
        box.tokens.device,
        {r for r in state.phases.refresh if state.phases.forwards[r] >= stepper.selection_delay},
    )


def count_refresh_bytes(stats, heads: PhaseHeads | None, refreshed: int, position_bytes: int) -> None:
    """A step's refreshes in its ``stats`` (CycleStats): the dense caches of its ``refreshed`` positions and
    what they kept; under the head-sparse cache (``heads``), of the rows that selected only (a refresh
    within the selection delay keeps nothing)."""
    positions = refreshed if heads is None else heads.selected_positions
    stats.kv_dense_bytes += positions * position_bytes
    stats.kv_kept_bytes += positions * position_bytes if heads is None else heads.kept_bytes()
