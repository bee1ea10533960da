"""The trainer: one run of GRPO/PPO (`run`, `loop`) over packages that each own one role.

From the top down (a module imports only from its own package or from packages below it; `tools/lint`'s
`trainer_layers_test` holds this):

- `supervised/`: the SFT and DPO drivers and their preflight; only their launchers import it.
- this folder: the RL run (`run`), its loop (`loop`, `components`), and what a step computes from rollouts
  (`experience`, `kl_reward`, `rollout_mismatch`, `policy_update`, `batching`, `startup`).
- `preflight/`: what is checked before anything starts (data, models, weights, images, memory, engines).
- `multi_turn/`: environments and agents playing episodes over several turns, and the agents' HTTP endpoint.
- `rollout/`: the generation engines, prompts as they take them, sampling, the rollout queue, the weight push.
- `workers/`: Ray, placement, the training workers' start and group, the lifeline, waiting on actors.
- `rewards/`: scoring responses (user functions in their own processes, reward models).
- `state/`: what a run leaves on disk (checkpoints, metrics, curves) and its guards (finite values, write faults,
  fault points for tests).
"""
