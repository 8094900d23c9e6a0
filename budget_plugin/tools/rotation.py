"""The order of contenders timed side by side, round after round."""

from typing import List


def rotation(n: int, round_: int) -> List[int]:
    """The order of ``n`` contenders in one timed round. Who goes first rotates from
    round to round: the first pays for the memory the previous round's last one
    handed back (page faults anew)."""
    return [(i + round_) % n for i in range(n)]
