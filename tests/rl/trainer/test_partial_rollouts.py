"""Partial rollouts (`trainer.fully_async.partial_rollout_tokens`): a weight push lands in the middle of a generation
call on a real engine actor (Ray, the HF engine, segments of 2 tokens), and the call's responses go on under the new
weights from the tokens already sampled.

Oracle: transformers' teacher-forced forward of each whole response under the weights of each version. Every token
before the push carries version 0 and every later one version 1; each token's reported logprob is the one its own
version's weights give (and, for the tokens after the push, not the old weights'), so the off-policy correction
weighs every token against the policy that actually sampled it. An engine lost mid-call: the same call run
uninterrupted, and the replacement runs only the segments from the lost one on. The segments' pure logic (budgets,
stop strings across a boundary, seeds) is checked on a scripted engine."""

import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl.core.generation import Rollout, SamplingParams
from rl.core.generation.segments import SEED_STRIDE, generate_in_segments
from rl.trainer.rollout.rollout_queue import partial_rollout_metrics
from tests.testing import tolerances
from tests.testing.tiny_job import make_tiny_job

SEGMENT = 2
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=40, seed=7)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


@pytest.fixture(scope="module")
def engines(job):
    import ray

    from rl.trainer.rollout.engines import RemoteEngines
    from tests.testing.ray_cluster import shared_ray_address

    ray.init(address=shared_ray_address(), log_to_driver=False)
    yield RemoteEngines("hf", job.model_path, 1, {"device": "cpu"}, lambda i: {"num_cpus": 0}, SEGMENT)
    ray.shutdown()


def _teacher_forced(model, rollout: Rollout) -> tuple[torch.Tensor, float]:
    """Per response token, log_softmax of the untempered logits of a whole-sequence forward, and the float32 bound
    of its gap to another evaluation of the same weights (`tolerances.network_rtol` times the largest logit)."""
    ids = torch.tensor([rollout.prompt_ids + rollout.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(rollout.prompt_ids) - 1:-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(rollout.response_ids)[:, None])[:, 0]
    reductions = tolerances.decoder_reductions(model.config, ids.shape[1])
    return picked, 2 * tolerances.network_rtol(reductions, torch.float32) * float(logits.abs().max())


def test_a_push_mid_call_splits_responses_between_two_versions(job, engines):

    tokenizer = AutoTokenizer.from_pretrained(job.model_path)
    prompts = [tokenizer.encode("12+34="), tokenizer.encode("7+8=")]
    old = AutoModelForCausalLM.from_pretrained(job.model_path, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(job.model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        generator = torch.Generator().manual_seed(3)
        for param in new.parameters():
            param.add_(0.5 * param.std() * torch.randn(param.shape, generator=generator))
    pending = engines.submit(prompts, PARAMS)
    deadline = time.monotonic() + 60
    while engines.segments_collected < 1:  # the push lands once the call has begun
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.002)
    engines.begin_update()
    engines.update_weights(list(new.state_dict().items()))
    engines.finish_update(1)
    versions, rollouts = engines.collect(pending)
    assert versions == [0] and len(rollouts) == 4
    split = [r for r in rollouts if set(r.token_versions) == {0, 1}]
    assert split, "some response was still open when the weights arrived"
    for rollout in rollouts:
        assert rollout.token_versions == sorted(rollout.token_versions), "version 0 tokens, then version 1 ones"
        assert rollout.response_text == tokenizer.decode(rollout.response_ids, skip_special_tokens=True)
        versions_of = torch.tensor(rollout.token_versions)
        reported = torch.tensor(rollout.raw_logprobs)
        for version, model in ((0, old), (1, new)):
            mine = versions_of == version
            want, bound = _teacher_forced(model, rollout)
            tolerances.assert_within(reported[mine], want[mine], bound, msg=f"version {version} tokens")
    after = torch.cat([torch.tensor(r.raw_logprobs)[torch.tensor(r.token_versions) == 1] for r in split])
    before_weights = torch.cat([_teacher_forced(old, r)[0][torch.tensor(r.token_versions) == 1] for r in split])
    assert (after - before_weights).abs().max() > 0.1, "the tokens after the push were sampled by the new weights"
    metrics = partial_rollout_metrics(rollouts, step=2)
    assert metrics["partial_responses"] == len(split) / 4
    assert 0 < metrics["token_lag_mean"] < 1


def test_an_engine_lost_mid_call_costs_only_its_segment_in_progress(job, tmp_path, capsys):
    """The engine is SIGKILLed as it starts a call's third segment; the replacement gets the same weights and runs
    that segment again with its seed, and the call goes on from there: the responses are those of the same call run
    uninterrupted (on the replacement, afterwards), and the replacement ran only the segments from the third on."""
    import ray

    from rl.trainer.rollout.engines import RemoteEngines
    from rl.trainer.workers.restarts import RestartBudget

    kill = {"RL_KILL_AT": "engine_generate:0:3", "RL_KILL_ONCE": str(tmp_path / "killed")}
    lossy = RemoteEngines("hf", job.model_path, 1, {"device": "cpu"},
                          lambda i: {"num_cpus": 0, "runtime_env": {"env_vars": kill}}, SEGMENT)
    state = list(AutoModelForCausalLM.from_pretrained(job.model_path, dtype=torch.float32).state_dict().items())
    lossy.budget = RestartBudget(1)
    lossy.bring_up = lambda actor: ray.get(actor.update_weights.remote(state))
    prompts = [AutoTokenizer.from_pretrained(job.model_path).encode("12+34=")]
    first = lossy.collect(lossy.submit(prompts, PARAMS))
    assert "1 call(s) issued again with their seeds" in capsys.readouterr().out
    segments, served = lossy.segments_collected, ray.get(lossy.actors[0].calls_served.remote())
    assert lossy.budget.engines_replaced == 1 and segments >= 4, segments
    assert served == segments - 2, "segments 1 and 2 came from the lost engine and were not run again"
    again = lossy.collect(lossy.submit(prompts, PARAMS))
    assert lossy.segments_collected == 2 * segments
    assert first[0] == again[0] == [0]
    for lost, whole in zip(first[1], again[1], strict=True):
        assert (lost.response_ids, lost.raw_logprobs) == (whole.response_ids, whole.raw_logprobs)


def test_calls_from_another_thread_never_land_inside_a_push(job):
    """Whole calls (no segments) submitted from a thread of their own, as the rollout queue's episodes submit them,
    while the driver pushes weights: each call reaches the engine before a push or after it, never between
    begin_update and finish_update (where the engine refuses to generate), and reports the version it ran on."""
    import threading

    from rl.trainer.rollout.engines import RemoteEngines

    whole = RemoteEngines("hf", job.model_path, 1, {"device": "cpu"}, lambda i: {"num_cpus": 0})
    tokenizer = AutoTokenizer.from_pretrained(job.model_path)
    state = list(AutoModelForCausalLM.from_pretrained(job.model_path, dtype=torch.float32).state_dict().items())
    seen, failures, pushes = [], [], 6
    done = threading.Event()

    def calls():
        try:
            while not done.is_set():
                call = whole.submit([tokenizer.encode("1+1=")], SamplingParams(max_new_tokens=4, seed=1))
                seen.extend(whole.collect(call)[0])
        except Exception as error:  # reported below
            failures.append(error)

    thread = threading.Thread(target=calls)
    thread.start()
    for version in range(1, pushes + 1):
        whole.begin_update()
        whole.update_weights(state)
        whole.finish_update(version)
    done.set()
    thread.join(60)
    assert not failures, failures
    assert seen and seen == sorted(seen) and set(seen) <= set(range(pushes + 1))


class _Scripted:
    """An engine playing fixed scripts: sample s of prompt [p] samples `scripts[p, s]`, a continuation (the prompt
    and a prefix of a script) that script's next tokens; 0 is its stop token. The weights' version is 0 for the first
    call and 1 after. Records every call."""

    def __init__(self, scripts: dict[tuple[int, int], list[int]]):
        self.scripts, self.calls = scripts, []

    def __call__(self, prompts, params):
        self.calls.append(params)
        out = []
        for index, prompt in enumerate(prompts):
            for sample in range(params.n):
                head, prefix = prompt[0], prompt[1:]
                script = next(script for (p, s), script in self.scripts.items()
                              if p == head and script[:len(prefix)] == prefix and (prefix or s == sample))
                tokens = script[len(prefix):][:params.max_new_tokens]
                stopped = 0 in tokens
                tokens = tokens[:tokens.index(0) + 1] if stopped else tokens
                out.append(Rollout(index, sample, prompt, tokens, [-0.5] * len(tokens), [-0.25] * len(tokens),
                                   "stop" if stopped else "length", "".join(map(str, tokens))))
        return (0 if len(self.calls) == 1 else 1), out


def test_segments_keep_budgets_seeds_and_stop_strings():
    scripts = {(1, 0): [1, 2, 3, 4, 5, 6, 7], (1, 1): [2, 0, 9], (2, 0): [8, 8, 8, 9, 9, 9, 9], (2, 1): [3] * 7}
    engine = _Scripted(scripts)
    params = SamplingParams(n=2, max_new_tokens=6, seed=11, stop=("99",))
    oldest, rollouts = generate_in_segments(engine, [[1], [2]], params, 2, lambda ids: "".join(map(str, ids)))
    assert oldest == 0
    by = {(r.prompt_index, r.sample_index): r for r in rollouts}
    assert by[0, 0].response_ids == [1, 2, 3, 4, 5, 6] and by[0, 0].finish_reason == "length"  # the budget
    assert by[0, 0].token_versions == [0, 0, 1, 1, 1, 1] and by[0, 0].response_text == "123456"
    assert by[0, 1].response_ids == [2, 0] and by[0, 1].finish_reason == "stop"  # a stop token, in one segment
    assert by[0, 1].token_versions == [0, 0]
    assert by[1, 0].response_ids == [8, 8, 8, 9, 9] and by[1, 0].finish_reason == "stop"  # "99" across a boundary
    assert by[1, 0].rollout_logprobs == [-0.5] * 5 and by[1, 0].raw_logprobs == [-0.25] * 5
    assert by[1, 0].token_versions == [0, 0, 1, 1, 1] and by[1, 0].response_text == "88899"
    assert by[1, 1].response_ids == [3] * 6
    first, *rest = engine.calls
    assert (first.max_new_tokens, first.n, first.seed) == (2, 2, 11)
    assert [call.seed for call in rest] == [11 * SEED_STRIDE + k for k in range(1, len(rest) + 1)] and len(rest) == 2
    assert all(call.n == 1 and call.max_new_tokens == 2 for call in rest)
    # three of the four responses span both versions ((0, 1) stopped in its first segment); of their 19 tokens 11
    # came from version 1, so at step 2 (policy version 1) the mean lag is 1 - 11/19 = 8/19
    metrics = partial_rollout_metrics(rollouts, step=2)
    assert metrics["partial_responses"] == 3 / 4
    assert metrics["token_lag_mean"] == pytest.approx(8 / 19, rel=1e-15)
