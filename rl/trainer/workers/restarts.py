"""How many recoveries a run may make (`trainer.max_restarts`), counted per kind of actor lost over a window of
steps (`trainer.restart_window_steps`): generation engines (replaced on their own during a generation, or with the
run's other actors when lost elsewhere) and the others (training workers, critics, references, reward models: the
run's actors started again from the last checkpoint). A run that recovers now and then over a long run is not ended
by the sum; one that fails every few steps is."""

from __future__ import annotations

ENGINE, WORKER = "engine", "worker"
KINDS = {ENGINE: "recoveries from a lost generation engine",
         WORKER: "recoveries from a lost training worker, critic, reference or reward model"}


class RestartBudget:
    def __init__(self, limit: int, window_steps: int = 0):
        """`limit` recoveries of each kind within any `window_steps` consecutive steps (0: over the whole run)."""
        self.limit, self.window = limit, window_steps
        self.steps: dict[str, list[int]] = {kind: [] for kind in KINDS}
        self.engines_replaced = 0  # engines replaced on their own (the others restarted every actor)

    def recent(self, kind: str, step: int) -> int:
        """How many recoveries of `kind` count against one at `step`."""
        return sum(1 for at in self.steps[kind] if not self.window or at > step - self.window)

    def take(self, kind: str, step: int) -> bool:
        """Records a recovery of `kind` at `step` if the limit allows it; False (nothing recorded) if not."""
        if self.recent(kind, step) >= self.limit:
            return False
        self.steps[kind].append(step)
        return True

    def total(self, kind: str) -> int:
        return len(self.steps[kind])

    def describe(self, kind: str, step: int) -> str:
        """"2 of 3 engine replacements (trainer.max_restarts, in the last 20 steps)" after a recovery at `step`."""
        window = f", in the last {self.window} steps" if self.window else ""
        return f"{self.recent(kind, step)} of {self.limit} {KINDS[kind]} (trainer.max_restarts{window})"
