"""trainer.max_restarts per kind of actor lost, over trainer.restart_window_steps: counted by hand."""

from rl.trainer.workers.restarts import ENGINE, WORKER, RestartBudget


def test_each_kind_has_its_own_limit_over_the_whole_run():
    budget = RestartBudget(limit=2)
    assert [budget.take(ENGINE, step) for step in (1, 5, 90)] == [True, True, False]
    assert budget.take(WORKER, 90), "the engines' recoveries do not count against the workers'"
    assert (budget.total(ENGINE), budget.total(WORKER)) == (2, 1)
    assert budget.describe(ENGINE, 90) == "2 of 2 recoveries from a lost generation engine (trainer.max_restarts)"


def test_a_recovery_counts_while_it_is_one_of_the_last_window_steps():
    budget = RestartBudget(limit=2, window_steps=5)
    assert budget.take(ENGINE, 1) and budget.take(ENGINE, 3)
    assert not budget.take(ENGINE, 5), "steps 1 and 3 are among the last 5 (1-5)"
    assert budget.take(ENGINE, 6), "step 1 is not among the last 5 (2-6)"
    assert not budget.take(ENGINE, 7), "steps 3 and 6 are (3-7)"
    assert budget.take(ENGINE, 8)
    assert budget.recent(ENGINE, 8) == 2 and budget.total(ENGINE) == 4
    assert budget.describe(ENGINE, 8) == ("2 of 2 recoveries from a lost generation engine (trainer.max_restarts, in "
                                          "the last 5 steps)")


def test_no_recovery_with_the_default_zero():
    budget = RestartBudget(limit=0)
    assert not budget.take(ENGINE, 1) and not budget.take(WORKER, 1)
    assert budget.total(ENGINE) == budget.total(WORKER) == 0
    assert budget.engines_replaced == 0, "what a run that replaced no engine logs as engines_replaced"
