"""The tournaments' rules (`rrc_jax.rewards.tournament_rules`) against literal implementations of their rules, on
random verdict tables (300 cases each, with ties and odd groups): the same duels round by round, the same standing,
the duels per group equal to the closed form, and rank rewards on one scale."""

import itertools

import numpy as np
import pytest

from rrc_jax.rewards.tournament_rules import Circular, DoubleElimination, SeededKnockout, Swiss, rank_rewards

CASES = 300


def verdicts(rng, m):
    """A random antisymmetric table `[m, m]`: +1 when i beats j, -1 when j beats i, 0 a tie (about a fifth)."""
    t = np.zeros((m, m), np.int64)
    for i, j in itertools.combinations(range(m), 2):
        t[i, j] = rng.choice([1, -1, 0], p=[0.4, 0.4, 0.2])
        t[j, i] = -t[i, j]
    return t


def run(rule, table):
    """Play `rule` against `table`: its rounds of duels and its standing."""
    rounds = []
    while pairs := rule.pairs():
        rounds.append(pairs)
        rule.record(pairs, [int(table[i, j]) for i, j in pairs])
    return rounds, rule.standing()


def points(table, i, j):
    return {1: 1.0, 0: 0.5, -1: 0.0}[int(table[i, j])]


def test_rank_rewards_average_tied_positions():
    """alpha (m - 1 - position) in the standing's order, tied responses sharing the mean of their positions."""
    rng = np.random.default_rng(0)
    for _ in range(CASES):
        m = int(rng.integers(1, 10))
        standing = rng.integers(0, 4, size=m).astype(float)
        order = sorted(range(m), key=lambda i: -standing[i])
        want = np.zeros(m)
        for i in range(m):
            positions = [p for p, k in enumerate(order) if standing[k] == standing[i]]
            want[i] = 0.3 * np.mean([m - 1 - p for p in positions])
        np.testing.assert_allclose(rank_rewards(standing, 0.3), want, rtol=1e-6)
        assert rank_rewards(standing).sum() == pytest.approx(m * (m - 1) / 2)  # one scale: 0 + 1 + ... + m - 1


def test_circular_is_each_against_the_next():
    rng = np.random.default_rng(1)
    for _ in range(CASES):
        m = int(rng.integers(2, 10))
        table = verdicts(rng, m)
        rounds, standing = run(Circular(m), table)
        pairs = [(0, 1)] if m == 2 else [(i, (i + 1) % m) for i in range(m)]
        assert rounds == [pairs] and len(pairs) == (m if m > 2 else 1)
        want = np.zeros(m)
        for i, j in pairs:
            want[i] += points(table, i, j)
            want[j] += points(table, j, i)
        np.testing.assert_array_equal(standing, want)


def swiss_round(m, score, met, byes):
    """The literal Swiss pairing: the bye (m odd) to the lowest ranked without one; then, among every perfect
    matching of the others that repeats no pair, the one whose partners, read in rank order, rank best (the best
    ranked response gets its best possible opponent, then the next unpaired one, and so on)."""
    ranked = sorted(range(m), key=lambda i: (-score[i], i))
    bye = None
    if m % 2:
        bye = [i for i in ranked if i not in byes][-1]
    players = [i for i in ranked if i != bye]
    rank = {p: k for k, p in enumerate(players)}

    def matchings(rest):
        if not rest:
            yield []
            return
        first = rest[0]
        for other in rest[1:]:
            for tail in matchings([r for r in rest[1:] if r != other]):
                yield [(first, other)] + tail

    valid = [mt for mt in matchings(sorted(players)) if not any(frozenset(p) in met for p in mt)]

    def key(mt):
        partner = {**{a: b for a, b in mt}, **{b: a for a, b in mt}}
        out, seen = [], set()
        for p in players:
            if p not in seen:
                out.append(rank[partner[p]])
                seen |= {p, partner[p]}
        return out

    best = min(valid, key=key)
    partner = {**{a: b for a, b in best}, **{b: a for a, b in best}}
    pairs, seen = [], set()
    for p in players:
        if p not in seen:
            pairs.append((p, partner[p]))
            seen |= {p, partner[p]}
    return pairs, bye


def test_swiss_pairs_by_score_without_repeats():
    rng = np.random.default_rng(2)
    for case in range(CASES):
        m = int(rng.integers(2, 10))
        rounds_n = int(rng.integers(1, m // 2 + 1))
        table = verdicts(rng, m)
        rounds, standing = run(Swiss(m, rounds_n), table)
        score, met, byes = np.zeros(m), set(), set()
        for r in range(rounds_n):
            pairs, bye = swiss_round(m, score, met, byes)
            assert rounds[r] == pairs, (case, r)
            for i, j in pairs:
                score[i] += points(table, i, j)
                score[j] += points(table, j, i)
            if bye is not None:
                score[bye] += 0.5
                byes.add(bye)
            met |= {frozenset(p) for p in pairs}
        assert len(rounds) == rounds_n and sum(map(len, rounds)) == rounds_n * (m // 2)
        np.testing.assert_array_equal(standing, score)
    with pytest.raises(ValueError, match="takes 1 to 4 rounds"):
        Swiss(8, 5)


def test_double_elimination_is_out_after_two_losses():
    """The literal bracket: while more than one response has fewer than two losses, the unbeaten play among
    themselves and the once-beaten among themselves (in index order, an odd one out waiting), except that one
    unbeaten and one once-beaten play each other; a tie goes to the first listed. 2m - 2 duels, 2m - 1 when the
    champion lost once (the reset); the standing is the round each went out."""
    rng = np.random.default_rng(3)
    for _ in range(CASES):
        m = int(rng.integers(1, 10))
        table = verdicts(rng, m)
        rounds, standing = run(DoubleElimination(m), table)
        losses, out, r, played = [0] * m, [None] * m, 0, []
        while sum(x < 2 for x in losses) > 1:
            zero = [i for i in range(m) if losses[i] == 0]
            one = [i for i in range(m) if losses[i] == 1]
            if len(zero) == 1 and len(one) == 1:
                pairs = [(zero[0], one[0])]
            else:
                pairs = [(pool[k], pool[k + 1]) for pool in (zero, one) for k in range(0, len(pool) - 1, 2)]
            r += 1
            played.append(pairs)
            for i, j in pairs:
                loser = j if table[i, j] >= 0 else i
                losses[loser] += 1
                if losses[loser] == 2:
                    out[loser] = r
        assert rounds == played
        champion = [i for i in range(m) if losses[i] < 2]
        assert len(champion) == 1 and all(losses[i] == 2 for i in range(m) if i != champion[0])
        assert sum(map(len, rounds)) == (0 if m == 1 else 2 * m - 2 + losses[champion[0]])
        np.testing.assert_array_equal(standing, [r + 1 if o is None else o for o in out])


# The standard seeded brackets (seed numbers from 1, in slot order), as printed in tournament tables.
BRACKETS = {1: [1], 2: [1, 2], 4: [1, 4, 2, 3], 8: [1, 8, 4, 5, 2, 7, 3, 6],
            16: [1, 16, 8, 9, 4, 13, 5, 12, 2, 15, 7, 10, 3, 14, 6, 11]}


def test_seeded_knockout_plays_the_standard_bracket():
    """Seeds by the first signal (ties by index), the standard bracket of the next power of 2 (the top seeds' byes),
    the better seed first in each duel and through on a tie; m - 1 duels; the standing is the duels won."""
    rng = np.random.default_rng(4)
    for _ in range(CASES):
        m = int(rng.integers(1, 17))
        table = verdicts(rng, m)
        signal = rng.integers(0, 3, size=m).astype(float)  # ties in the seeding too
        rounds, standing = run(SeededKnockout(m, signal), table)
        seeded = sorted(range(m), key=lambda i: (-signal[i], i))  # seeded[s - 1]: the response of seed s
        size = next(p for p in BRACKETS if p >= m)
        slots = [seeded[s - 1] if s <= m else None for s in BRACKETS[size]]
        seed_of = {r: s for s, r in enumerate(seeded)}
        wins, played = np.zeros(m), []
        while sum(s is not None for s in slots) > 1:
            pairs, nxt = [], []
            for a, b in zip(slots[::2], slots[1::2]):
                if a is None or b is None:
                    nxt.append(a if b is None else b)
                    continue
                a, b = (a, b) if seed_of[a] < seed_of[b] else (b, a)
                pairs.append((a, b))
                winner = a if table[a, b] >= 0 else b
                wins[winner] += 1
                nxt.append(winner)
            played.append(pairs)
            slots = nxt
        assert rounds == played and sum(map(len, rounds)) == max(m - 1, 0)
        np.testing.assert_array_equal(standing, wins)
