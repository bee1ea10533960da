"""Generation: the engines (in the driver or Ray actors), which rank feeds which engine its weights and the weight
push itself, prompts encoded as the engines take them (images included), sampling with dynamic filtering, and the
queue that generates ahead of training. May import `workers/`, `rewards/` and `state/`."""
