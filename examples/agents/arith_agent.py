"""An agent for the embedded arithmetic task, played through the OpenAI-compatible endpoint with the `openai`
client: the policy answers, a wrong answer gets the question asked again, and the policy answers a second time.
The reward is that of the `arith_retry` environment: 1 for a right first answer, 0.5 for a right second one.

    ./bazelw run //rl/launch:train -- environment.agent_fn=examples/agents/arith_agent.py:run \\
        generator.enable_http_endpoint=true generator.max_turns=2

Nothing here knows about the trainer: the same function works against any OpenAI-compatible server, given its
address and key.
"""

from openai import AsyncOpenAI

from rl.tasks.gsm8k.rewards import gsm8k_reward

ATTEMPTS = 2
RETRY_REWARD = 0.5


async def run(base_url: str, row: dict, api_key: str) -> dict:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300.0)
    try:
        model = (await client.models.list()).data[0].id
        messages = list(row["prompt"])
        question = messages[-1]["content"]
        for attempt in range(1, ATTEMPTS + 1):
            reply = await client.chat.completions.create(model=model, messages=messages)
            answer = reply.choices[0].message.content or ""
            if gsm8k_reward(answer, row["answer"]) == 1.0:
                return {"reward": 1.0 if attempt == 1 else RETRY_REWARD, "solved": 1.0, "attempts": attempt}
            # the feedback: the question again, as a new user turn (words the embedded tokenizer knows)
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]
        return {"reward": 0.0, "solved": 0.0, "attempts": ATTEMPTS}
    finally:
        await client.close()
