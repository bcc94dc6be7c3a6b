"""How the JAX engine packs questions after shared prefixes into model calls: a prefix tree of fixed depth.

A question is `prefixes[o] + suffix`; the first `split` tokens of its suffix are a segment other questions of
prefix o may share (a judge question's first response). Its tokens are read in four levels:

    prefix  o                    the judge's [instruction, prompt]
    node    (o, suffix[:split])  ... its first response
    leaf    (o, suffix)          ... the whole question
    copy                         the same question asked again, with its own random stream (a pair's votes in one
                                 order)

and each level is prefilled once for everything under it (`KVCache.branch` at each level, so attention also reads
it once per step for all its rows). A chunk of one model call is a uniform tree of P prefixes x F nodes x S leaves
x C copies (powers of two), P * F * S * C rows at most `max_rows`, and every chunk of a call has the same shape
(`call_shape`): of all fan-outs, the one whose chunks run the fewest padded tokens, the tree's parts cut to fit
(`fit`: a part cut off prefills its shared tokens again). Each new shape compiles every kernel again (seconds on a
CPU, a minute for a large model on a pod), and a judge's trees change shape with its questions (AGR's responses
that are copies of each other are one leaf asked several times): a chunk shape per tree shape compiled ~20 shapes
a step on the toy world, one shape a call compiles a handful in a run. The shape depends on the call's questions
alone, so a resumed run pads as the uninterrupted one did. Fixed levels, not a radix tree over arbitrary token runs
(SGLang's RadixAttention): the judge knows where its questions share text, and fixed levels keep the shapes
static, where a radix tree needs paged memory. A prefix whose nodes have different fan-outs (AGR: a response before
n anchors, an anchor before m responses) is cut into pieces of one fan-out each.

Pure host code (`JaxSampler` runs the chunks). Shapes: Q questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from rrc_jax.models.batches import bucket_length


class Leaf(NamedTuple):
    """A question's tokens after its node (`suffix[split:]`) and the questions `[C']` asking it (its copies)."""

    tokens: tuple[int, ...]
    questions: list[int]


class Node(NamedTuple):
    """A shared segment after a prefix (`suffix[:split]`, empty when none) and its leaves."""

    tokens: tuple[int, ...]
    leaves: list[Leaf]


class Piece(NamedTuple):
    """A prefix (`owner`, an index into the call's prefixes) with some of its nodes, all of one fan-out
    (`Piece.shape`): the unit a chunk packs."""

    owner: int
    nodes: list[Node]

    @property
    def shape(self) -> tuple[int, int, int]:
        """(F, S, C): nodes, leaves per node and copies per leaf, each a power of two."""
        return (bucket_length(len(self.nodes), 1), bucket_length(max(len(n.leaves) for n in self.nodes), 1),
                bucket_length(max(len(leaf.questions) for n in self.nodes for leaf in n.leaves), 1))


def question_tree(suffixes: Sequence[tuple[int, Sequence[int]]], splits: Sequence[int] | None = None
                  ) -> dict[int, dict[tuple, dict[tuple, list[int]]]]:
    """`{prefix: {node tokens: {leaf tokens: [questions]}}}` of `suffixes [Q]` `(prefix index, suffix ids)` split
    after `splits[q]` tokens (default 0: no node level), in the order of first appearance; a node with one leaf
    joins it under the empty node (nothing to share)."""
    tree: dict[int, dict[tuple, dict[tuple, list[int]]]] = {}
    for q, (owner, suffix) in enumerate(suffixes):
        k = 0 if splits is None else int(splits[q])
        if not 0 <= k <= len(suffix):
            raise ValueError(f"question {q}: split {k} is outside its suffix of {len(suffix)} tokens")
        node, leaf = tuple(suffix[:k]), tuple(suffix[k:])
        tree.setdefault(int(owner), {}).setdefault(node, {}).setdefault(leaf, []).append(q)
    for owner, nodes in tree.items():  # a first segment no other question shares is no level of its own
        alone = [node for node, leaves in nodes.items() if node and len(leaves) == 1]
        for node in alone:
            (leaf, questions), = nodes.pop(node).items()
            nodes.setdefault((), {}).setdefault(node + leaf, []).extend(questions)
    return tree


def pieces(tree: dict[int, dict[tuple, dict[tuple, list[int]]]], max_rows: int) -> list[Piece]:
    """The pieces of `tree` (`question_tree`), each at most `max_rows` rows (F * S * C): a leaf with more copies, a
    node with more leaves or a prefix with more nodes than fit is cut, each part prefilling the shared tokens
    again; a prefix's nodes are grouped by fan-out (S, C)."""
    out = []
    for owner, nodes in tree.items():
        by_shape: dict[tuple[int, int], list[Node]] = {}
        for node_tokens, leaves in nodes.items():
            split_leaves = [Leaf(tokens, qs[i:i + max_rows]) for tokens, qs in leaves.items()
                            for i in range(0, len(qs), max_rows)]
            c = bucket_length(max(len(leaf.questions) for leaf in split_leaves), 1)
            per_node = max(1, max_rows // c)
            for i in range(0, len(split_leaves), per_node):
                node = Node(node_tokens, split_leaves[i:i + per_node])
                by_shape.setdefault((bucket_length(len(node.leaves), 1), c), []).append(node)
        for (s, c), group in by_shape.items():
            per_piece = max(1, max_rows // (s * c))
            out += [Piece(owner, group[i:i + per_piece]) for i in range(0, len(group), per_piece)]
    return out


def fit(parts: list[Piece], f: int, s: int, c: int) -> list[Piece]:
    """`parts` cut so that each has at most `f` nodes, `s` leaves a node and `c` copies a leaf (to run in a chunk
    shape compiled before, `JaxSampler(reuse_shapes=True)`); a part cut off prefills its shared tokens again."""
    out = []
    for piece in parts:
        nodes = []
        for node in piece.nodes:
            leaves = [Leaf(leaf.tokens, leaf.questions[i:i + c]) for leaf in node.leaves
                      for i in range(0, len(leaf.questions), c)]
            nodes += [Node(node.tokens, leaves[i:i + s]) for i in range(0, len(leaves), s)]
        out += [Piece(piece.owner, nodes[i:i + f]) for i in range(0, len(nodes), f)]
    return out


def chunk_slots(shape: tuple[int, int, int, int], leaf: int, extra: int) -> int:
    """The cache slots of a chunk of `shape` (P, F, S, C) beyond its prefixes and nodes: its P * F * S questions'
    own `leaf` tokens, and room for `extra` decoded tokens in each of its P * F * S * C rows."""
    p, f, s, c = shape
    return p * f * s * (leaf + c * extra)


def fan_outs(most: int) -> list[tuple[int, int, int]]:
    """Every (F, S, C) of powers of two with F * S * C <= `most`: the fan-outs a call's chunks may take."""
    powers = [1 << k for k in range(max(1, most).bit_length())]
    return [(f, s, c) for f in powers for s in powers for c in powers if f * s * c <= most]


def cut_counts(parts: list[Piece], fans: Sequence[tuple[int, int, int]]) -> np.ndarray:
    """`len(fit(parts, f, s, c))` `[len(fans)]` for each (F, S, C) of `fans`, counted without cutting."""
    copies = [len(leaf.questions) for piece in parts for node in piece.nodes for leaf in node.leaves]
    leaf_node = [n for n, node in enumerate(x for piece in parts for x in piece.nodes) for _ in node.leaves]
    node_piece = [i for i, piece in enumerate(parts) for _ in piece.nodes]
    copies, leaf_node, node_piece = (np.asarray(x, np.int64) for x in (copies, leaf_node, node_piece))
    counts = np.zeros(len(fans), np.int64)
    if not parts:
        return counts
    for k, (f, s, c) in enumerate(fans):
        leaves = np.bincount(leaf_node, -(-copies // c), minlength=len(node_piece)).astype(np.int64)
        nodes = np.bincount(node_piece, -(-leaves // s), minlength=len(parts)).astype(np.int64)
        counts[k] = int((-(-nodes // f)).sum())
    return counts


def chunk_cost(shape: tuple[int, ...], extra: int, max_rows: int) -> int:
    """What a chunk of `shape` (P, F, S, C, prefix, node, leaf lengths) costs, in tokens run through the model:
    each level's padded tokens prefilled once per row of it, and `extra` decoding steps, each costing what
    `max_rows` rows cost (a decoding step reads the weights once whatever its rows: its rows are nearly free
    up to a full batch)."""
    p, f, s, c, prefix, node, leaf = shape
    return p * prefix + p * f * node + p * f * s * leaf + extra * max_rows


def call_shape(fans: Sequence[tuple[int, int, int]], counts: Sequence[int], lengths: tuple[int, int, int],
               extra: int, max_rows: int, multiple: int = 1, max_slots: int | None = None
               ) -> tuple[tuple[int, ...], int]:
    """The one chunk shape `(P, F, S, C, prefix, node, leaf lengths)` a whole call runs in, and its number of
    chunks: of `fans` (each cutting the call's parts into `counts[k]`, `cut_counts`) and P (`multiple` times a
    power of two) with P * F * S * C <= `max_rows` rows (and, with `max_slots`, `chunk_slots` within it), the
    least `chunk_cost` over the call, then the fewest rows. One shape a call, chosen from the call's counts and
    lengths alone: the calls of a run take few shapes (each a compilation of every kernel), and the same
    questions take the same shape however the run got there (a resumed run compiles and pads as the
    uninterrupted one did). No chunks when the counts are all 0."""
    if not max(counts, default=0):
        return (0, 0, 0, 0, *lengths), 0
    best = None
    for (f, s, c), n in zip(fans, counts):
        p = multiple
        while True:
            shape = (p, f, s, c, *lengths)
            rows, fits = p * f * s * c, max_slots is None or chunk_slots((p, f, s, c), lengths[2], extra) <= max_slots
            if rows > max_rows or not (fits or (p, f, s, c) == (multiple, 1, 1, 1)):
                break
            chunks = -(-int(n) // p)
            key = (chunks * chunk_cost(shape, extra, max_rows), chunks * rows, shape)
            if best is None or key < best[0]:
                best = (key, shape, chunks)
            if p >= n:
                break
            p *= 2
    if best is None:  # `multiple` rows already exceed max_rows (several hosts, a small max_batch): the least chunk
        return (multiple, 1, 1, 1, *lengths), int(counts[fans.index((1, 1, 1))])
    return best[1], best[2]


def uniform_chunks(parts: list[Piece], shape: tuple[int, ...]) -> list[list[Piece]]:
    """`parts` cut to the F, S, C of `shape` (`fit`) and packed P a chunk (none without parts)."""
    p, f, s, c = shape[:4]
    if not parts:
        return []
    cut = fit(parts, f, s, c)
    return [cut[i:i + p] for i in range(0, len(cut), p)]


def rows(chunk: list[Piece], f: int, s: int, c: int) -> tuple[list[int], list[int]]:
    """(questions, row of each) of a chunk laid out as P x f x s x c rows: piece p's node n's leaf l's copy k is
    row `((p * f + n) * s + l) * c + k`."""
    questions, at = [], []
    for p, piece in enumerate(chunk):
        for n, node in enumerate(piece.nodes):
            for j, leaf in enumerate(node.leaves):
                for k, q in enumerate(leaf.questions):
                    questions.append(q)
                    at.append(((p * f + n) * s + j) * c + k)
    return questions, at


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The number of leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _runs(order: list[int], shared: list[int], least: int) -> list[list[int]]:
    """`order` cut where the next item shares fewer than `least` leading tokens with the one before (`shared[k]`:
    item k's with item k - 1's)."""
    runs: list[list[int]] = []
    for k, i in enumerate(order):
        if runs and shared[k] >= least:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def shared_prefixes(prompts: Sequence[Sequence[int]], least: int = 8
                    ) -> tuple[list[list[int]], list[tuple[int, list[int]]], list[int]]:
    """Whole prompts (a server's requests) as questions after shared prefixes, for `complete`: `(prefixes,
    suffixes [B], splits [B])`, found from the prompts' tokens alone. Sorted, neighbours that share at least
    `least` leading tokens form a group whose common tokens are its prefix; within a group, neighbours that share
    at least `least` more form a run whose further common tokens are the node (`splits`: a judge question's first
    response). A prompt that shares less than `least` tokens with both neighbours is its own prefix."""
    order = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    shared = [0] + [common_length(prompts[a], prompts[b]) for a, b in zip(order, order[1:])]
    at = {i: k for k, i in enumerate(order)}
    prefixes, suffixes, splits = [], [None] * len(prompts), [0] * len(prompts)
    for group in _runs(order, shared, least):
        inner = [shared[at[i]] for i in group[1:]]
        head = min(inner, default=len(prompts[group[0]]))
        head = max(1, min(head, *(len(prompts[i]) for i in group)))  # every question keeps its first token shared
        prefixes.append(list(prompts[group[0]][:head]))
        for run in _runs(group, [0] + [shared[at[i]] - head for i in group[1:]], least):
            node = min((shared[at[i]] for i in run[1:]), default=head) - head
            for i in run:
                suffixes[i] = (len(prefixes) - 1, list(prompts[i][head:]))
                splits[i] = node if len(run) > 1 else 0
    return prefixes, suffixes, splits
