"""Reward functions for the tests' launcher runs, in a module of their own: every reward process of a run imports the
module that holds its function, and this one needs nothing beyond Python."""


def length_reward(response: str, answer: str) -> float:
    """The response's length in characters, capped at 40, over 40: a graded reward that differs within nearly every
    group of a random model's samples, so advantages are non-zero and the clipped surrogate has work to do."""
    return min(len(response), 40) / 40
