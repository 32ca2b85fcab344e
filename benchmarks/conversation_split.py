"""How the split of a long conversation into rows grows with its turns.

    python -m benchmarks.conversation_split --turns 1000 4000 16000

For one image with n questions of 150-700 characters (GEMeX's spread), with and without one
question whose reason runs to 9,000 characters (longer than a row may be), times
`builders.assembly.conversations.balanced_parts` at the default row limit and prints the rows
it makes: the long question alone, the others in the fewest rows that fit.
"""

from __future__ import annotations

import argparse
import random
import time

from builders.assembly.conversations import CHARS_PER_TOKEN, TEXT_TOKENS, balanced_parts

INSTRUCTION = 120
"""Characters of a shared instruction, paid once a row."""
LONG_TURN = 9_000


def costs(turns: int, long_turn: bool, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    out = [rng.randint(150, 700) for _ in range(turns)]
    if long_turn:
        out[turns // 2] = LONG_TURN
    return out


def timed(turns: int, long_turn: bool, repeats: int) -> tuple[float, list[list[int]]]:
    """The best of `repeats` timings of one split (seconds), and its rows."""
    given = costs(turns, long_turn)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        rows = balanced_parts(given, INSTRUCTION, TEXT_TOKENS * CHARS_PER_TOKEN)
        best = min(best, time.perf_counter() - start)
    return best, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    limit = TEXT_TOKENS * CHARS_PER_TOKEN
    print(f"row limit {limit:,} characters, {INSTRUCTION} a row for the instruction")
    print("| turns | long turn | rows | longest row (chars) | alone | ms | us/turn |")
    print("|---|---|---|---|---|---|---|")
    for turns in args.turns:
        for long_turn in (False, True):
            seconds, rows = timed(turns, long_turn, args.repeats)
            given = costs(turns, long_turn)
            longest = max((INSTRUCTION + sum(given[k] for k in row) for row in rows if len(row) > 1), default=0)
            alone = sum(len(row) == 1 for row in rows)
            print(
                f"| {turns:,} | {'yes' if long_turn else 'no'} | {len(rows)} | {longest:,} | {alone} | "
                f"{seconds * 1e3:.1f} | {seconds * 1e6 / turns:.2f} |"
            )


if __name__ == "__main__":
    main()
