"""The block prefix cache of block-diffusion models: a radix tree of whole blocks over the paged KV pool.

For a block-diffusion model (causal across blocks) a committed block's keys and values depend only on
the tokens up to that block's end, so two requests whose tokens agree on their first ``n`` whole blocks
have the same keys and values there, exactly: one page per block can serve both. The tree's edges are
blocks (``block_length`` tokens on the absolute grid) and each node holds the page of the pool that
keeps its block's keys and values, with one reference of its own (models/paged_kv.py), so a finished
request's blocks outlive it and a follow-up that resends the conversation finds them.

A row ``attach``es when it enters the batch: it shares the pages of the longest cached run of its whole
blocks and computes only the rest. Each cycle it ``extend``s the tree with its blocks before the active
block (their keys become final in the cycle's first forward, where every layer writes its keys before any
row reads them, so a row attached in the same cycle reads them as written). Nodes count the rows whose
prefix runs through them; when the pool runs short of pages, leaves no row uses are evicted, least
recently used first; pinned nodes (a warmed prefix: ``pin``) never are. Not for LLaDA or Dream: with
bidirectional attention a prefix's keys depend on what follows it.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from engine_pod.models.paged_kv import PagedKVPool
from engine_pod.runner.contract import PrefixCacheStats


@dataclass(eq=False)
class _Node:
    block: tuple[int, ...]
    page: int
    parent: _Node | None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    users: int = 0  # rows whose prefix runs through this node
    last_used: int = 0  # the cache's clock when a row last used it
    pinned: bool = False  # a warmed prefix's block: never evicted


class BlockPrefixCache:
    """Shared, reference-counted pages of whole blocks, looked up by the tokens that lead to them."""

    def __init__(self, pool: PagedKVPool, block_length: int) -> None:
        self.pool, self.block_length = pool, block_length
        self.root = _Node((), -1, None)
        self.stats = PrefixCacheStats()
        self._paths: dict[str, list[_Node]] = {}  # per row: the nodes of its cached blocks, in order
        self._clock = itertools.count(1)
        pool.reclaim = self.evict

    def attach(self, owner: str, tokens: list[int]) -> int:
        """Start ``owner``'s pages with the cached pages of its longest run of whole blocks; returns the
        tokens they cover (a multiple of the block length)."""
        self.detach(owner)
        L, node, path = self.block_length, self.root, []
        for b in range(len(tokens) // L):
            child = node.children.get(tuple(tokens[b * L : (b + 1) * L]))
            if child is None:
                break
            path.append(child)
            node = child
        self.pool.share(owner, [n.page for n in path])
        self._use(owner, path)
        hit = len(path) * L
        self.stats.looked_up_tokens += len(tokens) // L * L
        self.stats.hit_tokens += hit
        self.stats.attached_rows += 1
        return hit

    def extend(self, owner: str, tokens: list[int], upto: int) -> None:
        """Cache ``owner``'s blocks before position ``upto`` (its pages must cover them) that the tree lacks.
        A block cached already under another page stays there; the row keeps its own copy."""
        L, path, table = self.block_length, self._paths.get(owner, []), self.pool.table(owner)
        node = path[-1] if path else self.root
        added = []
        for b in range(len(path), upto // L):
            block = tuple(tokens[b * L : (b + 1) * L])
            child = node.children.get(block)
            if child is None:
                child = node.children[block] = _Node(block, table[b], node)
                self.pool.retain(child.page)
                self.stats.cached_tokens += L
            added.append(child)
            node = child
        self._use(owner, added)

    def pin(self, tokens: list[int]) -> int:
        """Keep the cached blocks of ``tokens``' whole blocks (a warmed prefix) for good: eviction passes
        them by. Returns the tokens pinned now (blocks another prefix pinned already are not counted)."""
        L, node, pinned = self.block_length, self.root, 0
        for b in range(len(tokens) // L):
            node = node.children.get(tuple(tokens[b * L : (b + 1) * L]))
            if node is None:
                raise ValueError(f"block {b} of the prefix to pin is not cached")
            pinned += 0 if node.pinned else L
            node.pinned = True
        self.stats.pinned_tokens += pinned
        return pinned

    def detach(self, owner: str) -> None:
        """``owner`` left the batch: its nodes count one user fewer (the pool releases its pages)."""
        now = next(self._clock)
        for node in self._paths.pop(owner, []):
            node.users -= 1
            node.last_used = now

    def evict(self, pages: int) -> int:
        """Free at least ``pages`` pages if it can: drop unused leaves, least recently used first (a
        parent whose last child goes becomes a candidate in turn). Returns the pages freed."""
        heap = [(n.last_used, id(n), n) for n in self._nodes() if not n.children and _unused(n)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < pages:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[node.block]
            freed += self.pool.holders(node.page) == 1
            self.pool.drop(node.page)
            self.stats.cached_tokens -= self.block_length
            self.stats.evicted_tokens += self.block_length
            if parent is not self.root and not parent.children and _unused(parent):
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        return freed

    def clear(self) -> None:
        """Evict every block no row uses (pinned ones stay)."""
        self.evict(self.stats.cached_tokens // self.block_length)

    def _use(self, owner: str, nodes: list[_Node]) -> None:
        now = next(self._clock)
        for node in nodes:
            node.users += 1
            node.last_used = now
        self._paths.setdefault(owner, []).extend(nodes)

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def _unused(node: _Node) -> bool:
    """Whether eviction may take ``node`` once it is a leaf: no row uses it and it is not pinned."""
    return node.users == 0 and not node.pinned
